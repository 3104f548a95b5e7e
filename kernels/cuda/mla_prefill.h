// MLA prefill attention in the expanded form (MlaPrefillParams in params.h
// states the math): FlashAttention-2-style causal attention on the tensor
// cores for a prompt's queries against keys and values expanded from the
// latent cache rows. Prefill runs it where a sequence brings many new tokens
// (common/cuda_backend/mla/mla_prefill_attention.cc); decode, and a few new
// tokens over a long context, run the absorbed decode kernel (mla_decode.h).
#ifndef MOESH_KERNELS_CUDA_MLA_PREFILL_H_
#define MOESH_KERNELS_CUDA_MLA_PREFILL_H_

#include "absl/status/status.h"
#include "kernels/cuda/params.h"

namespace moesh::cuda {

// REQUIRES (else INVALID_ARGUMENT): 0 <= num_q <= 65535 · 64, num_k >= 0, num_heads >= 1;
// non-null pointers (lse too when merge); k_nope, v and k_pe 16-byte aligned with
// kv_ld, kv_head_stride and k_pe_ld multiples of 8; q_nope, q_pe and out
// 4-byte aligned with even strides; impl kWgmma: q_nope and q_pe 16-byte
// aligned with strides multiples of 8 too. num_q == 0 launches nothing.
absl::Status RunMlaPrefill(const MlaPrefillParams& p);

// Floating-point operations one call performs on the tensor cores, counting
// only the causally visible (query, key) pairs: 2 · (192 + 128) a pair and head.
double MlaPrefillFlops(int num_q, int num_k, int num_heads, int q_pos0, int k_pos0);

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_MLA_PREFILL_H_
