// ModelConfig: the architecture of a DeepSeek-family checkpoint, parsed from
// its config.json as DeepSeek and transformers ship it.
//
// Both rope spellings are accepted: DeepSeek's legacy top-level `rope_theta`
// plus `rope_scaling` ({"type": "yarn", "factor", ...}) and transformers'
// newer `rope_parameters` ({"rope_type", "rope_theta", ...}). Fields that
// contradict each other are rejected with INVALID_ARGUMENT naming them.
#ifndef MOESH_COMMON_MODEL_CONFIG_H_
#define MOESH_COMMON_MODEL_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/family.h"

namespace moesh {

// DeepSeek-V4's attention per layer: a sliding window only, plus compressed
// sparse attention (CSA: overlapping windows of compress_rate_csa tokens, an
// indexer picks index_topk entries), or plus heavily compressed attention
// (HCA: windows of compress_rate_hca tokens, all entries).
enum class V4AttentionType { kSliding, kCompressedSparse, kHeavilyCompressed };
enum class RopeType { kDefault, kYarn };

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  // YaRN only.
  double factor = 1.0;
  int original_max_position_embeddings = 0;  // 0: not given
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;            // 0: not given
  double mscale_all_dim = 0.0;    // 0: not given
  double attention_factor = 0.0;  // 0: derived from mscale / mscale_all_dim
  bool truncate = true;
};

// The lightning indexer (DeepSeek-V3.2's DSA; DeepSeek-V4's CSA layers):
// n_heads query heads of head_dim over q_lora's latent, one shared key per
// token (V3.2: LayerNorm'd, RoPE in the rotate-half layout on its first
// qk_rope_head_dim dims); each query attends to the `topk` cached tokens (V4:
// compressed entries) it scores highest. config.json: index_topk,
// index_head_dim, index_n_heads.
struct IndexerConfig {
  int topk = 0;
  int head_dim = 0;
  int n_heads = 0;
};

// DeepSeek-V4's part of the config (config_v4.cc parses, validates and
// writes it). qk_rope_head_dim is the rotated tail of each head (head_dim *
// partial_rotary_factor); the config's `rope` is the sliding layers' ("main")
// rope, compress_rope the CSA/HCA layers'.
struct V4Config {
  int head_dim = 0;
  int o_groups = 0;
  int o_lora_rank = 0;
  int sliding_window = 0;
  int compress_rate_csa = 4;
  int compress_rate_hca = 128;
  std::vector<V4AttentionType> layer_types;  // [num_hidden_layers]
  std::vector<bool> hash_layers;             // [num_hidden_layers]: experts from tid2eid
  RopeConfig compress_rope;
  int hc_mult = 0;
  int hc_sinkhorn_iters = 0;
  double hc_eps = 1e-6;

  // The compress rate of layer l (0 for a sliding-only layer).
  int CompressRate(int l) const {
    return layer_types[l] == V4AttentionType::kSliding            ? 0
           : layer_types[l] == V4AttentionType::kCompressedSparse ? compress_rate_csa
                                                                  : compress_rate_hca;
  }
  // Compressor series per token of layer l: 2 (CSA's overlapping windows),
  // 1 (HCA), 0 (sliding only).
  int CompressSeries(int l) const {
    return layer_types[l] == V4AttentionType::kSliding            ? 0
           : layer_types[l] == V4AttentionType::kCompressedSparse ? 2
                                                                  : 1;
  }
};

struct ModelConfig {
  ModelFamily family = ModelFamily::kDeepseekV3;
  std::string model_type;  // traits().model_type

  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;      // dense MLP layers
  int moe_intermediate_size = 0;  // each routed / shared expert
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  // quantization_config {quant_method fp8, fmt e4m3, weight_block_size [128,
  // 128], activation_scheme dynamic} (DeepSeek-V3/R1/V3.2 as shipped): the
  // linear weights are e4m3 with a `weight_scale_inv` per 128 x 128 block.
  bool fp8_block_weights = false;
  // DeepSeek-V4 quantized (fp8_block_weights, its scales ue8m0 `.scale`
  // tensors) with expert_dtype fp4 (the default): the routed experts are MXFP4
  // (kernels/cpu/mxfp4.h), e2m1 pairs [n, k / 2] I8 with an F8_E8M0 `.scale`
  // [n, k / 32].
  bool mxfp4_experts = false;

  // MLA. q_lora_rank == 0 means q_proj is a plain projection (V2-Lite).
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  RopeConfig rope;
  // V2 and V3.2 always rotate interleaved pairs; V3 follows `rope_interleave`
  // (false: the neox rotate-half layout).
  bool rope_interleave = true;

  // The family parts: the lightning indexer (V3.2; V4's CSA layers) and
  // DeepSeek-V4's own fields (all zero / default for the other families).
  IndexerConfig indexer;
  V4Config v4;

  // MoE.
  int n_routed_experts = 0;
  int n_shared_experts = 0;
  int num_experts_per_tok = 0;
  int n_group = 1;
  int topk_group = 1;
  TopkMethod topk_method = TopkMethod::kGreedy;
  ScoringFunc scoring_func = ScoringFunc::kSoftmax;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  int first_k_dense_replace = 0;
  int moe_layer_freq = 1;
  double swiglu_limit = 0.0;  // SwiGLU's clamp (V4); 0: none

  bool tie_word_embeddings = false;
  int bos_token_id = -1;           // -1: none
  std::vector<int> eos_token_ids;  // may be empty

  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  const FamilyTraits& traits() const { return TraitsOf(family); }
  LayerArch layers() const { return traits().layers; }
  bool has_indexer() const { return traits().indexer; }
  // V4: width of layer l's cache rows (see v4_attention.h for the layout).
  int V4RowWidth(int l) const;
  // Width of one token's KV cache row per layer:
  // [kv_lora_rank latent | qk_rope_head_dim roped key | index_head_dim indexer
  // key (V3.2 only)].
  // V4: the widest layer's row (narrower layers leave the tail unused).
  int kv_cache_row_width() const;
  // True iff layer `l` has an MoE block (else a dense MLP).
  bool IsMoeLayer(int l) const {
    return n_routed_experts > 0 && l >= first_k_dense_replace && l % moe_layer_freq == 0;
  }
  // Softmax scale of attention: qk_head_dim^-0.5, times YaRN's mscale^2.
  double SoftmaxScale() const;

  // Parses config.json text; `source` names the file in error messages.
  static absl::StatusOr<ModelConfig> FromJson(const std::string& text, const std::string& source);
  // Reads <dir>/config.json.
  static absl::StatusOr<ModelConfig> Load(const std::string& dir);
  // Serialises in the legacy DeepSeek form (or rope_parameters if `new_rope_form`);
  // V4 always in transformers' form.
  std::string ToJson(bool new_rope_form = false) const;
  // Identifies the architecture, so services refuse peers built for another
  // model: "deepseek_v3/L61/H7168/E256/V129280".
  std::string Fingerprint() const;
  // Checks internal consistency; INVALID_ARGUMENT naming the fields otherwise.
  absl::Status Validate(const std::string& source) const;
  // Validate's family parts (V2/V3/V3.2, V4: config_v4.cc); what every family
  // shares (the sizes every model has, the EOS ids) is Validate's.
  absl::Status ValidateMla(const std::string& source) const;
  absl::Status ValidateV4(const std::string& source) const;
};

// YaRN's magnitude scale: 1 for scale <= 1, else 0.1 * mscale * ln(scale) + 1.
double YarnGetMscale(double scale, double mscale);

}  // namespace moesh

#endif  // MOESH_COMMON_MODEL_CONFIG_H_
