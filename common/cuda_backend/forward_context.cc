#include "common/cuda_backend/forward_context.h"

namespace moesh::cuda {

absl::Status ForwardContext::Gemm(const bf16* x, int ldx, const bf16* w, void* y, int ldy, int m,
                                  int n, int k, OutType out, bool accumulate) const {
  GemmParams p;
  p.x = x, p.w = w, p.y = y, p.out_type = out;
  p.m = m, p.n = n, p.k = k, p.ldx = ldx, p.ldy = ldy;
  p.accumulate = accumulate;
  p.stream = stream;
  return gemm->Run(p);
}

absl::Status ForwardContext::Mark(int index) const {
  if (profile == nullptr) return absl::OkStatus();
  return (*profile)[index].Record(stream);
}

}  // namespace moesh::cuda
