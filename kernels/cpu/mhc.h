// Manifold-constrained hyper-connections (mHC, DeepSeek-V4), CPU reference.
//
// The residual is hc parallel streams per token. Before a sublayer, a mapping
// of the (unweighted-RMSNorm'd, flattened) streams gives per token
//   pre[hc]      = sigmoid(scale[0] * mix_pre + base_pre) + hc_eps
//   post[hc]     = 2 * sigmoid(scale[1] * mix_post + base_post)
//   comb[hc, hc] = Sinkhorn(softmax_rows(scale[2] * mix_comb + base_comb) + hc_eps)
// (Sinkhorn: a column normalisation, then sinkhorn_iters - 1 rounds of row
// and column normalisations, each sum + hc_eps), and the sublayer reads the
// collapse sum_j pre[j] * x[j]. After it, with output y:
//   x'[k] = post[k] * y + sum_j comb[j, k] * x[j].
// The final head collapses the streams the same way with its own pre.
#ifndef MOESH_KERNELS_CPU_MHC_H_
#define MOESH_KERNELS_CPU_MHC_H_

namespace moesh::cpu {

struct MhcPreParams {
  const float* x = nullptr;  // [num_tokens, hc, hidden]
  int num_tokens = 0;
  int hc = 0;
  int hidden = 0;
  const float* fn = nullptr;     // [(2 + hc) * hc, hc * hidden]
  const float* base = nullptr;   // [(2 + hc) * hc]
  const float* scale = nullptr;  // [3]
  int sinkhorn_iters = 1;
  float hc_eps = 1e-6f;
  float norm_eps = 1e-6f;      // the unweighted RMSNorm's
  float* collapsed = nullptr;  // [num_tokens, hidden]
  float* post = nullptr;       // [num_tokens, hc]
  float* comb = nullptr;       // [num_tokens, hc, hc], comb[t, j, k]
};
void RunMhcPre(const MhcPreParams& p);

// x[t, k, :] = post[t, k] * y[t, :] + sum_j comb[t, j, k] * x[t, j, :], in place.
void RunMhcPost(float* x, const float* y, const float* post, const float* comb, int num_tokens,
                int hc, int hidden);

struct MhcHeadParams {
  const float* x = nullptr;  // [num_tokens, hc, hidden]
  int num_tokens = 0;
  int hc = 0;
  int hidden = 0;
  const float* fn = nullptr;     // [hc, hc * hidden]
  const float* base = nullptr;   // [hc]
  const float* scale = nullptr;  // [1]
  float hc_eps = 1e-6f;
  float norm_eps = 1e-6f;
  float* out = nullptr;  // [num_tokens, hidden]
};
void RunMhcHead(const MhcHeadParams& p);

}  // namespace moesh::cpu

#endif  // MOESH_KERNELS_CPU_MHC_H_
