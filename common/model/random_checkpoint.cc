#include "common/model/random_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/dtype.h"
#include "base/file_util.h"
#include "base/status.h"
#include "common/model/safetensors.h"
#include "common/model/weights.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/mxfp4.h"

namespace moesh {

namespace {

// DeepSeek-V4 in miniature: every layer type (sliding, CSA, HCA), hash-routed
// and learned-routed MoE layers, a YaRN-scaled compress rope.
absl::StatusOr<ModelConfig> V4Preset(const std::string& preset) {
  ModelConfig c;
  c.family = ModelFamily::kDeepseekV4;
  c.model_type = "deepseek_v4";
  c.num_hidden_layers = 4;
  c.v4.layer_types = {V4AttentionType::kSliding, V4AttentionType::kCompressedSparse,
                      V4AttentionType::kHeavilyCompressed, V4AttentionType::kCompressedSparse};
  c.v4.hash_layers = {true, true, false, false};
  c.n_shared_experts = 1;
  c.scoring_func = ScoringFunc::kSqrtSoftplus;
  c.topk_method = TopkMethod::kGreedy;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 1.5;
  c.first_k_dense_replace = 0;
  c.v4.hc_mult = 4;
  c.v4.hc_sinkhorn_iters = 20;
  c.v4.hc_eps = 1e-6;
  c.swiglu_limit = 10.0;
  c.rms_norm_eps = 1e-6;
  c.bos_token_id = 0;
  c.eos_token_ids = {1};
  c.rope.theta = 10000.0;
  c.v4.compress_rope.type = RopeType::kYarn;
  c.v4.compress_rope.theta = 160000.0;
  c.v4.compress_rope.beta_fast = 32;
  c.v4.compress_rope.beta_slow = 1;
  c.v4.compress_rope.attention_factor = 1.0;
  if (preset == "tiny") {
    c.vocab_size = 512;
    c.hidden_size = 64;
    c.num_attention_heads = 4;
    c.v4.head_dim = 32;
    c.qk_rope_head_dim = 8;
    c.q_lora_rank = 48;
    c.v4.o_groups = 2;
    c.v4.o_lora_rank = 16;
    c.moe_intermediate_size = 32;
    c.n_routed_experts = 8;
    c.num_experts_per_tok = 2;
    c.v4.sliding_window = 8;
    c.v4.compress_rate_csa = 4;
    c.v4.compress_rate_hca = 8;
    c.indexer.n_heads = 4;
    c.indexer.head_dim = 16;
    c.indexer.topk = 3;
    c.v4.compress_rope.factor = 4;
    c.v4.compress_rope.original_max_position_embeddings = 64;
  } else if (preset == "small") {
    c.vocab_size = 8192;
    c.hidden_size = 512;
    c.num_attention_heads = 8;
    c.v4.head_dim = 128;
    c.qk_rope_head_dim = 32;
    c.q_lora_rank = 192;
    c.v4.o_groups = 4;
    c.v4.o_lora_rank = 128;
    c.moe_intermediate_size = 256;
    c.n_routed_experts = 16;
    c.num_experts_per_tok = 4;
    c.v4.sliding_window = 64;
    c.v4.compress_rate_csa = 4;
    c.v4.compress_rate_hca = 128;
    c.indexer.n_heads = 8;
    c.indexer.head_dim = 64;
    c.indexer.topk = 32;
    c.v4.compress_rope.factor = 16;
    c.v4.compress_rope.original_max_position_embeddings = 256;
  } else if (preset == "real") {
    // DeepSeek-V4-Flash (transformers' DeepseekV4Config defaults): two HCA
    // layers, then HCA and CSA alternating; the first three hash-routed.
    c.num_hidden_layers = 43;
    c.v4.layer_types.assign(2, V4AttentionType::kHeavilyCompressed);
    for (int i = 0; i < c.num_hidden_layers - 2; ++i) {
      c.v4.layer_types.push_back(i % 2 ? V4AttentionType::kCompressedSparse
                                       : V4AttentionType::kHeavilyCompressed);
    }
    c.v4.hash_layers.assign(c.num_hidden_layers, false);
    for (int i = 0; i < 3; ++i) c.v4.hash_layers[i] = true;
    c.vocab_size = 129280;
    c.hidden_size = 4096;
    c.num_attention_heads = 64;
    c.v4.head_dim = 512;
    c.qk_rope_head_dim = 64;
    c.q_lora_rank = 1024;
    c.v4.o_groups = 8;
    c.v4.o_lora_rank = 1024;
    c.moe_intermediate_size = 2048;
    c.n_routed_experts = 256;
    c.num_experts_per_tok = 6;
    c.v4.sliding_window = 128;
    c.v4.compress_rate_csa = 4;
    c.v4.compress_rate_hca = 128;
    c.indexer.n_heads = 64;
    c.indexer.head_dim = 128;
    c.indexer.topk = 512;
    c.v4.compress_rope.factor = 16;
    c.v4.compress_rope.original_max_position_embeddings = 65536;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown preset \"", preset, "\" (tiny, small, real)"));
  }
  c.max_position_embeddings = static_cast<int>(c.v4.compress_rope.factor) *
                              c.v4.compress_rope.original_max_position_embeddings;
  RETURN_IF_ERROR(c.Validate(absl::StrCat("preset v4/", preset)));
  return c;
}

}  // namespace

// DeepSeek-V2-Lite's config.json, field by field (16B parameters: for
// `--load_format dummy` on a GPU, or mkmodel --config_only).
absl::StatusOr<ModelConfig> V2LiteReal() {
  ASSIGN_OR_RETURN(ModelConfig c, PresetConfig("v2-lite", "small"));
  c.vocab_size = 102400;
  c.hidden_size = 2048;
  c.intermediate_size = 10944;
  c.moe_intermediate_size = 1408;
  c.num_hidden_layers = 27;
  c.num_attention_heads = 16;
  c.q_lora_rank = 0;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.n_routed_experts = 64;
  c.n_shared_experts = 2;
  c.num_experts_per_tok = 6;
  c.n_group = 1;
  c.topk_group = 1;
  c.topk_method = TopkMethod::kGreedy;
  c.scoring_func = ScoringFunc::kSoftmax;
  c.norm_topk_prob = false;
  c.routed_scaling_factor = 1.0;
  c.first_k_dense_replace = 1;
  c.rope.type = RopeType::kYarn;
  c.rope.theta = 10000.0;
  c.rope.factor = 40;
  c.rope.original_max_position_embeddings = 4096;
  c.rope.beta_fast = 32;
  c.rope.beta_slow = 1;
  c.rope.mscale = 0.707;
  c.rope.mscale_all_dim = 0.707;
  c.max_position_embeddings = 163840;
  c.bos_token_id = 100000;
  c.eos_token_ids = {100001};
  RETURN_IF_ERROR(c.Validate("preset v2-lite/real"));
  return c;
}

// DeepSeek-V3's config.json, field by field (671B parameters: for
// `--load_format dummy` on GPUs, usually with mkmodel --layers).
absl::StatusOr<ModelConfig> V3Real() {
  ASSIGN_OR_RETURN(ModelConfig c, PresetConfig("v3", "small"));
  c.vocab_size = 129280;
  c.hidden_size = 7168;
  c.intermediate_size = 18432;
  c.moe_intermediate_size = 2048;
  c.num_hidden_layers = 61;
  c.num_attention_heads = 128;
  c.q_lora_rank = 1536;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.n_routed_experts = 256;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 8;
  c.n_group = 8;
  c.topk_group = 4;
  c.first_k_dense_replace = 3;
  c.rope.original_max_position_embeddings = 4096;
  c.max_position_embeddings = 163840;
  RETURN_IF_ERROR(c.Validate("preset v3/real"));
  return c;
}

absl::StatusOr<ModelConfig> PresetConfig(const std::string& family, const std::string& preset) {
  if (family == "v4") return V4Preset(preset);
  if (preset == "real") {
    if (family == "v2-lite") return V2LiteReal();
    if (family == "v3") return V3Real();
    if (family == "v3.2") {  // DeepSeek-V3.2-Exp: V3's shapes plus the lightning indexer
      ASSIGN_OR_RETURN(ModelConfig c, V3Real());
      c.family = ModelFamily::kDeepseekV32;
      c.model_type = "deepseek_v32";
      c.indexer.n_heads = 64;
      c.indexer.head_dim = 128;
      c.indexer.topk = 2048;
      RETURN_IF_ERROR(c.Validate("preset v3.2/real"));
      return c;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("preset \"real\" exists for v2-lite, v3, v3.2 and v4 only, not ", family));
  }
  ModelConfig c;
  if (family == "v2-lite" || family == "v2") {
    c.family = ModelFamily::kDeepseekV2;
    c.model_type = "deepseek_v2";
  } else if (family == "v3") {
    c.family = ModelFamily::kDeepseekV3;
    c.model_type = "deepseek_v3";
  } else if (family == "v3.2") {
    c.family = ModelFamily::kDeepseekV32;
    c.model_type = "deepseek_v32";
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown family \"", family, "\" (v2-lite, v2, v3, v3.2, v4)"));
  }
  const bool v3_like = family == "v3" || family == "v3.2";
  if (preset == "tiny") {
    c.vocab_size = 512;
    c.hidden_size = 64;
    c.intermediate_size = 96;
    c.moe_intermediate_size = 32;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 4;
    c.kv_lora_rank = 32;
    c.qk_nope_head_dim = 16;
    c.qk_rope_head_dim = 8;
    c.v_head_dim = 16;
    c.n_routed_experts = 8;
    c.num_experts_per_tok = 2;
    c.q_lora_rank = family == "v2-lite" ? 0 : 48;
    if (family == "v3.2") {
      // Fewer than the model tests' prompts, so the sparse selection matters.
      c.indexer.topk = 8;
      c.indexer.n_heads = 4;
      c.indexer.head_dim = 32;
    }
  } else if (preset == "small") {
    c.vocab_size = 8192;
    c.hidden_size = 512;
    c.intermediate_size = 1024;
    c.moe_intermediate_size = 256;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 8;
    c.kv_lora_rank = 128;
    c.qk_nope_head_dim = 64;
    c.qk_rope_head_dim = 32;
    c.v_head_dim = 64;
    c.n_routed_experts = 16;
    c.num_experts_per_tok = 4;
    c.q_lora_rank = family == "v2-lite" ? 0 : 192;
    if (family == "v3.2") {
      c.indexer.topk = 64;
      c.indexer.n_heads = 8;
      c.indexer.head_dim = 64;
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown preset \"", preset, "\" (tiny, small, real)"));
  }
  c.n_shared_experts = family == "v2" ? 2 : 1;
  c.first_k_dense_replace = 1;
  c.moe_layer_freq = 1;
  c.rms_norm_eps = 1e-6;
  c.bos_token_id = 0;
  c.eos_token_ids = {1};
  c.rope.type = RopeType::kYarn;
  c.rope.theta = 10000.0;
  c.rope.beta_fast = 32;
  c.rope.beta_slow = 1;
  if (v3_like) {
    c.topk_method = TopkMethod::kNoauxTc;
    c.scoring_func = ScoringFunc::kSigmoid;
    c.n_group = 4;
    c.topk_group = 2;
    c.norm_topk_prob = true;
    c.routed_scaling_factor = 2.5;
    c.rope_interleave = true;
    c.rope.factor = 40;
    c.rope.mscale = 1.0;
    c.rope.mscale_all_dim = 1.0;
  } else {
    c.topk_method = family == "v2" ? TopkMethod::kGroupLimitedGreedy : TopkMethod::kGreedy;
    c.scoring_func = ScoringFunc::kSoftmax;
    c.n_group = family == "v2" ? 4 : 1;
    c.topk_group = family == "v2" ? 2 : 1;
    c.norm_topk_prob = false;
    c.routed_scaling_factor = family == "v2" ? 16.0 : 1.0;
    c.rope.factor = 40;
    c.rope.mscale = 0.707;
    c.rope.mscale_all_dim = 0.707;
  }
  c.rope.original_max_position_embeddings = preset == "tiny" ? 64 : 4096;
  c.max_position_embeddings =
      static_cast<int>(c.rope.factor) * c.rope.original_max_position_embeddings;
  RETURN_IF_ERROR(c.Validate(absl::StrCat("preset ", family, "/", preset)));
  return c;
}

bool IsFp8Linear(const std::string& name) {
  if (absl::EndsWith(name, "indexer.weights_proj.weight")) return false;  // bf16 in V3.2
  return absl::EndsWith(name, "_proj.weight") || absl::EndsWith(name, "_proj_with_mqa.weight") ||
         absl::EndsWith(name, "indexer.wq_b.weight") || absl::EndsWith(name, "indexer.wk.weight");
}

bool IsV4Fp8Linear(const std::string& name) {
  for (const char* suffix :
       {".attn.wq_a.weight", ".attn.wq_b.weight", ".attn.wkv.weight", ".attn.wo_a.weight",
        ".attn.wo_b.weight", ".attn.indexer.wq_b.weight", ".shared_experts.w1.weight",
        ".shared_experts.w2.weight", ".shared_experts.w3.weight"}) {
    if (absl::EndsWith(name, suffix)) return true;
  }
  return false;
}

namespace {

// "<x>.scale" for "<x>.weight": DeepSeek-V4's scale tensor names.
std::string V4ScaleName(const std::string& weight) {
  return std::string(absl::StripSuffix(weight, ".weight")) + ".scale";
}

// Block-scaled e4m3 with each 128 x 128 block's scale rounded up to a power
// of two (ue8m0: scale_fmt "ue8m0"), as DeepSeek-V4 quantizes its linears.
void Ue8m0Fp8Blocks(const std::vector<float>& w, int rows, int cols, std::vector<uint8_t>* codes,
                    std::vector<uint8_t>* scales) {
  const int rb = cpu::Fp8Blocks(rows), cb = cpu::Fp8Blocks(cols);
  scales->assign(static_cast<size_t>(rb) * cb, 127);
  for (int bi = 0; bi < rb; ++bi) {
    for (int bj = 0; bj < cb; ++bj) {
      const int r1 = std::min(rows, (bi + 1) * cpu::kFp8Block);
      const int c1 = std::min(cols, (bj + 1) * cpu::kFp8Block);
      float amax = 0.0f;
      for (int r = bi * cpu::kFp8Block; r < r1; ++r) {
        for (int c = bj * cpu::kFp8Block; c < c1; ++c)
          amax = std::max(amax, std::fabs(w[r * cols + c]));
      }
      int e = amax > 0 ? static_cast<int>(std::ceil(std::log2(amax / cpu::kFp8Max))) : 0;
      e = std::clamp(e, -127, 127);
      (*scales)[bi * cb + bj] = static_cast<uint8_t>(e + 127);
      const float inv = std::ldexp(1.0f, -e);
      for (int r = bi * cpu::kFp8Block; r < r1; ++r) {
        for (int c = bj * cpu::kFp8Block; c < c1; ++c) {
          (*codes)[r * cols + c] = F32ToF8E4M3(w[r * cols + c] * inv);
        }
      }
    }
  }
}

}  // namespace

absl::Status WriteRandomCheckpoint(const ModelConfig& config, const std::string& dir,
                                   const RandomCheckpointOptions& options) {
  if (options.dtype != DType::kBF16 && options.dtype != DType::kF16 &&
      options.dtype != DType::kF32 && options.dtype != DType::kF8E4M3) {
    return absl::InvalidArgumentError(
        "random checkpoints are written as BF16, F16, F32 or F8_E4M3 (block-scaled FP8)");
  }
  const bool fp8 = options.dtype == DType::kF8E4M3;
  const bool v4 = config.layers() == LayerArch::kV4;
  RETURN_IF_ERROR(MakeDirs(dir));
  std::mt19937_64 rng(options.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  SafetensorsWriter writer;
  for (const TensorSpec& spec : CheckpointSchema(config)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    if (spec.integer) {
      // V4's tid2eid: each token's experts, distinct, uniformly drawn.
      const int64_t k = spec.shape[1];
      std::vector<int64_t> table(static_cast<size_t>(n));
      std::vector<int64_t> experts(config.n_routed_experts);
      for (int64_t row = 0; row < spec.shape[0]; ++row) {
        std::iota(experts.begin(), experts.end(), 0);
        std::shuffle(experts.begin(), experts.end(), rng);
        std::copy(experts.begin(), experts.begin() + k, table.begin() + row * k);
      }
      std::vector<uint8_t> bytes(table.size() * sizeof(int64_t));
      std::memcpy(bytes.data(), table.data(), bytes.size());
      writer.Add(spec.name, DType::kI64, spec.shape, std::move(bytes));
      continue;
    }
    // Norm weights (and V4's mHC scales) near 1, biases small, the rest N(0, std).
    const bool is_norm =
        absl::EndsWith(spec.name, "norm.weight") || absl::EndsWith(spec.name, "_scale");
    const bool is_bias = absl::EndsWith(spec.name, "e_score_correction_bias") ||
                         absl::EndsWith(spec.name, "k_norm.bias") ||
                         absl::EndsWith(spec.name, "gate.bias");
    if (fp8 && v4 && RoutedExpertOf(spec.name) >= 0) {
      // As DeepSeek-V4 ships its routed experts: MXFP4, e2m1 pairs as I8 and
      // a ue8m0 scale per 32 inputs in "<x>.scale".
      const int rows = static_cast<int>(spec.shape[0]), cols = static_cast<int>(spec.shape[1]);
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = options.std * normal(rng);
      std::vector<uint8_t> packed(v.size() / 2), scales(v.size() / cpu::kMxfp4Block);
      cpu::QuantizeMxfp4(v.data(), packed.data(), scales.data(), rows, cols);
      writer.Add(spec.name, DType::kI8, {rows, cols / 2}, std::move(packed));
      writer.Add(V4ScaleName(spec.name), DType::kF8E8M0, {rows, cols / cpu::kMxfp4Block},
                 std::move(scales));
      continue;
    }
    if (fp8 && v4 && IsV4Fp8Linear(spec.name)) {
      // DeepSeek-V4's FP8 linears: e4m3 codes with a power-of-two (ue8m0)
      // scale per 128 x 128 block in "<x>.scale".
      const int rows = static_cast<int>(spec.shape[0]), cols = static_cast<int>(spec.shape[1]);
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = options.std * normal(rng);
      std::vector<uint8_t> codes(v.size());
      std::vector<uint8_t> scales;
      Ue8m0Fp8Blocks(v, rows, cols, &codes, &scales);
      writer.Add(spec.name, DType::kF8E4M3, spec.shape, std::move(codes));
      writer.Add(V4ScaleName(spec.name), DType::kF8E8M0,
                 {cpu::Fp8Blocks(rows), cpu::Fp8Blocks(cols)}, std::move(scales));
      continue;
    }
    if (fp8 && !v4 && IsFp8Linear(spec.name)) {
      // As DeepSeek ships it: e4m3 codes and a float32 scale per 128 x 128 block.
      const int rows = static_cast<int>(spec.shape[0]), cols = static_cast<int>(spec.shape[1]);
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = options.std * normal(rng);
      std::vector<uint8_t> codes(v.size());
      std::vector<float> scales(static_cast<size_t>(cpu::Fp8Blocks(rows)) * cpu::Fp8Blocks(cols));
      cpu::QuantizeFp8Blocks(v.data(), codes.data(), scales.data(), rows, cols);
      writer.Add(spec.name, DType::kF8E4M3, spec.shape, std::move(codes));
      std::vector<uint8_t> sb(scales.size() * sizeof(float));
      std::memcpy(sb.data(), scales.data(), sb.size());
      writer.Add(spec.name + "_scale_inv", DType::kF32,
                 {cpu::Fp8Blocks(rows), cpu::Fp8Blocks(cols)}, std::move(sb));
      continue;
    }
    const DType dtype = fp8 ? DType::kBF16 : options.dtype;
    const size_t es = DTypeSize(dtype);
    std::vector<uint8_t> bytes(static_cast<size_t>(n) * es);
    for (int64_t i = 0; i < n; ++i) {
      float v = normal(rng);
      v = is_norm ? 1.0f + 0.1f * v : (is_bias ? 0.1f * v : options.std * v);
      if (dtype == DType::kBF16) {
        const uint16_t b = F32ToBf16(v);
        std::memcpy(&bytes[i * es], &b, es);
      } else if (dtype == DType::kF16) {
        const uint16_t b = F32ToF16(v);
        std::memcpy(&bytes[i * es], &b, es);
      } else {
        std::memcpy(&bytes[i * es], &v, es);
      }
    }
    writer.Add(spec.name, dtype, spec.shape, std::move(bytes));
  }
  ModelConfig written = config;
  written.fp8_block_weights = fp8;
  written.mxfp4_experts = fp8 && v4;
  RETURN_IF_ERROR(
      WriteStringToFile(JoinPath(dir, "config.json"), written.ToJson(options.new_rope_form)));
  if (!options.tokenizer_json.empty()) {
    RETURN_IF_ERROR(WriteStringToFile(JoinPath(dir, "tokenizer.json"), options.tokenizer_json));
  }
  return writer.WriteCheckpoint(dir, options.num_shards);
}

absl::Status WriteBf16RoundedCopy(const std::string& dir, const std::string& out_dir) {
  auto kept_f32 = [](const std::string& n) {
    for (const char* suffix : {".gate.weight", ".gate.bias", "e_score_correction_bias", ".ape",
                               ".attn_sink", "indexer.k_norm.weight", "indexer.k_norm.bias"}) {
      if (absl::EndsWith(n, suffix)) return true;
    }
    return n.find("hc_") != std::string::npos;
  };
  RETURN_IF_ERROR(MakeDirs(out_dir));
  ASSIGN_OR_RETURN(std::string config, ReadFileToString(JoinPath(dir, "config.json")));
  RETURN_IF_ERROR(WriteStringToFile(JoinPath(out_dir, "config.json"), config));
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
  SafetensorsWriter w;
  for (const auto& [name, t] : ckpt->tensors()) {
    std::vector<uint8_t> bytes(t->data, t->data + t->nbytes);
    if (t->dtype == DType::kF32 && !kept_f32(name)) {
      float* v = reinterpret_cast<float*>(bytes.data());
      for (int64_t i = 0; i < t->numel(); ++i) v[i] = Bf16ToF32(F32ToBf16(v[i]));
    }
    w.Add(name, t->dtype, t->shape, std::move(bytes));
  }
  return w.WriteCheckpoint(out_dir, 1);
}

}  // namespace moesh
