// Reading and writing Hugging Face safetensors checkpoints.
//
// A SafetensorsFile memory-maps one file and validates its header once, at
// Open: every tensor's dtype is known, its shape matches its byte range, and
// the range lies inside the file. A Checkpoint is a model directory: either a
// single model.safetensors or shards listed in model.safetensors.index.json.
//
// Loading streams: a loader reads one tensor at a time through the mapping
// and hands it back with Checkpoint::Consumed, which drops its pages from this
// process (the page cache keeps them), so the host memory a load holds beyond
// what it builds stays near one tensor, not the checkpoint. Consumed also
// counts the bytes for a progress callback and records which tensors were
// read (tests assert an expert worker reads only its experts).
//
// Thread-safe after construction (the read bookkeeping is locked).
#ifndef MOESH_COMMON_MODEL_SAFETENSORS_H_
#define MOESH_COMMON_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/dtype.h"

namespace moesh {

// A read-only view of one tensor's bytes inside a mapped file.
struct TensorView {
  std::string name;
  std::string file;  // path of the file holding it, for error messages
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // [numel * DTypeSize(dtype)] bytes
  size_t nbytes = 0;

  int64_t numel() const;
  std::string ShapeString() const;  // "[4, 8]"
};

class SafetensorsFile {
 public:
  // NOT_FOUND if the file is missing, DATA_LOSS if truncated or its header is
  // corrupt, INVALID_ARGUMENT for an unsupported dtype. Messages name the file
  // and, where one is at fault, the tensor.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }

 private:
  SafetensorsFile(std::string path, void* base, size_t size)
      : path_(std::move(path)), base_(base), size_(size) {}
  absl::Status ParseHeader();

  const std::string path_;
  void* const base_;  // mmap'ed region, owned
  const size_t size_;
  std::map<std::string, TensorView> tensors_;
};

// Where a load stands: bytes of checkpoint tensors read so far of those the
// loads under way plan to read, and the time since the first was planned.
struct LoadProgress {
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
  absl::Duration elapsed;
};
// Called after every tensor read (from the loading thread, under no lock of
// the checkpoint's); it must not call back into the checkpoint.
using LoadProgressFn = std::function<void(const LoadProgress&)>;

// The callback every Checkpoint opened afterwards reports to (none by
// default): binaries install one that prints (FormatLoadProgress); library
// code only reports. Not for concurrent use with Checkpoint::Open.
void SetDefaultLoadProgress(LoadProgressFn fn);
// "loading /m: 1.20/3.40 GB (35%) 1.10 GB/s ETA 2s".
std::string FormatLoadProgress(const std::string& what, const LoadProgress& p);
// A LoadProgressFn printing FormatLoadProgress to stderr at most every
// `period` (one line redrawn on a terminal; into a file a line every 5 s at
// most), only once a load has taken over a second (then its last line too),
// and nothing at all (null) if the environment variable MOESH_QUIET_LOAD is
// set and not "0".
LoadProgressFn StderrLoadProgress(std::string what, absl::Duration period = absl::Seconds(0.5));

// All tensors of a model directory, from one or several safetensors files.
class Checkpoint {
 public:
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  // NOT_FOUND naming the tensor and the directory if absent.
  absl::StatusOr<const TensorView*> Get(const std::string& name) const;
  const std::map<std::string, const TensorView*>& tensors() const { return index_; }
  const std::string& dir() const { return dir_; }
  // Total bytes of all tensors.
  uint64_t total_bytes() const;
  // Paths of the safetensors files, in the order opened.
  std::vector<std::string> files() const;

  // Asks the kernel to read `view`'s pages ahead (madvise WILLNEED), so a cold
  // read streams the tensor instead of faulting it in page by page.
  void WillRead(const TensorView& view) const;
  // A loader about to read `bytes` of tensors adds them to the progress total.
  void PlanRead(uint64_t bytes) const;
  // `view` (one of tensors()) has been read: its pages leave this process's
  // memory (a later read maps them again from the file), its bytes count as
  // done and its name as read.
  void Consumed(const TensorView& view) const;
  // Names passed to Consumed so far.
  std::set<std::string> tensors_read() const;
  // Replaces the progress callback (SetDefaultLoadProgress's at Open).
  void set_progress(LoadProgressFn fn);

 private:
  explicit Checkpoint(std::string dir);

  const std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;

  mutable absl::Mutex mu_;
  LoadProgressFn progress_;
  mutable uint64_t planned_ ABSL_GUARDED_BY(mu_) = 0;
  mutable uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  mutable absl::Time start_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  mutable std::set<std::string> read_ ABSL_GUARDED_BY(mu_);
};

// Accumulates tensors in memory and writes them as safetensors.
// Not thread-safe.
class SafetensorsWriter {
 public:
  // REQUIRES: bytes.size() == numel(shape) * DTypeSize(dtype); name unique.
  void Add(const std::string& name, DType dtype, std::vector<int64_t> shape,
           std::vector<uint8_t> bytes);
  // Writes everything into one file.
  absl::Status WriteFile(const std::string& path) const;
  // Writes model.safetensors when num_shards == 1, else
  // model-0000i-of-0000N.safetensors plus model.safetensors.index.json.
  absl::Status WriteCheckpoint(const std::string& dir, int num_shards) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  absl::Status WriteEntries(const std::string& path,
                            const std::vector<const Entry*>& entries) const;

  std::vector<Entry> entries_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_MODEL_SAFETENSORS_H_
