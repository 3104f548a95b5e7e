// kernel_bench's FP8 tables (kernel_bench_fp8.h).
#include "tools/bench/kernel_bench_fp8.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/cpu/fp8.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/fill.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/routing.h"

namespace moesh::cuda {

// DeepSeek-V3's dense linears (hidden 7168, q_lora 1536, 128 heads, dense
// intermediate 18432, one shared expert of 2048) as the FP8 checkpoint has
// them, against the bf16 GEMM of the same shape measured now.
absl::Status BenchFp8(CublasGemm& gemm, const Ceilings& ceil, bool quick, cudaStream_t stream) {
  struct Shape {
    const char* name;
    int n, k;
  };
  const Shape shapes[] = {
      {"q_a + kv_a", 2112, 7168},
      {"q_b", 24576, 1536},
      {"o_proj", 7168, 16384},
      {"dense gate_up", 36864, 7168},
      {"dense down", 7168, 18432},
      {"shared gate_up", 4096, 7168},
      {"shared down", 7168, 2048},
      // DeepSeek-V2-Lite's attention projections and shared experts (k 2048: 16
      // blocks of 128; the shared down's 2816).
      {"v2-lite q_proj", 3072, 2048},
      {"v2-lite kv_a", 576, 2048},
      {"v2-lite o_proj", 2048, 2048},
      {"v2-lite shared gate_up", 5632, 2048},
      {"v2-lite shared down", 2048, 2816},
  };
  const int max_m = quick ? 128 : 2048;
  const int ms_list[] = {1, 8, 32, 128, 2048};
  // The FP8 GEMM's rate on a large square problem: its ceiling in this run.
  double fp8_tflops = 0;
  {
    const int n = 8192;
    ASSIGN_OR_RETURN(auto a, DeviceBuffer<uint8_t>::Create(size_t{1} * n * n));
    ASSIGN_OR_RETURN(auto b, DeviceBuffer<uint8_t>::Create(size_t{1} * n * n));
    ASSIGN_OR_RETURN(auto sa, DeviceBuffer<float>::Create(size_t{1} * n * cpu::Fp8Blocks(n)));
    ASSIGN_OR_RETURN(
        auto sb, DeviceBuffer<float>::Create(size_t{1} * cpu::Fp8Blocks(n) * Fp8ScaleStride(n)));
    ASSIGN_OR_RETURN(auto y, DeviceBuffer<bf16>::Create(size_t{1} * n * n));
    RETURN_IF_CUDA_ERROR(cudaMemsetAsync(a.get(), 0x30, a.bytes(), stream));
    RETURN_IF_CUDA_ERROR(cudaMemsetAsync(b.get(), 0x30, b.bytes(), stream));
    RETURN_IF_ERROR(FillUniform(sa.get(), sa.size(), 4, 1.0f, stream));
    RETURN_IF_ERROR(FillUniform(sb.get(), sb.size(), 5, 1.0f, stream));
    Fp8GemmParams p;
    p.x = a.get(), p.x_scale = sa.get(), p.w = b.get(), p.w_scale = sb.get(), p.y = y.get();
    p.m = n, p.n = n, p.k = n, p.stream = stream;
    ASSIGN_OR_RETURN(double ms, EventMedianMs(stream, 3, 10, [&](int) { return gemm.RunFp8(p); }));
    fp8_tflops = 2.0 * n * n * n / (ms * 1e-3) / 1e12;
  }
  std::printf(
      "\nFP8 block-scaled linears at DeepSeek-V3 shapes: quantize x (1x128) + cuBLASLt FP8 GEMM "
      "(w 128x128 scales), bf16 out;\nbf16 GEMM of the same shape beside it. FP8 GEMM 8192^3: "
      "%.0f TFLOP/s (bf16: %.0f). floor: FP8 bytes / copy BW or FLOPs / FP8 rate.\n"
      "gemv_us: quantize + RunFp8Gemv (m <= %d), in place of cuBLASLt's GEMM; fused_us: "
      "RunFp8Gemv quantizing x itself (x_bf16; the model's choice up to n %d).\n",
      fp8_tflops, ceil.gemm_tflops, kFp8GemvMaxRows, kFp8GemvQuantizeMaxN);
  std::printf("%-16s %6s %6s %6s %9s %9s %9s %9s %9s %8s %8s %9s %8s %9s\n", "op", "m", "n", "k",
              "bf16_us", "quant_us", "fp8_us", "total_us", "floor_us", "speedup", "floor/t",
              "gemv_us", "floor/g", "fused_us");
  for (const Shape& s : shapes) {
    const size_t w_elems = size_t{1} * s.n * s.k;
    ASSIGN_OR_RETURN(auto w16, DeviceBuffer<bf16>::Create(w_elems));
    ASSIGN_OR_RETURN(auto w8, DeviceBuffer<uint8_t>::Create(w_elems));
    ASSIGN_OR_RETURN(auto ws, DeviceBuffer<float>::Create(size_t{1} * cpu::Fp8Blocks(s.n) *
                                                          Fp8ScaleStride(s.k)));
    ASSIGN_OR_RETURN(auto x, DeviceBuffer<bf16>::Create(size_t{1} * max_m * s.k));
    ASSIGN_OR_RETURN(auto xq, DeviceBuffer<uint8_t>::Create(size_t{1} * max_m * s.k));
    ASSIGN_OR_RETURN(auto xs, DeviceBuffer<float>::Create(size_t{1} * max_m * cpu::Fp8Blocks(s.k)));
    ASSIGN_OR_RETURN(auto y, DeviceBuffer<bf16>::Create(size_t{1} * max_m * s.n));
    RETURN_IF_ERROR(FillUniform(w16.get(), w16.size(), 21, 0.05f, stream));
    RETURN_IF_CUDA_ERROR(cudaMemsetAsync(w8.get(), 0x30, w8.bytes(), stream));
    RETURN_IF_ERROR(FillUniform(ws.get(), ws.size(), 23, 1e-3f, stream));
    RETURN_IF_ERROR(FillUniform(x.get(), x.size(), 22, 1.0f, stream));
    for (int m : ms_list) {
      if (m > max_m) continue;
      GemmParams bp;
      bp.x = x.get(), bp.w = w16.get(), bp.y = y.get(), bp.m = m, bp.n = s.n, bp.k = s.k,
      bp.stream = stream;
      QuantizeFp8Params qp;
      qp.x = x.get(), qp.q = xq.get(), qp.scale = xs.get(), qp.m = m, qp.k = s.k,
      qp.stream = stream;
      Fp8GemmParams fp;
      fp.x = xq.get(), fp.x_scale = xs.get(), fp.w = w8.get(), fp.w_scale = ws.get(),
      fp.y = y.get(), fp.m = m, fp.n = s.n, fp.k = s.k, fp.stream = stream;
      const int reps = quick ? 5 : 11;
      ASSIGN_OR_RETURN(double bf16_ms,
                       MedianMs(
                           stream, 3, reps, [&](int) { return gemm.Run(bp); }, kInner));
      ASSIGN_OR_RETURN(double q_ms,
                       MedianMs(
                           stream, 3, reps, [&](int) { return RunQuantizeFp8(qp); }, kInner));
      ASSIGN_OR_RETURN(double f_ms,
                       MedianMs(
                           stream, 3, reps, [&](int) { return gemm.RunFp8(fp); }, kInner));
      ASSIGN_OR_RETURN(double t_ms, MedianMs(
                                        stream, 3, reps,
                                        [&](int) {
                                          RETURN_IF_ERROR(RunQuantizeFp8(qp));
                                          return gemm.RunFp8(fp);
                                        },
                                        kInner));
      const double flops = 2.0 * m * s.n * s.k;
      const double bytes = double(w_elems) + 2.0 * m * s.k + 2.0 * m * s.n;
      const double floor =
          std::max(bytes / (ceil.copy_gbps * 1e9), flops / (fp8_tflops * 1e12)) * 1e6;
      double g_ms = 0.0, fused_ms = 0.0;
      if (m <= kFp8GemvMaxRows) {
        ASSIGN_OR_RETURN(g_ms, MedianMs(
                                   stream, 3, reps,
                                   [&](int) {
                                     RETURN_IF_ERROR(RunQuantizeFp8(qp));
                                     return RunFp8Gemv(fp);
                                   },
                                   kInner));
        Fp8GemmParams fused = fp;
        fused.x = nullptr, fused.x_scale = nullptr, fused.x_bf16 = x.get(), fused.ldx = s.k;
        ASSIGN_OR_RETURN(fused_ms,
                         MedianMs(
                             stream, 3, reps, [&](int) { return RunFp8Gemv(fused); }, kInner));
      }
      std::printf("%-16s %6d %6d %6d %9.1f %9.1f %9.1f %9.1f %9.1f %8.2f %8.2f", s.name, m, s.n,
                  s.k, bf16_ms * 1e3, q_ms * 1e3, f_ms * 1e3, t_ms * 1e3, floor, bf16_ms / t_ms,
                  floor / (t_ms * 1e3));
      if (g_ms > 0.0) {
        std::printf(" %9.1f %8.2f %9.1f\n", g_ms * 1e3, floor / (g_ms * 1e3), fused_ms * 1e3);
      } else {
        std::printf(" %9s %8s %9s\n", "-", "-", "-");
      }
    }
  }
  return absl::OkStatus();
}

// The routed experts' FP8 grouped GEMM at DeepSeek-V3's prefill shapes
// (16384 tokens x top-8 of 256 experts, uniform random routing; gate_up n
// 4096 k 7168, down n 7168 k 2048): the wgmma kernel and its mma.sync
// baseline against cuBLASLt's block-scaled FP8 GEMM over the same rows as
// one dense matrix, the activations' quantization timed apart.
absl::Status BenchFp8Grouped(CublasGemm& gemm, cudaStream_t stream) {
  constexpr int kTokens = 16384, kTopK = 8, kExperts = 256, kTileM = 64;
  constexpr int kRowsAll = kTokens * kTopK;
  struct Shape {
    const char* name;
    int n, k;
    OutType out;
  };
  const Shape shapes[] = {{"gate_up", 4096, 7168, OutType::kBf16},
                          {"down", 7168, 2048, OutType::kBf16},
                          {"down, fp32 out", 7168, 2048, OutType::kFloat32}};
  std::mt19937 rng(7);
  const std::vector<int32_t> ids = UniformTopkIds(kTokens, kTopK, kExperts, rng);
  ASSIGN_OR_RETURN(auto d_ids, DeviceBuffer<int32_t>::Create(kRowsAll));
  RETURN_IF_ERROR(d_ids.CopyFrom(ids));
  ASSIGN_OR_RETURN(auto off, DeviceBuffer<int32_t>::Create(kExperts + 1));
  ASSIGN_OR_RETURN(auto tiles, DeviceBuffer<int32_t>::Create(kExperts + 1));
  ASSIGN_OR_RETURN(auto row_token, DeviceBuffer<int32_t>::Create(kRowsAll));
  ASSIGN_OR_RETURN(auto pair_row, DeviceBuffer<int32_t>::Create(kRowsAll));
  MoePermuteParams pp;
  pp.topk_ids = d_ids.get(), pp.num_tokens = kTokens, pp.top_k = kTopK, pp.num_experts = kExperts;
  pp.tile_m = kTileM, pp.expert_offsets = off.get(), pp.tile_offsets = tiles.get();
  pp.row_token = row_token.get(), pp.pair_row = pair_row.get(), pp.stream = stream;
  RETURN_IF_ERROR(RunMoePermute(pp));
  const int rows = Fp8Rows(kRowsAll);
  std::printf(
      "\nFP8 grouped expert GEMM at DeepSeek-V3 prefill shapes: %d tokens x top-%d of %d experts "
      "(uniform random), FP8 activations (1x128 scales) x FP8 weights (128x128); dense = "
      "cuBLASLt's block-scaled FP8 GEMM over the same %d rows as one matrix\n",
      kTokens, kTopK, kExperts, kRowsAll);
  std::printf("%-15s %5s %5s %10s %10s %10s %9s %9s %9s %8s %8s\n", "op", "n", "k", "quant_us",
              "wgmma_us", "mma_us", "dense_us", "wgmma_TF", "dense_TF", "mma_TF", "w/dense");
  for (const Shape& s : shapes) {
    // One expert's weights quantized from random bf16, copied to all (the
    // same bytes in every expert: the speed does not depend on which).
    const size_t w_elems = size_t{1} * s.n * s.k;
    const size_t w_scales = size_t{1} * cpu::Fp8Blocks(s.n) * Fp8ScaleStride(s.k);
    ASSIGN_OR_RETURN(auto w16, DeviceBuffer<bf16>::Create(w_elems));
    ASSIGN_OR_RETURN(auto w8, DeviceBuffer<uint8_t>::Create(w_elems * kExperts));
    ASSIGN_OR_RETURN(auto ws, DeviceBuffer<float>::Create(w_scales * kExperts));
    RETURN_IF_ERROR(FillUniform(w16.get(), w16.size(), 31, 0.05f, stream));
    QuantizeFp8BlocksParams qb;
    qb.w_bf16 = w16.get(), qb.q = w8.get(), qb.scale = ws.get(), qb.n = s.n, qb.k = s.k,
    qb.stream = stream;
    RETURN_IF_ERROR(RunQuantizeFp8Blocks(qb));
    for (int e = 1; e < kExperts; ++e) {
      RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(w8.get() + e * w_elems, w8.get(), w_elems,
                                           cudaMemcpyDeviceToDevice, stream));
      RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(ws.get() + e * w_scales, ws.get(), w_scales * 4,
                                           cudaMemcpyDeviceToDevice, stream));
    }
    ASSIGN_OR_RETURN(auto x, DeviceBuffer<bf16>::Create(size_t{1} * kTokens * s.k));
    RETURN_IF_ERROR(FillUniform(x.get(), x.size(), 32, 1.0f, stream));
    ASSIGN_OR_RETURN(auto xq, DeviceBuffer<uint8_t>::Create(size_t{1} * rows * s.k));
    ASSIGN_OR_RETURN(auto xs, DeviceBuffer<float>::Create(size_t{1} * rows * cpu::Fp8Blocks(s.k)));
    const size_t out_bytes = s.out == OutType::kFloat32 ? 4 : 2;
    ASSIGN_OR_RETURN(auto y, DeviceBuffer<uint8_t>::Create(size_t{1} * rows * s.n * out_bytes));
    QuantizeFp8Params qp;
    qp.x = x.get(), qp.index = row_token.get(), qp.count = off.get() + kExperts, qp.q = xq.get();
    qp.scale = xs.get(), qp.m = kRowsAll, qp.k = s.k, qp.stream = stream;
    GroupedGemmParams gp;
    gp.x_fp8 = xq.get(), gp.ldx = s.k, gp.x_scale = xs.get(), gp.x_scale_ld = rows;
    gp.w_fp8 = w8.get(), gp.w_scale = ws.get(), gp.num_experts = kExperts, gp.n = s.n, gp.k = s.k;
    gp.expert_offsets = off.get(), gp.tile_offsets = tiles.get(), gp.tile_m = kTileM;
    gp.max_tiles = GroupedGemmMaxTiles(kRowsAll, kExperts, kTileM), gp.y = y.get();
    gp.out_type = s.out, gp.stream = stream;
    Fp8GemmParams dp;
    dp.x = xq.get(), dp.x_scale = xs.get(), dp.w = w8.get(), dp.w_scale = ws.get(), dp.y = y.get(),
    dp.out_type = s.out, dp.m = kRowsAll, dp.n = s.n, dp.k = s.k, dp.stream = stream;
    ASSIGN_OR_RETURN(double q_ms,
                     EventMedianMs(stream, 2, 5, [&](int) { return RunQuantizeFp8(qp); }));
    gp.x_fp8_mma_sync = false;
    ASSIGN_OR_RETURN(double g_ms,
                     EventMedianMs(stream, 2, 7, [&](int) { return RunGroupedGemm(gp); }));
    gp.x_fp8_mma_sync = true;
    ASSIGN_OR_RETURN(double m_ms,
                     EventMedianMs(stream, 1, 3, [&](int) { return RunGroupedGemm(gp); }));
    ASSIGN_OR_RETURN(double d_ms,
                     EventMedianMs(stream, 2, 7, [&](int) { return gemm.RunFp8(dp); }));
    const double tf = 2.0 * kRowsAll * s.n * s.k / 1e12;
    std::printf("%-15s %5d %5d %10.1f %10.1f %10.1f %9.1f %9.0f %9.0f %9.0f %8.2f\n", s.name, s.n,
                s.k, q_ms * 1e3, g_ms * 1e3, m_ms * 1e3, d_ms * 1e3, tf / (g_ms * 1e-3),
                tf / (d_ms * 1e-3), tf / (m_ms * 1e-3), d_ms / g_ms);
  }
  return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

}  // namespace moesh::cuda
