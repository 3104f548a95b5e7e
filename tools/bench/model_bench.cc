// cuda_model_bench: the CUDA model's decode (and prefill) throughput, next to
// the hardware floor measured in the same run. `moesh bench --device cuda`
// runs this binary (the moesh command itself does not link CUDA).
//
// Decode: `batch` sequences each holding `context` tokens of (random) cache
// rows take one token per step; a step is Step() as a server calls it (inputs
// copied in, graph replayed, greedy tokens copied out, synchronised), timed
// on the host, median of --steps after --warmup. Its floor is
//   (weight bytes the step reads + KV cache bytes it reads) / copy bandwidth,
// with the weights counted as every non-expert tensor once, each routed
// expert that received a token once (counted on the device), and the
// embedding rows gathered; the copy bandwidth is a 2 GiB device-to-device
// cudaMemcpy (bytes read + written) measured first.
//
// Usage: cuda_model_bench [--device cuda] [--load-format dummy|auto] [--quantization fp8|mxfp4]
//          [--shape v2-lite | --model DIR] [--batch 1,32,128,256] [--context 2048]
//          [--steps 20] [--warmup 3] [--gpu-memory-utilization 0.9]
//          [--prefill-seqs 8] [--prefill-len 2048] [--no-graphs] [--seed S] [--grouped-gemm-only]
//          [--profile-step] [--mla-kernel auto|heads16|generic] [--kv-cache-dtype auto|fp8]
//          [--mla-prefill auto|absorbed|expanded] [--mla-prefill-impl mma|wgmma]
//          [--sparse-mla gather|direct] [--indexer cuda-cores|tensor-cores]
//          [--fp8-gemv off|on] [--bf16-gemv off|on] [--fp8-expert-act off|on] [--pdl on|off]
//          [--shared-stream off|on]
// --mla-kernel heads16 runs the 16-head MLA kernel at any head count (the
// baseline of the 64-head one at V2/V3's 128 heads), generic the plain one.
// --kv-cache-dtype fp8: the paged cache in FlashMLA's FP8 rows (the floor
// counts their bytes). --mla-prefill: how the prefill table's prompts attend
// (CudaModelOptions::mla_prefill, default auto: a prompt of >= 64 tokens
// expanded); --mla-prefill-impl: the expanded form's kernel (wgmma, the
// default, or mma.sync). --sparse-mla (DeepSeek-V3.2): each token's selection
// read straight from the pool (direct, the default) or gathered into a dense
// copy (CudaModelOptions::sparse_mla_gather); --indexer: the lightning
// indexer's scores on the CUDA cores or the tensor cores (the default;
// CudaModelOptions::indexer_tensor_cores); --fp8-gemv off: FP8 linears at up
// to 8 rows through cuBLASLt instead of RunFp8Gemv (CudaModelOptions::fp8_gemv,
// on); --bf16-gemv off: MLA's per-head W_UK / W_UV at decode sizes through
// cuBLASLt's batched GEMM instead of RunBf16Gemv (CudaModelOptions::bf16_gemv,
// on); --fp8-expert-act off: FP8 routed experts on bf16 activations in prefill
// tiles too (CudaModelOptions::fp8_expert_act, on); --shared-stream off: the
// shared experts' MLP on the model's stream after the routed experts instead
// of on a second stream beside them at decode sizes
// (CudaModelOptions::shared_expert_stream, on). Each switch's default is
// CudaModelOptions'. --pdl off: every kernel launched plainly, none
// programmatically (kernels/cuda/pdl.h; on by default).
#include <cuda_profiler_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/cuda_backend/cuda_model.h"
#include "common/cuda_backend/sample_rows.h"
#include "common/model/random_checkpoint.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cuda/config.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/expert_mlp.h"
#include "kernels/cuda/fill.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/mxfp4.h"
#include "kernels/cuda/pdl.h"
#include "tools/bench/bench_util.h"

namespace moesh::cuda {
namespace {

struct Flags {
  std::string load_format = "dummy";
  std::string shape = "v2-lite";
  std::string model_dir;
  std::string quantization;             // "fp8": the dense linears in block-scaled FP8
  std::string mla_kernel = "auto";      // auto | heads16 | generic (CudaModelOptions::mla_kernel)
  std::string kv_cache_dtype = "auto";  // auto | fp8 (CudaModelOptions::fp8_kv_cache)
  // The switches below default to CudaModelOptions' defaults.
  std::string mla_prefill = "auto";        // auto | absorbed | expanded (mla_prefill)
  std::string mla_prefill_impl = "wgmma";  // mma | wgmma (mla_prefill_impl)
  // gather | direct (sparse_mla_gather); empty: direct where it applies (V3.2)
  std::string sparse_mla;
  std::string indexer = "tensor-cores";  // cuda-cores | tensor-cores (indexer_tensor_cores)
  std::string fp8_gemv = "on";           // off | on (fp8_gemv)
  std::string bf16_gemv = "on";          // off | on (bf16_gemv)
  std::string fp8_expert_act = "on";     // off | on (fp8_expert_act)
  std::string pdl = "on";                // on | off (SetProgrammaticLaunch)
  std::string shared_stream = "on";      // off | on (shared_expert_stream)
  std::vector<int> batches = {1, 32, 128, 256};
  int context = 2048, steps = 20, warmup = 3;
  double gpu_memory_utilization = 0.9;
  int prefill_seqs = 8, prefill_len = 2048;
  bool graphs = true;
  bool grouped_gemm_only = false;  // only the grouped GEMM table (for profilers)
  bool profile_step = false;  // one decode step at the first batch between cudaProfilerStart/Stop
  uint64_t seed = 1;
};

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  std::map<std::string, std::string> kv;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--no-graphs") {
      f.graphs = false;
      continue;
    }
    if (a == "--grouped-gemm-only") {
      f.grouped_gemm_only = true;
      continue;
    }
    if (a == "--profile-step") {
      f.profile_step = true;
      continue;
    }
    if (a.rfind("--", 0) != 0) return absl::InvalidArgumentError("unexpected argument " + a);
    const size_t eq = a.find('=');
    if (eq != std::string::npos) {
      kv[a.substr(2, eq - 2)] = a.substr(eq + 1);
    } else if (i + 1 < argc) {
      kv[a.substr(2)] = argv[++i];
    } else {
      return absl::InvalidArgumentError("flag " + a + " needs a value");
    }
  }
  auto take_int = [&](const char* name, int* out) -> absl::Status {
    auto it = kv.find(name);
    if (it == kv.end()) return absl::OkStatus();
    if (!absl::SimpleAtoi(it->second, out))
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": not an integer"));
    kv.erase(it);
    return absl::OkStatus();
  };
  for (auto [name, out] :
       std::vector<std::pair<const char*, int*>>{{"context", &f.context},
                                                 {"steps", &f.steps},
                                                 {"warmup", &f.warmup},
                                                 {"prefill-seqs", &f.prefill_seqs},
                                                 {"prefill-len", &f.prefill_len}}) {
    RETURN_IF_ERROR(take_int(name, out));
  }
  if (auto it = kv.find("batch"); it != kv.end()) {
    f.batches.clear();
    for (absl::string_view s : absl::StrSplit(it->second, ',')) {
      int b = 0;
      if (!absl::SimpleAtoi(s, &b) || b < 1)
        return absl::InvalidArgumentError("--batch: positive integers, comma-separated");
      f.batches.push_back(b);
    }
    kv.erase(it);
  }
  if (auto it = kv.find("gpu-memory-utilization"); it != kv.end()) {
    if (!absl::SimpleAtod(it->second, &f.gpu_memory_utilization)) {
      return absl::InvalidArgumentError("--gpu-memory-utilization: not a number");
    }
    kv.erase(it);
  }
  if (auto it = kv.find("seed"); it != kv.end()) {
    if (!absl::SimpleAtoi(it->second, &f.seed))
      return absl::InvalidArgumentError("--seed: not an integer");
    kv.erase(it);
  }
  if (auto it = kv.find("device"); it != kv.end()) {
    if (it->second != "cuda") return absl::InvalidArgumentError("--device: only cuda");
    kv.erase(it);
  }
  for (const char* name :
       {"load-format", "shape", "model", "quantization", "mla-kernel", "kv-cache-dtype",
        "mla-prefill", "mla-prefill-impl", "sparse-mla", "indexer", "fp8-gemv", "bf16-gemv",
        "fp8-expert-act", "pdl", "shared-stream"}) {
    auto it = kv.find(name);
    if (it == kv.end()) continue;
    const std::string n = name;
    std::string& dst = n == "load-format"        ? f.load_format
                       : n == "shape"            ? f.shape
                       : n == "model"            ? f.model_dir
                       : n == "quantization"     ? f.quantization
                       : n == "mla-kernel"       ? f.mla_kernel
                       : n == "mla-prefill"      ? f.mla_prefill
                       : n == "mla-prefill-impl" ? f.mla_prefill_impl
                       : n == "sparse-mla"       ? f.sparse_mla
                       : n == "indexer"          ? f.indexer
                       : n == "fp8-gemv"         ? f.fp8_gemv
                       : n == "bf16-gemv"        ? f.bf16_gemv
                       : n == "fp8-expert-act"   ? f.fp8_expert_act
                       : n == "pdl"              ? f.pdl
                       : n == "shared-stream"    ? f.shared_stream
                                                 : f.kv_cache_dtype;
    dst = it->second;
    kv.erase(it);
  }
  if (!kv.empty()) return absl::InvalidArgumentError("unknown flag --" + kv.begin()->first);
  if (!f.quantization.empty() && f.quantization != "fp8" && f.quantization != "mxfp4")
    return absl::InvalidArgumentError("--quantization: fp8, mxfp4 (DeepSeek-V4) or empty");
  if (f.mla_kernel != "auto" && f.mla_kernel != "heads16" && f.mla_kernel != "generic")
    return absl::InvalidArgumentError("--mla-kernel: auto, heads16 or generic");
  if (f.mla_prefill != "auto" && f.mla_prefill != "absorbed" && f.mla_prefill != "expanded")
    return absl::InvalidArgumentError("--mla-prefill: auto, absorbed or expanded");
  if (f.mla_prefill_impl != "mma" && f.mla_prefill_impl != "wgmma")
    return absl::InvalidArgumentError("--mla-prefill-impl: mma or wgmma");
  if (!f.sparse_mla.empty() && f.sparse_mla != "gather" && f.sparse_mla != "direct")
    return absl::InvalidArgumentError("--sparse-mla: gather or direct");
  if (f.indexer != "cuda-cores" && f.indexer != "tensor-cores")
    return absl::InvalidArgumentError("--indexer: cuda-cores or tensor-cores");
  if (f.fp8_gemv != "off" && f.fp8_gemv != "on")
    return absl::InvalidArgumentError("--fp8-gemv: off or on");
  if (f.bf16_gemv != "off" && f.bf16_gemv != "on")
    return absl::InvalidArgumentError("--bf16-gemv: off or on");
  if (f.fp8_expert_act != "off" && f.fp8_expert_act != "on")
    return absl::InvalidArgumentError("--fp8-expert-act: off or on");
  if (f.pdl != "off" && f.pdl != "on") return absl::InvalidArgumentError("--pdl: on or off");
  if (f.shared_stream != "off" && f.shared_stream != "on")
    return absl::InvalidArgumentError("--shared-stream: off or on");
  if (f.kv_cache_dtype != "auto" && f.kv_cache_dtype != "fp8")
    return absl::InvalidArgumentError("--kv-cache-dtype: auto or fp8");
  if (f.load_format != "dummy" && f.load_format != "auto") {
    return absl::InvalidArgumentError("--load-format: dummy or auto");
  }
  if (f.load_format == "auto" && f.model_dir.empty()) {
    return absl::InvalidArgumentError("--load-format auto needs --model DIR");
  }
  if (f.context < 0 || f.steps < 1 || f.warmup < 1 || f.prefill_seqs < 0 || f.prefill_len < 1) {
    return absl::InvalidArgumentError("need --context >= 0, --steps >= 1, --warmup >= 1");
  }
  return f;
}

// DeepSeek-V2-Lite's shapes (random_checkpoint's "real" preset).
absl::StatusOr<ModelConfig> ShapeConfig(const std::string& shape) {
  if (shape != "v2-lite") {
    return absl::InvalidArgumentError(
        "--shape: v2-lite (the larger DeepSeek models do not fit one GPU in bf16)");
  }
  return PresetConfig("v2-lite", "real");
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// FLOPs of the GEMMs one token's forward pass runs (no lm_head) and of its
// attention at `context` visible tokens per layer (absorbed form).
double TokenFlops(const ModelConfig& c, double context) {
  if (c.layers() == LayerArch::kV4) {  // the stacked first projection, wq_b, index q, wo_a / wo_b,
                                       // mHC, experts; attention
    const double h = c.hidden_size, heads = c.num_attention_heads, d = c.v4.head_dim,
                 qr = c.q_lora_rank;
    const double ni = c.indexer.n_heads, di = c.indexer.head_dim, hc = c.v4.hc_mult;
    double gemm = 0, attention = 0;
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      const bool csa = c.v4.layer_types[l] == V4AttentionType::kCompressedSparse;
      const double rate = c.v4.CompressRate(l), entries = rate > 0 ? context / rate : 0;
      gemm += h * (qr + c.V4RowWidth(l) + (csa ? ni : 0)) + qr * heads * d +
              (csa ? qr * ni * di : 0) + heads * d * c.v4.o_lora_rank +
              c.v4.o_groups * c.v4.o_lora_rank * h + 2 * (2 + hc) * hc * hc * h +
              h * c.n_routed_experts +
              3.0 * h * c.moe_intermediate_size * (c.num_experts_per_tok + c.n_shared_experts);
      const double keys = std::min<double>(c.v4.sliding_window, context) +
                          (csa ? std::min<double>(c.indexer.topk, entries) : entries);
      attention += 2 * heads * keys * d + (csa ? ni * entries * di : 0);
    }
    return 2.0 * (gemm + attention / 2);
  }
  const double h = c.hidden_size, heads = c.num_attention_heads, qk = c.qk_head_dim();
  const double rank = c.kv_lora_rank, rope = c.qk_rope_head_dim, nope = c.qk_nope_head_dim,
               v = c.v_head_dim;
  const double q_width = c.q_lora_rank > 0 ? c.q_lora_rank : heads * qk;
  const double per_layer_attn = h * (q_width + rank + rope) +
                                (c.q_lora_rank > 0 ? c.q_lora_rank * heads * qk : 0) +
                                heads * nope * rank + heads * v * rank + h * heads * v;
  double gemm = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    gemm += per_layer_attn;
    gemm += c.IsMoeLayer(l)
                ? h * c.n_routed_experts + 3.0 * h * c.moe_intermediate_size *
                                               (c.num_experts_per_tok + c.n_shared_experts)
                : 3.0 * h * c.intermediate_size;
  }
  const double attention = c.num_hidden_layers * heads * context * (rank + rope + rank);
  return 2.0 * (gemm + attention);
}

// Bytes of KV state one sequence's decode step at `context` tokens must read:
// the latent rows (MLA, bf16 or FP8; V3.2: the selected ones and every index key), or for V4 the
// window's rows, the compressed entries it attends to and (CSA) the index keys its indexer scores,
// bf16. (Our V4 pools the entries from the cache rows each step: it reads more.)
double DecodeKvBytes(const ModelConfig& c, double context, bool fp8_rows) {
  // A row's latent and rope part: FlashMLA's FP8 bytes, or bf16.
  const double row = fp8_rows ? cpu::Fp8KvRowLayout{c.kv_lora_rank, c.qk_rope_head_dim}.bytes()
                              : 2.0 * (c.kv_lora_rank + c.qk_rope_head_dim);
  if (c.has_indexer()) {  // the selected rows, and every row's (bf16) index key
    return (std::min<double>(context, c.indexer.topk) * row + context * c.indexer.head_dim * 2.0) *
           c.num_hidden_layers;
  }
  if (fp8_rows) return context * row * c.num_hidden_layers;  // MLA (CudaModel refuses V4's)
  if (c.layers() != LayerArch::kV4)
    return context * (c.kv_lora_rank + c.qk_rope_head_dim) * 2.0 * c.num_hidden_layers;
  double values = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const double rate = c.v4.CompressRate(l), entries = rate > 0 ? std::floor(context / rate) : 0;
    const bool csa = c.v4.layer_types[l] == V4AttentionType::kCompressedSparse;
    values += std::min<double>(c.v4.sliding_window, context) * c.v4.head_dim +
              (csa ? std::min<double>(c.indexer.topk, entries) * c.v4.head_dim +
                         entries * c.indexer.head_dim
                   : entries * c.v4.head_dim);
  }
  return values * 2.0;
}

// The grouped expert GEMM alone (gate_up of one MoE layer: n = 2 x moe_intermediate,
// k = hidden), uniform random routing, against one dense cuBLAS GEMM of the same FLOPs.
absl::Status BenchGroupedGemm(const ModelConfig& c, std::mt19937& rng) {
  if (c.n_routed_experts == 0) return absl::OkStatus();
  {
    std::printf(
        "\nexpert grouped GEMM alone (gate_up, n %d, k %d, %d experts), vs cuBLAS on one dense "
        "GEMM of "
        "the same rows\n",
        2 * c.moe_intermediate_size, c.hidden_size, c.n_routed_experts);
    std::printf(
        "| tokens x top-k | tile rows x k slice | grouped us | grouped TFLOP/s | weights GB/s | "
        "dense us | dense "
        "TFLOP/s | grouped/dense |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    ASSIGN_OR_RETURN(Stream stream, Stream::Create());
    const cudaStream_t s = stream.get();
    ASSIGN_OR_RETURN(auto gemm, CublasGemm::Create());
    const int e = c.n_routed_experts, k = c.num_experts_per_tok, n = 2 * c.moe_intermediate_size,
              hk = c.hidden_size;
    ASSIGN_OR_RETURN(auto w, DeviceBuffer<bf16>::Create(static_cast<size_t>(e) * n * hk));
    RETURN_IF_ERROR(FillUniform(w.get(), w.size(), 11, 0.02f, s));
    const int inter = c.moe_intermediate_size;
    ASSIGN_OR_RETURN(auto wd, DeviceBuffer<bf16>::Create(static_cast<size_t>(e) * hk * inter));
    RETURN_IF_ERROR(FillUniform(wd.get(), wd.size(), 14, 0.02f, s));
    ASSIGN_OR_RETURN(auto h_off, PinnedBuffer<int32_t>::Create(e + 1));
    // The same gate_up weights in FP8 (each expert's 128 x 128 blocks).
    const size_t w8_scales = static_cast<size_t>(cpu::Fp8Blocks(n)) * Fp8ScaleStride(hk);
    ASSIGN_OR_RETURN(auto w8, DeviceBuffer<uint8_t>::Create(static_cast<size_t>(e) * n * hk));
    ASSIGN_OR_RETURN(auto w8s, DeviceBuffer<float>::Create(e * w8_scales));
    for (int i = 0; i < e; ++i) {
      QuantizeFp8BlocksParams qp;
      qp.w_bf16 = w.get() + static_cast<size_t>(i) * n * hk;
      qp.q = w8.get() + static_cast<size_t>(i) * n * hk, qp.scale = w8s.get() + i * w8_scales;
      qp.n = n, qp.k = hk, qp.stream = s;
      RETURN_IF_ERROR(RunQuantizeFp8Blocks(qp));
    }
    // And in MXFP4 (DeepSeek-V4's format: 4-bit codes, a ue8m0 scale per 32 inputs).
    ASSIGN_OR_RETURN(auto w4, DeviceBuffer<uint8_t>::Create(static_cast<size_t>(e) * n * hk / 2));
    ASSIGN_OR_RETURN(auto w4s, DeviceBuffer<uint8_t>::Create(static_cast<size_t>(e) * n * hk / 32));
    {
      QuantizeMxfp4Params qp;
      qp.w = w.get(), qp.q = w4.get(), qp.scale = w4s.get(), qp.n = e * n, qp.k = hk, qp.stream = s;
      RETURN_IF_ERROR(RunQuantizeMxfp4(qp));
    }
    std::vector<std::string> mlp_rows;  // the whole expert MLP per path, printed after
    for (int tokens : {256, 16384}) {
      const int rows = tokens * k;
      const std::vector<int32_t> ids = UniformTopkIds(tokens, k, e, rng);
      ASSIGN_OR_RETURN(auto d_ids, DeviceBuffer<int32_t>::Create(rows));
      RETURN_IF_ERROR(d_ids.CopyFrom(ids));
      ASSIGN_OR_RETURN(auto x, DeviceBuffer<bf16>::Create(static_cast<size_t>(tokens) * hk));
      ASSIGN_OR_RETURN(auto y, DeviceBuffer<bf16>::Create(static_cast<size_t>(rows) * n));
      ASSIGN_OR_RETURN(auto xd, DeviceBuffer<bf16>::Create(static_cast<size_t>(rows) * hk));
      RETURN_IF_ERROR(FillUniform(x.get(), x.size(), 12, 1.0f, s));
      RETURN_IF_ERROR(FillUniform(xd.get(), xd.size(), 13, 1.0f, s));
      ASSIGN_OR_RETURN(auto off, DeviceBuffer<int32_t>::Create(e + 1));
      ASSIGN_OR_RETURN(auto tiles, DeviceBuffer<int32_t>::Create(e + 1));
      ASSIGN_OR_RETURN(auto row_token, DeviceBuffer<int32_t>::Create(rows));
      ASSIGN_OR_RETURN(auto pair_row, DeviceBuffer<int32_t>::Create(rows));
      RETURN_IF_CUDA_ERROR(cudaDeviceSynchronize());
      const int tile = rows <= 12 * e ? 16 : rows <= 40 * e ? 32 : 64;
      MoePermuteParams pp;
      pp.topk_ids = d_ids.get(), pp.num_tokens = tokens, pp.top_k = k, pp.num_experts = e,
      pp.tile_m = tile;
      pp.expert_offsets = off.get(), pp.tile_offsets = tiles.get(), pp.row_token = row_token.get();
      pp.pair_row = pair_row.get(), pp.stream = s;
      RETURN_IF_ERROR(RunMoePermute(pp));
      GroupedGemmParams gp;
      gp.x = x.get(), gp.ldx = hk, gp.row_index = row_token.get(), gp.w = w.get(),
      gp.num_experts = e, gp.n = n;
      gp.k = hk, gp.expert_offsets = off.get(), gp.tile_offsets = tiles.get(), gp.tile_m = tile;
      gp.max_tiles = GroupedGemmMaxTiles(rows, e, tile), gp.y = y.get(), gp.stream = s;
      GemmParams dp;
      dp.x = xd.get(), dp.w = w.get(), dp.y = y.get(), dp.m = rows, dp.n = n, dp.k = hk,
      dp.stream = s;
      ASSIGN_OR_RETURN(double d_ms, EventMedianMs(s, 3, 20, [&](int) { return gemm->Run(dp); }));
      const double flops = 2.0 * rows * n * hk;
      // Weights the grouped GEMM must read: every expert that got a row (all, here).
      const double w_bytes = static_cast<double>(e) * n * hk * 2;
      for (int k_tile : {64, 32}) {
        gp.k_tile = k_tile;
        ASSIGN_OR_RETURN(double g_ms,
                         EventMedianMs(s, 3, 20, [&](int) { return RunGroupedGemm(gp); }));
        std::printf("| %d x %d | %d x %d | %.1f | %.1f | %.0f | %.1f | %.1f | %.2f |\n", tokens, k,
                    tile, k_tile, g_ms * 1e3, flops / (g_ms * 1e-3) / 1e12,
                    w_bytes / (g_ms * 1e-3) / 1e9, d_ms * 1e3, flops / (d_ms * 1e-3) / 1e12,
                    d_ms / g_ms);
      }
      for (int k_tile : {128, 64}) {  // FP8 weights (half the bytes), 128- and 64-wide slices
        GroupedGemmParams g8 = gp;
        g8.w = nullptr, g8.w_fp8 = w8.get(), g8.w_scale = w8s.get(), g8.k_tile = k_tile;
        ASSIGN_OR_RETURN(double g_ms,
                         EventMedianMs(s, 3, 20, [&](int) { return RunGroupedGemm(g8); }));
        std::printf(
            "| %d x %d | %d x %d, FP8 weights | %.1f | %.1f | %.0f | %.1f | %.1f | %.2f |\n",
            tokens, k, tile, k_tile, g_ms * 1e3, flops / (g_ms * 1e-3) / 1e12,
            (w_bytes / 2 + e * w8_scales * 4.0) / (g_ms * 1e-3) / 1e9, d_ms * 1e3,
            flops / (d_ms * 1e-3) / 1e12, d_ms / g_ms);
      }
      {  // FP8 activations too (CudaModelOptions::fp8_expert_act): the permuted rows
         // quantized (RunQuantizeFp8 through row_token), then the FP8 x FP8 GEMM; the
         // quantization timed with it
        const int fp8_rows = Fp8Rows(rows);
        ASSIGN_OR_RETURN(auto xq,
                         DeviceBuffer<uint8_t>::Create(static_cast<size_t>(fp8_rows) * hk));
        ASSIGN_OR_RETURN(auto xqs, DeviceBuffer<float>::Create(static_cast<size_t>(fp8_rows) *
                                                               cpu::Fp8Blocks(hk)));
        QuantizeFp8Params qp;
        qp.x = x.get(), qp.index = row_token.get(), qp.count = off.get() + e, qp.q = xq.get();
        qp.scale = xqs.get(), qp.m = rows, qp.k = hk, qp.stream = s;
        GroupedGemmParams g8 = gp;
        g8.x = nullptr, g8.row_index = nullptr, g8.x_fp8 = xq.get(), g8.x_scale = xqs.get();
        g8.x_scale_ld = fp8_rows, g8.w = nullptr, g8.w_fp8 = w8.get(), g8.w_scale = w8s.get();
        g8.k_tile = 0;
        // 64-row tiles: the wgmma kernel, then the mma.sync one (its baseline).
        for (bool mma_sync : {false, true}) {
          if (mma_sync && tile != 64) break;
          g8.x_fp8_mma_sync = mma_sync;
          ASSIGN_OR_RETURN(double g_ms, EventMedianMs(s, 3, 20, [&](int) {
                             RETURN_IF_ERROR(RunQuantizeFp8(qp));
                             return RunGroupedGemm(g8);
                           }));
          std::printf(
              "| %d x %d | %d x 128, FP8 weights and activations (+ quantize), %s | %.1f | %.1f | "
              "%.0f | %.1f | %.1f | %.2f |\n",
              tokens, k, tile, tile == 64 && !mma_sync ? "wgmma" : "mma.sync", g_ms * 1e3,
              flops / (g_ms * 1e-3) / 1e12,
              (w_bytes / 2 + e * w8_scales * 4.0) / (g_ms * 1e-3) / 1e9, d_ms * 1e3,
              flops / (d_ms * 1e-3) / 1e12, d_ms / g_ms);
        }
      }
      {  // MXFP4 weights (a quarter of the bytes and a scale byte per 32), the
         // kernel's slice width (RunGroupedGemm: 128 on decode tiles where k allows)
        GroupedGemmParams g4 = gp;
        g4.w = nullptr, g4.w_fp4 = w4.get(), g4.w_mx_scale = w4s.get(), g4.k_tile = 0;
        ASSIGN_OR_RETURN(double g_ms,
                         EventMedianMs(s, 3, 20, [&](int) { return RunGroupedGemm(g4); }));
        std::printf(
            "| %d x %d | %d x the kernel's, MXFP4 weights | %.1f | %.1f | %.0f | %.1f | %.1f | "
            "%.2f |\n",
            tokens, k, tile, g_ms * 1e3, flops / (g_ms * 1e-3) / 1e12,
            (w_bytes / 4 + w_bytes / 64) / (g_ms * 1e-3) / 1e9, d_ms * 1e3,
            flops / (d_ms * 1e-3) / 1e12, d_ms / g_ms);
      }
      // The whole expert MLP as the model runs it (EnqueueExpertMlp), each
      // path, against two dense cuBLAS GEMMs of the same rows.
      const size_t slack = static_cast<size_t>(rows) + kDenseRowAlign;
      ASSIGN_OR_RETURN(auto gathered, DeviceBuffer<bf16>::Create(slack * hk));
      ASSIGN_OR_RETURN(auto gu, DeviceBuffer<bf16>::Create(slack * n));
      ASSIGN_OR_RETURN(auto act, DeviceBuffer<bf16>::Create(slack * inter));
      ASSIGN_OR_RETURN(auto yf, DeviceBuffer<float>::Create(slack * hk));
      RETURN_IF_ERROR(FillUniform(act.get(), act.size(), 15, 1.0f, s));
      GemmParams dd;
      dd.x = act.get(), dd.w = wd.get(), dd.y = yf.get(), dd.out_type = OutType::kFloat32,
      dd.m = rows, dd.n = hk;
      dd.k = inter, dd.stream = s;
      ASSIGN_OR_RETURN(double dense_ms, EventMedianMs(s, 3, 20, [&](int) -> absl::Status {
                         RETURN_IF_ERROR(gemm->Run(dp));
                         return gemm->Run(dd);
                       }));
      const double mlp_flops = flops + 2.0 * rows * hk * inter;
      for (bool dense_path : {false, true}) {
        ExpertMlpParams mp;
        mp.x = x.get(), mp.ldx = hk, mp.row_token = row_token.get(), mp.expert_offsets = off.get();
        mp.tile_offsets = tiles.get(), mp.tile_m = tile, mp.rows = rows, mp.gate_up = w.get(),
        mp.down = wd.get();
        mp.num_experts = e, mp.hidden = hk, mp.inter = inter;
        mp.gathered = dense_path ? gathered.get() : nullptr, mp.gu = gu.get(), mp.act = act.get(),
        mp.y = yf.get();
        mp.host_offsets = h_off.get(), mp.gemm = gemm.get(), mp.stream = s;
        const bool taken = !dense_path || rows >= kDenseRowsPerExpert * e;
        if (!taken) continue;  // EnqueueExpertMlp would run the grouped kernel: the row above
        ASSIGN_OR_RETURN(double m_ms,
                         EventMedianMs(s, 3, 20, [&](int) { return EnqueueExpertMlp(mp); }));
        mlp_rows.push_back(
            absl::StrFormat("| %d x %d | %s | %.1f | %.1f | %.1f | %.1f | %.2f |", tokens, k,
                            dense_path ? "per-expert cuBLAS" : "grouped kernel", m_ms * 1e3,
                            mlp_flops / (m_ms * 1e-3) / 1e12, dense_ms * 1e3,
                            mlp_flops / (dense_ms * 1e-3) / 1e12, dense_ms / m_ms));
      }
    }
    std::printf(
        "\nexpert MLP (gate_up, SiLU·mul, down; EnqueueExpertMlp), vs two dense cuBLAS GEMMs of "
        "the same "
        "rows\n| tokens x top-k | path | us | TFLOP/s | dense us | dense TFLOP/s | path/dense |\n"
        "| --- | --- | --- | --- | --- | --- | --- |\n");
    for (const std::string& r : mlp_rows) std::printf("%s\n", r.c_str());
  }

  return absl::OkStatus();
}

absl::Status Run(const Flags& f) {
  ASSIGN_OR_RETURN(DeviceInfo info, CurrentDeviceInfo());
  cudaDeviceProp prop{};
  RETURN_IF_CUDA_ERROR(cudaGetDeviceProperties(&prop, info.device));
  std::printf("device: %s, %d SMs, %.0f GiB\n", prop.name, info.num_sms,
              prop.totalGlobalMem / double(1 << 30));
  ASSIGN_OR_RETURN(Stream ceil_stream, Stream::Create());
  ASSIGN_OR_RETURN(std::unique_ptr<CublasGemm> ceil_gemm, CublasGemm::Create());
  ASSIGN_OR_RETURN(Ceilings ceil, MeasureCeilings(*ceil_gemm, ceil_stream.get()));
  std::printf(
      "ceilings (this run): D2D copy %.0f GB/s (read + write), bf16 GEMM 8192^3 %.0f TFLOP/s\n",
      ceil.copy_gbps, ceil.gemm_tflops);

  ModelConfig config;
  if (!f.model_dir.empty()) {
    ASSIGN_OR_RETURN(config, ModelConfig::Load(f.model_dir));
  } else {
    ASSIGN_OR_RETURN(config, ShapeConfig(f.shape));
  }
  if (f.quantization == "mxfp4") {  // as V4-Flash ships: FP8 linears, MXFP4 routed experts
    if (config.layers() != LayerArch::kV4)
      return absl::InvalidArgumentError("--quantization mxfp4: DeepSeek-V4's format (--family v4)");
    config.fp8_block_weights = true, config.mxfp4_experts = true;
  }
  const int max_batch = *std::max_element(f.batches.begin(), f.batches.end());
  CudaModelOptions o;
  o.gpu_memory_utilization = f.gpu_memory_utilization;
  o.max_num_seqs = std::max(max_batch, f.prefill_seqs);
  o.max_model_len = (std::max(f.context + f.warmup + f.steps + 1, f.prefill_len) + 63) / 64 * 64;
  o.cuda_graphs = f.graphs;
  o.fp8_linears = f.quantization == "fp8";  // mxfp4: from the config
  o.fp8_kv_cache = f.kv_cache_dtype == "fp8";
  o.mla_kernel = f.mla_kernel == "heads16"   ? MlaKernel::kHeads16
                 : f.mla_kernel == "generic" ? MlaKernel::kGeneric
                                             : MlaKernel::kAuto;
  o.mla_prefill = f.mla_prefill == "absorbed"   ? MlaPrefill::kAbsorbed
                  : f.mla_prefill == "expanded" ? MlaPrefill::kExpanded
                                                : MlaPrefill::kAuto;
  o.mla_prefill_impl =
      f.mla_prefill_impl == "wgmma" ? MlaPrefillImpl::kWgmma : MlaPrefillImpl::kMmaSync;
  o.sparse_mla_gather = f.sparse_mla == "gather";
  o.indexer_tensor_cores = f.indexer == "tensor-cores";
  o.fp8_gemv = f.fp8_gemv == "on";
  o.bf16_gemv = f.bf16_gemv == "on";
  o.fp8_expert_act = f.fp8_expert_act == "on";
  o.shared_expert_stream = f.shared_stream == "on";
  SetProgrammaticLaunch(f.pdl == "on");
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<CudaModel> model;
  if (f.load_format == "auto") {
    ASSIGN_OR_RETURN(model, CudaModel::Load(f.model_dir, o));
  } else {
    ASSIGN_OR_RETURN(model, CudaModel::Dummy(config, f.seed, o));
  }
  RETURN_IF_ERROR(model->FillKvCacheRandom(f.seed + 1));
  const auto t1 = std::chrono::steady_clock::now();
  const ModelConfig& c = model->config();
  if (f.sparse_mla == "direct" &&
      (!c.has_indexer() || f.mla_kernel == "generic" ||
       (f.kv_cache_dtype == "fp8" && c.num_attention_heads < mla::kWideHeads))) {
    return absl::InvalidArgumentError(
        "--sparse-mla direct: DeepSeek-V3.2's sparse attention on the tuned kernels only: bf16 "
        "rows, or FP8 rows from 64 heads up (this model has no indexer, --mla-kernel generic, "
        "or --kv-cache-dtype fp8 below 64 heads, which gathers)");
  }
  std::printf(
      "model %s (%s weights, %.2f GB, dense linears %s, routed experts %s): layers %d, hidden "
      "%d, heads %d, experts %d top-%d + %d shared, vocab %d; KV cache %d blocks (%.1f GB, %s "
      "rows); "
      "ready in %.1f s\n",
      f.model_dir.empty() ? f.shape.c_str() : f.model_dir.c_str(), f.load_format.c_str(),
      model->weights().bytes() / 1e9, model->weights().fp8_linears() ? "fp8" : "bf16",
      RoutedExpertFormat(c, model->weights().fp8_linears()) == LinearFormat::kMxfp4 ? "mxfp4"
      : RoutedExpertFormat(c, model->weights().fp8_linears()) == LinearFormat::kFp8 ? "fp8"
                                                                                    : "bf16",
      c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.n_routed_experts,
      c.num_experts_per_tok, c.n_shared_experts, c.vocab_size, model->kv_pool().num_blocks(),
      model->kv_pool().bytes() / 1e9, model->kv_row_spec().fp8() ? "fp8" : "bf16", Seconds(t0, t1));

  std::mt19937 rng(static_cast<uint32_t>(f.seed));
  std::uniform_int_distribution<int32_t> tok(2, c.vocab_size - 1);
  std::printf(
      "\ndecode, %d tokens of context, greedy, CUDA graphs %s (median of %d steps after %d "
      "warm-up)\n",
      f.context, f.graphs ? "on" : "off", f.steps, f.warmup);
  std::printf(
      "| batch | step ms | tok/s | experts touched | weights GB | KV GB | floor ms | floor/step "
      "|\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  std::vector<std::pair<int, PhaseTimes>> profiles;
  // One table row; with `profile`, one more step runs eagerly with events between the phases.
  // With `sampled`, every sequence samples on the device (temperature 0.8, top-p 0.95).
  if (f.profile_step) {  // for `ncu --profile-from-start off`: one decode step, after two
                         // unprofiled ones
    const int b = f.batches[0];
    std::vector<SequenceTokens> batch(b);
    std::vector<std::vector<int32_t>> next(b, std::vector<int32_t>(1));
    ASSIGN_OR_RETURN(const std::vector<int> seqs, model->AddSyntheticSequences(b, f.context));
    for (int i = 0; i < b; ++i) {
      next[i][0] = tok(rng);
      batch[i] = {seqs[i], next[i]};
    }
    for (int s = 0; s < 3; ++s) {
      if (s == 2) RETURN_IF_CUDA_ERROR(cudaProfilerStart());
      ASSIGN_OR_RETURN(StepOutput out, model->Step(batch));
      if (s == 2) RETURN_IF_CUDA_ERROR(cudaProfilerStop());
    }
    std::printf("profiled one decode step at batch %d (CUDA graphs %s)\n", b,
                f.graphs ? "on" : "off");
    return absl::OkStatus();
  }
  auto decode_row = [&](int b, const char* label, bool profile,
                        bool sampled = false) -> absl::Status {
    ASSIGN_OR_RETURN(const std::vector<int> seqs, model->AddSyntheticSequences(b, f.context));
    std::vector<std::vector<int32_t>> next(b, std::vector<int32_t>(1));
    std::vector<SequenceTokens> batch(b);
    auto fill = [&] {
      for (int i = 0; i < b; ++i) {
        next[i][0] = tok(rng);
        batch[i] = {seqs[i], next[i]};
      }
    };
    StepSampling sampling;
    SamplingParams sp;
    sp.temperature = 0.8f, sp.top_p = 0.95f;
    std::uniform_real_distribution<double> draw(0.0, 1.0);
    for (int i = 0; i < b && sampled; ++i)
      AppendSampleRow(sp, draw(rng), {}, {}, &sampling.rows, &sampling.penalties);
    std::vector<double> times;
    double kv_bytes = 0;
    for (int s = 0; s < f.warmup + f.steps; ++s) {
      fill();
      const auto a = std::chrono::steady_clock::now();
      ASSIGN_OR_RETURN(StepOutput out,
                       model->Step(batch, 0, nullptr, sampled ? &sampling : nullptr));
      const auto z = std::chrono::steady_clock::now();
      if (s >= f.warmup) {
        times.push_back(Seconds(a, z));
        kv_bytes += static_cast<double>(b) *
                    DecodeKvBytes(c, f.context + s + 1, model->kv_row_spec().fp8());
      }
    }
    if (f.graphs && !model->last_step_used_graph())
      return absl::InternalError("decode did not replay a graph");
    ASSIGN_OR_RETURN(std::vector<int32_t> counts, model->LastExpertCounts());
    int64_t touched = 0;
    for (int32_t n : counts) touched += n > 0;
    const double step = Median(times);
    const double w_bytes = model->weights().StepWeightBytes(touched, b);
    kv_bytes /= f.steps;
    const double floor_s = (w_bytes + kv_bytes) / (ceil.copy_gbps * 1e9);
    std::printf("| %d%s | %.3f | %.0f | %lld | %.2f | %.2f | %.3f | %.2f |\n", b, label, step * 1e3,
                b / step, static_cast<long long>(touched), w_bytes / 1e9, kv_bytes / 1e9,
                floor_s * 1e3, floor_s / step);
    std::fflush(stdout);
    if (profile) {
      fill();
      ASSIGN_OR_RETURN(PhaseTimes t, model->ProfileStep(batch));
      profiles.push_back({b, t});
    }
    for (int id : seqs) RETURN_IF_ERROR(model->ReleaseSequence(id));
    return absl::OkStatus();
  };
  for (size_t i = 0; i < f.batches.size() && !f.grouped_gemm_only; ++i) {
    RETURN_IF_ERROR(decode_row(f.batches[i], "", true));
  }
  if (f.grouped_gemm_only) return BenchGroupedGemm(c, rng);
  // The same steps sampling on the device instead of greedy.
  RETURN_IF_ERROR(decode_row(max_batch, " (sampled: T 0.8, top-p 0.95)", false, true));
  // The expert tile height at the largest batch: the picked one against the other two.
  for (int tile : {16, 32, 64}) {
    RETURN_IF_ERROR(model->SetMoeTileM(tile));
    RETURN_IF_ERROR(
        decode_row(max_batch, absl::StrFormat(" (expert tiles of %d rows)", tile).c_str(), false));
  }
  RETURN_IF_ERROR(model->SetMoeTileM(0));

  std::printf(
      "\none decode step run eagerly, GPU ms by phase (events between phases; at small batches the "
      "host's "
      "launches, not the GPU, set the pace)\n");
  std::printf(
      "| batch | embed | attention | dense MLP | MoE (+shared) | head + greedy | total |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  for (const auto& [b, t] : profiles) {
    std::printf("| %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n", b, t.embed_ms, t.attention_ms,
                t.dense_mlp_ms, t.moe_ms, t.head_ms, t.total_ms);
  }

  RETURN_IF_ERROR(BenchGroupedGemm(c, rng));

  if (f.prefill_seqs > 0) {
    std::printf(
        "\nprefill: %d prompts x %d tokens (chunks of %d tokens; --mla-prefill %s, impl %s)\n",
        f.prefill_seqs, f.prefill_len, o.max_tokens_per_step, f.mla_prefill.c_str(),
        f.mla_prefill_impl.c_str());
    std::vector<std::vector<int32_t>> prompts(f.prefill_seqs);
    for (auto& p : prompts) {
      for (int t = 0; t < f.prefill_len; ++t) p.push_back(tok(rng));
    }
    double best = 1e30;
    for (int rep = 0; rep < 2; ++rep) {  // the first also creates the GEMM plans
      std::vector<SequenceTokens> batch;
      std::vector<int> seqs;
      for (auto& p : prompts) {
        ASSIGN_OR_RETURN(int id, model->AddSequence());
        seqs.push_back(id);
        batch.push_back({id, p});
      }
      const auto a = std::chrono::steady_clock::now();
      ASSIGN_OR_RETURN(StepOutput out, model->Step(batch));
      const auto z = std::chrono::steady_clock::now();
      best = std::min(best, Seconds(a, z));
      for (int id : seqs) RETURN_IF_ERROR(model->ReleaseSequence(id));
    }
    const double tokens = static_cast<double>(f.prefill_seqs) * f.prefill_len;
    const double flops = tokens * TokenFlops(c, f.prefill_len / 2.0);
    std::printf(
        "| prompts | tokens | s | tok/s | TFLOP/s (model FLOPs) | GEMM peak TFLOP/s |\n| --- | --- "
        "| --- | --- | --- | --- |\n");
    std::printf("| %d | %.0f | %.3f | %.0f | %.1f | %.0f |\n", f.prefill_seqs, tokens, best,
                tokens / best, flops / best / 1e12, ceil.gemm_tflops);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace moesh::cuda

int main(int argc, char** argv) {
  absl::StatusOr<moesh::cuda::Flags> flags = moesh::cuda::ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "cuda_model_bench: %s\n", std::string(flags.status().message()).c_str());
    return 2;
  }
  const absl::Status s = moesh::cuda::Run(*flags);
  if (!s.ok()) {
    std::fprintf(stderr, "cuda_model_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
