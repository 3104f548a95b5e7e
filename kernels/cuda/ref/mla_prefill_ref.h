// Plain C++ reference of the CUDA MLA prefill op (kernels/cuda/params.h
// MlaPrefillParams): expanded keys and values, causal by position, double
// accumulation, one call over the whole key range (no merging).
#ifndef MOESH_KERNELS_CUDA_REF_MLA_PREFILL_REF_H_
#define MOESH_KERNELS_CUDA_REF_MLA_PREFILL_REF_H_

namespace moesh::cuda::ref {

struct MlaPrefillRefParams {
  const float* q = nullptr;       // [num_q, num_heads, nope_dim + rope_dim], rope part roped
  const float* k_nope = nullptr;  // [num_k, num_heads, nope_dim]
  const float* k_pe = nullptr;    // [num_k, rope_dim], shared by the heads
  const float* v = nullptr;       // [num_k, num_heads, v_dim]
  int num_q = 0, num_k = 0, num_heads = 0;
  int nope_dim = 128, rope_dim = 64, v_dim = 128;
  int q_pos0 = 0, k_pos0 = 0;  // query i sees key j iff k_pos0 + j <= q_pos0 + i
  float softmax_scale = 1.0f;
  float* out = nullptr;  // [num_q, num_heads, v_dim]; zeros for a query that sees no key
  float* lse = nullptr;  // [num_q, num_heads], natural log; -inf where no key; may be null
};

void MlaPrefillRef(const MlaPrefillRefParams& p);

}  // namespace moesh::cuda::ref

#endif  // MOESH_KERNELS_CUDA_REF_MLA_PREFILL_REF_H_
