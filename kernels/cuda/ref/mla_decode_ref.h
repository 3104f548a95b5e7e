// Plain C++ reference of the CUDA MLA decode op (kernels/cuda/params.h
// MlaDecodeParams): absorbed weights, paged latent cache, double accumulation.
#ifndef MOESH_KERNELS_CUDA_REF_MLA_DECODE_REF_H_
#define MOESH_KERNELS_CUDA_REF_MLA_DECODE_REF_H_

#include <cstdint>

namespace moesh::cuda::ref {

struct MlaDecodeRefParams {
  const float* q = nullptr;              // [batch, num_heads, kv_lora_rank + rope_dim]
  const float* kv_cache = nullptr;       // [num_blocks, block_size, kv_lora_rank + rope_dim]
  const int32_t* block_table = nullptr;  // [batch, max_blocks_per_seq]
  const int32_t* seq_lens = nullptr;     // [batch]
  int batch = 0, num_heads = 0, kv_lora_rank = 0, rope_dim = 0;
  int block_size = 64, max_blocks_per_seq = 0;
  float softmax_scale = 1.0f;
  float* out = nullptr;  // [batch, num_heads, kv_lora_rank]; zeros where seq_lens[b] == 0
  float* lse =
      nullptr;  // [batch, num_heads], natural log; -inf where seq_lens[b] == 0; may be null
};

void MlaDecodeRef(const MlaDecodeRefParams& p);

}  // namespace moesh::cuda::ref

#endif  // MOESH_KERNELS_CUDA_REF_MLA_DECODE_REF_H_
