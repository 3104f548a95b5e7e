// Multi-head latent attention (MLA) over a latent KV cache, CPU reference.
//
// The cache holds per token one latent row [kv_lora_rank normalised latent |
// qk_rope_head_dim roped key], shared by all heads. kv_b_proj is absorbed:
// q_nope is mapped into the latent space (W_UK), attention runs there, and the
// result is mapped out per head (W_UV). Mathematically equal to expanding the
// cache into per-head keys/values as transformers does.
#ifndef MOESH_KERNELS_CPU_MLA_ATTENTION_H_
#define MOESH_KERNELS_CPU_MLA_ATTENTION_H_

#include <cstdint>

namespace moesh::cpu {

struct MlaAttentionParams {
  const float* q = nullptr;  // [num_q, num_heads, qk_nope_head_dim + qk_rope_head_dim], roped
  int num_q = 0;
  int num_heads = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int kv_lora_rank = 0;
  int v_head_dim = 0;
  // Row j's latent at kv + j * kv_row_stride, its roped key right after it.
  const float* kv = nullptr;  // [num_kv, kv_row_stride]
  int kv_row_stride = 0;      // 0: kv_lora_rank + qk_rope_head_dim
  int num_kv = 0;
  // Query i is at position q_start_pos + i and attends to cache rows
  // [0, q_start_pos + i]. REQUIRES: q_start_pos + num_q <= num_kv.
  int q_start_pos = 0;
  // May be null. Sparse attention (DSA): query i attends only to the causal
  // rows j with kv_mask[i * num_kv + j] != 0 (at least one per query).
  const uint8_t* kv_mask = nullptr;  // [num_q, num_kv]
  const float* w_kv_b = nullptr;     // [num_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]
  float softmax_scale = 1.0f;
  float* out = nullptr;  // [num_q, num_heads * v_head_dim]
};

void RunMlaAttention(const MlaAttentionParams& p);

}  // namespace moesh::cpu

#endif  // MOESH_KERNELS_CPU_MLA_ATTENTION_H_
