// golden_bf16_drift: how far the CPU engine's log-probabilities move when a
// golden checkpoint's weights are rounded as the CUDA model rounds them
// (WriteBf16RoundedCopy), CPU engine against CPU engine: each prompt of
// golden.json teacher-forced with transformers' tokens, the max |log-prob
// difference| over the vocabulary at every step. What the GPU tests' bounds
// stand on (cuda_model_test: the CPU reference runs on the rounded copy).
//
// Usage: golden_bf16_drift [NAME...]   (tests/golden/NAME; default v3 v32 v4 v4_legacy)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "common/model/model.h"
#include "common/model/random_checkpoint.h"
#include "nlohmann/json.hpp"

namespace {

std::vector<double> LogSoftmax(const std::vector<float>& x) {
  double m = -INFINITY;
  for (float v : x) m = std::max(m, static_cast<double>(v));
  double s = 0.0;
  for (float v : x) s += std::exp(v - m);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] - m - std::log(s);
  return out;
}

int Run(const std::string& name) {
  using namespace moesh;
  const std::string dir = JoinPath(JoinPath(MOESH_SOURCE_DIR, "tests/golden"), name);
  const std::string rounded = JoinPath("/tmp", "moesh_bf16_drift_" + name);
  if (absl::Status s = WriteBf16RoundedCopy(dir, rounded); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), s.ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<Model>> a = Model::Load(dir), b = Model::Load(rounded);
  absl::StatusOr<std::string> text = ReadFileToString(JoinPath(dir, "golden.json"));
  if (!a.ok() || !b.ok() || !text.ok()) {
    std::fprintf(stderr, "%s: cannot load the checkpoint or golden.json\n", name.c_str());
    return 1;
  }
  const nlohmann::json golden = nlohmann::json::parse(*text);
  double worst = 0.0;
  for (size_t p = 0; p < golden["prompts"].size(); ++p) {
    SequenceKvCache ca = (*a)->NewCache(), cb = (*b)->NewCache();
    std::vector<int32_t> input = golden["prompts"][p].get<std::vector<int32_t>>();
    const std::vector<int32_t> want = golden["output_ids"][p].get<std::vector<int32_t>>();
    std::printf("%s prompt %zu (%zu tokens):", name.c_str(), p, input.size());
    for (int32_t next : want) {
      SequenceInput ia{input, &ca}, ib{input, &cb};
      absl::StatusOr<std::vector<float>> la = (*a)->Forward(absl::MakeConstSpan(&ia, 1));
      absl::StatusOr<std::vector<float>> lb = (*b)->Forward(absl::MakeConstSpan(&ib, 1));
      if (!la.ok() || !lb.ok()) return 1;
      const std::vector<double> x = LogSoftmax(*la), y = LogSoftmax(*lb);
      double d = 0.0;
      for (size_t i = 0; i < x.size(); ++i) d = std::max(d, std::fabs(x[i] - y[i]));
      worst = std::max(worst, d);
      std::printf(" %.3f", d);
      input = {next};
    }
    std::printf("\n");
  }
  std::printf("%s: max |log-prob drift| %.3f\n", name.c_str(), worst);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> names(argv + 1, argv + argc);
  if (names.empty()) names = {"v3", "v32", "v4", "v4_legacy"};
  int rc = 0;
  for (const std::string& n : names) rc |= Run(n);
  return rc;
}
