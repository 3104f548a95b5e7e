// CudaModel: a DeepSeek V2/V3/V3.2/V4 model (MLA, dense MLP, MoE with shared
// and routed experts; V3.2's lightning indexer and sparse MLA; V4's mHC and
// sliding/compressed attention in cuda_model_v4.cc) run entirely on one GPU: weights in bf16 on the
// device, a paged latent KV cache in device memory sized from free memory, and a batched forward
// pass whose decode step can replay as a CUDA graph.
//
// Per layer, for T tokens (T = all new tokens of the step, flattened):
//   x (fp32 residual) → RMSNorm → [q_a | kv_a] GEMM (→ q_a norm → q_b GEMM)
//   → W_UK absorbed into q (batched GEMM over heads) → kv_a norm + RoPE + paged
//   cache write (q_pe roped too) → MLA attention over the cache → W_UV
//   (batched GEMM) → o_proj GEMM accumulated into x → RMSNorm →
//   dense MLP, or: fp32 router GEMM → gate/top-k → permute by expert →
//   grouped gate_up GEMM → SiLU·mul → grouped down GEMM → shared expert into x
//   → weighted combine into x.
// Then the final RMSNorm on each sequence's last token, lm_head (fp32
// logits), greedy + log-probabilities on the device.
//
// Prefill runs the same path: each prompt token is one query row attending to
// cache rows [0, position] (its own row written first), through the decode
// attention kernel. That is correct and simple, not fast: the prefix is read
// once per query token rather than once per tile of queries.
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
#include "common/cuda_backend/device_weights.h"
#include "common/cuda_backend/graph_runner.h"
#include "common/cuda_backend/kv_pool.h"
#include "common/cuda_backend/kv_store.h"
#include "common/model/config.h"
#include "common/model/expert_client.h"
#include "common/model/kv_cache.h"
#include "common/model/weights.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/mla_decode.h"
#include "kernels/cuda/v4_ops.h"

namespace moesh::cuda {

// Which MLA attention kernel runs: the tuned one where it is built for the
// widths (latent 512, rope 64), else the plain one; or always the plain one
// (a cross-check of the tuned kernel inside the whole model).
enum class MlaKernel { kAuto, kGeneric };

struct CudaModelOptions {
  // Fraction of the device's total memory that everything on it may use once
  // this model is loaded (other processes' memory counts); the KV cache gets
  // what the weights and scratch buffers leave of it.
  double gpu_memory_utilization = 0.9;
  int max_num_seqs = 256;          // sequences per step; decode graphs cover batches up to it
  int max_model_len = 0;           // tokens per sequence; 0: min(max_position_embeddings, 8192)
  int max_tokens_per_step = 8192;  // longer prefills run in chunks of this many tokens
  bool cuda_graphs = true;  // decode steps (one token per sequence) replay a graph per batch bucket
  int max_kv_blocks = 0;    // > 0: at most this many cache blocks (tests)
  MlaKernel mla_kernel = MlaKernel::kAuto;
  int moe_tile_m = 0;           // rows per expert tile: 16, 32 or 64; 0 picks by rows per expert
  bool record_routing = false;  // keep each pass's expert choices (LastRouting)
  // False: the routed experts are not loaded on this device; every forward
  // pass then takes an ExpertClient (the disaggregated attention worker).
  bool routed_experts_on_device = true;
};

// GPU time of one eager forward pass by phase, summed over the layers, from
// events between the phases (ProfileStep). Where the GPU outruns the host's
// launches (small batches), the phases include the launch gaps.
struct PhaseTimes {
  double embed_ms = 0, attention_ms = 0, dense_mlp_ms = 0, moe_ms = 0, head_ms = 0, total_ms = 0;
};

// New tokens of one sequence for a step.
struct SequenceTokens {
  int seq = -1;                      // from AddSequence
  absl::Span<const int32_t> tokens;  // appended after the cached prefix; not empty
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
  // Loads <dir>/config.json and its safetensors through the CPU loader
  // (validating the checkpoint), then rounds every weight to bf16 on the device.
  static absl::StatusOr<std::unique_ptr<CudaModel>> Load(const std::string& dir,
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
  int max_model_len() const { return max_model_len_; }
  const DeviceInfo& device_info() const { return info_; }
  bool has_routed_experts() const { return options_.routed_experts_on_device; }

  // Sequences: each owns cache blocks until released. AddSequence(n)
  // allocates the blocks of n tokens up front (RESOURCE_EXHAUSTED, adding
  // nothing, if they are not free); later steps allocate more as needed.
  absl::StatusOr<int> AddSequence(int reserve_tokens = 0);
  absl::Status ReleaseSequence(int seq);
  absl::StatusOr<int> SequenceLength(int seq) const;

  // Runs every sequence's new tokens through the model as one batch (in
  // chunks of max_tokens_per_step), appending to the caches. Step returns the
  // greedy choice per sequence (top_logprobs in [0, 20]), or with `sampling`
  // (a row per sequence) the GPU sampler's (the log-probabilities are the
  // raw logits', as without); INTERNAL if it picks no token (non-finite
  // logits). ForwardLogits the
  // fp32 logits of each sequence's last token, [num_seqs, vocab], on the host.
  // INVALID_ARGUMENT for unknown or repeated sequences, empty or
  // out-of-vocabulary tokens, more than max_num_seqs sequences or a sequence
  // beyond max_model_len; RESOURCE_EXHAUSTED if the cache lacks blocks. On
  // other errors the sequences' caches are undefined.
  //
  // `experts` non-null: the routed experts run behind it (each MoE layer's
  // normalised hidden states and top-k go to the host, or stay on this GPU
  // where experts->dispatch_device() is it; the shared expert runs on the
  // device meanwhile; the combined result comes back). Decode steps with a
  // device-resident client replay piecewise CUDA graphs (one per stretch
  // between MoE dispatches); otherwise eagerly. Null: the experts on the
  // device (FAILED_PRECONDITION without options.routed_experts_on_device).
  absl::StatusOr<StepOutput> Step(absl::Span<const SequenceTokens> seqs, int top_logprobs = 0,
                                  ExpertClient* experts = nullptr,
                                  const StepSampling* sampling = nullptr);
  absl::StatusOr<std::vector<float>> ForwardLogits(absl::Span<const SequenceTokens> seqs,
                                                   ExpertClient* experts = nullptr);

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
  // process on this node, or this one) into `seq`, which must be empty;
  // returns when the copy is done. INVALID_ARGUMENT for another geometry.
  absl::StatusOr<DeviceKvBlocks> ExportKv(int seq);
  absl::Status ImportKv(int seq, const DeviceKvBlocks& src, int length);
  int kv_row_width() const { return config_.kv_cache_row_width(); }

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
  // One forward pass's host-side inputs.
  struct Batch {
    int num_tokens = 0;  // T, including padding rows
    int num_rows = 0;    // head rows (sequences), including padding
    std::vector<int32_t> tokens, positions, slots, seq_lens, head_rows, block_table;
    int max_seq_len = 0;
    bool decode = false;   // one token per sequence, padded to a bucket
    int real_tokens = -1;  // decode: the rows before the padding; -1: num_tokens
    // Segments (runs of one sequence's tokens): each one's last row and its
    // first token's position (V4's compressed entries).
    std::vector<int32_t> seg_last, seg_from;
  };
  // Rows laid out densely for the tuned MLA kernel (V3.2's selections, V4's
  // window + entries; cuda_model_dsa.cc): `tokens` queries at a time, query
  // i's rows at [i * stride, (i + 1) * stride) of `rows`, read through the
  // constant block table `table` (stride a multiple of 64).
  struct MlaScratch {
    int stride = 0, tokens = 0;
    DeviceBuffer<bf16> rows;
    DeviceBuffer<int32_t> table;
    DeviceBuffer<uint8_t> ws;  // the split partials of any batch up to `tokens`
  };
  // DeepSeek-V4's scratch and tables (cuda_model_v4.cc), sized for
  // max_tokens_ tokens and max_rows_ segments.
  struct V4State {
    DeviceBuffer<float> mix, post, comb, collapsed, y;
    DeviceBuffer<bf16> a, q, attn, grouped;
    DeviceBuffer<int32_t> seg_last, seg_from;
    // Compressed entries, each computed once (v4_ops.h V4CompressParams):
    // per layer, entry e of a sequence at its row e (the KV pool's block ids),
    // [head_dim kv entry | index_head_dim index entry (CSA)], bf16.
    std::unique_ptr<KvPool> entries;
    int entry_width = 0, min_rate = 0;
    DeviceBuffer<float> main_inv_freq, compress_inv_freq;
    RopeTableView main_rope, compress_rope;
    // head_dim 512 (the MLA kernel's latent width): attention on the tuned
    // kernel over the keys gathered densely into `keys` (RunV4GatherKeys).
    bool fast = false;
    MlaScratch keys;
    DeviceBuffer<bf16> q576;
    DeviceBuffer<int32_t> key_count;
    DeviceBuffer<float> o, lse;
  };
  explicit CudaModel(const ModelConfig& config, const CudaModelOptions& options);
  static absl::StatusOr<std::unique_ptr<CudaModel>> Create(const ModelConfig& config,
                                                           const CudaModelOptions& options,
                                                           std::unique_ptr<DeviceWeights> weights,
                                                           Stream stream);
  absl::Status Init();

  int Bucket(int batch) const;
  // Validates, allocates cache blocks and lays out the step's tokens; a
  // decode batch is padded to its bucket. `chunks` gets the passes to run.
  absl::Status Plan(absl::Span<const SequenceTokens> seqs, std::vector<Batch>* chunks,
                    std::vector<int>* row_seq_index);
  absl::Status Upload(const Batch& b);
  absl::Status EnqueueForward(const Batch& b, bool sample, int top_k,
                              ExpertClient* experts = nullptr);
  absl::Status EnqueueLayers(const Batch& b, ExpertClient* experts);
  // DeepSeek-V4 (cuda_model_v4.cc): its scratch, its layers, its hc head
  // and final norm into head_normed_.
  absl::Status InitV4();
  absl::Status InitV4Entries();  // after the KV pool
  // The compressed entries rows [from, to) of `seq` complete, every layer
  // (after rows came in through AppendKvRows or ImportKv); synchronous.
  absl::Status FillV4Entries(int seq, int from, int to);
  // Layer l's compressors over the pass's segments (or FillV4Entries').
  absl::Status EnqueueV4Compress(int layer, int num_segs, int max_new);
  absl::Status EnqueueV4Layers(const Batch& b, ExpertClient* experts);
  // DeepSeek-V3.2's indexer for layer l after its cache write: keys into the
  // cache rows, queries, the top-k per token into index_selected_/index_count_.
  absl::Status EnqueueDsaIndexer(int layer, int num_tokens);
  // The indexer's scratch (index_*_), for up to max_keys keys per query.
  absl::Status InitIndexer(int max_keys);
  absl::Status InitSparseMla();
  // An MlaScratch of `rows_per_token` (rounded up to 64) rows per query.
  absl::Status InitMlaScratch(int rows_per_token, MlaScratch* s);
  // The tuned MLA kernel on `n` queries whose rows are in `s`; `mp` gives the
  // queries, their row counts (seq_lens), the output and the scale.
  absl::Status RunMlaOnScratch(const MlaScratch& s, int n, MlaDecodeParams mp);
  // The tuned MLA kernel over each token's gathered selection; `mp` as for
  // the dense kernel (q, out, softmax scale, the layer's pool).
  absl::Status EnqueueSparseMla(const Batch& b, const MlaDecodeParams& mp);
  absl::Status EnqueueV4Attention(const Batch& b, int layer);
  absl::Status EnqueueV4Head(int num_tokens, int num_rows);
  // V4State::fast: RunV4Attention's math on the tuned MLA kernel.
  absl::Status EnqueueV4FastAttention(const V4AttentionParams& ap);
  // mHC before a sublayer: its collapse of x_ RMSNorm'd into normed_ (and,
  // for the router's fp32 GEMM, normed_f32_).
  absl::Status EnqueueMhcPre(const float* fn, const float* base, const float* scale,
                             const bf16* norm, int num_tokens, bool router_input);
  absl::Status EnqueueMhcPost(int num_tokens);
  absl::Status EnqueueMlp(const bf16* w_gate_up, const bf16* w_down, int inter, int num_tokens);
  absl::Status EnqueueMoe(int layer, int num_tokens, ExpertClient* experts);
  // The routed part of EnqueueMoe through `experts` (host round trip).
  absl::Status RunExternalExperts(int layer, int num_tokens, ExpertClient* experts);
  // The final norm and lm_head on the pass's num_rows head rows (of num_tokens).
  absl::Status EnqueueHead(int num_tokens, int num_rows, bool sample, int top_k);
  absl::Status Gemm(const bf16* x, int ldx, const bf16* w, void* y, int ldy, int m, int n, int k,
                    OutType out, bool accumulate);
  absl::Status RunDecodeGraph(const Batch& b, int top_k);
  // The same for device-resident external experts, with piecewise graphs.
  absl::Status RunPiecewiseGraph(const Batch& b, int top_k, ExpertClient* experts);
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
  absl::Status Mark(int index);  // records profiling event `index` iff profiling

  // Constant after Init (but options_.moe_tile_m: SetMoeTileM).
  const ModelConfig config_;
  CudaModelOptions options_;
  DeviceInfo info_;
  Stream stream_;
  std::unique_ptr<CublasGemm> gemm_;
  std::unique_ptr<DeviceWeights> weights_;
  std::unique_ptr<KvStore> store_;  // the sequences and their pool
  KvPool* kv_ = nullptr;            // store_'s pool
  int max_model_len_ = 0, max_blocks_per_seq_ = 0;
  int max_tokens_ = 0;  // scratch rows
  int max_rows_ = 0;    // head rows
  std::vector<int> buckets_;
  bool fast_mla_ = false;
  float softmax_scale_ = 1.0f;
  RopeTableView rope_;
  DeviceBuffer<float> inv_freq_;

  // Scratch (device), sized for max_tokens_ tokens. x_ is the residual
  // ([T, hc_mult, hidden] for V4); the MLP and MoE outputs accumulate into
  // *resid_ (x_, or for V4 the sublayer output mHC then mixes in).
  float* resid_ = nullptr;
  std::unique_ptr<V4State> v4_;
  // The lightning indexer's (V3.2; V4's CSA layers): queries, scores over up
  // to index_max_keys_ keys, the selection and its size per token.
  int index_max_keys_ = 0;
  DeviceBuffer<bf16> index_q_;
  DeviceBuffer<float> index_scores_;
  DeviceBuffer<int32_t> index_selected_, index_count_;
  RopeTableView index_rope_;  // V3.2: the model's table, rotate-half layout
  // V3.2 at the tuned MLA kernel's widths: each token's selected rows
  // (their pool rows in sparse_rows_) gathered into sparse_.
  bool sparse_fast_ = false;
  MlaScratch sparse_;
  DeviceBuffer<int32_t> sparse_rows_;
  DeviceBuffer<float> x_, normed_f32_, router_logits_, topk_w_, moe_out_, logits_, next_lp_,
      topk_lp_;
  DeviceBuffer<bf16> normed_, qkv_, qa_, q_, q_mla_, o_lat_, attn_, mlp_gu_, mlp_act_, moe_gu_,
      moe_act_, head_normed_;
  DeviceBuffer<int32_t> topk_ids_, row_token_, pair_row_, expert_offsets_, tile_offsets_,
      expert_counts_, next_ids_, topk_out_ids_;
  DeviceBuffer<bf16> moe_gathered_;  // the dense expert path's gathered rows (null: never taken)
  PinnedBuffer<int32_t> h_expert_offsets_;
  DeviceBuffer<uint8_t> decode_ws_,
      prefill_ws_;  // MLA split partials (decode_ws_ fixed: graphs hold it)
  // Step inputs: device copies at fixed addresses (graphs read them), pinned staging.
  DeviceBuffer<int32_t> d_tokens_, d_positions_, d_slots_, d_seq_lens_, d_head_rows_,
      d_block_table_;
  PinnedBuffer<int32_t> h_meta_;  // staging for the above
  PinnedBuffer<int32_t> h_ids_;   // next_ids, topk ids back
  PinnedBuffer<float> h_lp_;      // next_logprobs, topk logprobs back
  // The GPU sampler's rows of a chunk and a step's penalty entries (grown as needed).
  DeviceBuffer<SampleRow> d_sample_rows_;
  DeviceBuffer<PenaltyEntry> d_penalties_;
  // External experts: the dispatch staged on the host, the result back.
  PinnedBuffer<float> h_hidden_, h_topk_w_, h_routed_;
  PinnedBuffer<int32_t> h_topk_ids_;
  Event dispatch_copied_;

  // Mutable state.
  std::unique_ptr<GraphRunner> graphs_;  // decode steps' CUDA graphs, on stream_
  int dispatch_tokens_ = 0;  // the current pass's rows that go to external experts (no padding)
  MlaDecodePlan plan_;       // the current pass's
  DeviceBuffer<int32_t> routing_log_;  // [num_layers, max_tokens_, top_k] iff record_routing
  int routing_rows_ = 0;
  std::vector<Event>* profile_ = nullptr;  // non-null while ProfileStep runs
};

}  // namespace moesh::cuda

#endif  // MOESH_COMMON_CUDA_BACKEND_CUDA_MODEL_H_
