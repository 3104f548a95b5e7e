// libFuzzer target: config.json (ModelConfig::FromJson). A config it accepts
// must describe a model whose sizes the loaders can trust.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<moesh::ModelConfig> config = moesh::ModelConfig::FromJson(text, "fuzz.json");
  if (config.ok()) (void)config->Fingerprint();
  return 0;
}
