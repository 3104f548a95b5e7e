// libFuzzer target: a safetensors file's header (SafetensorsFile::Open on
// the input as a whole file: the 8-byte length, the JSON header, the tensors'
// byte ranges). Open must refuse what is malformed and every tensor it
// accepts must lie inside the file.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memfd_create("safetensors", 0);
  if (fd < 0) return 0;
  size_t written = 0;
  while (written < size) {
    const ssize_t n = write(fd, data + written, size - written);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  absl::StatusOr<std::unique_ptr<moesh::SafetensorsFile>> file =
      moesh::SafetensorsFile::Open(absl::StrCat("/proc/self/fd/", fd));
  if (file.ok()) {
    const auto* begin = reinterpret_cast<const uint8_t*>(
        (*file)->tensors().empty() ? nullptr : (*file)->tensors().begin()->second.data);
    for (const auto& [name, t] : (*file)->tensors()) {
      // Touch the first and the last byte: ASan reports a range outside the mapping.
      volatile uint8_t sink = 0;
      if (t.nbytes > 0) sink = t.data[0] ^ t.data[t.nbytes - 1];
      (void)sink;
      (void)begin;
      if (t.numel() < 0) abort();
    }
  }
  close(fd);
  return 0;
}
