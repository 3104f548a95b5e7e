#include "common/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/file_util.h"
#include "base/status.h"
#include "nlohmann/json.hpp"

namespace moesh {
namespace {

using Json = nlohmann::json;

// Headers of real checkpoints are a few MB; anything near this is corrupt.
constexpr uint64_t kMaxHeaderBytes = 512ull << 20;

absl::Status Corrupt(const std::string& file, const std::string& what) {
  return absl::DataLossError(absl::StrCat(file, ": corrupt safetensors: ", what));
}

}  // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::ShapeString() const {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::InternalError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat(path, ": cannot stat: ", std::strerror(errno)));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return Corrupt(path,
                   absl::StrCat("file is ", size, " bytes, shorter than the 8-byte header length"));
  }
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    return absl::InternalError(absl::StrCat(path, ": mmap failed: ", std::strerror(errno)));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile(path, base, size));
  RETURN_IF_ERROR(file->ParseHeader());
  return file;
}

SafetensorsFile::~SafetensorsFile() { ::munmap(base_, size_); }

absl::Status SafetensorsFile::ParseHeader() {
  const uint8_t* bytes = static_cast<const uint8_t*>(base_);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);  // little-endian on every platform we build for
  if (header_len > kMaxHeaderBytes || header_len > size_ - 8) {
    return Corrupt(path_, absl::StrCat("header length ", header_len, " exceeds the file (", size_,
                                       " bytes): truncated or not a safetensors file"));
  }
  Json header = Json::parse(bytes + 8, bytes + 8 + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return Corrupt(path_, "header is not a JSON object");
  }
  const uint8_t* data = bytes + 8 + header_len;
  const size_t data_size = size_ - 8 - header_len;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") continue;
    const Json& e = it.value();
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
        !e.contains("data_offsets") || !e["dtype"].is_string() || !e["shape"].is_array() ||
        !e["data_offsets"].is_array() || e["data_offsets"].size() != 2) {
      return Corrupt(
          path_, absl::StrCat("tensor \"", name, "\" lacks a valid dtype, shape or data_offsets"));
    }
    TensorView v;
    v.name = name;
    v.file = path_;
    absl::StatusOr<DType> dtype = ParseDType(e["dtype"].get<std::string>());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": tensor \"", name, "\": ", dtype.status().message()));
    }
    v.dtype = *dtype;
    for (const Json& d : e["shape"]) {
      if (!d.is_number_unsigned()) {
        return Corrupt(path_, absl::StrCat("tensor \"", name, "\" has a non-integer dimension"));
      }
      v.shape.push_back(d.get<int64_t>());
    }
    const Json& off = e["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return Corrupt(path_, absl::StrCat("tensor \"", name, "\" has invalid data_offsets"));
    }
    const uint64_t begin = off[0].get<uint64_t>();
    const uint64_t end = off[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return Corrupt(path_, absl::StrFormat("tensor \"%s\" spans bytes [%d, %d) but the data "
                                            "section has %d bytes (truncated file?)",
                                            name, begin, end, data_size));
    }
    const uint64_t want = static_cast<uint64_t>(v.numel()) * DTypeSize(v.dtype);
    if (end - begin != want) {
      return Corrupt(path_,
                     absl::StrFormat("tensor \"%s\" of shape %s %s needs %d bytes but its "
                                     "data_offsets cover %d",
                                     name, v.ShapeString(), DTypeName(v.dtype), want, end - begin));
    }
    v.data = data + begin;
    v.nbytes = end - begin;
    ranges.emplace_back(begin, end);
    tensors_.emplace(name, std::move(v));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      return Corrupt(path_, "tensor byte ranges overlap");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint(dir));
  const std::string index_path = JoinPath(dir, "model.safetensors.index.json");
  const std::string single_path = JoinPath(dir, "model.safetensors");
  if (FileExists(index_path)) {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path));
    Json index = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
        !index["weight_map"].is_object()) {
      return absl::DataLossError(
          absl::StrCat(index_path, ": not a valid index (needs a \"weight_map\" object)"));
    }
    std::map<std::string, SafetensorsFile*> opened;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string()) {
        return absl::DataLossError(
            absl::StrCat(index_path, ": weight_map entry \"", it.key(), "\" is not a file name"));
      }
      const std::string shard = it.value().get<std::string>();
      if (shard.find('/') != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": shard name \"", shard, "\" must be a plain file name"));
      }
      SafetensorsFile*& f = opened[shard];
      if (f == nullptr) {
        ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                         SafetensorsFile::Open(JoinPath(dir, shard)));
        f = file.get();
        ckpt->files_.push_back(std::move(file));
      }
      auto t = f->tensors().find(it.key());
      if (t == f->tensors().end()) {
        return absl::DataLossError(absl::StrCat(index_path, ": tensor \"", it.key(),
                                                "\" is listed in ", shard,
                                                " but not stored there"));
      }
      ckpt->index_[it.key()] = &t->second;
    }
    for (const auto& file : ckpt->files_) {
      for (const auto& [name, view] : file->tensors()) {
        if (!ckpt->index_.count(name)) {
          return absl::DataLossError(
              absl::StrCat(file->path(), ": tensor \"", name, "\" is not listed in ", index_path));
        }
      }
    }
  } else if (FileExists(single_path)) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(single_path));
    for (const auto& [name, view] : file->tensors()) ckpt->index_[name] = &view;
    ckpt->files_.push_back(std::move(file));
  } else {
    return absl::NotFoundError(absl::StrCat(
        dir, ": no model.safetensors or model.safetensors.index.json in the model directory"));
  }
  return ckpt;
}

namespace {

absl::Mutex g_progress_mu;
LoadProgressFn* g_default_progress ABSL_GUARDED_BY(g_progress_mu) = nullptr;

}  // namespace

void SetDefaultLoadProgress(LoadProgressFn fn) {
  absl::MutexLock lock(&g_progress_mu);
  delete g_default_progress;
  g_default_progress = fn ? new LoadProgressFn(std::move(fn)) : nullptr;
}

std::string FormatLoadProgress(const std::string& what, const LoadProgress& p) {
  constexpr double kGB = 1e9;
  const double secs = absl::ToDoubleSeconds(p.elapsed);
  const double rate = secs > 0 ? p.bytes_done / secs : 0;
  std::string line =
      absl::StrFormat("%s: %.2f/%.2f GB", what, p.bytes_done / kGB, p.bytes_total / kGB);
  if (p.bytes_total > 0) {
    absl::StrAppendFormat(&line, " (%d%%)", static_cast<int>(100.0 * p.bytes_done / p.bytes_total));
  }
  absl::StrAppendFormat(&line, " %.2f GB/s", rate / kGB);
  if (p.bytes_done >= p.bytes_total) {
    absl::StrAppendFormat(&line, " done in %.1fs", secs);
  } else if (rate > 0) {
    absl::StrAppendFormat(&line, " ETA %.0fs", (p.bytes_total - p.bytes_done) / rate);
  }
  return line;
}

LoadProgressFn StderrLoadProgress(std::string what, absl::Duration period) {
  const char* quiet = std::getenv("MOESH_QUIET_LOAD");
  if (quiet != nullptr && std::string(quiet) != "0") return nullptr;
  struct State {
    absl::Mutex mu;
    absl::Duration last_print = -absl::InfiniteDuration();
  };
  auto state = std::make_shared<State>();
  // On a terminal one line redrawn; into a log a line every 5 s at most.
  const bool tty = ::isatty(STDERR_FILENO) == 1;
  if (!tty) period = std::max(period, absl::Seconds(5));
  return [state, what = std::move(what), period, tty](const LoadProgress& p) {
    absl::MutexLock lock(&state->mu);
    const bool last = p.bytes_done >= p.bytes_total;
    if (p.elapsed < absl::Seconds(1)) return;  // short loads stay silent
    if (!last && p.elapsed - state->last_print < period) return;
    state->last_print = p.elapsed;
    std::cerr << FormatLoadProgress(what, p) << (last || !tty ? "\n" : "\r") << std::flush;
  };
}

Checkpoint::Checkpoint(std::string dir) : dir_(std::move(dir)) {
  absl::MutexLock lock(&g_progress_mu);
  if (g_default_progress != nullptr) progress_ = *g_default_progress;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, view] : index_) n += view->nbytes;
  return n;
}

std::vector<std::string> Checkpoint::files() const {
  std::vector<std::string> out;
  for (const auto& f : files_) out.push_back(f->path());
  return out;
}

void Checkpoint::set_progress(LoadProgressFn fn) {
  absl::MutexLock lock(&mu_);
  progress_ = std::move(fn);
}

void Checkpoint::PlanRead(uint64_t bytes) const {
  absl::MutexLock lock(&mu_);
  if (planned_ == done_) start_ = absl::Now();  // a new load begins
  planned_ += bytes;
}

namespace {

// madvise over `view`'s bytes rounded out to whole pages (a neighbour's page
// dropped too is read again from the page cache when touched).
void AdviseTensor(const TensorView& view, int advice) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(view.data) & ~(page - 1);
  const uintptr_t end =
      (reinterpret_cast<uintptr_t>(view.data) + view.nbytes + page - 1) & ~(page - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, advice);
}

}  // namespace

void Checkpoint::WillRead(const TensorView& view) const { AdviseTensor(view, MADV_WILLNEED); }

void Checkpoint::Consumed(const TensorView& view) const {
  AdviseTensor(view, MADV_DONTNEED);  // its pages leave this process
  LoadProgress p;
  LoadProgressFn fn;
  {
    absl::MutexLock lock(&mu_);
    if (start_ == absl::InfinitePast()) start_ = absl::Now();
    read_.insert(view.name);
    done_ += view.nbytes;
    planned_ = std::max(planned_, done_);
    p = {done_, planned_, absl::Now() - start_};
    fn = progress_;
  }
  if (fn) fn(p);
}

std::set<std::string> Checkpoint::tensors_read() const {
  absl::MutexLock lock(&mu_);
  return read_;
}

absl::StatusOr<const TensorView*> Checkpoint::Get(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": checkpoint has no tensor \"", name, "\""));
  }
  return it->second;
}

void SafetensorsWriter::Add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                            std::vector<uint8_t> bytes) {
  entries_.push_back(Entry{name, dtype, std::move(shape), std::move(bytes)});
}

absl::Status SafetensorsWriter::WriteEntries(const std::string& path,
                                             const std::vector<const Entry*>& entries) const {
  Json header = Json::object();
  uint64_t offset = 0;
  for (const Entry* e : entries) {
    header[e->name] = {{"dtype", std::string(DTypeName(e->dtype))},
                       {"shape", e->shape},
                       {"data_offsets", {offset, offset + e->bytes.size()}}};
    offset += e->bytes.size();
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');  // keeps data 8-byte aligned
  std::string out;
  out.reserve(8 + h.size() + offset);
  const uint64_t len = h.size();
  out.append(reinterpret_cast<const char*>(&len), 8);
  out.append(h);
  for (const Entry* e : entries) {
    out.append(reinterpret_cast<const char*>(e->bytes.data()), e->bytes.size());
  }
  return WriteStringToFile(path, out);
}

absl::Status SafetensorsWriter::WriteFile(const std::string& path) const {
  std::vector<const Entry*> all;
  for (const Entry& e : entries_) all.push_back(&e);
  return WriteEntries(path, all);
}

absl::Status SafetensorsWriter::WriteCheckpoint(const std::string& dir, int num_shards) const {
  RETURN_IF_ERROR(MakeDirs(dir));
  if (num_shards <= 1) return WriteFile(JoinPath(dir, "model.safetensors"));
  std::vector<std::vector<const Entry*>> shards(num_shards);
  uint64_t total = 0;
  for (const Entry& e : entries_) total += e.bytes.size();
  // Fill shards in order up to an even share of the bytes, as HF's sharding does.
  uint64_t acc = 0;
  for (const Entry& e : entries_) {
    int s = static_cast<int>(
        std::min<uint64_t>(num_shards - 1, acc * num_shards / std::max<uint64_t>(total, 1)));
    shards[s].push_back(&e);
    acc += e.bytes.size();
  }
  Json weight_map = Json::object();
  for (int s = 0; s < num_shards; ++s) {
    std::string name = absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, num_shards);
    RETURN_IF_ERROR(WriteEntries(JoinPath(dir, name), shards[s]));
    for (const Entry* e : shards[s]) weight_map[e->name] = name;
  }
  Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  return WriteStringToFile(JoinPath(dir, "model.safetensors.index.json"), index.dump(2));
}

}  // namespace moesh
