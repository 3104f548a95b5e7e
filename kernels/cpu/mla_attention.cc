#include "kernels/cpu/mla_attention.h"

#include <cblas.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/ops.h"

namespace moesh::cpu {

void RunMlaAttention(const MlaAttentionParams& p) {
  const int r = p.kv_lora_rank;
  const int qk = p.qk_nope_head_dim + p.qk_rope_head_dim;
  const int kv_ld = p.kv_row_stride ? p.kv_row_stride : r + p.qk_rope_head_dim;
  const int q_ld = p.num_heads * qk;
  const int out_ld = p.num_heads * p.v_head_dim;
  std::vector<float> q_lat(static_cast<size_t>(p.num_q) * r);
  std::vector<float> scores(static_cast<size_t>(p.num_q) * p.num_kv);
  std::vector<float> o_lat(static_cast<size_t>(p.num_q) * r);
  for (int h = 0; h < p.num_heads; ++h) {
    const float* w_uk =
        p.w_kv_b + static_cast<int64_t>(h) * (p.qk_nope_head_dim + p.v_head_dim) * r;
    const float* w_uv = w_uk + static_cast<int64_t>(p.qk_nope_head_dim) * r;
    const float* q_nope = p.q + static_cast<int64_t>(h) * qk;
    const float* q_pe = q_nope + p.qk_nope_head_dim;
    // q_lat[num_q, r] = q_nope[num_q, nope] · w_uk[nope, r]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, p.num_q, r, p.qk_nope_head_dim, 1.0f,
                q_nope, q_ld, w_uk, r, 0.0f, q_lat.data(), r);
    // scores = q_lat · latent^T + q_pe · k_pe^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, p.num_q, p.num_kv, r, 1.0f, q_lat.data(),
                r, p.kv, kv_ld, 0.0f, scores.data(), p.num_kv);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, p.num_q, p.num_kv, p.qk_rope_head_dim,
                1.0f, q_pe, q_ld, p.kv + r, kv_ld, 1.0f, scores.data(), p.num_kv);
    for (int i = 0; i < p.num_q; ++i) {
      float* row = scores.data() + static_cast<int64_t>(i) * p.num_kv;
      const int visible = p.q_start_pos + i + 1;
      for (int j = 0; j < visible; ++j) row[j] *= p.softmax_scale;
      for (int j = visible; j < p.num_kv; ++j) row[j] = -std::numeric_limits<float>::infinity();
      if (p.kv_mask != nullptr) {
        const uint8_t* keep = p.kv_mask + static_cast<int64_t>(i) * p.num_kv;
        for (int j = 0; j < visible; ++j) {
          if (!keep[j]) row[j] = -std::numeric_limits<float>::infinity();
        }
      }
    }
    SoftmaxRows(scores.data(), p.num_q, p.num_kv);
    // o_lat[num_q, r] = probs[num_q, num_kv] · latent[num_kv, r]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, p.num_q, r, p.num_kv, 1.0f,
                scores.data(), p.num_kv, p.kv, kv_ld, 0.0f, o_lat.data(), r);
    // out[:, h] = o_lat · w_uv^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, p.num_q, p.v_head_dim, r, 1.0f,
                o_lat.data(), r, w_uv, r, 0.0f, p.out + static_cast<int64_t>(h) * p.v_head_dim,
                out_ld);
  }
}

}  // namespace moesh::cpu
