// libFuzzer target: the public API's request validation. The input is a
// serialized moesh.v1.GenerateRequest (what a client sends); it goes
// through GenerationService::Validate against the tiny V3 model with its
// tokenizer, as the router checks every request before it runs.
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "base/file_util.h"
#include "common/model/config.h"
#include "common/model/random_checkpoint.h"
#include "common/tokenizer/embedded_tokenizers.h"
#include "moesh/v1/generation.pb.h"
#include "router/generation_service.h"
#include "router/text_codec_loader.h"

namespace {

struct Service {
  std::unique_ptr<moesh::TextCodec> codec;
  std::unique_ptr<moesh::GenerationService> service;
};

Service* MakeService() {
  auto* s = new Service;
  char dir[] = "/tmp/moesh-request-fuzzer-XXXXXX";
  if (mkdtemp(dir) == nullptr) abort();
  {
    std::ofstream out(moesh::JoinPath(dir, "tokenizer.json"));
    out << *moesh::EmbeddedTokenizerJson("tiny");
  }
  s->codec = std::move(*moesh::LoadTextCodec(dir));
  absl::StatusOr<moesh::ModelConfig> config = moesh::PresetConfig("v3", "tiny");
  if (!config.ok() || s->codec == nullptr) abort();
  moesh::GenerationServiceOptions options;
  options.max_context_tokens = 512;
  s->service =
      std::make_unique<moesh::GenerationService>(*config, nullptr, s->codec.get(), options);
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Service* const s = MakeService();
  moesh::v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  (void)s->service->Validate(request);
  return 0;
}
