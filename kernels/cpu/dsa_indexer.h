// DeepSeek Sparse Attention's lightning indexer (V3.2), CPU reference: scores
// every causal cache row for each query and keeps the top index_topk.
//
//   score[i, j] = sum_h weight[i, h] * relu(softmax_scale * q[i, h] . k[j])
//
// which is transformers' DeepseekV32Indexer (its fp8 quantisation and
// Hadamard rotation are precision and speed devices that leave the scores as
// they are). Queries with at most top_k causal rows keep them all.
#ifndef MOESH_KERNELS_CPU_DSA_INDEXER_H_
#define MOESH_KERNELS_CPU_DSA_INDEXER_H_

#include <cstdint>

namespace moesh::cpu {

struct DsaIndexerParams {
  const float* q = nullptr;  // [num_q, num_heads, head_dim], roped
  int num_q = 0;
  int num_heads = 0;
  int head_dim = 0;
  // Row j's indexer key at k + j * k_row_stride: [head_dim], roped.
  const float* k = nullptr;
  int k_row_stride = 0;
  int num_kv = 0;
  // Query i is at position q_start_pos + i and sees rows [0, q_start_pos + i].
  // REQUIRES: q_start_pos + num_q <= num_kv.
  int q_start_pos = 0;
  const float* weights = nullptr;  // [num_q, num_heads], per-head weights
  float softmax_scale = 1.0f;
  int top_k = 0;
  // Out: mask[i * num_kv + j] = 1 iff query i attends to row j (selected and
  // causal), else 0. Ties at the top-k boundary keep the earlier row.
  uint8_t* mask = nullptr;  // [num_q, num_kv]
};

void RunDsaIndexer(const DsaIndexerParams& p);

}  // namespace moesh::cpu

#endif  // MOESH_KERNELS_CPU_DSA_INDEXER_H_
