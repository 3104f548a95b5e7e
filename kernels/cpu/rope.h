// Rotary position embedding on the CPU: frequency tables (plain and YaRN) and
// the in-place rotation.
#ifndef MOESH_KERNELS_CPU_ROPE_H_
#define MOESH_KERNELS_CPU_ROPE_H_

#include <vector>

namespace moesh::cpu {

// Which elements of a rope slice form a rotated pair.
enum class RopeLayout {
  kInterleaved,  // (x0, x1), (x2, x3), ... — DeepSeek's native layout
  kHalves,       // (x_i, x_{i + d/2}) — the "neox" rotate-half layout
};

struct RopeTable {
  std::vector<float> inv_freq;    // [dim / 2]
  float attention_factor = 1.0f;  // multiplies cos and sin
};

// theta^(-2i/dim) for i in [0, dim/2).
RopeTable DefaultRopeTable(double theta, int dim);

struct YarnParams {
  double theta = 10000.0;
  double factor = 1.0;
  int original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;            // 0: unset
  double mscale_all_dim = 0.0;    // 0: unset
  double attention_factor = 0.0;  // 0: derived
  bool truncate = true;
};
// YaRN's blend of interpolated and extrapolated frequencies, as transformers'
// _compute_yarn_parameters does it.
RopeTable YarnRopeTable(const YarnParams& p, int dim);

struct RopeParams {
  float* x = nullptr;  // [num_rows, row_stride]; rope slice at x + row * row_stride + offset
  int num_rows = 0;    // rows sharing one position (e.g. heads of one token)
  int row_stride = 0;
  int offset = 0;
  int dim = 0;  // rope dims, even
  int position = 0;
  RopeLayout layout = RopeLayout::kInterleaved;
  const RopeTable* table = nullptr;
};
// Rotates every row's slice in place. The output keeps the input's layout.
void RunRope(const RopeParams& p);

}  // namespace moesh::cpu

#endif  // MOESH_KERNELS_CPU_ROPE_H_
