// MLA prefill attention, expanded form (MlaPrefillParams), on wgmma: the
// FlashAttention-3 division of labour at the MLA prefill's shape (q·k 192 =
// three SW128 column blocks, v 128 = two). One CTA = (128 queries, head):
//   * the producer warpgroup (one lane) loads the CTA's Q once (two 64-row
//     halves, each [64, 192]) and streams 64-key tiles of K [64, 192] and
//     V [64, 128] into a two-stage ring with 2-D tensor copies (64 x 64
//     boxes swizzled by the copy engine; rows past the call's queries or keys
//     read as zeros), completing on full[stage]; a stage is reused once all
//     eight consumer warps have arrived on empty[stage];
//   * consumer warpgroup w owns queries [64 w, 64 w + 64) of the CTA:
//     S = Q·K^T (twelve wgmma m64n64k16, both operands K-major in shared
//     memory), the mask and online softmax (mla_prefill_common.cuh, as the
//     mma.sync kernel), P from registers into O += P·V (four wgmma
//     m64n128k16, V MN-major), the epilogue and merge as the mma.sync kernel.
// (Query tile, head) pairs in PrefillTileOf's order, as mla_prefill.cu's.
#include <algorithm>
#include <cstdint>

#include "base/status.h"
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/config.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/mla_prefill_common.cuh"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/wgmma.cuh"

namespace moesh::cuda::mla_prefill {
namespace {

constexpr int kWgRows = 64;  // queries a consumer warpgroup owns
constexpr int kConsumerWgs = 2;
constexpr int kCtaQueries = kWgRows * kConsumerWgs;  // 128
constexpr int kBlockBytes = 64 * 128;                // one SW128 column block of 64 rows
constexpr int kQkBlocks = kQkDim / 64;               // 3: Q and K rows
constexpr int kNopeBlocks = kNopeDim / 64;           // 2 of them from the no-rope part
constexpr int kVBlocks = kVDim / 64;                 // 2
constexpr int kStages = 2;
constexpr int kWgThreads = 128 * (kConsumerWgs + 1);  // + the producer warpgroup
constexpr int kConsumerWarps = 4 * kConsumerWgs;
// Registers per thread after setmaxnreg (mla_decode_wide.cu's split): a CTA
// of 384 threads gets 168 each at launch.
constexpr int kConsumerRegs = 240, kProducerRegs = 24;
static_assert((kConsumerWgs * kConsumerRegs + kProducerRegs) * 128 <=
                  65536 / kWgThreads / 8 * 8 * kWgThreads,
              "setmaxnreg would wait forever for registers the CTA does not have");
static_assert(kQkDim % 64 == 0 && kNopeDim % 64 == 0 && kVDim % 64 == 0 && kTileK == 64);

struct Smem {
  uint8_t q[kConsumerWgs][kQkBlocks * kBlockBytes];  // per warpgroup [64 queries, 192]
  uint8_t k[kStages][kQkBlocks * kBlockBytes];       // [64 keys, 192]
  uint8_t v[kStages][kVBlocks * kBlockBytes];        // [64 keys, 128]
  alignas(8) uint64_t q_full, full[kStages], empty[kStages];
};
// 1 KB of slack to align the dynamic shared memory to 1024 bytes (SW128).
constexpr int kSmemBytes = static_cast<int>(sizeof(Smem)) + 1024;
static_assert(kSmemBytes <= 227 * 1024, "over Hopper's shared memory per CTA");

// The call's operands as 2-D tensors read in 64 x 64 boxes: q_nope [num_q,
// q_nope_ld], q_pe [num_q, q_pe_ld], k_nope and v [num_k, kv_ld], k_pe
// [num_k, 64] (rows k_pe_ld apart).
struct Maps {
  CUtensorMap q_nope, q_pe, k_nope, k_pe, v;
};

__global__ void __launch_bounds__(kWgThreads, 1)
    MlaPrefillWgmmaKernel(const __grid_constant__ Maps maps, MlaPrefillParams p, int group) {
  extern __shared__ uint8_t smem_raw[];
  Smem& s =
      *reinterpret_cast<Smem*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const PrefillTile tile =
      PrefillTileOf(blockIdx.x, (p.num_q + kCtaQueries - 1) / kCtaQueries, p.num_heads, group);
  const int qt = tile.qt, h = tile.h;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int q0 = qt * kCtaQueries;
  const int diag = p.q_pos0 - p.k_pos0;  // key j is visible to query i iff j <= diag + i
  const int seen = max(0, min(p.num_k, diag + min(q0 + kCtaQueries, p.num_q)));
  const int n_kt = (seen + kTileK - 1) / kTileK;

  if (tid == 0) {
    MbarInit(&s.q_full, 1);
    for (int st = 0; st < kStages; ++st) {
      MbarInit(&s.full[st], 1);
      MbarInit(&s.empty[st], kConsumerWarps);
    }
    FenceMbarInit();
  }
  __syncthreads();

  if (warp >= kConsumerWarps) {  // the producer warpgroup: one lane works
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
    if (warp == kConsumerWarps && lane == 0) {
      const int qn_x = h * p.q_nope_head_stride, qp_x = h * p.q_pe_head_stride;
      const int kv_x = h * p.kv_head_stride;
      MbarArriveExpectTx(&s.q_full, kConsumerWgs * kQkBlocks * kBlockBytes);
      for (int wg = 0; wg < kConsumerWgs; ++wg) {
        const int y = q0 + wg * kWgRows;
        for (int c = 0; c < kNopeBlocks; ++c) {
          TmaLoad2D(s.q[wg] + c * kBlockBytes, &maps.q_nope, qn_x + c * 64, y, &s.q_full);
        }
        TmaLoad2D(s.q[wg] + kNopeBlocks * kBlockBytes, &maps.q_pe, qp_x, y, &s.q_full);
      }
      for (int i = 0; i < n_kt; ++i) {
        const int stage = i % kStages, y = i * kTileK;
        if (i >= kStages) MbarWait(&s.empty[stage], (i / kStages - 1) & 1);
        MbarArriveExpectTx(&s.full[stage], (kQkBlocks + kVBlocks) * kBlockBytes);
        for (int c = 0; c < kNopeBlocks; ++c) {
          TmaLoad2D(s.k[stage] + c * kBlockBytes, &maps.k_nope, kv_x + c * 64, y, &s.full[stage]);
        }
        TmaLoad2D(s.k[stage] + kNopeBlocks * kBlockBytes, &maps.k_pe, 0, y, &s.full[stage]);
        for (int c = 0; c < kVBlocks; ++c) {
          TmaLoad2D(s.v[stage] + c * kBlockBytes, &maps.v, kv_x + c * 64, y, &s.full[stage]);
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
  const int wg = tid / 128, g = lane / 4, tq = lane % 4;
  const int i0 = q0 + wg * kWgRows;                            // this warpgroup's first query
  const int r_lo = i0 + (warp % 4) * 16 + g, r_hi = r_lo + 8;  // this thread's two queries
  const float scale_log2 = p.softmax_scale * kLog2e;
  float o[kORegs];
#pragma unroll
  for (int i = 0; i < kORegs; ++i) o[i] = 0.0f;
  RowState st;
  const uint8_t* q = s.q[wg];
  MbarWait(&s.q_full, 0);

  for (int i = 0; i < n_kt; ++i) {
    const int stage = i % kStages;
    MbarWait(&s.full[stage], (i / kStages) & 1);
    __syncwarp();  // the wgmma below are warp-synchronous
    // S[64 queries, 64 keys] over the 192 dims.
    float sc[kSRegs];
    wgmma::GemmM64N64KMajor<kQkBlocks>(sc, q, s.k[stage], kBlockBytes);

    const int j0 = i * kTileK;
    const bool masked = j0 + kTileK - 1 > diag + i0 || j0 + kTileK > p.num_k;
    uint32_t pa[kPvSteps][4];
    SoftmaxTile(sc, o, pa, st, masked, j0, p.num_k, diag + r_lo, diag + r_hi, tq, scale_log2);

    // O[64 queries, 128] += P · V.
    wgmma::FenceOperands(o);
    wgmma::Fence();
    const uint64_t dv = wgmma::DescMnMajor(s.v[stage], kBlockBytes);
#pragma unroll
    for (int kk = 0; kk < kPvSteps; ++kk) {
      wgmma::WgmmaM64N128K16Rs<1>(o, pa[kk], dv + wgmma::DescStep(kk * 16 * 128), 1);
    }
    wgmma::Commit();
    wgmma::Wait<0>();
    wgmma::FenceOperands(o);
    __syncwarp();
    if (lane == 0) MbarArrive(&s.empty[stage]);
  }
  FinishRows(p, h, r_lo, tq, o, st);
}

}  // namespace

absl::Status LaunchMlaPrefillWgmma(const MlaPrefillParams& p) {
  if (p.q_nope_ld % 8 != 0 || p.q_pe_ld % 8 != 0 || p.q_nope_head_stride % 8 != 0 ||
      p.q_pe_head_stride % 8 != 0 || reinterpret_cast<uintptr_t>(p.q_nope) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(p.q_pe) % 16 != 0) {
    return absl::InvalidArgumentError(
        "RunMlaPrefill (wgmma): q_nope and q_pe must be 16-byte aligned with strides of whole 16 "
        "bytes (tensor copies)");
  }
  const uint64_t num_q = static_cast<uint64_t>(p.num_q);
  const uint64_t num_k = static_cast<uint64_t>(std::max(p.num_k, 1));  // none read if 0
  Maps maps;
  ASSIGN_OR_RETURN(maps.q_nope, Bf16BoxMap64(p.q_nope, num_q, p.q_nope_ld, p.q_nope_ld, "q_nope"));
  ASSIGN_OR_RETURN(maps.q_pe, Bf16BoxMap64(p.q_pe, num_q, p.q_pe_ld, p.q_pe_ld, "q_pe"));
  ASSIGN_OR_RETURN(maps.k_nope, Bf16BoxMap64(p.k_nope, num_k, p.kv_ld, p.kv_ld, "k_nope"));
  ASSIGN_OR_RETURN(maps.k_pe, Bf16BoxMap64(p.k_pe, num_k, kRopeDim, p.k_pe_ld, "k_pe"));
  ASSIGN_OR_RETURN(maps.v, Bf16BoxMap64(p.v, num_k, p.kv_ld, p.kv_ld, "v"));
  RETURN_IF_ERROR(AllowDynamicSmem<MlaPrefillWgmmaKernel>(kSmemBytes));
  ASSIGN_OR_RETURN(const int group, PrefillHeadsPerGroup(p));
  const int grid = (p.num_q + kCtaQueries - 1) / kCtaQueries * p.num_heads;
  MlaPrefillWgmmaKernel<<<grid, kWgThreads, kSmemBytes, p.stream>>>(maps, p, group);
  return LaunchStatus("MlaPrefillWgmmaKernel");
}

}  // namespace moesh::cuda::mla_prefill
