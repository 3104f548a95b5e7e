#include "common/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "kernels/cpu/ops.h"

namespace moesh {

absl::Status SamplingParams::Validate(int vocab_size) const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(absl::StrCat("temperature must be >= 0, got ", temperature));
  }
  if (top_k < 0)
    return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0 (0: off), got ", top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must lie in (0, 1], got ", top_p));
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("min_p must lie in [0, 1], got ", min_p));
  }
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty)) {
    return absl::InvalidArgumentError(
        absl::StrCat("repetition_penalty must be > 0, got ", repetition_penalty));
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("presence_penalty must lie in [-2, 2], got ", presence_penalty));
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("frequency_penalty must lie in [-2, 2], got ", frequency_penalty));
  }
  if (top_logprobs < 0 || top_logprobs > vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "top_logprobs must lie in [0, vocab_size = ", vocab_size, "], got ", top_logprobs));
  }
  if (prompt_logprobs < -1 || prompt_logprobs > vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt_logprobs must lie in [0, vocab_size = ", vocab_size, "], got ", prompt_logprobs));
  }
  return absl::OkStatus();
}

absl::Status SamplingParams::ValidateServed(int vocab_size) const {
  RETURN_IF_ERROR(Validate(vocab_size));
  if (top_logprobs > kMaxLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_logprobs must be <= ", kMaxLogprobs, ", got ", top_logprobs));
  }
  if (prompt_logprobs > kMaxLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt_logprobs must be <= ", kMaxLogprobs, ", got ", prompt_logprobs));
  }
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params)
    : params_(params),
      seed_(params.seed.has_value()
                ? *params.seed
                : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()) {}

int32_t Sampler::Sample(const float* logits, int vocab, int step, absl::Span<const int32_t> prompt,
                        absl::Span<const int32_t> output) {
  return SampleWithDraw(logits, vocab, params_, Draw(step), prompt, output);
}

namespace {

// splitmix64's finaliser (Steele, Lea and Flood): a bijective 64-bit mix.
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// x such that x ^ (x >> s) == y (s > 0): each pass fixes s more high bits.
uint64_t UnXorShift(uint64_t y, int s) {
  uint64_t x = y;
  for (int fixed = s; fixed < 64; fixed += s) x = y ^ (x >> s);
  return x;
}

// The inverse of odd `a` modulo 2^64 (Newton's iteration: a is its own
// inverse to 3 bits, and each step doubles the correct bits).
uint64_t InverseOdd(uint64_t a) {
  uint64_t x = a;
  for (int i = 0; i < 5; ++i) x *= 2 - a * x;
  return x;
}

// Mix's inverse: Unmix(Mix(z)) == z.
uint64_t Unmix(uint64_t z) {
  z = UnXorShift(z, 31) * InverseOdd(0x94D049BB133111EBull);
  z = UnXorShift(z, 27) * InverseOdd(0xBF58476D1CE4E5B9ull);
  return UnXorShift(z, 30);
}

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

}  // namespace

double Sampler::Draw(int step) const {
  if (params_.temperature < kMinSamplingTemperature) return 0.0;  // greedy takes no draw
  // Counter-based: the seed's stream (mixed, so nearby seeds share nothing)
  // at position `step` — no generator state to seed per request per step.
  const uint64_t z =
      Mix(Mix(seed_) + kGolden * (static_cast<uint64_t>(static_cast<uint32_t>(step)) + 1));
  return static_cast<double>(z >> 11) * 0x1.0p-53;  // 53 bits in [0, 1)
}

uint64_t Sampler::SeedAtStep(uint64_t seed, int step) {
  // Draw(i) mixes Mix(seed) + kGolden * (i + 1): the seed whose Mix is
  // kGolden * step further along the same stream.
  return Unmix(Mix(seed) + kGolden * static_cast<uint64_t>(static_cast<uint32_t>(step)));
}

int32_t Sampler::SampleWithDraw(const float* logits, int vocab, const SamplingParams& params,
                                double u01, absl::Span<const int32_t> prompt,
                                absl::Span<const int32_t> output) {
  std::vector<float> penalized;
  if (params.has_penalties()) {
    penalized.assign(logits, logits + vocab);
    if (params.repetition_penalty != 1.0f) {
      std::vector<bool> seen(vocab, false);
      for (int32_t t : prompt) seen[t] = true;
      for (int32_t t : output) seen[t] = true;
      for (int i = 0; i < vocab; ++i) {
        if (!seen[i]) continue;
        penalized[i] = penalized[i] > 0 ? penalized[i] / params.repetition_penalty
                                        : penalized[i] * params.repetition_penalty;
      }
    }
    if (params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f) {
      std::vector<int> count(vocab, 0);
      for (int32_t t : output) ++count[t];
      for (int i = 0; i < vocab; ++i) {
        if (count[i] == 0) continue;
        penalized[i] -=
            params.presence_penalty + params.frequency_penalty * static_cast<float>(count[i]);
      }
    }
    logits = penalized.data();
  }
  if (params.temperature <
      kMinSamplingTemperature) {  // the first of the largest; NaN never wins (all NaN: token 0)
    int32_t best = 0;
    bool found = false;
    for (int i = 0; i < vocab; ++i) {
      if (std::isnan(logits[i]) || (found && !(logits[i] > logits[best]))) continue;
      best = i;
      found = true;
    }
    return best;
  }
  // Candidates sorted by logit, best first; ties to the lower id; NaN as -inf.
  std::vector<std::pair<float, int32_t>> cand(vocab);
  for (int i = 0; i < vocab; ++i) {
    const float v = logits[i] / params.temperature;
    cand[i] = {std::isnan(v) ? -std::numeric_limits<float>::infinity() : v, i};
  }
  auto better = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  int n = vocab;
  if (params.top_k > 0 && params.top_k < vocab) {
    n = params.top_k;
    std::partial_sort(cand.begin(), cand.begin() + n, cand.end(), better);
  } else {
    std::sort(cand.begin(), cand.end(), better);
  }
  // No finite best (an infinite logit, or -inf everywhere): the best candidate.
  if (!std::isfinite(cand[0].first)) return cand[0].second;
  // Probabilities over the kept candidates.
  const float mx = cand[0].first;
  std::vector<double> p(n);
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += (p[i] = std::exp(static_cast<double>(cand[i].first) - mx));
  for (double& v : p) v /= sum;
  if (params.top_p < 1.0f) {
    double acc = 0.0;
    int keep = n;
    for (int i = 0; i < n; ++i) {
      acc += p[i];
      if (acc >= params.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
  }
  if (params.min_p > 0.0f) {
    const double floor = params.min_p * p[0];
    int keep = 1;
    while (keep < n && p[keep] >= floor) ++keep;
    n = keep;
  }
  double mass = 0.0;
  for (int i = 0; i < n; ++i) mass += p[i];
  const double u = u01 * mass;
  double acc = 0.0;
  for (int i = 0; i < n; ++i) {
    acc += p[i];
    if (u < acc) return cand[i].second;
  }
  return cand[n - 1].second;
}

std::vector<TokenLogprob> Sampler::TopLogprobs(const float* logits, int vocab, int k) {
  std::vector<float> lp(vocab);
  cpu::LogSoftmax(logits, lp.data(), vocab);
  std::vector<int32_t> idx(vocab);
  for (int i = 0; i < vocab; ++i) idx[i] = i;
  k = std::min(k, vocab);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return lp[a] > lp[b] || (lp[a] == lp[b] && a < b);
  });
  std::vector<TokenLogprob> out;
  for (int i = 0; i < k; ++i) out.push_back({idx[i], lp[idx[i]]});
  return out;
}

float Sampler::Logprob(const float* logits, int vocab, int32_t id) {
  std::vector<float> lp(vocab);
  cpu::LogSoftmax(logits, lp.data(), vocab);
  return lp[id];
}

PromptLogprobs Sampler::PromptLogprobsOf(const float* logits, int vocab,
                                         absl::Span<const int32_t> prompt, int k) {
  PromptLogprobs out;
  std::vector<float> lp(vocab);
  for (size_t t = 0; t + 1 < prompt.size(); ++t) {
    const float* row = logits + t * static_cast<size_t>(vocab);
    cpu::LogSoftmax(row, lp.data(), vocab);
    out.logprobs.push_back(lp[prompt[t + 1]]);
    if (k > 0) out.top.push_back(TopLogprobs(row, vocab, k));
  }
  return out;
}

}  // namespace moesh
