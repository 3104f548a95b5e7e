// Reading and writing Hugging Face safetensors checkpoints.
//
// A SafetensorsFile memory-maps one file and validates its header once, at
// Open: every tensor's dtype is known, its shape matches its byte range, and
// the range lies inside the file. A Checkpoint is a model directory: either a
// single model.safetensors or shards listed in model.safetensors.index.json.
//
// Thread-safe after construction (read-only).
#ifndef MOESH_COMMON_MODEL_SAFETENSORS_H_
#define MOESH_COMMON_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
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

// All tensors of a model directory, from one or several safetensors files.
class Checkpoint {
 public:
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  // NOT_FOUND naming the tensor and the directory if absent.
  absl::StatusOr<const TensorView*> Get(const std::string& name) const;
  const std::map<std::string, const TensorView*>& tensors() const { return index_; }
  const std::string& dir() const { return dir_; }

 private:
  explicit Checkpoint(std::string dir) : dir_(std::move(dir)) {}

  const std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
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
