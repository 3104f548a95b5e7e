// The FP8 forward pass (DeepSeek's block-scaled FP8: e4m3 weights with a
// float32 scale per 128 x 128 block; the dense linears with activations
// quantized per token per 128 channels on cuBLASLt's block-scaled GEMM, the
// routed experts' weights widened to bf16 in the grouped GEMM) against the
// CPU engine, at DeepSeek's
// real attention widths (latent 512, rope 64, 16 heads), teacher-forced:
//   * an FP8 checkpoint written as DeepSeek-V3 ships it: the CPU engine
//     dequantizes it exactly and the GPU re-quantizes the same codes, so the
//     differences are the GPU's own (FP8 activations, bf16 elsewhere). The
//     same weights through the bf16 GPU path give the baseline.
//   * a bf16 checkpoint under --quantization fp8 (fp8_linears): the weights'
//     own quantization error on top.
// Every position's distribution is compared over the whole vocabulary (max
// |Δlogprob|), and the greedy token: where it differs from the CPU engine's,
// the CPU's own top-2 margin there must be small (a near-tie that FP8 may
// flip). Prefill of 201 tokens and decode batches of 3 take the GEMM's
// path for rows past a multiple of four. Every token goes to every expert,
// so no router near-tie can flip a choice. Skips where no GPU is present.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "common/cuda_backend/cuda_expert_stage.h"
#include "common/cuda_backend/cuda_model.h"
#include "common/cuda_backend/fidelity_test_util.h"
#include "common/cuda_backend/model_test_util.h"
#include "common/model/random_checkpoint.h"
#include "gtest/gtest.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/expert_mlp.h"
#include "kernels/cuda/pdl.h"
#include "kernels/cuda/test_util.h"

namespace moesh::cuda {
namespace {

using testing::Argmax;
using testing::Compare;
using testing::CpuEngine;
using testing::CpuStep;
using testing::Fidelity;
using testing::LoadCpu;
using testing::LogSoftmax;
using testing::RandomMoeInput;
using testing::RealWidths;
using testing::RelErr;
using testing::RelLogitErr;
using testing::RelMaxErr;
using testing::RoundBf16;

// Measured on the H200 (BENCHMARKS.md, "FP8 linears"): 0.20 to 0.25 of the
// logits' spread on FP8 checkpoints, 0.32 to 0.36 under --quantization fp8
// (the weights' own rounding on top), against 0.025 to 0.031 for the bf16
// path on the same weights. FP8 activations carry up to 6% relative rounding
// per element and this random model amplifies rounding (bf16's 0.4% per
// element already moves its logits by 3%). A wrong scale layout, block or
// row of the tail path moves them by their whole spread (>= 1); the GEMM
// itself matches the CPU's block-scaled linear to 2e-3 (cuda_fp8_test).
// bf16's own bound: testing::kBf16RelLogitTolerance.
constexpr double kFp8RelTolerance = 0.5;
constexpr double kBf16RelTolerance = testing::kBf16RelLogitTolerance;

class CudaFp8ModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  // A random checkpoint of RealWidths(family) in `dtype`, under the test's
  // temporary directory; its seed in *seed.
  std::string WriteCheckpoint(const ModelConfig& c, const std::string& name, DType dtype,
                              uint64_t* seed) {
    const std::string dir = JoinPath(::testing::TempDir(), name + "_" + GetParam());
    RandomCheckpointOptions ro;
    ro.seed = *seed = testing::FreshSeed();
    ro.dtype = dtype;
    EXPECT_TRUE(WriteRandomCheckpoint(c, dir, ro).ok());
    return dir;
  }
};

TEST_P(CudaFp8ModelTest, Fp8CheckpointMatchesCpuEngine) {
  MOESH_REQUIRE_GPU();
  const ModelConfig c = RealWidths(GetParam());
  uint64_t seed = 0;
  const std::string dir = WriteCheckpoint(c, "cuda_fp8", DType::kF8E4M3, &seed);
  SCOPED_TRACE(::testing::Message() << "checkpoint seed " << seed);
  absl::StatusOr<CpuEngine> cpu = LoadCpu(dir);
  ASSERT_TRUE(cpu.ok()) << cpu.status();

  const CudaModelOptions options = testing::SmallModelOptions();
  absl::StatusOr<std::unique_ptr<CudaModel>> fp8 = CudaModel::Load(dir, options);
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  ASSERT_TRUE((*fp8)->weights().fp8_linears()) << "an FP8 checkpoint runs in FP8";
  // The decode steps' linears through cuBLASLt instead of RunFp8Gemv (the
  // default where k allows).
  CudaModelOptions gemv_options = options;
  gemv_options.fp8_gemv = !options.fp8_gemv;
  absl::StatusOr<std::unique_ptr<CudaModel>> gemv = CudaModel::Load(dir, gemv_options);
  ASSERT_TRUE(gemv.ok()) << gemv.status();
  // Every expert tile 64 rows, so the experts run on FP8 activations (the
  // wgmma kernel) in decode steps too; the default runs them there only in
  // prefill.
  CudaModelOptions act_options = options;
  act_options.fp8_expert_act = true, act_options.moe_tile_m = 64;
  absl::StatusOr<std::unique_ptr<CudaModel>> act = CudaModel::Load(dir, act_options);
  ASSERT_TRUE(act.ok()) << act.status();
  // The same (dequantized) weights in bf16.
  absl::StatusOr<ModelConfig> bf16_config = ModelConfig::Load(dir);
  ASSERT_TRUE(bf16_config.ok());
  bf16_config->fp8_block_weights = false;
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  absl::StatusOr<std::unique_ptr<AttentionWeights>> attention =
      AttentionWeights::Load(*bf16_config, **ckpt);
  ASSERT_TRUE(attention.ok()) << attention.status();
  absl::StatusOr<std::unique_ptr<ExpertShardWeights>> experts =
      ExpertShardWeights::Load(*bf16_config, **ckpt, {});
  ASSERT_TRUE(experts.ok()) << experts.status();
  absl::StatusOr<std::unique_ptr<CudaModel>> bf16 =
      CudaModel::FromHost(*bf16_config, **attention, experts->get(), options);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  ASSERT_FALSE((*bf16)->weights().fp8_linears());
  EXPECT_LT((*fp8)->weights().bytes(), (*bf16)->weights().bytes());

  std::vector<Fidelity> f;
  Compare(c, *cpu, {fp8->get(), bf16->get(), gemv->get(), act->get()}, &f, seed);
  std::printf("%s FP8 checkpoint vs the CPU engine (dequantized), teacher-forced:\n",
              GetParam().c_str());
  f[0].Print("GPU FP8 linears:");
  f[1].Print("GPU bf16 (same weights):");
  f[2].Print(options.fp8_gemv ? "GPU FP8 linears, decode via cuBLASLt:"
                              : "GPU FP8 linears, decode via RunFp8Gemv:");
  f[3].Print("GPU FP8 linears, experts on FP8 activations in every pass:");
  EXPECT_LE(f[0].worst_rel, kFp8RelTolerance);
  EXPECT_LE(f[1].worst_rel, kBf16RelTolerance);
  EXPECT_LE(f[2].worst_rel, kFp8RelTolerance);
  EXPECT_LE(f[3].worst_rel, kFp8RelTolerance);
}

TEST_P(CudaFp8ModelTest, OnlineQuantizationOfABf16Checkpoint) {
  MOESH_REQUIRE_GPU();
  const ModelConfig c = RealWidths(GetParam());
  uint64_t seed = 0;
  const std::string dir = WriteCheckpoint(c, "cuda_fp8_online", DType::kBF16, &seed);
  SCOPED_TRACE(::testing::Message() << "checkpoint seed " << seed);
  absl::StatusOr<CpuEngine> cpu = LoadCpu(dir);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  CudaModelOptions options = testing::SmallModelOptions();
  options.fp8_linears = true;
  absl::StatusOr<std::unique_ptr<CudaModel>> fp8 = CudaModel::Load(dir, options);
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  ASSERT_TRUE((*fp8)->weights().fp8_linears());
  std::vector<Fidelity> f;
  Compare(c, *cpu, {fp8->get()}, &f, seed);
  std::printf("%s bf16 checkpoint, --quantization fp8, vs the CPU engine (bf16 weights):\n",
              GetParam().c_str());
  f[0].Print("GPU FP8 linears (weights quantized):");
  EXPECT_LE(f[0].worst_rel, kFp8RelTolerance);
}

// What the GPU stage computes where FP8 experts take FP8 activations
// (kFp8ActivationTileRows-row tiles, kernels/cuda/expert_mlp.h), on the CPU:
// each routed row rounded to bf16 and quantized per 128 columns
// (QuantizeFp8Rows, the codes the GPU's quantizer writes bit for bit), gate_up
// in float32 over the dequantized codes and rounded to bf16, SiLU·mul rounded
// to bf16 and quantized the same, then down. `shard`: the stage's weights
// (the FP8 checkpoint's, dequantized exactly). Added into out[tokens, hidden].
void Fp8ActivationExperts(const ModelConfig& c, const ExpertShardWeights& shard,
                          const MoeDispatch& d, float* out) {
  const int h = c.hidden_size, inter = c.moe_intermediate_size;
  std::vector<float> x(h), gu(2 * inter), act(inter), y(h);
  std::vector<uint8_t> codes(std::max(h, inter));
  std::vector<float> scales(cpu::Fp8Blocks(std::max(h, inter)));
  auto to_fp8 = [&](std::vector<float>& v) {  // bf16, then e4m3 per 128 columns
    for (float& e : v) e = RoundBf16(e);
    const int n = static_cast<int>(v.size());
    cpu::QuantizeFp8Rows(v.data(), codes.data(), scales.data(), 1, n);
    cpu::DequantizeFp8Rows(codes.data(), scales.data(), v.data(), 1, n);
  };
  for (int t = 0; t < d.num_tokens; ++t) {
    for (int k = 0; k < d.top_k; ++k) {
      const int e = d.topk_ids[t * d.top_k + k];
      if (!shard.expert_ids.count(e)) continue;
      const MlpWeights& w = shard.layers.at(d.layer).at(e);
      std::copy_n(d.hidden_f32() + static_cast<size_t>(t) * h, h, x.begin());
      to_fp8(x);
      cpu::Linear(x.data(), w.gate_up.data(), gu.data(), 1, 2 * inter, h);
      for (float& v : gu) v = RoundBf16(v);
      cpu::SiluAndMul(gu.data(), act.data(), 1, inter, static_cast<float>(c.swiglu_limit));
      to_fp8(act);
      cpu::Linear(act.data(), w.down.data(), y.data(), 1, h, inter);
      cpu::Axpy(d.topk_weights[t * d.top_k + k], y.data(), out + static_cast<size_t>(t) * h, h);
    }
  }
}

// An expert worker's stage with FP8 weights (an FP8 checkpoint's experts,
// re-quantized to the same codes), in about half the device memory of the
// bf16 stage, against the CPU stage on the dequantized weights: within 2e-2
// where its tiles widen the FP8 weights to bf16 (decode sizes: bf16's error,
// the codes times their scales rounded to bf16); at prefill tiles (FP8
// activations, as the colocated engine's) near the CPU doing the same
// quantizations: the GPU's gate_up sums differ from the CPU's in their last
// bits, the bf16 rounding after them passes that on to ~1 in 4 values, and a
// value that crosses an e4m3 rounding boundary moves by a whole code (6 to
// 12%): about 1% of SiLU·mul's codes land on the neighbouring one, so the
// outputs differ by ~1% throughout (H100: L2 4e-3 to 8.5e-3, max 0.9e-2 to
// 1.5e-2 of the largest output; bounds 2e-2 and 3e-2), and the plain CPU
// stage by what the activations' own rounding costs (L2 4.2e-2 to 4.4e-2,
// max up to 4.8e-2; bounds 6e-2 and 8e-2). A wrong scale, row or expert is
// an error of the output's own size.
TEST_P(CudaFp8ModelTest, Fp8ExpertStageMatchesCpuStage) {
  MOESH_REQUIRE_GPU();
  const ModelConfig c = RealWidths(GetParam());
  uint64_t seed = 0;
  const std::string dir = WriteCheckpoint(c, "cuda_fp8_experts", DType::kF8E4M3, &seed);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  const std::set<int> shard = {0, 2, 5};
  auto load = [&] {
    absl::StatusOr<std::unique_ptr<ExpertShardWeights>> w =
        ExpertShardWeights::Load(c, **ckpt, shard);
    EXPECT_TRUE(w.ok()) << w.status();
    return std::move(*w);
  };
  const std::unique_ptr<ExpertShardWeights> weights = load();
  ExpertStage cpu(c, load());
  absl::StatusOr<std::unique_ptr<CudaExpertStage>> fp8 = CudaExpertStage::Create(c, load(), true);
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  ASSERT_TRUE((*fp8)->fp8_activations()) << "DeepSeek's widths: whole 128-column blocks";
  absl::StatusOr<std::unique_ptr<CudaExpertStage>> bf16 = CudaExpertStage::Create(c, load());
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_LT((*fp8)->device_bytes(), 0.55 * (*bf16)->device_bytes());
  std::mt19937 rng(seed);
  int fp8_act_cases = 0;
  for (int tokens : {1, 7, 64, 300}) {
    SCOPED_TRACE(::testing::Message() << tokens << " tokens");
    RandomMoeInput in(c, c.first_k_dense_replace, tokens, rng);
    in.HitShard(shard);
    std::vector<float> want(in.x.size(), 0.0f), got(in.x.size(), 0.0f);
    ASSERT_TRUE(cpu.Accumulate(in.dispatch, want.data()).ok());
    const absl::Status st = (*fp8)->Accumulate(in.dispatch, got.data());
    ASSERT_TRUE(st.ok()) << st;
    double ref = 0.0;
    for (float v : want) ref = std::max(ref, std::fabs(static_cast<double>(v)));
    EXPECT_GT(ref, 1e-3) << "no expert of the shard received a token";
    // The stage's tile height for this dispatch (its hosted pairs over its
    // experts), so the reference its numerics call for.
    int pairs = 0;
    for (int32_t e : in.ids) pairs += shard.count(e);
    if (ExpertTileRows(pairs, static_cast<int>(shard.size())) == kFp8ActivationTileRows) {
      ++fp8_act_cases;
      std::vector<float> emulated(in.x.size(), 0.0f);
      Fp8ActivationExperts(c, *weights, in.dispatch, emulated.data());
      const double max_emulated = RelMaxErr(got, emulated), max_plain = RelMaxErr(got, want);
      const double l2_emulated = RelErr(got, emulated), l2_plain = RelErr(got, want);
      std::printf(
          "%d tokens, FP8 activations: rel max err %.3e / L2 %.3e against the CPU doing the same "
          "quantizations, %.3e / %.3e against the plain CPU stage\n",
          tokens, max_emulated, l2_emulated, max_plain, l2_plain);
      EXPECT_LT(l2_emulated, 2e-2) << "against the CPU on FP8 activations";
      EXPECT_LT(max_emulated, 3e-2) << "against the CPU on FP8 activations";
      EXPECT_LT(l2_plain, 6e-2) << "against the plain CPU stage";
      EXPECT_LT(max_plain, 8e-2) << "against the plain CPU stage";
    } else {
      EXPECT_LT(RelMaxErr(got, want), 2e-2);
    }
  }
  EXPECT_EQ(fp8_act_cases, 2) << "64 and 300 tokens take 64-row tiles";
}

// The streamed load (CudaModel::Load: one layer's float32 weights on the host
// at a time, the experts' FP8 codes copied as they are) against the whole
// host load (FromHost: everything float32 first, re-quantized on the device):
// the same model, so the same logits.
TEST_P(CudaFp8ModelTest, StreamedLoadMatchesTheHostLoad) {
  MOESH_REQUIRE_GPU();
  const ModelConfig c = RealWidths(GetParam());
  uint64_t seed = 0;
  const std::string dir = WriteCheckpoint(c, "cuda_fp8_streamed", DType::kF8E4M3, &seed);
  SCOPED_TRACE(::testing::Message() << "checkpoint seed " << seed);
  const CudaModelOptions options = testing::SmallModelOptions();
  absl::StatusOr<std::unique_ptr<CudaModel>> streamed = CudaModel::Load(dir, options);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  absl::StatusOr<ModelConfig> config = ModelConfig::Load(dir);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(config.ok() && ckpt.ok());
  absl::StatusOr<std::unique_ptr<AttentionWeights>> attention =
      AttentionWeights::Load(*config, **ckpt);
  absl::StatusOr<std::unique_ptr<ExpertShardWeights>> experts =
      ExpertShardWeights::Load(*config, **ckpt, {});
  ASSERT_TRUE(attention.ok() && experts.ok());
  absl::StatusOr<std::unique_ptr<CudaModel>> host =
      CudaModel::FromHost(*config, **attention, experts->get(), options);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ((*streamed)->weights().bytes(), (*host)->weights().bytes());
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(2, c.vocab_size - 1);
  std::vector<std::vector<int32_t>> prompts;
  for (int len : {9, 150}) {
    prompts.emplace_back(len);
    for (int32_t& t : prompts.back()) t = tok(rng);
  }
  std::vector<SequenceTokens> a, b;  // views of `prompts`
  for (const std::vector<int32_t>& prompt : prompts) {
    absl::StatusOr<int> sa = (*streamed)->AddSequence(), sb = (*host)->AddSequence();
    ASSERT_TRUE(sa.ok() && sb.ok());
    a.push_back({*sa, prompt});
    b.push_back({*sb, prompt});
  }
  absl::StatusOr<std::vector<float>> la = (*streamed)->ForwardLogits(a);
  ASSERT_TRUE(la.ok()) << la.status();
  absl::StatusOr<std::vector<float>> lb = (*host)->ForwardLogits(b);
  ASSERT_TRUE(lb.ok()) << lb.status();
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, RelLogitErr(la->data() + i * c.vocab_size,
                                        lb->data() + i * c.vocab_size, c.vocab_size));
  }
  std::printf("%s streamed vs host load: rel logits difference %.3e\n", GetParam().c_str(), worst);
  // The same codes give the same logits; a misplaced block or scale row moves
  // them by their whole spread.
  EXPECT_LE(worst, 1e-3);
}

// Programmatic dependent launch (kernels/cuda/pdl.cuh) changes when kernels
// start, never what they compute: the same prompts and greedy decode steps
// (graphs captured under each setting) give the same logits, tokens and
// logprobs bit for bit with it on and off, over a bf16 and an FP8 cache. A
// kernel that touched its inputs before its PdlWait would read the previous
// kernel's half-written rows. V3 at its 128 heads: the 64-head MLA kernel
// (over FP8 rows, its CTA pairs' cluster launch). The shared experts on their
// own stream (CudaModelOptions::shared_expert_stream) change no bit either:
// forked and joined by events, their sum added before the routed one.
TEST_P(CudaFp8ModelTest, ProgrammaticLaunchChangesNoBit) {
  MOESH_REQUIRE_GPU();
  ModelConfig c = RealWidths(GetParam());
  if (GetParam() == "v3") c.num_attention_heads = 128;
  uint64_t seed = 0;
  const std::string dir = WriteCheckpoint(c, "cuda_fp8_pdl", DType::kF8E4M3, &seed);
  SCOPED_TRACE(::testing::Message() << "checkpoint seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(2, c.vocab_size - 1);
  std::vector<std::vector<int32_t>> prompts;
  for (int len : {1, 37, 150}) {
    prompts.emplace_back(len);
    for (int32_t& t : prompts.back()) t = tok(rng);
  }
  struct Run {
    std::vector<float> logits;
    std::vector<int32_t> ids;
    std::vector<float> logprobs;
  };
  const auto run = [&](bool pdl, bool fp8_kv, bool shared_stream = false) {
    SetProgrammaticLaunch(pdl);
    Run r;
    CudaModelOptions options = testing::SmallModelOptions();
    options.fp8_kv_cache = fp8_kv;
    options.shared_expert_stream = shared_stream;
    absl::StatusOr<std::unique_ptr<CudaModel>> m = CudaModel::Load(dir, options);
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return r;
    std::vector<int> seqs;
    std::vector<SequenceTokens> batch;
    for (const std::vector<int32_t>& prompt : prompts) {
      absl::StatusOr<int> s = (*m)->AddSequence();
      EXPECT_TRUE(s.ok());
      seqs.push_back(*s);
      batch.push_back({*s, prompt});
    }
    absl::StatusOr<std::vector<float>> l = (*m)->ForwardLogits(batch);
    EXPECT_TRUE(l.ok()) << l.status();
    if (l.ok()) r.logits = *l;
    std::vector<std::vector<int32_t>> next(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i)
      next[i] = {l.ok() ? Argmax(l->data() + i * c.vocab_size, c.vocab_size) : 2};
    for (int step = 0; step < 4; ++step) {  // decode steps through the graphs
      batch.clear();
      for (size_t i = 0; i < prompts.size(); ++i) batch.push_back({seqs[i], next[i]});
      absl::StatusOr<StepOutput> o = (*m)->Step(batch);
      EXPECT_TRUE(o.ok()) << o.status();
      if (!o.ok()) break;
      for (size_t i = 0; i < prompts.size(); ++i) next[i] = {o->next_ids[i]};
      r.ids.insert(r.ids.end(), o->next_ids.begin(), o->next_ids.end());
      r.logprobs.insert(r.logprobs.end(), o->next_logprobs.begin(), o->next_logprobs.end());
    }
    return r;
  };
  for (bool fp8_kv : {false, true}) {
    SCOPED_TRACE(fp8_kv ? "FP8 cache" : "bf16 cache");
    const Run off = run(false, fp8_kv), on = run(true, fp8_kv),
              aside = run(true, fp8_kv, /*shared_stream=*/true);
    SetProgrammaticLaunch(true);
    ASSERT_EQ(off.logits.size(), prompts.size() * c.vocab_size);
    ASSERT_EQ(off.ids.size(), 4 * prompts.size());
    EXPECT_EQ(on.logits, off.logits);
    EXPECT_EQ(on.ids, off.ids);
    EXPECT_EQ(on.logprobs, off.logprobs);
    EXPECT_EQ(aside.logits, off.logits);
    EXPECT_EQ(aside.ids, off.ids);
    EXPECT_EQ(aside.logprobs, off.logprobs);
  }
}

// An expert worker's GPU stage from a Deferred shard (its experts read from
// the checkpoint by the stage, FP8 codes copied as they are) computes what the
// stage made from float32 host weights does; after RemoveExperts and AddShard
// (experts already on the device copied there, the new one read from the
// checkpoint) it still does, and the checkpoint was read for its experts only.
TEST_P(CudaFp8ModelTest, DeferredExpertStageMatchesTheHostLoadedOne) {
  MOESH_REQUIRE_GPU();
  const ModelConfig c = RealWidths(GetParam());
  uint64_t seed = 0;
  const std::string dir = WriteCheckpoint(c, "cuda_fp8_deferred", DType::kF8E4M3, &seed);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  absl::StatusOr<std::unique_ptr<Checkpoint>> host_ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok() && host_ckpt.ok());
  const std::set<int> shard = {0, 2, 5};
  absl::StatusOr<std::unique_ptr<ExpertShardWeights>> deferred =
      ExpertShardWeights::Deferred(c, **ckpt, shard);
  absl::StatusOr<std::unique_ptr<ExpertShardWeights>> loaded =
      ExpertShardWeights::Load(c, **host_ckpt, shard);
  ASSERT_TRUE(deferred.ok() && loaded.ok());
  absl::StatusOr<std::unique_ptr<CudaExpertStage>> gpu =
      CudaExpertStage::Create(c, std::move(*deferred), true);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  absl::StatusOr<std::unique_ptr<CudaExpertStage>> ref =
      CudaExpertStage::Create(c, std::move(*loaded), true);
  ASSERT_TRUE(ref.ok()) << ref.status();
  for (const std::string& name : (*ckpt)->tensors_read()) {
    const int e = RoutedExpertOf(name);
    EXPECT_TRUE(e >= 0 && shard.count(e)) << "read " << name;
  }
  std::mt19937 rng(seed);
  auto expect_same = [&](const char* when) {
    for (int tokens : {1, 64}) {
      RandomMoeInput in(c, c.first_k_dense_replace, tokens, rng);
      in.HitShard(shard);
      std::vector<float> want(in.x.size(), 0.0f), got(in.x.size(), 0.0f);
      ASSERT_TRUE((*ref)->Accumulate(in.dispatch, want.data()).ok());
      ASSERT_TRUE((*gpu)->Accumulate(in.dispatch, got.data()).ok());
      EXPECT_LT(RelMaxErr(got, want), 1e-5) << when << ", " << tokens << " tokens";
    }
  };
  expect_same("created");
  ASSERT_TRUE((*gpu)->RemoveExperts({2}).ok());
  ASSERT_TRUE((*ref)->RemoveExperts({2}).ok());
  expect_same("after RemoveExperts");
  absl::StatusOr<std::unique_ptr<ExpertShardWeights>> more =
      ExpertShardWeights::Deferred(c, **ckpt, {2, 7});
  absl::StatusOr<std::unique_ptr<ExpertShardWeights>> more_ref =
      ExpertShardWeights::Load(c, **host_ckpt, {2, 7});
  ASSERT_TRUE(more.ok() && more_ref.ok());
  ASSERT_TRUE((*gpu)->AddShard(std::move(*more)).ok());
  ASSERT_TRUE((*ref)->AddShard(std::move(*more_ref)).ok());
  expect_same("after AddShard");
  EXPECT_EQ((*gpu)->device_bytes(), (*ref)->device_bytes());
}

INSTANTIATE_TEST_SUITE_P(Families, CudaFp8ModelTest, ::testing::Values("v2-lite", "v3"));

// DeepSeek-V4 as V4-Flash ships it (FP8 linears with ue8m0 block scales,
// MXFP4 routed experts) at its real attention width (head_dim 512, a CSA then
// an HCA layer): the GPU holds the experts in MXFP4 (4-bit codes read by the
// grouped GEMM) and the FP8 linears in bf16 (exact), so it computes what the
// bf16 path computes on the dequantized weights — the same on decode steps,
// where both take the grouped kernel (a bf16 prefill's experts take the dense
// GEMM, which rounds differently) — in about a quarter of the experts' bytes.
// Against the CPU engine it is printed (the CSA indexer's bf16-vs-fp32
// near-ties select other keys there, as cuda_model_test's V4 real widths).
TEST(CudaMxfp4ModelTest, V4FlashCheckpointRunsItsExpertsInMxfp4) {
  MOESH_REQUIRE_GPU();
  const ModelConfig c = testing::V4RealWidths(/*moe_intermediate=*/256);
  const std::string dir = JoinPath(::testing::TempDir(), "cuda_mxfp4_v4");
  RandomCheckpointOptions ro;
  ro.seed = testing::FreshSeed();
  ro.dtype = DType::kF8E4M3;
  SCOPED_TRACE(::testing::Message() << "checkpoint seed " << ro.seed);
  ASSERT_TRUE(WriteRandomCheckpoint(c, dir, ro).ok());
  absl::StatusOr<CpuEngine> cpu = LoadCpu(dir);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const CudaModelOptions options = testing::SmallModelOptions();
  absl::StatusOr<std::unique_ptr<CudaModel>> mx = CudaModel::Load(dir, options);
  ASSERT_TRUE(mx.ok()) << mx.status();
  ASSERT_TRUE((*mx)->weights().layer(0).experts_gate_up.mxfp4());
  ASSERT_FALSE((*mx)->weights().fp8_linears());
  // The same dequantized weights, every one in bf16.
  absl::StatusOr<ModelConfig> plain = ModelConfig::Load(dir);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(plain.ok() && ckpt.ok());
  absl::StatusOr<std::unique_ptr<AttentionWeights>> attention =
      AttentionWeights::Load(*plain, **ckpt);
  absl::StatusOr<std::unique_ptr<ExpertShardWeights>> experts =
      ExpertShardWeights::Load(*plain, **ckpt, {});
  ASSERT_TRUE(attention.ok() && experts.ok());
  plain->fp8_block_weights = false, plain->mxfp4_experts = false;
  absl::StatusOr<std::unique_ptr<CudaModel>> bf16 =
      CudaModel::FromHost(*plain, **attention, experts->get(), options);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  ASSERT_FALSE((*bf16)->weights().layer(0).experts_gate_up.mxfp4());
  const double expert_bytes = 2.0 * c.n_routed_experts * 3 * c.moe_intermediate_size *
                              c.hidden_size * c.num_hidden_layers;  // bf16
  const double saved = static_cast<double>((*bf16)->weights().bytes()) -
                       static_cast<double>((*mx)->weights().bytes());
  std::printf("V4 MXFP4 experts: weights %.2f MB vs bf16 %.2f MB (experts %.2f MB in bf16)\n",
              (*mx)->weights().bytes() / 1e6, (*bf16)->weights().bytes() / 1e6, expert_bytes / 1e6);
  EXPECT_GT(saved, 0.7 * expert_bytes) << "4.25 bits a weight instead of 16";

  std::mt19937 rng(ro.seed);
  std::uniform_int_distribution<int32_t> tok(2, c.vocab_size - 1);
  const std::vector<int> lens = {70, 130, 1};
  std::vector<std::vector<int32_t>> inputs(lens.size());
  std::vector<int> seq_mx, seq_bf;
  std::vector<SequenceKvCache> caches;
  for (size_t i = 0; i < lens.size(); ++i) {
    for (int t = 0; t < lens[i]; ++t) inputs[i].push_back(tok(rng));
    absl::StatusOr<int> a = (*mx)->AddSequence(), b = (*bf16)->AddSequence();
    ASSERT_TRUE(a.ok() && b.ok());
    seq_mx.push_back(*a);
    seq_bf.push_back(*b);
    caches.push_back(cpu->model->NewCache());
  }
  Fidelity vs_cpu, vs_bf16;
  vs_cpu.check_flips = false;  // the CSA indexer's near-ties (bf16 vs fp32) pick other keys
  for (int step = 0; step < 5; ++step) {  // a prefill, then decode steps
    std::vector<SequenceTokens> a, b;
    for (size_t i = 0; i < lens.size(); ++i) {
      a.push_back({seq_mx[i], inputs[i]});
      b.push_back({seq_bf[i], inputs[i]});
    }
    absl::StatusOr<std::vector<float>> la = (*mx)->ForwardLogits(a);
    ASSERT_TRUE(la.ok()) << la.status();
    absl::StatusOr<std::vector<float>> lb = (*bf16)->ForwardLogits(b);
    ASSERT_TRUE(lb.ok()) << lb.status();
    for (size_t i = 0; i < lens.size(); ++i) {
      const std::vector<float> ref = CpuStep(*cpu, &caches[i], inputs[i]);
      const float* got = la->data() + i * c.vocab_size;
      vs_cpu.Add(got, ref.data(), c.vocab_size);
      vs_bf16.Add(got, lb->data() + i * c.vocab_size, c.vocab_size);
      std::printf("  step %d sequence %zu: rel logits err vs the bf16 path %.3e\n", step, i,
                  RelLogitErr(got, lb->data() + i * c.vocab_size, c.vocab_size));
      inputs[i] = {Argmax(ref.data(), c.vocab_size)};
    }
  }
  std::printf("V4-Flash layout (FP8 linears, MXFP4 experts), teacher-forced:\n");
  vs_cpu.Print("GPU vs the CPU engine:");
  vs_bf16.Print("GPU vs the GPU bf16 path:");
  // Measured (H200, BENCHMARKS.md): the bf16 path's distance from itself on
  // the dense-vs-grouped prefill rounding only; a wrong nibble order, scale
  // row or group moves the logits by their whole spread.
  EXPECT_LE(vs_bf16.worst_rel, 2e-2);
}

// An expert worker's GPU stage on a V4-Flash checkpoint holds its experts in
// MXFP4, from a Deferred shard (read by the stage, exactly re-quantized) as
// from host weights, and computes what the CPU stage does on the dequantized
// weights within bf16's rounding.
TEST(CudaMxfp4ModelTest, V4ExpertStageMatchesCpuStage) {
  MOESH_REQUIRE_GPU();
  const ModelConfig c = testing::V4RealWidths(/*moe_intermediate=*/256);
  const std::string dir = JoinPath(::testing::TempDir(), "cuda_mxfp4_v4_stage");
  RandomCheckpointOptions ro;
  ro.seed = testing::FreshSeed();
  ro.dtype = DType::kF8E4M3;
  ASSERT_TRUE(WriteRandomCheckpoint(c, dir, ro).ok());
  absl::StatusOr<ModelConfig> config = ModelConfig::Load(dir);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(config.ok() && ckpt.ok());
  ASSERT_TRUE(config->mxfp4_experts);
  const std::set<int> shard = {0, 2, 5};
  auto load = [&] {
    absl::StatusOr<std::unique_ptr<ExpertShardWeights>> w =
        ExpertShardWeights::Load(*config, **ckpt, shard);
    EXPECT_TRUE(w.ok()) << w.status();
    return std::move(*w);
  };
  ExpertStage cpu(*config, load());
  absl::StatusOr<std::unique_ptr<CudaExpertStage>> mx = CudaExpertStage::Create(*config, load());
  ASSERT_TRUE(mx.ok()) << mx.status();
  absl::StatusOr<std::unique_ptr<ExpertShardWeights>> deferred =
      ExpertShardWeights::Deferred(*config, **ckpt, shard);
  ASSERT_TRUE(deferred.ok());
  absl::StatusOr<std::unique_ptr<CudaExpertStage>> from_ckpt =
      CudaExpertStage::Create(*config, std::move(*deferred));
  ASSERT_TRUE(from_ckpt.ok()) << from_ckpt.status();
  ModelConfig bf16_config = *config;
  bf16_config.fp8_block_weights = false, bf16_config.mxfp4_experts = false;
  absl::StatusOr<std::unique_ptr<CudaExpertStage>> bf16 =
      CudaExpertStage::Create(bf16_config, load());
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_LT((*mx)->device_bytes(), 0.3 * (*bf16)->device_bytes());
  EXPECT_EQ((*mx)->device_bytes(), (*from_ckpt)->device_bytes());
  std::mt19937 rng(ro.seed);
  for (int tokens : {1, 7, 64, 300}) {
    RandomMoeInput in(*config, 0, tokens, rng);
    in.HitShard(shard);
    std::vector<float> want(in.x.size(), 0.0f), got(in.x.size(), 0.0f), got_ckpt(in.x.size(), 0.0f);
    ASSERT_TRUE(cpu.Accumulate(in.dispatch, want.data()).ok());
    ASSERT_TRUE((*mx)->Accumulate(in.dispatch, got.data()).ok());
    ASSERT_TRUE((*from_ckpt)->Accumulate(in.dispatch, got_ckpt.data()).ok());
    double ref = 0.0;
    for (float v : want) ref = std::max(ref, std::fabs(static_cast<double>(v)));
    EXPECT_GT(ref, 1e-3) << "no expert of the shard received a token";
    EXPECT_LT(RelMaxErr(got, want), 2e-2) << tokens << " tokens";
    EXPECT_EQ(got, got_ckpt) << "the checkpoint's own codes, read by the stage";
  }
}

}  // namespace
}  // namespace moesh::cuda
