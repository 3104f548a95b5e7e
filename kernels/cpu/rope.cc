#include "kernels/cpu/rope.h"

#include <algorithm>
#include <cmath>

namespace moesh::cpu {
namespace {

double YarnMscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

double CorrectionDim(double num_rotations, int dim, double base, double max_pos) {
  return (dim * std::log(max_pos / (num_rotations * 2.0 * M_PI))) / (2.0 * std::log(base));
}

}  // namespace

RopeTable DefaultRopeTable(double theta, int dim) {
  RopeTable t;
  for (int i = 0; i < dim; i += 2) {
    // float32 exponent, as torch.arange(dtype=float) / dim computes it.
    const float e = static_cast<float>(i) / static_cast<float>(dim);
    t.inv_freq.push_back(static_cast<float>(1.0 / std::pow(theta, static_cast<double>(e))));
  }
  return t;
}

RopeTable YarnRopeTable(const YarnParams& p, int dim) {
  const double base = p.theta;
  const double factor = p.factor;
  const double orig = p.original_max_position_embeddings;
  RopeTable t;
  if (p.attention_factor > 0) {
    t.attention_factor = static_cast<float>(p.attention_factor);
  } else if (p.mscale != 0 && p.mscale_all_dim != 0) {
    t.attention_factor =
        static_cast<float>(YarnMscale(factor, p.mscale) / YarnMscale(factor, p.mscale_all_dim));
  } else {
    t.attention_factor = static_cast<float>(YarnMscale(factor, 1.0));
  }
  double low = CorrectionDim(p.beta_fast, dim, base, orig);
  double high = CorrectionDim(p.beta_slow, dim, base, orig);
  if (p.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  for (int i = 0; i < dim / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(dim);
    const float pos_freq = static_cast<float>(std::pow(base, static_cast<double>(e)));
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (static_cast<float>(factor) * pos_freq);
    const float ramp = std::clamp(static_cast<float>((i - low) / (high - low)), 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    t.inv_freq.push_back(interpolation * (1.0f - extrapolation_factor) +
                         extrapolation * extrapolation_factor);
  }
  return t;
}

void RunRope(const RopeParams& p) {
  const int half = p.dim / 2;
  const RopeTable& t = *p.table;
  for (int i = 0; i < half; ++i) {
    // float32 angle, as transformers' (inv_freq @ position_ids) produces it.
    const float angle = t.inv_freq[i] * static_cast<float>(p.position);
    const float c = std::cos(angle) * t.attention_factor;
    const float s = std::sin(angle) * t.attention_factor;
    for (int r = 0; r < p.num_rows; ++r) {
      float* x = p.x + static_cast<long>(r) * p.row_stride + p.offset;
      const int a = p.layout == RopeLayout::kInterleaved ? 2 * i : i;
      const int b = p.layout == RopeLayout::kInterleaved ? 2 * i + 1 : i + half;
      const float x0 = x[a];
      const float x1 = x[b];
      x[a] = x0 * c - x1 * s;
      x[b] = x1 * c + x0 * s;
    }
  }
}

}  // namespace moesh::cpu
