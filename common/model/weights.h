// The weights of a DeepSeek checkpoint in memory (float32 on the CPU), split
// the way the services split the model: everything an attention worker needs
// (AttentionWeights) and the routed experts of one shard (ExpertShardWeights).
//
// The checkpoint schema (every expected tensor name and shape) is defined in
// one place, CheckpointSchema(); loading validates a checkpoint against it
// before reading anything: missing, extra, misshapen or wrongly typed tensors
// are INVALID_ARGUMENT naming the file and the tensor.
#ifndef MOESH_COMMON_MODEL_WEIGHTS_H_
#define MOESH_COMMON_MODEL_WEIGHTS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "common/model/safetensors.h"

namespace moesh {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool integer = false;  // an index table (I64 or I32), e.g. V4's tid2eid
};

// Every tensor a checkpoint of `config` holds, in a stable order. Per-expert
// names (mlp.experts.E.{gate,up,down}_proj.weight) as DeepSeek ships them.
std::vector<TensorSpec> CheckpointSchema(const ModelConfig& config);

// Checks `ckpt` against the schema: nothing missing, nothing extra (an MTP
// layer at index >= num_hidden_layers is ignored, as transformers does),
// shapes equal, float dtypes only (F8_E4M3 only with a weight_scale_inv).
absl::Status ValidateCheckpoint(const ModelConfig& config, const Checkpoint& ckpt);

// A SwiGLU MLP: gate and up stacked for one GEMM.
struct MlpWeights {
  int intermediate = 0;
  std::vector<float> gate_up;  // [2 * intermediate, hidden]
  std::vector<float> down;     // [hidden, intermediate]
};

// A DeepSeek-V4 compressor: per token c series of d features and their gates
// (c = 2 for CSA's overlapping windows, 1 for HCA), softmax-pooled per window
// with the per-slot bias `ape`, then RMSNorm'd.
struct V4CompressorWeights {
  std::vector<float> wkv;    // [c * d, hidden]
  std::vector<float> wgate;  // [c * d, hidden]
  std::vector<float> ape;    // [rate, c * d]
  std::vector<float> norm;   // [d]
};

// The V4-only part of a layer (input_layernorm / post_attention_layernorm,
// gate, gate_bias and shared_experts of AttentionLayerWeights hold attn_norm,
// ffn_norm, ffn.gate.weight, ffn.gate.bias and ffn.shared_experts).
struct V4LayerWeights {
  // mHC mappings of the attention and FFN sites.
  std::vector<float> hc_attn_fn, hc_ffn_fn;        // [(2 + hc) * hc, hc * hidden]
  std::vector<float> hc_attn_base, hc_ffn_base;    // [(2 + hc) * hc]
  std::vector<float> hc_attn_scale, hc_ffn_scale;  // [3]
  std::vector<float> wq_a;                         // [q_lora_rank, hidden]
  std::vector<float> q_norm;                       // [q_lora_rank]
  std::vector<float> wq_b;                         // [heads * head_dim, q_lora_rank]
  std::vector<float> wkv;                          // [head_dim, hidden]
  std::vector<float> kv_norm;                      // [head_dim]
  std::vector<float> wo_a;                // [o_groups * o_lora_rank, heads * head_dim / o_groups]
  std::vector<float> wo_b;                // [hidden, o_groups * o_lora_rank]
  std::vector<float> sinks;               // [heads]
  V4CompressorWeights compressor;         // CSA (c = 2) and HCA (c = 1) layers
  V4CompressorWeights index_compressor;   // CSA layers: c = 2, d = index_head_dim
  std::vector<float> index_wq_b;          // [index_n_heads * index_head_dim, q_lora_rank]
  std::vector<float> index_weights_proj;  // [index_n_heads, hidden]
  std::vector<int32_t> tid2eid;           // [vocab, top_k]; hash-routed layers
};

struct AttentionLayerWeights {
  std::vector<float> input_layernorm;           // [hidden]
  std::vector<float> post_attention_layernorm;  // [hidden]
  std::vector<float> q_proj;          // [heads * qk_head_dim, hidden]; iff q_lora_rank == 0
  std::vector<float> q_a_proj;        // [q_lora_rank, hidden]; iff q_lora_rank > 0
  std::vector<float> q_a_layernorm;   // [q_lora_rank]
  std::vector<float> q_b_proj;        // [heads * qk_head_dim, q_lora_rank]
  std::vector<float> kv_a_proj;       // [kv_lora_rank + qk_rope_head_dim, hidden]
  std::vector<float> kv_a_layernorm;  // [kv_lora_rank]
  std::vector<float> kv_b_proj;       // [heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]
  std::vector<float> o_proj;          // [hidden, heads * v_head_dim]
  // DSA indexer (V3.2 only; empty otherwise).
  std::vector<float> indexer_wq_b;          // [index_n_heads * index_head_dim, q_lora_rank]
  std::vector<float> indexer_wk;            // [index_head_dim, hidden]
  std::vector<float> indexer_k_norm;        // [index_head_dim] LayerNorm weight
  std::vector<float> indexer_k_norm_bias;   // [index_head_dim] LayerNorm bias
  std::vector<float> indexer_weights_proj;  // [index_n_heads, hidden]
  bool is_moe = false;
  MlpWeights dense_mlp;          // iff !is_moe
  std::vector<float> gate;       // [n_routed_experts, hidden]; iff is_moe
  std::vector<float> gate_bias;  // [n_routed_experts] e_score_correction_bias; may be empty
  MlpWeights shared_experts;     // iff is_moe && n_shared_experts > 0
  V4LayerWeights v4;             // DeepSeek-V4 only
};

// Everything but the routed experts.
struct AttentionWeights {
  std::vector<float> embed_tokens;  // [vocab, hidden]
  std::vector<AttentionLayerWeights> layers;
  std::vector<float> norm;     // [hidden]
  std::vector<float> lm_head;  // [vocab, hidden]; empty iff tied (use embed_tokens)
  // DeepSeek-V4's final collapse of the hc_mult streams.
  std::vector<float> hc_head_fn;     // [hc, hc * hidden]
  std::vector<float> hc_head_base;   // [hc]
  std::vector<float> hc_head_scale;  // [1]

  const float* lm_head_data() const {
    return lm_head.empty() ? embed_tokens.data() : lm_head.data();
  }

  static absl::StatusOr<std::unique_ptr<AttentionWeights>> Load(const ModelConfig& config,
                                                                const Checkpoint& ckpt);
};

// For loaders that move each part elsewhere (a device) before reading the
// next, so the host holds one part at a time (V2/V3/V3.2; V4 loads whole):
// Load's per-layer step (no PlanRead), and the names of the tensors outside
// the layers ([vocab, hidden], [hidden], [vocab, hidden] unless tied).
// With `stored` (weights.h's StoredLinear, below), the layer's F8_E4M3 linears
// (q_a_proj or q_proj, q_b_proj, kv_a_proj_with_mqa, o_proj, and the dense MLP
// or shared experts when all three of theirs are) are left in the checkpoint
// as stored there and their vectors in *lw stay empty (their views handed back
// with ReleaseStoredLinear by whoever copies them).
struct StoredLayerLinears;
absl::Status LoadAttentionLayer(const ModelConfig& config, const Checkpoint& ckpt, int layer,
                                AttentionLayerWeights* lw, StoredLayerLinears* stored = nullptr);
extern const char kEmbedTokensTensor[];  // "model.embed_tokens.weight"
extern const char kFinalNormTensor[];    // "model.norm.weight"
extern const char kLmHeadTensor[];       // "lm_head.weight"

// The routed experts of one shard: for each MoE layer, the experts listed.
struct ExpertShardWeights {
  std::set<int> expert_ids;                         // the shard's experts
  std::map<int, std::map<int, MlpWeights>> layers;  // layer -> expert id -> weights

  // `expert_ids` empty means all experts.
  static absl::StatusOr<std::unique_ptr<ExpertShardWeights>> Load(const ModelConfig& config,
                                                                  const Checkpoint& ckpt,
                                                                  std::set<int> expert_ids);
  // The shard's experts and layers with empty weights: for a device that
  // makes its own (--load_format dummy); nothing may compute from it.
  static absl::StatusOr<std::unique_ptr<ExpertShardWeights>> Placeholder(const ModelConfig& config,
                                                                         std::set<int> expert_ids);
  // The shard's experts and layers with empty weights that stay in `ckpt`
  // (which must outlive the shard) until a device stage reads them as stored
  // (ReadStoredExpert): no float32 copy on the host. Nothing is read here.
  static absl::StatusOr<std::unique_ptr<ExpertShardWeights>> Deferred(const ModelConfig& config,
                                                                      const Checkpoint& ckpt,
                                                                      std::set<int> expert_ids);
  // Empty weights a device fills with random values (not Deferred).
  bool is_placeholder() const;

  const Checkpoint* deferred = nullptr;  // set by Deferred
};

// Reads one tensor as float32, checking its shape; dequantises F8_E4M3 with
// its 128x128 block weight_scale_inv. The tensor (and its scale) are then
// Checkpoint::Consumed: their pages leave this process.
absl::StatusOr<std::vector<float>> ReadTensorF32(const Checkpoint& ckpt, const std::string& name,
                                                 const std::vector<int64_t>& shape);
// A linear [n, k] as its checkpoint stores it, for loaders that keep FP8 on a
// device: an F8_E4M3 tensor's codes stay a view into the checkpoint's mapping
// (with its 128 x 128 block scales widened to float32, row-major [ceil(n /
// 128), ceil(k / 128)] as shipped); any other dtype is read as float32
// (ReadTensorF32). Hand a read one back with ReleaseStoredLinear once copied.
struct StoredLinear {
  const TensorView* codes = nullptr;  // F8_E4M3 [n, k]; null: `values` hold the weight
  const TensorView* scale_view = nullptr;
  std::vector<float> scale;   // iff codes
  std::vector<float> values;  // [n, k] iff !codes
  bool fp8() const { return codes != nullptr; }
};
absl::StatusOr<StoredLinear> ReadStoredLinear(const Checkpoint& ckpt, const std::string& name,
                                              const std::vector<int64_t>& shape);
// Checkpoint::Consumed for an FP8 linear's views (nothing for values).
void ReleaseStoredLinear(const Checkpoint& ckpt, const StoredLinear& s);
// s->values = the dequantized codes (released); nothing for values.
void StoredToValues(const Checkpoint& ckpt, StoredLinear* s);

// One routed expert's SwiGLU linears as stored.
struct StoredMlp {
  int intermediate = 0;
  StoredLinear gate, up;  // [intermediate, hidden]
  StoredLinear down;      // [hidden, intermediate]
};
// LoadAttentionLayer's FP8 linears as stored (each fp8() or left empty).
struct StoredLayerLinears {
  StoredLinear q;  // q_a_proj (q_lora_rank > 0) or q_proj
  StoredLinear q_b, kv_a, o_proj;
  StoredMlp mlp;  // the dense MLP or the shared experts
};
absl::StatusOr<StoredMlp> ReadStoredExpert(const ModelConfig& config, const Checkpoint& ckpt,
                                           int layer, int expert);

// Reads a float tensor of `shape` (rows = shape[0]) as bf16 for a device copy
// without a float32 copy of it on the host: `fn(row0, rows, bf16 values)` over
// chunks of rows: a BF16 tensor in one chunk, its bytes as stored (a view of
// the mapping, maybe unaligned), another dtype converted about 16 MB at a time
// (F8_E4M3 and MXFP4 dequantized whole first). The pages are released after.
absl::Status ReadTensorAsBf16(
    const Checkpoint& ckpt, const std::string& name, const std::vector<int64_t>& shape,
    const std::function<absl::Status(int64_t row0, int64_t rows, const void* bf16)>& fn);
// Reads an integer (I64 or I32) tensor as int32, checking its shape.
absl::StatusOr<std::vector<int32_t>> ReadTensorI32(const Checkpoint& ckpt, const std::string& name,
                                                   const std::vector<int64_t>& shape);

// The routed expert a tensor belongs to ("model.layers.L.{mlp,ffn}.experts.E.…"),
// or -1 (shared experts, everything else).
int RoutedExpertOf(const std::string& name);
// Bytes of the tensors AttentionWeights::Load reads from `ckpt` (everything
// but the routed experts and what loading ignores: MTP layers, ...), and those
// ExpertShardWeights::Load reads for the experts `ids` (all if empty), scales
// included: the totals the loaders plan (Checkpoint::PlanRead) for progress.
uint64_t AttentionLoadBytes(const ModelConfig& config, const Checkpoint& ckpt);
uint64_t ExpertLoadBytes(const ModelConfig& config, const Checkpoint& ckpt,
                         const std::set<int>& ids);

// DeepSeek-V4's side of the above (weights_v4.cc): its checkpoint names are
// DeepSeek's (model.layers.N.attn.wq_a, ffn.experts.E.w1, hc_attn_fn, ...) as
// transformers' save_pretrained writes them.
std::vector<TensorSpec> V4CheckpointSchema(const ModelConfig& config);
absl::Status LoadV4AttentionWeights(const ModelConfig& config, const Checkpoint& ckpt,
                                    AttentionWeights* w);
// "model.layers.L.ffn.experts.E." for V4, "model.layers.L.mlp.experts.E." otherwise.
std::string ExpertPrefix(const ModelConfig& config, int layer, int expert);
// Reads a SwiGLU MLP stored as three tensors named prefix + gate / up / down.
absl::StatusOr<MlpWeights> ReadMlpTensors(const Checkpoint& ckpt, const std::string& prefix,
                                          int inter, int hidden, const std::string& gate,
                                          const std::string& up, const std::string& down);

}  // namespace moesh

#endif  // MOESH_COMMON_MODEL_WEIGHTS_H_
