// kernel_bench: MLA decode and the dense GEMMs at DeepSeek-V2-Lite shapes,
// against the ceilings measured in the same run (a large device-to-device
// copy; a large square cuBLAS GEMM). Each row prints its floor — the larger
// of bytes / copy bandwidth and FLOPs / GEMM rate — and measured / floor.
//
// Usage: kernel_bench [--quick | --mla-table | --mla-wide-table | --mla[-fp8] HEADS,BATCH,CONTEXT |
//                     --fp8 | --fp8-grouped | --mla-prefill-table].
// --mla-table runs the MLA table alone (quick; --mla-wide-table its 128-head
// rows alone, bf16 and FP8); --mla-prefill-table the MLA
// prefill attention table alone (the expanded kernel against the absorbed
// form at 4K to 64K-token prompts); --mla runs that one MLA case
// with the default tile over bf16 rows (--mla-fp8: FP8 rows), for profilers; --fp8 runs
// DeepSeek-V3's dense linears in block-scaled FP8 (the activations' quantization
// plus cuBLASLt's GEMM) beside the bf16 GEMM of each shape, and the FP8 GEMM's
// own 8192^3 rate as its ceiling; --fp8-grouped the routed experts' FP8
// grouped GEMM at V3's prefill shapes against cuBLASLt's dense FP8 GEMM of the
// same rows. Exits non-zero on any
// CUDA error or when there is no device.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cuda/config.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/fill.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/mla_decode.h"
#include "kernels/cuda/mla_prefill.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/routing.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/kernel_bench_fp8.h"

namespace moesh::cuda {
namespace {

double FloorUs(double bytes, double flops, const Ceilings& c) {
  return std::max(bytes / (c.copy_gbps * 1e9), flops / (c.gemm_tflops * 1e12)) * 1e6;
}

struct MlaCase {
  int heads = 0, batch = 0, ctx = 0;  // heads 0: the whole table
  KvCacheDtype kv = KvCacheDtype::kBf16;
  bool wide_only = false;  // the table's 128-head bf16 rows alone (--mla-wide-table)
};

absl::Status BenchMla(const Ceilings& ceil, const DeviceInfo& info, bool quick, cudaStream_t stream,
                      const MlaCase& only) {
  constexpr int kDim = mla::kHeadDim, kRank = mla::kLatentDim;
  constexpr size_t kRowBytes = kDim * sizeof(bf16);
  const int max_blocks = 256 * 16384 / kKvBlockSize;  // 4.8 GB
  // Enough blocks for the largest case; smaller cases rotate through disjoint
  // block sets so no run finds the previous run's cache rows in L2.
  ASSIGN_OR_RETURN(auto cache,
                   DeviceBuffer<bf16>::Create(size_t{1} * max_blocks * kKvBlockSize * kDim));
  RETURN_IF_ERROR(FillUniform(cache.get(), cache.size(), 11, 1.0f, stream));
  // The same blocks as FP8 rows (--kv_cache_dtype fp8: 656 bytes a token).
  constexpr size_t kFp8RowBytes = cpu::Fp8KvRowLayout{kRank, mla::kRopeDim}.bytes();
  DeviceBuffer<uint8_t> fp8_cache;
  if (only.heads == 0 || only.kv == KvCacheDtype::kFp8) {
    ASSIGN_OR_RETURN(fp8_cache, DeviceBuffer<uint8_t>::Create(size_t{1} * max_blocks *
                                                              kKvBlockSize * kFp8RowBytes));
    RETURN_IF_ERROR(FillFp8KvRows(fp8_cache.get(), size_t{1} * max_blocks * kKvBlockSize, kRank,
                                  mla::kRopeDim, 13, 1.0f, stream));
  }
  std::printf(
      "\nMLA decode (absorbed, paged; kv_lora_rank %d, rope %d, bf16 out; kv: the cache's "
      "rows, bf16 %zu or fp8 %zu bytes; GB/s over those bytes)\n",
      kRank, mla::kRopeDim, kRowBytes, kFp8RowBytes);
  std::printf("%-6s %4s %5s %6s %7s %6s %10s %10s %9s %9s %9s %9s\n", "tile", "kv", "heads",
              "batch", "context", "splits", "time_us", "floor_us", "GB/s", "%copyBW", "TFLOP/s",
              "floor/t");
  std::mt19937 rng(5);
  struct Tile {
    const char* name;
    MlaTileConfig config;
  };
  const Tile tiles[] = {
      {"64x2", MlaTileConfig::kTokens64Stages2},       {"32x4", MlaTileConfig::kTokens32Stages4},
      {"32x5", MlaTileConfig::kTokens32Stages5},       {"32x2", MlaTileConfig::kTokens32Stages2},
      {"w64", MlaTileConfig::kHeads64Tokens64Stages2}, {"auto", MlaTileConfig::kDefault}};
  const auto name = [&tiles](MlaTileConfig t) {
    for (const Tile& tile : tiles) {
      if (tile.config == t) return tile.name;
    }
    return "?";
  };
  std::printf("(default tiles below 64 heads: bf16 rows %s, FP8 rows %s; w64 from 64 heads)\n",
              name(mla::kDefaultTile), name(mla::kFp8DefaultTile));
  struct Case {
    const Tile* tile;
    int heads, batch, ctx;
    KvCacheDtype kv = KvCacheDtype::kBf16;
    int splits = 0;  // 0: PlanMlaDecode's
  };
  std::vector<Case> cases;
  for (const Tile& tile : tiles) {
    if (tile.config == MlaTileConfig::kHeads64Tokens64Stages2 ||
        tile.config == MlaTileConfig::kDefault) {
      continue;
    }
    for (int batch : {1, 32, 128}) {
      for (int ctx : {2048, 4096, 8192}) cases.push_back({&tile, 16, batch, ctx});
    }
  }
  // 128 query heads (DeepSeek-V2/V3): the 16-head kernel as the baseline, and
  // the 64-head wgmma kernel (the default from 64 heads up) over the grid.
  for (int batch : {32, 128}) cases.push_back({&tiles[3], 128, batch, 4096});
  for (int batch : {1, 32, 128, 256}) {
    for (int ctx : {1024, 4096, 16384}) cases.push_back({&tiles[4], 128, batch, ctx});
  }
  // FP8 rows: the 16-head kernel's tiles at 16 heads, and at 128 heads the
  // 64-head kernel over FP8 rows (auto, mla_decode_wide.cu) beside the 16-head one
  // (64x2) and the bf16 rows above.
  for (const Tile* tile : {&tiles[0], &tiles[1], &tiles[2], &tiles[3]}) {
    for (int batch : {1, 32, 128}) cases.push_back({tile, 16, batch, 4096, KvCacheDtype::kFp8});
  }
  for (int batch : {1, 32, 128, 256}) {
    for (int ctx : {1024, 4096, 16384}) {
      cases.push_back({&tiles[5], 128, batch, ctx, KvCacheDtype::kFp8});
      if (ctx == 4096) cases.push_back({&tiles[0], 128, batch, ctx, KvCacheDtype::kFp8});
    }
  }
  // Small batches over a sweep of splits, both kinds of rows: the planner's
  // pick (splits 0) against its neighbours (each split CTA writes its heads x
  // 513 fp32 partials that the combine reads back): at 128 heads the 64-head
  // kernel, at 16 (V2-Lite) the default tiles (bf16 32x2, FP8 64x2).
  const auto sweep_splits = [&](const Tile* tile, int heads, int batch, int ctx, KvCacheDtype kv) {
    for (int splits : {0, 4, 8, 16, 24, 32, 64}) {
      if (splits <= ctx / 64) cases.push_back({tile, heads, batch, ctx, kv, splits});
    }
  };
  for (const KvCacheDtype kv : {KvCacheDtype::kBf16, KvCacheDtype::kFp8}) {
    for (int batch : {1, 2, 4, 8}) {
      for (int ctx : {1024, 4096, 16384}) {
        if (ctx == 16384 && batch > 1) continue;
        sweep_splits(&tiles[4], 128, batch, ctx, kv);
      }
    }
  }
  for (const KvCacheDtype kv : {KvCacheDtype::kBf16, KvCacheDtype::kFp8}) {
    const Tile* tile = kv == KvCacheDtype::kFp8 ? &tiles[0] : &tiles[3];
    for (int batch : {1, 4}) {
      for (int ctx : {2048, 8192}) sweep_splits(tile, 16, batch, ctx, kv);
    }
  }
  if (only.heads > 0) cases = {{&tiles[5], only.heads, only.batch, only.ctx, only.kv}};
  if (only.wide_only) {
    cases.erase(
        std::remove_if(cases.begin(), cases.end(), [](const Case& c) { return c.heads < 128; }),
        cases.end());
  }
  for (const Case& c : cases) {
    const int heads = c.heads, batch = c.batch, ctx = c.ctx;
    const int blocks_per_seq = ctx / kKvBlockSize, need = batch * blocks_per_seq;
    const int sets = std::max(1, std::min(8, max_blocks / need));
    std::vector<int32_t> pool(static_cast<size_t>(need) * sets);
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    ASSIGN_OR_RETURN(auto table, DeviceBuffer<int32_t>::Create(pool.size()));
    RETURN_IF_ERROR(table.CopyFrom(pool));
    std::vector<int32_t> lens(batch, ctx);
    ASSIGN_OR_RETURN(auto dlens, DeviceBuffer<int32_t>::Create(batch));
    RETURN_IF_ERROR(dlens.CopyFrom(lens));
    ASSIGN_OR_RETURN(auto q, DeviceBuffer<bf16>::Create(size_t{1} * batch * heads * kDim));
    RETURN_IF_ERROR(FillUniform(q.get(), q.size(), 12, 1.0f, stream));
    ASSIGN_OR_RETURN(auto out, DeviceBuffer<bf16>::Create(size_t{1} * batch * heads * kRank));
    const bool fp8 = c.kv == KvCacheDtype::kFp8;
    MlaDecodePlan plan = PlanMlaDecode(batch, heads, ctx, info.num_sms, c.tile->config, c.kv);
    if (c.splits > 0) {
      plan.num_splits = c.splits;
      plan.workspace_bytes = MlaDecodeWorkspaceBytes(batch, heads, c.splits);
    }
    ASSIGN_OR_RETURN(auto ws, DeviceBuffer<uint8_t>::Create(plan.workspace_bytes));
    MlaDecodeParams p;
    p.q = q.get(), p.seq_lens = dlens.get();
    p.kv_cache = fp8 ? reinterpret_cast<const bf16*>(fp8_cache.get()) : cache.get();
    p.kv_dtype = c.kv;
    p.batch = batch, p.num_heads = heads, p.num_blocks = max_blocks,
    p.max_blocks_per_seq = blocks_per_seq;
    p.max_seq_len = ctx, p.softmax_scale = 0.1352f, p.out = out.get(), p.out_type = OutType::kBf16;
    p.num_splits = plan.num_splits, p.workspace = ws.get(),
    p.workspace_bytes = plan.workspace_bytes;
    p.stream = stream, p.tile = c.tile->config;
    ASSIGN_OR_RETURN(double ms, MedianMs(
                                    stream, 3, quick ? 5 : 15,
                                    [&](int rep) {
                                      MlaDecodeParams r = p;
                                      r.block_table =
                                          table.get() + static_cast<size_t>(rep % sets) * need;
                                      return RunMlaDecode(r);
                                    },
                                    kInner));
    const double bytes = double(batch) * ctx * (fp8 ? kFp8RowBytes : kRowBytes) +
                         double(batch) * heads * (kDim + kRank) * 2;
    const double flops = 2.0 * batch * heads * ctx * (kDim + kRank);
    const double us = ms * 1e3, floor = FloorUs(bytes, flops, ceil);
    const double gbps = bytes / (ms * 1e-3) / 1e9;
    // Rows at forced splits say "split" where the tile's name goes.
    std::printf("%-6s %4s %5d %6d %7d %6d %10.1f %10.1f %9.0f %8.1f%% %9.1f %9.2f\n",
                c.splits > 0 ? "split" : c.tile->name, fp8 ? "fp8" : "bf16", heads, batch, ctx,
                plan.num_splits, us, floor, gbps, 100.0 * gbps / ceil.copy_gbps,
                flops / (ms * 1e-3) / 1e12, floor / us);
  }
  return absl::OkStatus();
}

struct GemmShape {
  const char* name;
  int n, k;
  OutType out;
};

absl::Status BenchGemm(CublasGemm& gemm, const Ceilings& ceil, const DeviceInfo& info, bool quick,
                       cudaStream_t stream) {
  // DeepSeek-V2-Lite: hidden 2048, 16 heads (q 192 = 128 nope + 64 rope, v 128),
  // kv_lora_rank 512, dense intermediate 10944, 2 shared experts of 1408, 64 routed, vocab 102400.
  const GemmShape shapes[] = {
      {"q_proj", 3072, 2048, OutType::kBf16},
      {"kv_a_proj_with_mqa", 576, 2048, OutType::kBf16},
      {"o_proj", 2048, 2048, OutType::kBf16},
      {"router (fp32 out)", 64, 2048, OutType::kFloat32},
      {"dense gate_up", 21888, 2048, OutType::kBf16},
      {"dense down", 2048, 10944, OutType::kBf16},
      {"shared gate_up", 5632, 2048, OutType::kBf16},
      {"shared down", 2048, 2816, OutType::kBf16},
      {"lm_head (fp32 out)", 102400, 2048, OutType::kFloat32},
  };
  const int ms_list[] = {1, 8, 32, 128, 2048};
  std::printf("\nGEMM y[m,n] = x[m,k]·w[n,k]^T via cuBLASLt (bf16 in, fp32 accumulate)\n");
  std::printf("%-20s %6s %6s %6s %10s %10s %9s %9s %9s\n", "op", "m", "n", "k", "time_us",
              "floor_us", "TFLOP/s", "GB/s", "floor/t");
  for (const GemmShape& s : shapes) {
    const size_t w_elems = size_t{1} * s.n * s.k;
    // Rotate weight copies so that together they exceed the L2 several times.
    const int copies =
        static_cast<int>(std::clamp<size_t>(4 * size_t(info.l2_bytes) / (w_elems * 2) + 1, 1, 16));
    ASSIGN_OR_RETURN(auto w, DeviceBuffer<bf16>::Create(w_elems * copies));
    RETURN_IF_ERROR(FillUniform(w.get(), w.size(), 21, 0.05f, stream));
    const int max_m = quick ? 128 : 2048;
    ASSIGN_OR_RETURN(auto x, DeviceBuffer<bf16>::Create(size_t{1} * max_m * s.k));
    RETURN_IF_ERROR(FillUniform(x.get(), x.size(), 22, 1.0f, stream));
    const size_t out_bytes = s.out == OutType::kFloat32 ? 4 : 2;
    ASSIGN_OR_RETURN(auto y, DeviceBuffer<uint8_t>::Create(size_t{1} * max_m * s.n * out_bytes));
    for (int m : ms_list) {
      if (m > max_m) continue;
      GemmParams p;
      p.x = x.get(), p.y = y.get(), p.out_type = s.out, p.m = m, p.n = s.n, p.k = s.k,
      p.stream = stream;
      ASSIGN_OR_RETURN(double ms, MedianMs(
                                      stream, 3, quick ? 5 : 15,
                                      [&](int rep) {
                                        GemmParams r = p;
                                        r.w = w.get() + (rep % copies) * w_elems;
                                        return gemm.Run(r);
                                      },
                                      kInner));
      const double flops = 2.0 * m * s.n * s.k;
      const double bytes = 2.0 * w_elems + 2.0 * m * s.k + double(out_bytes) * m * s.n;
      const double us = ms * 1e3, floor = FloorUs(bytes, flops, ceil);
      std::printf("%-20s %6d %6d %6d %10.1f %10.1f %9.1f %9.0f %9.2f\n", s.name, m, s.n, s.k, us,
                  floor, flops / (ms * 1e-3) / 1e12, bytes / (ms * 1e-3) / 1e9, floor / us);
    }
  }
  return absl::OkStatus();
}

// The row-wise and routing ops at decode sizes: microseconds per call (GPU
// time from graph replay); at these sizes they are launch- and latency-bound,
// their bytes mostly L2-resident, so no floor is given.
absl::Status BenchSmallOps(cudaStream_t stream) {
  const int t = 128, hidden = 2048, inter = 10944, vocab = 102400;
  ASSIGN_OR_RETURN(auto x, DeviceBuffer<bf16>::Create(size_t{1} * t * 2 * inter));
  ASSIGN_OR_RETURN(auto r, DeviceBuffer<bf16>::Create(size_t{1} * t * hidden));
  ASSIGN_OR_RETURN(auto y, DeviceBuffer<bf16>::Create(size_t{1} * t * inter));
  ASSIGN_OR_RETURN(auto w, DeviceBuffer<bf16>::Create(hidden));
  ASSIGN_OR_RETURN(auto logits, DeviceBuffer<float>::Create(size_t{1} * t * vocab));
  ASSIGN_OR_RETURN(auto freq, DeviceBuffer<float>::Create(32));
  ASSIGN_OR_RETURN(auto ids, DeviceBuffer<int32_t>::Create(size_t{1} * t * 32));
  ASSIGN_OR_RETURN(auto wts, DeviceBuffer<float>::Create(size_t{1} * t * 32));
  ASSIGN_OR_RETURN(auto cache, DeviceBuffer<bf16>::Create(size_t{1} * 4 * kKvBlockSize * 576));
  ASSIGN_OR_RETURN(auto q, DeviceBuffer<bf16>::Create(size_t{1} * t * 16 * 192));
  std::vector<int32_t> idx(t);
  std::iota(idx.begin(), idx.end(), 0);
  ASSIGN_OR_RETURN(auto slots, DeviceBuffer<int32_t>::Create(t));
  RETURN_IF_ERROR(slots.CopyFrom(idx));
  RETURN_IF_ERROR(FillUniform(x.get(), x.size(), 31, 1.0f, stream));
  RETURN_IF_ERROR(FillUniform(r.get(), r.size(), 32, 1.0f, stream));
  RETURN_IF_ERROR(FillUniform(w.get(), w.size(), 33, 1.0f, stream));
  RETURN_IF_ERROR(FillUniform(logits.get(), logits.size(), 34, 8.0f, stream));
  RETURN_IF_ERROR(FillUniform(freq.get(), freq.size(), 35, 0.5f, stream));
  RETURN_IF_ERROR(FillUniform(q.get(), q.size(), 36, 1.0f, stream));

  RmsNormParams norm{x.get(), w.get(), y.get(), t, hidden, 0, 0, 1e-6f, stream};
  AddRmsNormParams add{x.get(), r.get(), w.get(), y.get(), t, hidden, 0, 0, 0, 1e-6f, stream};
  SiluAndMulParams silu{x.get(), y.get(), t, inter, stream};
  RopeKvCacheParams rope;
  rope.kv = x.get(), rope.kv_ld = 576, rope.kv_norm_weight = w.get(), rope.cache = cache.get();
  rope.num_blocks = 4, rope.slot_mapping = slots.get(), rope.num_tokens = t,
  rope.kv_lora_rank = 512;
  rope.q = q.get(), rope.q_num_heads = 16, rope.q_token_stride = 16 * 192, rope.q_head_stride = 192;
  rope.q_rope_offset = 128, rope.positions = slots.get(),
  rope.rope = {freq.get(), 1.0f, 64, RopeLayout::kInterleaved};
  rope.stream = stream;
  MoeGateParams v2;
  v2.logits = logits.get(), v2.num_tokens = t, v2.num_experts = 64, v2.top_k = 6;
  v2.topk_ids = ids.get(), v2.topk_weights = wts.get(), v2.stream = stream;
  MoeGateParams v3 = v2;
  v3.num_experts = 256, v3.top_k = 8, v3.n_group = 8, v3.topk_group = 4,
  v3.scoring = GateScoring::kSigmoid;
  v3.select = GateSelect::kGroupTop2Sum, v3.renormalize = true, v3.routed_scaling_factor = 2.5f;
  GreedyLogprobsParams lp;
  lp.logits = logits.get(), lp.batch = t, lp.vocab = vocab, lp.top_k = 20;
  lp.next_ids = ids.get(), lp.topk_ids = ids.get() + t, lp.topk_logprobs = wts.get(),
  lp.stream = stream;
  GreedyLogprobsParams lp1 = lp;
  lp1.batch = 1;
  GreedyLogprobsParams g0 = lp;  // greedy alone, no alternatives (the common serving case)
  g0.top_k = 0, g0.topk_ids = nullptr, g0.topk_logprobs = nullptr;
  // The sampler at temperature 1 (it divides the logits in place: other
  // temperatures would flatten them from replay to replay).
  auto sample_rows = [&](int top_k, float top_p,
                         float min_p) -> absl::StatusOr<DeviceBuffer<SampleRow>> {
    std::vector<SampleRow> host(t);
    for (int i = 0; i < t; ++i) {
      host[i].temperature = 1.0f, host[i].top_k = top_k, host[i].top_p = top_p,
      host[i].min_p = min_p;
      host[i].draw = (i + 0.5) / t;
    }
    ASSIGN_OR_RETURN(auto d, DeviceBuffer<SampleRow>::Create(t));
    RETURN_IF_ERROR(d.CopyFrom(host));
    return d;
  };
  ASSIGN_OR_RETURN(auto s_plain, sample_rows(0, 1.0f, 0.0f));
  ASSIGN_OR_RETURN(auto s_topk, sample_rows(50, 1.0f, 0.0f));
  ASSIGN_OR_RETURN(auto s_topp, sample_rows(0, 0.9f, 0.0f));
  ASSIGN_OR_RETURN(auto s_all, sample_rows(50, 0.9f, 0.05f));
  auto sample = [&](const DeviceBuffer<SampleRow>& rows, int batch) {
    SampleParams sp;
    sp.logits = logits.get(), sp.batch = batch, sp.vocab = vocab, sp.rows = rows.get(),
    sp.ids = ids.get();
    sp.stream = stream;
    return RunSample(sp);
  };

  struct Row {
    const char* name;
    std::function<absl::Status()> fn;
  };
  const Row rows[] = {
      {"rmsnorm 128x2048", [&] { return RunRmsNorm(norm); }},
      {"add+rmsnorm 128x2048", [&] { return RunAddRmsNorm(add); }},
      {"silu_and_mul 128x10944", [&] { return RunSiluAndMul(silu); }},
      {"rope+kv cache write 128 tok", [&] { return RunRopeKvCacheWrite(rope); }},
      {"moe gate v2-lite 128x64 top6", [&] { return RunMoeGate(v2); }},
      {"moe gate v3 128x256 noaux_tc", [&] { return RunMoeGate(v3); }},
      {"greedy+top20 logprobs 128x102400", [&] { return RunGreedyLogprobs(lp); }},
      {"greedy+top20 logprobs 1x102400", [&] { return RunGreedyLogprobs(lp1); }},
      {"greedy 128x102400", [&] { return RunGreedyLogprobs(g0); }},
      {"sample T=1 128x102400", [&] { return sample(s_plain, t); }},
      {"sample top_k 50 128x102400", [&] { return sample(s_topk, t); }},
      {"sample top_p 0.9 128x102400", [&] { return sample(s_topp, t); }},
      {"sample k50 p0.9 min_p 128x102400", [&] { return sample(s_all, t); }},
      {"sample T=1 1x102400", [&] { return sample(s_plain, 1); }},
      {"sample top_p 0.9 1x102400", [&] { return sample(s_topp, 1); }},
  };
  std::printf("\nSmall ops (graph replay, GPU time per call)\n%-34s %10s\n", "op", "time_us");
  for (const Row& row : rows) {
    ASSIGN_OR_RETURN(double ms, MedianMs(
                                    stream, 3, 9, [&](int) { return row.fn(); }, kInner));
    std::printf("%-34s %10.2f\n", row.name, ms * 1e3);
  }
  return absl::OkStatus();
}

// Prefill attention of one prompt of T tokens (no cached prefix), causal: the
// expanded kernel (mla_prefill.h) on keys/values already expanded, and the
// absorbed form the decode kernel gives (each token a query row over its
// prefix in the paged cache; its FLOPs counted at 576 + 512 a pair). TFLOP/s
// over the causally visible pairs, against the bf16 GEMM rate measured now.
absl::Status BenchMlaPrefill(const Ceilings& ceil, const DeviceInfo& info, bool quick,
                             cudaStream_t stream) {
  constexpr int kQk = mla_prefill::kQkDim, kNope = mla_prefill::kNopeDim, kV = mla_prefill::kVDim;
  constexpr int kRow = mla::kHeadDim;
  std::printf(
      "\nMLA prefill attention, one causal prompt of T tokens (expanded: q·k %d, v %d a head, "
      "keys/values expanded beforehand; absorbed: the decode kernel, a query row a token)\n",
      kQk, kV);
  std::printf("%-18s %5s %6s %10s %9s %9s\n", "form", "heads", "T", "time_ms", "TFLOP/s", "%gemm");
  struct Case {
    bool expanded;
    int heads, tokens;
    MlaPrefillImpl impl = MlaPrefillImpl::kMmaSync;
  };
  std::vector<Case> cases;
  for (int heads : {16, 128}) {
    for (int t : {4096, 16384, 65536}) {
      if (quick && t == 65536 && heads == 128) continue;
      for (MlaPrefillImpl impl : {MlaPrefillImpl::kMmaSync, MlaPrefillImpl::kWgmma}) {
        cases.push_back({true, heads, t, impl});
      }
    }
  }
  for (int t : {4096, 16384}) cases.push_back({false, 16, t});
  cases.push_back({false, 128, 4096});
  for (const Case& c : cases) {
    const int heads = c.heads, t = c.tokens;
    double ms = 0.0, flops = 0.0;
    if (c.expanded) {
      ASSIGN_OR_RETURN(auto q, DeviceBuffer<bf16>::Create(size_t{1} * t * heads * kQk));
      ASSIGN_OR_RETURN(auto kn, DeviceBuffer<bf16>::Create(size_t{1} * t * heads * kNope));
      ASSIGN_OR_RETURN(auto v, DeviceBuffer<bf16>::Create(size_t{1} * t * heads * kV));
      ASSIGN_OR_RETURN(auto rows, DeviceBuffer<bf16>::Create(size_t{1} * t * kRow));
      ASSIGN_OR_RETURN(auto out, DeviceBuffer<bf16>::Create(size_t{1} * t * heads * kV));
      RETURN_IF_ERROR(FillUniform(q.get(), q.size(), 21, 1.0f, stream));
      RETURN_IF_ERROR(FillUniform(kn.get(), kn.size(), 22, 1.0f, stream));
      RETURN_IF_ERROR(FillUniform(v.get(), v.size(), 23, 1.0f, stream));
      RETURN_IF_ERROR(FillUniform(rows.get(), rows.size(), 24, 1.0f, stream));
      MlaPrefillParams p;
      p.q_nope = q.get(), p.q_pe = q.get() + kNope;
      p.q_nope_ld = p.q_pe_ld = static_cast<int64_t>(heads) * kQk;
      p.q_nope_head_stride = p.q_pe_head_stride = kQk;
      p.k_nope = kn.get(), p.v = v.get(), p.kv_ld = static_cast<int64_t>(heads) * kNope;
      p.kv_head_stride = kNope, p.k_pe = rows.get() + mla::kLatentDim, p.k_pe_ld = kRow;
      p.num_q = t, p.num_k = t, p.num_heads = heads, p.softmax_scale = 0.1352f;
      p.out = out.get(), p.out_ld = static_cast<int64_t>(heads) * kV, p.out_head_stride = kV;
      p.impl = c.impl, p.stream = stream;
      ASSIGN_OR_RETURN(ms,
                       MedianMs(stream, 1, quick ? 3 : 5, [&](int) { return RunMlaPrefill(p); }));
      flops = MlaPrefillFlops(t, t, heads, 0, 0);
    } else {
      const int blocks = t / kKvBlockSize;
      ASSIGN_OR_RETURN(auto cache,
                       DeviceBuffer<bf16>::Create(size_t{1} * blocks * kKvBlockSize * kRow));
      RETURN_IF_ERROR(FillUniform(cache.get(), cache.size(), 25, 1.0f, stream));
      std::vector<int32_t> table(static_cast<size_t>(t) * blocks), lens(t);
      for (int i = 0; i < t; ++i) {
        lens[i] = i + 1;
        std::iota(table.begin() + static_cast<size_t>(i) * blocks,
                  table.begin() + static_cast<size_t>(i + 1) * blocks, 0);
      }
      ASSIGN_OR_RETURN(auto dtable, DeviceBuffer<int32_t>::Create(table.size()));
      RETURN_IF_ERROR(dtable.CopyFrom(table));
      ASSIGN_OR_RETURN(auto dlens, DeviceBuffer<int32_t>::Create(lens.size()));
      RETURN_IF_ERROR(dlens.CopyFrom(lens));
      ASSIGN_OR_RETURN(auto q, DeviceBuffer<bf16>::Create(size_t{1} * t * heads * kRow));
      RETURN_IF_ERROR(FillUniform(q.get(), q.size(), 26, 1.0f, stream));
      ASSIGN_OR_RETURN(auto out,
                       DeviceBuffer<bf16>::Create(size_t{1} * t * heads * mla::kLatentDim));
      const MlaDecodePlan plan = PlanMlaDecode(t, heads, t, info.num_sms);
      ASSIGN_OR_RETURN(auto ws, DeviceBuffer<uint8_t>::Create(plan.workspace_bytes));
      MlaDecodeParams p;
      p.q = q.get(), p.kv_cache = cache.get(), p.block_table = dtable.get(),
      p.seq_lens = dlens.get();
      p.batch = t, p.num_heads = heads, p.num_blocks = blocks, p.max_blocks_per_seq = blocks;
      p.max_seq_len = t, p.softmax_scale = 0.1352f, p.out = out.get(), p.out_type = OutType::kBf16;
      p.num_splits = plan.num_splits, p.workspace = ws.get(),
      p.workspace_bytes = plan.workspace_bytes;
      p.stream = stream;
      ASSIGN_OR_RETURN(ms, MedianMs(stream, 1, 3, [&](int) { return RunMlaDecode(p); }));
      flops = 2.0 * (kRow + mla::kLatentDim) * heads * (static_cast<double>(t) * (t + 1) / 2);
    }
    const double tflops = flops / (ms * 1e-3) / 1e12;
    const char* form = !c.expanded                        ? "absorbed (decode)"
                       : c.impl == MlaPrefillImpl::kWgmma ? "expanded wgmma"
                                                          : "expanded mma.sync";
    std::printf("%-18s %5d %6d %10.3f %9.1f %8.1f%%\n", form, heads, t, ms, tflops,
                100.0 * tflops / ceil.gemm_tflops);
  }
  return absl::OkStatus();
}

absl::Status Main(bool quick, bool fp8, bool fp8_grouped, bool mla_table, bool prefill_table,
                  const MlaCase& only) {
  ASSIGN_OR_RETURN(int n, CudaDeviceCount());
  if (n == 0) return absl::UnavailableError("no CUDA device");
  ASSIGN_OR_RETURN(DeviceInfo info, CurrentDeviceInfo());
  cudaDeviceProp prop;
  RETURN_IF_CUDA_ERROR(cudaGetDeviceProperties(&prop, info.device));
  std::printf("device: %s, %d SMs, L2 %d MiB, cc %d.%d\n", prop.name, info.num_sms,
              info.l2_bytes >> 20, info.cc_major, info.cc_minor);
  ASSIGN_OR_RETURN(Stream stream, Stream::Create());
  ASSIGN_OR_RETURN(auto gemm, CublasGemm::Create());
  ASSIGN_OR_RETURN(Ceilings ceil, MeasureCeilings(*gemm, stream.get()));
  std::printf(
      "ceilings measured now: D2D copy %.0f GB/s (read + write), bf16 GEMM 8192^3 %.0f TFLOP/s\n",
      ceil.copy_gbps, ceil.gemm_tflops);
  if (fp8) {
    RETURN_IF_ERROR(BenchFp8(*gemm, ceil, quick, stream.get()));
    return stream.Synchronize();
  }
  if (fp8_grouped) return BenchFp8Grouped(*gemm, stream.get());
  if (prefill_table) {
    RETURN_IF_ERROR(BenchMlaPrefill(ceil, info, quick, stream.get()));
    return stream.Synchronize();
  }
  RETURN_IF_ERROR(BenchMla(ceil, info, quick, stream.get(), only));
  if (only.heads > 0 || mla_table) return stream.Synchronize();
  RETURN_IF_ERROR(BenchGemm(*gemm, ceil, info, quick, stream.get()));
  RETURN_IF_ERROR(BenchSmallOps(stream.get()));
  return stream.Synchronize();
}

}  // namespace
}  // namespace moesh::cuda

int main(int argc, char** argv) {
  const bool wide_table = argc > 1 && std::strcmp(argv[1], "--mla-wide-table") == 0;
  const bool mla_table = wide_table || (argc > 1 && std::strcmp(argv[1], "--mla-table") == 0);
  const bool quick = mla_table || (argc > 1 && std::strcmp(argv[1], "--quick") == 0);
  const bool fp8 = argc > 1 && std::strcmp(argv[1], "--fp8") == 0;
  const bool fp8_grouped = argc > 1 && std::strcmp(argv[1], "--fp8-grouped") == 0;
  const bool prefill_table = argc > 1 && std::strcmp(argv[1], "--mla-prefill-table") == 0;
  moesh::cuda::MlaCase only;
  only.wide_only = wide_table;
  const bool mla_fp8 = argc > 2 && std::strcmp(argv[1], "--mla-fp8") == 0;
  if (mla_fp8) only.kv = moesh::cuda::KvCacheDtype::kFp8;
  if (argc > 2 && (std::strcmp(argv[1], "--mla") == 0 || mla_fp8) &&
      (std::sscanf(argv[2], "%d,%d,%d", &only.heads, &only.batch, &only.ctx) != 3 ||
       only.heads < 1 || only.batch < 1 || only.ctx < 64 || only.ctx % 64 != 0 ||
       only.batch * (only.ctx / 64) > 256 * 16384 / 64)) {
    std::fprintf(stderr,
                 "kernel_bench: --mla[-fp8] HEADS,BATCH,CONTEXT (context a multiple of 64, batch x "
                 "context <= 256 x 16384)\n");
    return 2;
  }
  const absl::Status st =
      moesh::cuda::Main(quick, fp8, fp8_grouped, mla_table, prefill_table, only);
  if (!st.ok()) {
    std::fprintf(stderr, "kernel_bench: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
