// libFuzzer target: tokenizer.json (Tokenizer::FromJson). The input is the
// file; a tokenizer it accepts encodes and decodes a fixed text and the
// input's own bytes (well-formed UTF-8 or not) without failing loudly.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::unique_ptr<moesh::Tokenizer>> t = moesh::Tokenizer::FromJson(json, "fuzz");
  if (!t.ok()) return 0;
  for (const std::string& text :
       {std::string("Hello, world! 123 <｜User｜> héllo"), json.substr(0, 256)}) {
    absl::StatusOr<std::vector<int32_t>> ids = (*t)->Encode(text, /*add_special_tokens=*/true);
    if (ids.ok()) (void)(*t)->Decode(*ids, /*skip_special_tokens=*/false);
  }
  (void)(*t)->Decode({0, 1, 2, -1, 1 << 30}, /*skip_special_tokens=*/true);
  return 0;
}
