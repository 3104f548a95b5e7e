// CudaModel: a DeepSeek V2/V3/V3.2/V4 model run entirely on one GPU: weights
// in bf16 on the device, a paged latent KV cache in device memory sized from
// free memory, and a batched forward pass whose decode step can replay as a
// CUDA graph. It coordinates its parts:
//   * StepPlanner (step_planner.h): a step's tokens validated against the
//     sequences, cut into passes, uploaded;
//   * LayerStack (layer_stack.h): the family's layers (MlaLayerStack for
//     V2/V3/V3.2, V4LayerStack for V4), each layer's FFN through FfnBlock
//     (ffn_block.h: dense MLP, MoE on the device or behind an ExpertClient);
//   * GraphRunner (graph_runner.h): decode steps as whole or piecewise graphs;
//   * KvStore (kv_store.h): the sequences and their blocks in the pool, and
//     the KV handoff in and out of it;
// and runs the head: the final norm (the stack's), lm_head (fp32 logits),
// greedy + log-probabilities or the GPU sampler on the device.
//
// Not thread-safe: one caller at a time (it owns one stream).
#ifndef MOESH_COMMON_CUDA_BACKEND_CUDA_MODEL_H_
#define MOESH_COMMON_CUDA_BACKEND_CUDA_MODEL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/cuda_backend/cuda_model_options.h"
#include "common/cuda_backend/device_weights.h"
#include "common/cuda_backend/ffn_block.h"
#include "common/cuda_backend/forward_context.h"
#include "common/cuda_backend/graph_runner.h"
#include "common/cuda_backend/kv_pool.h"
#include "common/cuda_backend/kv_store.h"
#include "common/cuda_backend/layer_stack.h"
#include "common/cuda_backend/sample_rows.h"
#include "common/cuda_backend/step_planner.h"
#include "common/model/config.h"
#include "common/model/expert_client.h"
#include "common/model/kv_cache.h"
#include "common/model/weights.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"

namespace moesh::cuda {

// GPU time of one eager forward pass by phase, summed over the layers, from
// events between the phases (ProfileStep). Where the GPU outruns the host's
// launches (small batches), the phases include the launch gaps.
struct PhaseTimes {
  double embed_ms = 0, attention_ms = 0, dense_mlp_ms = 0, moe_ms = 0, head_ms = 0, total_ms = 0;
};

// The GPU sampler's rows for a Step, one per sequence in the step's order
// (common/cuda_backend/sample_rows.h AppendSampleRow).
struct StepSampling {
  std::vector<SampleRow> rows;
  std::vector<PenaltyEntry> penalties;
};

// The token chosen per sequence (greedy, or sampled with a StepSampling),
// with log-probabilities (natural log of the softmax of the fp32 logits).
struct StepOutput {
  std::vector<int32_t> next_ids;     // [num_seqs]
  std::vector<float> next_logprobs;  // [num_seqs]: of the greedy token, whatever was sampled
  int top_k = 0;
  std::vector<int32_t> topk_ids;     // [num_seqs, top_k], best first
  std::vector<float> topk_logprobs;  // [num_seqs, top_k]
};

class CudaModel {
 public:
  // Loads <dir>/config.json and its safetensors (validating the checkpoint),
  // streamed to the device: FromCheckpoint.
  static absl::StatusOr<std::unique_ptr<CudaModel>> Load(const std::string& dir,
                                                         const CudaModelOptions& options);
  // The weights of a validated checkpoint streamed to the device
  // (DeviceWeights::FromCheckpoint: the host holds about one layer at a time;
  // an FP8 checkpoint's expert codes are copied as they are).
  static absl::StatusOr<std::unique_ptr<CudaModel>> FromCheckpoint(const ModelConfig& config,
                                                                   const Checkpoint& ckpt,
                                                                   const CudaModelOptions& options);
  // `experts` must hold every routed expert iff options.routed_experts_on_device
  // (it is not read otherwise and may be null).
  static absl::StatusOr<std::unique_ptr<CudaModel>> FromHost(const ModelConfig& config,
                                                             const AttentionWeights& attention,
                                                             const ExpertShardWeights* experts,
                                                             const CudaModelOptions& options);
  // Random weights generated on the device (--load_format dummy).
  static absl::StatusOr<std::unique_ptr<CudaModel>> Dummy(const ModelConfig& config, uint64_t seed,
                                                          const CudaModelOptions& options);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  const ModelConfig& config() const { return config_; }
  const DeviceWeights& weights() const { return *weights_; }
  const KvPool& kv_pool() const { return *kv_; }
  // The cache blocks' bookkeeping: free blocks, the prefix cache's counters
  // and block hashes.
  const KvBlockAllocator& kv_blocks() const { return store_->blocks(); }
  // Whether full blocks are shared (options.prefix_cache, not V4).
  bool prefix_cache() const { return store_->blocks().prefix_cache(); }
  int max_model_len() const { return max_model_len_; }
  const DeviceInfo& device_info() const { return info_; }
  bool has_routed_experts() const { return options_.routed_experts_on_device; }

  // Sequences: each owns cache blocks until released. AddSequence(n)
  // allocates the blocks of n tokens up front (RESOURCE_EXHAUSTED, adding
  // nothing, if they are not free); later steps allocate more as needed.
  // With the prefix cache the sequence starts with the cached rows of the
  // leading full blocks of `prefix` (SequenceLength says how many; at most
  // prefix.size() - 1), shared with the sequences that hold them.
  absl::StatusOr<int> AddSequence(int reserve_tokens = 0, absl::Span<const int32_t> prefix = {});
  // Offers the sequence's full blocks to the prefix cache: `tokens` are the
  // tokens of its rows (the prompt, then what was generated). A no-op
  // without the prefix cache. INVALID_ARGUMENT for no such sequence.
  absl::Status PublishSequence(int seq, absl::Span<const int32_t> tokens);
  // Allocates blocks so that `seq` covers `tokens` tokens now. INVALID_ARGUMENT
  // for no such sequence or beyond max_model_len; RESOURCE_EXHAUSTED (adding
  // nothing) if the blocks are not free.
  absl::Status ReserveSequence(int seq, int tokens);
  absl::Status ReleaseSequence(int seq);
  absl::StatusOr<int> SequenceLength(int seq) const;

  // Runs every sequence's new tokens through the model as one batch (in
  // chunks of max_tokens_per_step), appending to the caches. Step returns the
  // greedy choice per sequence (top_logprobs in [0, 20]), or with `sampling`
  // (a row per sequence) the GPU sampler's (the log-probabilities are the
  // raw logits', as without); INTERNAL if it picks no token (non-finite
  // logits). ForwardLogits the
  // fp32 logits of each sequence's last token, [num_seqs, vocab], on the host
  // (ForwardAllLogits: of every token).
  // INVALID_ARGUMENT for unknown or repeated sequences, empty or
  // out-of-vocabulary tokens, more than max_num_seqs sequences or a sequence
  // beyond max_model_len; RESOURCE_EXHAUSTED if the cache lacks blocks. On
  // other errors the sequences' caches are undefined.
  //
  // `experts` non-null: the routed experts run behind it (each MoE layer's
  // normalised hidden states and top-k go to the host, or stay on this GPU
  // where experts->memory_kinds() takes its memory; the shared expert runs on the
  // device meanwhile; the combined result comes back). Decode steps with a
  // device-resident client replay piecewise CUDA graphs (one per stretch
  // between MoE dispatches); otherwise eagerly. Null: the experts on the
  // device (FAILED_PRECONDITION without options.routed_experts_on_device).
  absl::StatusOr<StepOutput> Step(absl::Span<const SequenceTokens> seqs, int top_logprobs = 0,
                                  ExpertClient* experts = nullptr,
                                  const StepSampling* sampling = nullptr);
  absl::StatusOr<std::vector<float>> ForwardLogits(absl::Span<const SequenceTokens> seqs,
                                                   ExpertClient* experts = nullptr);
  // Step's pass with the fp32 logits of every new token, [total new tokens,
  // vocab] on the host, sequence by sequence in `seqs`' order (prompt
  // log-probabilities). Eager, never a CUDA graph: the final norm and lm_head
  // run over each pass's rows in chunks of all_position_rows(), into the
  // head's logits buffer, which holds max(max_num_seqs, all_position_rows())
  // rows: at most kAllPositionLogitBytes of fp32 logits beyond the
  // max_num_seqs rows decode steps need. Errors as ForwardLogits'.
  absl::StatusOr<std::vector<float>> ForwardAllLogits(absl::Span<const SequenceTokens> seqs,
                                                      ExpertClient* experts = nullptr);
  // Rows per lm_head chunk of ForwardAllLogits: kAllPositionLogitBytes of
  // fp32 logits (at least max_num_seqs rows, at most a pass's tokens).
  int all_position_rows() const { return all_position_rows_; }
  static constexpr size_t kAllPositionLogitBytes = size_t{256} << 20;

  // KV rows on the host, as the CPU cache holds them (float32 [n, kv_lora_rank
  // + qk_rope_head_dim]; bf16 on the device): the KV handoff between prefill
  // and decode workers. AppendKvRows writes rows at positions [length, length
  // + n) of `layer`, allocating blocks; the call for the last layer advances
  // the length. ReadKvRows returns `layer`'s rows [0, n).
  absl::Status AppendKvRows(int seq, int layer, const float* rows, int n);
  absl::StatusOr<std::vector<float>> ReadKvRows(int seq, int layer, int n);
  // The KV handoff in device memory (cuda_ipc): where `seq`'s rows lie in
  // this model's pool (valid until the sequence changes or is released), and
  // the copy of `length` tokens of such a sequence of another model (another
  // process on this node, or this one) into `seq`, which must hold nothing
  // but whole blocks from the prefix cache (those rows are not copied);
  // returns when the copy is done. INVALID_ARGUMENT for another geometry.
  absl::StatusOr<DeviceKvBlocks> ExportKv(int seq);
  absl::Status ImportKv(int seq, const DeviceKvBlocks& src, int length);
  int kv_row_width() const { return config_.kv_cache_row_width(); }
  // How the pool stores a row of kv_row_width() values (options.fp8_kv_cache).
  KvRowSpec kv_row_spec() const;

  // Benchmarks: fills the whole cache with random rows, then adds `n`
  // sequences that each claim `length` tokens of them without running the
  // model; returns their ids.
  absl::Status FillKvCacheRandom(uint64_t seed);
  absl::StatusOr<std::vector<int>> AddSyntheticSequences(int n, int length);

  // Tokens each routed expert received in the last step, [num_layers,
  // n_routed_experts] (rows of dense layers are 0).
  absl::StatusOr<std::vector<int32_t>> LastExpertCounts();
  // With options.record_routing: the routed experts of every token row of
  // the last pass, [num_layers, *rows, top_k] (-1 for dense layers).
  absl::StatusOr<std::vector<int32_t>> LastRouting(int* rows);
  // Step(seqs) run eagerly with events between the phases.
  absl::StatusOr<PhaseTimes> ProfileStep(absl::Span<const SequenceTokens> seqs);
  // Sets options.moe_tile_m (dropping the captured graphs). For benchmarks.
  absl::Status SetMoeTileM(int tile_m);
  // True iff the last Step replayed a CUDA graph.
  bool last_step_used_graph() const { return graphs_->last_replayed(); }

 private:
  using Sequence = KvStore::Sequence;
  explicit CudaModel(const ModelConfig& config, const CudaModelOptions& options);
  static absl::StatusOr<std::unique_ptr<CudaModel>> Create(const ModelConfig& config,
                                                           const CudaModelOptions& options,
                                                           std::unique_ptr<DeviceWeights> weights,
                                                           Stream stream);
  absl::Status Init();
  // Sizes the KV pool from what the utilisation target leaves, up to what
  // max_num_seqs full-length sequences can use.
  absl::Status InitKvStore();

  // Pass `b` (uploaded) through the stack and the head.
  absl::Status EnqueueForward(const StepBatch& b, bool sample, int top_k,
                              ExpertClient* experts = nullptr);
  // The final norm and lm_head on the pass's num_rows head rows (of num_tokens).
  absl::Status EnqueueHead(int num_tokens, int num_rows, bool sample, int top_k);
  // The final norm and lm_head of the pass's rows `rows` (device indices,
  // num_rows <= the logits buffer's rows) into logits_.
  absl::Status EnqueueLogits(int num_tokens, int num_rows, const int32_t* rows);
  absl::Status RunDecodeGraph(const StepBatch& b, int top_k);
  // The same for device-resident external experts, with piecewise graphs.
  absl::Status RunPiecewiseGraph(const StepBatch& b, int top_k, ExpertClient* experts);
  // Samples the chunk's `rows` logits rows (chunk row r is sequence
  // order[first + r]) into next_ids_, on the stream.
  absl::Status EnqueueSample(const StepSampling& sampling, const std::vector<int>& order,
                             size_t first, int rows);
  absl::Status Commit(absl::Span<const SequenceTokens> seqs);
  // FAILED_PRECONDITION unless `experts` is null iff the experts are on the device.
  absl::Status CheckExperts(const ExpertClient* experts) const;
  // Runs a chunk (`run` enqueues it and waits for the stream), then asks the
  // experts whether their device results were sound; once more if a worker
  // failed under it (its replicas take over).
  absl::Status RunChecked(ExpertClient* experts, const std::function<absl::Status()>& run);

  // Constant after Init (but options_.moe_tile_m: SetMoeTileM).
  const ModelConfig config_;
  CudaModelOptions options_;
  DeviceInfo info_;
  Stream stream_;
  std::unique_ptr<CublasGemm> gemm_;
  std::unique_ptr<DeviceWeights> weights_;
  int max_model_len_ = 0;
  // The parts; ctx_ refers to the members above and to the parts' own.
  std::unique_ptr<ForwardContext> ctx_;
  std::unique_ptr<GraphRunner> graphs_;  // decode steps' CUDA graphs, on stream_
  std::unique_ptr<StepPlanner> planner_;
  std::unique_ptr<FfnBlock> ffn_;
  std::unique_ptr<LayerStack> stack_;
  std::unique_ptr<KvStore> store_;  // the sequences and their pool
  KvPool* kv_ = nullptr;            // store_'s pool

  // The head, [max_num_seqs rows, ...] (head_normed_ and logits_:
  // max(max_num_seqs, all_position_rows_) rows).
  int all_position_rows_ = 0;
  DeviceBuffer<int32_t> iota_rows_;  // [max_tokens]: 0, 1, 2, ... (ForwardAllLogits' rows)
  DeviceBuffer<bf16> head_normed_;
  DeviceBuffer<float> logits_, next_lp_, topk_lp_;
  DeviceBuffer<int32_t> next_ids_, topk_out_ids_;
  PinnedBuffer<int32_t> h_ids_;  // next_ids, topk ids back
  PinnedBuffer<float> h_lp_;     // next_logprobs, topk logprobs back
  // The GPU sampler's rows of a chunk and a step's penalty entries (grown as needed).
  DeviceBuffer<SampleRow> d_sample_rows_;
  DeviceBuffer<PenaltyEntry> d_penalties_;
};

}  // namespace moesh::cuda

#endif  // MOESH_COMMON_CUDA_BACKEND_CUDA_MODEL_H_
