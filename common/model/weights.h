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
  bool is_moe = false;
  MlpWeights dense_mlp;              // iff !is_moe
  std::vector<float> gate;           // [n_routed_experts, hidden]; iff is_moe
  std::vector<float> gate_bias;      // [n_routed_experts] e_score_correction_bias; may be empty
  MlpWeights shared_experts;         // iff is_moe && n_shared_experts > 0
};

// Everything but the routed experts.
struct AttentionWeights {
  std::vector<float> embed_tokens;  // [vocab, hidden]
  std::vector<AttentionLayerWeights> layers;
  std::vector<float> norm;     // [hidden]
  std::vector<float> lm_head;  // [vocab, hidden]; empty iff tied (use embed_tokens)

  const float* lm_head_data() const { return lm_head.empty() ? embed_tokens.data() : lm_head.data(); }

  static absl::StatusOr<std::unique_ptr<AttentionWeights>> Load(const ModelConfig& config,
                                                                const Checkpoint& ckpt);
};

// The routed experts of one shard: for each MoE layer, the experts listed.
struct ExpertShardWeights {
  std::set<int> expert_ids;                      // the shard's experts
  std::map<int, std::map<int, MlpWeights>> layers;  // layer -> expert id -> weights

  // `expert_ids` empty means all experts.
  static absl::StatusOr<std::unique_ptr<ExpertShardWeights>> Load(const ModelConfig& config,
                                                                   const Checkpoint& ckpt,
                                                                   std::set<int> expert_ids);
};

// Reads one tensor as float32, checking its shape; dequantises F8_E4M3 with
// its 128x128 block weight_scale_inv.
absl::StatusOr<std::vector<float>> ReadTensorF32(const Checkpoint& ckpt, const std::string& name,
                                                 const std::vector<int64_t>& shape);

}  // namespace moesh

#endif  // MOESH_COMMON_MODEL_WEIGHTS_H_
