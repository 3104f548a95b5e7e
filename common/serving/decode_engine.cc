#include "common/serving/decode_engine.h"

#include <algorithm>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "common/serving/outbox.h"
#include "common/transport/kv_handoff.h"

namespace moesh {

absl::StatusOr<PreemptionMode> ParsePreemptionMode(absl::string_view name) {
  if (name == "recompute") return PreemptionMode::kRecompute;
  if (name == "swap") return PreemptionMode::kSwap;
  return absl::InvalidArgumentError(
      absl::StrCat("preemption mode '", name, "' is neither 'recompute' nor 'swap'"));
}

namespace {

// A swapped-out request's KV rows in host memory, counted in `*total` (the
// engine's swapped bytes) while they live.
class SwappedKv {
 public:
  SwappedKv(KvTransfer rows, std::atomic<int64_t>* total)
      : rows_(std::move(rows)), bytes_(static_cast<int64_t>(rows_.row_bytes())), total_(total) {
    *total_ += bytes_;
  }
  ~SwappedKv() { *total_ -= bytes_; }
  SwappedKv(const SwappedKv&) = delete;
  SwappedKv& operator=(const SwappedKv&) = delete;

  const KvTransfer& rows() const { return rows_; }

 private:
  const KvTransfer rows_;
  const int64_t bytes_;
  std::atomic<int64_t>* const total_;
};

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

struct DecodeEngine::Request {
  DecodeSpec spec;
  uint64_t arrival = 0;  // order of Reserve calls: FCFS within a priority
  // Null while queued (new or preempted). Shared with a KV handoff in
  // progress, which keeps it alive if the request ends meanwhile (its lease
  // expires, it is cancelled).
  std::shared_ptr<KvSequence> kv;
  std::unique_ptr<Sampler> sampler;
  std::vector<int32_t> output;                        // generated so far, the first token included
  std::chrono::steady_clock::time_point reserved_at;  // admission
  std::string caller;                                 // who reserved it (Reserve's `caller`)
  int pending_blocks = 0;    // counted in pending_blocks_[caller] until its KV arrives
  bool admitted = false;     // its prompt's blocks were held once (Reserve returned)
  bool kv_received = false;  // PushKv stored its prompt's rows
  bool streaming = false;    // a Decode call reads the outbox
  bool running = false;      // in the batch loop, holding blocks
  bool preempted = false;    // queued again, its blocks freed
  bool recompute = false;    // running; its next steps feed prompt + output (in chunks)
  // Preempted by swap: its rows until it resumes (null otherwise).
  std::unique_ptr<SwappedKv> swapped;
  // compute_prompt: from Reserve to its first chunk's step (-1: not yet), and
  // the prompt tokens its sequence took from the prefix cache.
  std::chrono::steady_clock::time_point arrived_at = std::chrono::steady_clock::now();
  double queue_seconds = -1;
  int cached_tokens = 0;
  uint64_t chunk_turn = 0;  // the step that computed its last chunk (0: none yet)
  // compute_prompt with prompt_logprobs: its chunks' so far, joined.
  PromptLogprobs prompt_logprobs;
  bool cancelled = false;
  bool done = false;
  absl::Status status;
  Outbox outbox;  // produced by the engine, drained by Decode; closed by Finish
};

DecodeEngine::DecodeEngine(AttentionBackend* backend, ExpertClient* experts,
                           DecodeEngineOptions options)
    : backend_(backend), experts_(experts), options_(options) {
  if (Metrics* m = options.metrics) {
    kv_usage_ =
        &m->GaugeFamily("moesh_kv_cache_usage_perc", "Fraction of KV cache blocks in use, [0, 1].")
             .Add({});
    kv_free_blocks_ =
        &m->GaugeFamily("moesh_kv_cache_free_blocks", "Free KV cache blocks.").Add({});
    running_ =
        &m->GaugeFamily("moesh_num_requests_running", "Requests in the running batch or reserved.")
             .Add({});
    waiting_gauge_ = &m->GaugeFamily("moesh_decode_num_requests_waiting",
                                     "Requests queued for KV blocks: new ones before admission, "
                                     "preempted ones before they resume.")
                          .Add({});
    prometheus::Family<prometheus::Counter>& preemptions = m->CounterFamily(
        "moesh_decode_preemptions_total",
        "Running requests preempted because the KV cache ran dry (their blocks freed), by how "
        "they resume: mode=recompute (KV recomputed) or swap (rows copied to host memory and "
        "back, --preemption_mode=swap).");
    preempt_recompute_ = &preemptions.Add({{"mode", "recompute"}});
    preempt_swap_ = &preemptions.Add({{"mode", "swap"}});
    swap_fallbacks_ = &m->CounterFamily("moesh_decode_swap_fallbacks_total",
                                        "Preemptions that were to swap but recomputed: the rows "
                                        "would pass --swap_space_mb, or their copy failed.")
                           .Add({});
    swapped_bytes_gauge_ = &m->GaugeFamily("moesh_decode_swapped_bytes",
                                           "Host memory the KV rows of swapped-out requests hold.")
                                .Add({});
    prometheus::Family<prometheus::Histogram>& swap_seconds =
        m->HistogramFamily("moesh_decode_swap_seconds",
                           "Wall time of copying a preempted request's KV rows out of the pool "
                           "into host memory (direction=out) or back into a new sequence (in).");
    swap_out_seconds_ = &swap_seconds.Add({{"direction", "out"}}, Metrics::LatencyBuckets());
    swap_in_seconds_ = &swap_seconds.Add({{"direction", "in"}}, Metrics::LatencyBuckets());
    tokens_ = &m->CounterFamily("moesh_generation_tokens_total", "Tokens generated.").Add({});
    step_seconds_ =
        &m->HistogramFamily("moesh_decode_step_seconds", "Wall time of one batched decode step.")
             .Add({}, Metrics::LatencyBuckets());
    batch_size_ = &m->HistogramFamily("moesh_decode_batch_size",
                                      "Requests per decode step that produced a token.")
                       .Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64, 128,
                                                                        256, 512});
    step_tokens_ = &m->HistogramFamily("moesh_decode_step_tokens",
                                       "Tokens one decode step computes: a token per running "
                                       "decode plus the prompt chunks (--max_num_batched_tokens).")
                        .Add({}, prometheus::Histogram::BucketBoundaries{
                                     1, 4, 16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384});
    prompt_chunks_ = &m->CounterFamily("moesh_decode_prompt_chunks_total",
                                       "Prompt chunks decode steps computed (of prompts computed "
                                       "here and of preempted requests' recomputes); a prompt "
                                       "run whole counts one.")
                          .Add({});
    prefix_metrics_ = std::make_unique<PrefixCacheMetrics>(m);
    kv_free_blocks_->Set(backend_->kv_usage().free_blocks);
  }
  thread_ = std::thread([this] { Loop(); });
}

DecodeEngine::~DecodeEngine() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
  absl::MutexLock lock(&mu_);
  while (!requests_.empty())
    Finish(requests_.begin()->second, absl::UnavailableError("decode worker shutting down"));
}

absl::StatusOr<std::shared_ptr<DecodeEngine::Request>> DecodeEngine::Reserve(
    const DecodeSpec& spec, const CancelToken* cancel, const std::string& caller) {
  RETURN_IF_ERROR(CheckRequestId(spec.request_id));
  if (spec.prompt_ids.empty() || spec.max_new_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("request ", spec.request_id, ": ",
                                                   spec.prompt_ids.size(), " prompt tokens and ",
                                                   spec.max_new_tokens, " new tokens to decode"));
  }
  if (absl::Status s = spec.sampling.ValidateServed(backend_->config().vocab_size); !s.ok())
    return s;
  if (spec.compute_prompt) {
    RETURN_IF_ERROR(CheckPrompt(*backend_, spec.prompt_ids, spec.sampling.prompt_logprobs));
  }
  const int context = backend_->config().max_position_embeddings;
  if (context > 0 && spec.max_tokens() > context) {
    return absl::InvalidArgumentError(absl::StrCat("a sequence of ", spec.max_tokens(),
                                                   " tokens exceeds the model's context of ",
                                                   context, " tokens"));
  }
  const KvUsage u = backend_->kv_usage();
  if (u.total_blocks > 0 && BlocksFor(u, spec.max_tokens()) > u.total_blocks) {
    return absl::ResourceExhaustedError(
        absl::StrCat("request ", spec.request_id, " may need ", BlocksFor(u, spec.max_tokens()),
                     " KV blocks of ", u.block_size, " tokens; the pool holds ", u.total_blocks));
  }
  auto r = std::make_shared<Request>();
  {
    absl::MutexLock lock(&mu_);
    if (draining_) return absl::UnavailableError("decode worker draining (shutting down)");
    if (requests_.count(spec.request_id))
      return absl::AlreadyExistsError(absl::StrCat("request ", spec.request_id, " exists"));
    // The prompt blocks of one caller's reservations awaiting their KV (or,
    // computing the prompt here, their first token: what admission holds for
    // them) stay within max_pending_kv_share of the pool.
    int pending = 0;
    if (!caller.empty() && options_.max_pending_kv_share < 1.0 && u.total_blocks > 0 &&
        u.block_size > 0) {
      pending = BlocksFor(u, static_cast<int>(spec.prompt_ids.size()));
      const auto held = pending_blocks_.find(caller);
      const int cap = static_cast<int>(options_.max_pending_kv_share * u.total_blocks);
      if (held != pending_blocks_.end() && held->second + pending > cap) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "request ", spec.request_id, ": ", caller, "'s reservations awaiting their KV hold ",
            held->second, " KV blocks; ", pending, " more would pass the per-peer cap of ", cap,
            " (--max_pending_kv_share ", options_.max_pending_kv_share, " of ", u.total_blocks,
            ")"));
      }
    }
    r->spec = spec;
    r->caller = caller;
    r->pending_blocks = pending;
    if (pending > 0) pending_blocks_[caller] += pending;
    r->sampler = std::make_unique<Sampler>(spec.sampling);
    r->arrival = next_arrival_++;
    requests_[spec.request_id] = r;
    waiting_[{spec.priority, r->arrival}] = r;
    ++waiting_new_;
    Admit();
    if (!r->admitted && !r->done && waiting_new_ > std::max(options_.max_waiting, 0)) {
      const absl::Status full = absl::ResourceExhaustedError(
          absl::StrCat("decode worker queue full: ", std::max(options_.max_waiting, 0),
                       " requests wait for KV blocks (--max_waiting_requests)"));
      Finish(r, full);
      return full;
    }
    UpdateGauges();
    if (r->admitted) return r;
  }
  // Queued: wait for admission, or the caller's cancellation (registered
  // with no lock held: an already cancelled token runs it at once).
  CancelToken::Registration on_cancel;
  if (cancel != nullptr) {
    on_cancel = cancel->OnCancel([this, r] {
      absl::MutexLock lock(&mu_);
      if (!r->admitted) Cancel(r, absl::CancelledError("cancelled while queued for KV blocks"));
    });
  }
  {
    absl::MutexLock lock(&mu_);
    auto ready = [&r]() { return r->admitted || r->done; };
    mu_.Await(absl::Condition(&ready));
  }
  on_cancel.Reset();
  absl::MutexLock lock(&mu_);
  if (r->done && !r->admitted) return r->status;
  return r;
}

int DecodeEngine::BlocksFor(const KvUsage& u, int tokens) {
  return u.block_size > 0 ? (tokens + u.block_size - 1) / u.block_size : 0;
}

void DecodeEngine::Admit() {
  int running = 0;
  for (auto& [id, r] : requests_) running += r->running ? 1 : 0;
  while (!waiting_.empty() && !stopping_) {
    auto it = waiting_.begin();
    std::shared_ptr<Request> r = it->second;
    const int prompt = static_cast<int>(r->spec.prompt_ids.size());
    const int total = prompt + static_cast<int>(r->output.size());
    // A preempted request rebuilds the rows of prompt + output in one pass
    // (or takes back those it swapped out and computes the rest).
    const int tokens = r->preempted ? total : prompt;
    const KvUsage u = backend_->kv_usage();
    if (u.total_blocks > 0 && u.free_blocks < u.total_blocks) {
      // Room for this request, a block for each running one's next step (so
      // admitting does not preempt), and its prefill pass where that shares
      // the pool.
      int need = BlocksFor(u, tokens) + running;
      if (!r->preempted && !r->spec.compute_prompt && options_.prefill_shares_pool)
        need += BlocksFor(u, prompt);
      if (u.free_blocks < need) break;
    }
    // The sequence starts with what the prefix cache holds of the prompt (+
    // output if preempted; a swapped one's rows' tokens): handoffs and resumes
    // store only the rest. Prompt log-probabilities need every position: such
    // a prompt reads no cached rows (a swapped one kept its earlier chunks').
    std::vector<int32_t> known = r->spec.prompt_ids;
    if (r->preempted) known.insert(known.end(), r->output.begin(), r->output.end());
    if (r->swapped != nullptr)
      known.resize(r->swapped->rows().num_tokens);
    else if (r->spec.compute_prompt && r->output.empty() && r->spec.sampling.prompt_logprobs >= 0)
      known.clear();
    absl::StatusOr<std::unique_ptr<KvSequence>> kv = backend_->NewCachedSequence(tokens, known);
    if (kv.status().code() == absl::StatusCode::kResourceExhausted) break;  // taken meanwhile
    waiting_.erase(it);
    if (!r->preempted) --waiting_new_;
    if (!kv.ok()) {
      Finish(r, kv.status());
      continue;
    }
    r->kv = std::move(*kv);
    r->admitted = true;
    if (r->preempted) {
      if (r->swapped != nullptr) {
        if (absl::Status s = SwapIn(r.get()); !s.ok()) {
          Finish(r, s);
          continue;
        }
      }
      r->preempted = false;
      r->running = true;
      // A decode holds every row but its last token's (fed by its next step).
      r->recompute = r->output.empty() || r->kv->length() < total - 1;
      ++running;
    } else {
      r->reserved_at = std::chrono::steady_clock::now();
      if (r->spec.compute_prompt) {
        // No KV to wait for: it runs its prompt here, in chunks.
        r->kv_received = true;
        r->cached_tokens = r->kv->cached_tokens();
        r->running = true;
        r->recompute = true;
        ++running;
      }
    }
  }
  UpdateGauges();
}

void DecodeEngine::Preempt(const std::shared_ptr<Request>& r) {
  const bool swapped = options_.preemption_mode == PreemptionMode::kSwap && SwapOut(r.get());
  r->kv.reset();
  if (!swapped) r->prompt_logprobs = {};  // recomputed from the start; swapped: kept
  r->running = false;
  r->recompute = false;
  r->preempted = true;
  waiting_[{r->spec.priority, r->arrival}] = r;
  ++num_preemptions_;
  if (preempt_recompute_ != nullptr) (swapped ? preempt_swap_ : preempt_recompute_)->Increment();
}

bool DecodeEngine::SwapOut(Request* r) {
  const KvSequence& kv = *r->kv;
  if (kv.length() == 0) return false;  // nothing computed yet: nothing to keep
  const int layers = backend_->config().num_hidden_layers;
  const int64_t bytes = static_cast<int64_t>(layers) * kv.length() * kv.row_width() *
                        (kv.bf16_rows() ? sizeof(uint16_t) : sizeof(float));
  const auto start = std::chrono::steady_clock::now();
  std::string why;
  if (swapped_bytes_ + bytes > options_.swap_space_bytes) {
    why = absl::StrCat(swapped_bytes_.load(), " swapped bytes and ", bytes, " more would pass ",
                       options_.swap_space_bytes, " (--swap_space_mb)");
  } else {
    absl::StatusOr<KvTransfer> rows = SerializeKv(r->spec.request_id, kv, layers);
    if (rows.ok() && kv.status().ok()) {
      r->swapped = std::make_unique<SwappedKv>(*std::move(rows), &swapped_bytes_);
      if (swap_out_seconds_ != nullptr) swap_out_seconds_->Observe(SecondsSince(start));
      return true;
    }
    why = absl::StrCat("copying its rows failed: ",
                       (rows.ok() ? kv.status() : rows.status()).message());
  }
  if (swap_fallbacks_ != nullptr) swap_fallbacks_->Increment();
  if (!logged_swap_fallback_) {
    logged_swap_fallback_ = true;
    std::cerr << "decode engine: request " << r->spec.request_id
              << " preempted by recompute instead of swap: " << why
              << " (the first such; moesh_decode_swap_fallbacks_total counts them)" << std::endl;
  }
  return false;
}

absl::Status DecodeEngine::SwapIn(Request* r) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status s =
      DeserializeKv(r->swapped->rows(), backend_->config().num_hidden_layers, r->kv.get());
  if (s.ok()) s = r->kv->status();
  r->swapped.reset();
  if (!s.ok()) {
    return absl::InternalError(absl::StrCat(
        "request ", r->spec.request_id, ": taking back its swapped KV rows failed: ", s.message()));
  }
  if (swap_in_seconds_ != nullptr) swap_in_seconds_->Observe(SecondsSince(start));
  // Its blocks join the prefix cache again (those evicted while it was out).
  std::vector<int32_t> known = r->spec.prompt_ids;
  known.insert(known.end(), r->output.begin(), r->output.end());
  known.resize(r->kv->length());
  r->kv->PublishPrefix(known);
  return absl::OkStatus();
}

std::vector<DecodeEngine::StepItem> DecodeEngine::PlanStep() {
  // Running requests by (priority, arrival): the first are served first, the
  // last preempted first.
  std::vector<std::shared_ptr<Request>> order;
  for (auto& [id, r] : requests_) {
    if (r->running && !r->cancelled) order.push_back(r);
  }
  auto before = [](const std::shared_ptr<Request>& a, const std::shared_ptr<Request>& b) {
    return std::make_pair(a->spec.priority, a->arrival) <
           std::make_pair(b->spec.priority, b->arrival);
  };
  std::sort(order.begin(), order.end(), before);
  std::vector<StepItem> batch;
  auto full = [&] { return static_cast<int>(batch.size()) >= options_.max_batch; };
  // Decodes: room for each one's next token, preempting from the order's end
  // where the pool is dry.
  size_t end = order.size();  // order[end..) were preempted
  for (size_t i = 0; i < end && !full(); ++i) {
    const std::shared_ptr<Request>& r = order[i];
    if (r->recompute) continue;
    while (true) {
      absl::Status room = r->kv->Reserve(r->kv->length() + 1);
      if (room.ok()) {
        batch.push_back({r, 1});
        break;
      }
      if (room.code() != absl::StatusCode::kResourceExhausted) {
        Finish(r, room);
        break;
      }
      // The pool is dry: the last request in the order gives its blocks up.
      while (order[end - 1]->done) --end;  // ended above: holds nothing
      std::shared_ptr<Request> victim = order[--end];
      Preempt(victim);
      if (victim == r) break;
    }
  }
  // Prompt chunks in what the budget leaves, by priority, then round robin:
  // the request whose last chunk is oldest (or that has none yet) first, so a
  // short prompt arriving behind a long one gets the next step's budget
  // instead of waiting for all of the long one's chunks. Their sequences hold
  // the blocks of the whole prompt (+ output) since admission, so they never
  // preempt.
  std::vector<std::shared_ptr<Request>> prompts;
  for (size_t i = 0; i < end; ++i) {
    if (order[i]->recompute && order[i]->running) prompts.push_back(order[i]);
  }
  std::stable_sort(prompts.begin(), prompts.end(),
                   [](const std::shared_ptr<Request>& a, const std::shared_ptr<Request>& b) {
                     return std::make_pair(a->spec.priority, a->chunk_turn) <
                            std::make_pair(b->spec.priority, b->chunk_turn);
                   });
  ++steps_;
  const int budget = options_.max_num_batched_tokens;
  int left = budget - static_cast<int>(batch.size());
  for (const std::shared_ptr<Request>& r : prompts) {
    if (full()) break;
    const int total = static_cast<int>(r->spec.prompt_ids.size() + r->output.size());
    const int remaining = total - r->kv->length();
    int take = remaining;
    if (budget > 0) {
      if (left <= 0) continue;
      take = std::min(remaining, left);
    }
    if (absl::Status room = r->kv->Reserve(r->kv->length() + take); !room.ok()) {
      if (room.code() != absl::StatusCode::kResourceExhausted) Finish(r, room);
      continue;
    }
    if (r->queue_seconds < 0) {
      r->queue_seconds = SecondsSince(r->arrived_at);
    }
    batch.push_back({r, take});
    r->chunk_turn = steps_;
    left -= take;
  }
  return batch;
}

absl::Status DecodeEngine::PushKv(const KvTransfer& transfer) {
  const int vocab = backend_->config().vocab_size;
  if (transfer.first_token < 0 || transfer.first_token >= vocab) {
    return absl::InvalidArgumentError(absl::StrCat("KV for ", transfer.request_id, ": first token ",
                                                   transfer.first_token,
                                                   " is outside the vocabulary [0, ", vocab, ")"));
  }
  std::shared_ptr<Request> r;
  std::shared_ptr<KvSequence> kv;
  {
    absl::MutexLock lock(&mu_);
    auto it = requests_.find(transfer.request_id);
    if (it == requests_.end())
      return absl::NotFoundError(absl::StrCat("no reservation for ", transfer.request_id));
    r = it->second;
    if (r->kv_received)  // a request runs only once its KV was received
      return absl::FailedPreconditionError("KV already received for " + transfer.request_id);
    if (!r->admitted)
      return absl::FailedPreconditionError(transfer.request_id + " still waits for KV blocks");
    kv = r->kv;
    ++kv_arriving_;
  }
  // The sequence is not shared until kv_received is set.
  absl::Status stored = DeserializeKv(transfer, backend_->config().num_hidden_layers, kv.get());
  absl::MutexLock lock(&mu_);
  --kv_arriving_;
  if (!stored.ok()) return stored;
  if (!kv->status().ok()) {
    return absl::InternalError(
        absl::StrCat("storing the KV rows failed: ", kv->status().message()));
  }
  if (transfer.device.has_value() && !logged_device_kv_.exchange(true)) {
    std::cerr
        << "decode worker: KV handoff copied device to device from a prefill worker's GPU memory"
        << std::endl;
  }
  if (r->done)
    return absl::FailedPreconditionError("the reservation for " + transfer.request_id +
                                         " ended during the KV handoff");
  r->kv_received = true;
  kv->PublishPrefix(r->spec.prompt_ids);
  EndPending(r.get());
  // The first event: the prefill worker's token, its alternatives as asked,
  // and how long the prompt queued.
  const DecodeSpec& spec = r->spec;
  r->output = {transfer.first_token};
  TokenEvent first;
  first.queue_seconds = transfer.queue_seconds;
  first.cached_tokens = transfer.cached_tokens;
  first.ids.push_back(transfer.first_token);
  if (spec.sampling.top_logprobs > 0) first.logprobs.push_back(transfer.first_logprobs);
  if (spec.sampling.wants_logprob()) first.token_logprobs.push_back(transfer.first_logprob);
  if (spec.sampling.prompt_logprobs >= 0) first.prompt_logprobs = transfer.prompt_logprobs;
  first.stopped = std::find(spec.stop_token_ids.begin(), spec.stop_token_ids.end(),
                            transfer.first_token) != spec.stop_token_ids.end();
  first.finished = first.stopped || spec.max_new_tokens <= 1;
  const bool finished = first.finished;
  r->outbox.Push(std::move(first));
  if (finished) {
    Finish(r, absl::OkStatus());
  } else {
    r->running = true;
  }
  return absl::OkStatus();
}

void DecodeEngine::Release(const std::shared_ptr<Request>& request) {
  absl::MutexLock lock(&mu_);
  Cancel(request, absl::CancelledError("released"));
}

int DecodeEngine::HeldTokens(const Request& r) const {
  absl::MutexLock lock(&mu_);
  return r.done || r.kv == nullptr ? 0 : r.kv->cached_tokens();
}

void DecodeEngine::Cancel(std::shared_ptr<Request> r, absl::Status why) {
  if (r->done) return;
  if (r->running) {
    r->cancelled = true;  // the loop owns running requests' caches
  } else {
    Finish(std::move(r), std::move(why));
  }
}

void DecodeEngine::EndPending(Request* r) {
  if (r->pending_blocks == 0) return;
  auto it = pending_blocks_.find(r->caller);
  if (it != pending_blocks_.end() && (it->second -= r->pending_blocks) <= 0) {
    pending_blocks_.erase(it);
  }
  r->pending_blocks = 0;
}

void DecodeEngine::Finish(std::shared_ptr<Request> r,
                          absl::Status status) {  // by value: callers pass map entries
  EndPending(r.get());
  r->status = std::move(status);
  r->done = true;
  r->outbox.Close();
  r->running = false;
  if (auto w = waiting_.find({r->spec.priority, r->arrival});
      w != waiting_.end() && w->second == r) {
    waiting_.erase(w);
    if (!r->admitted) --waiting_new_;
  }
  for (auto it = requests_.begin(); it != requests_.end(); ++it) {
    if (it->second == r) {
      requests_.erase(it);
      break;
    }
  }
  r->kv.reset();       // blocks back to the pool now, not when the last reader lets go
  r->swapped.reset();  // and its host copy
  ++frees_;
  UpdateGauges();
}

void DecodeEngine::UpdateGauges() {
  if (kv_usage_ == nullptr) return;
  const KvUsage u = backend_->kv_usage();
  kv_usage_->Set(u.used_fraction());
  kv_free_blocks_->Set(u.free_blocks);
  running_->Set(static_cast<double>(requests_.size() - waiting_.size()));
  waiting_gauge_->Set(static_cast<double>(waiting_.size()));
  swapped_bytes_gauge_->Set(static_cast<double>(swapped_bytes_.load()));
  prefix_metrics_->Update(backend_->prefix_cache_stats());
}

absl::Status DecodeEngine::Decode(const std::shared_ptr<Request>& r, const DecodeSink& sink,
                                  const CancelToken& cancel) {
  {
    absl::MutexLock lock(&mu_);
    if (r->streaming)
      return absl::AlreadyExistsError(absl::StrCat(r->spec.request_id, " is already decoding"));
    r->streaming = true;
  }
  // Cancellation ends a request waiting for its KV at once, and marks a
  // running one, which the loop drops at the next step boundary; Finish wakes
  // the wait below. (Registered with no lock held: an already cancelled
  // token runs this at once.)
  CancelToken::Registration on_cancel = cancel.OnCancel([this, r] {
    absl::MutexLock lock(&mu_);
    Cancel(r, absl::CancelledError("cancelled by the caller"));
  });
  for (bool closed = false; !closed;) {
    for (const TokenEvent& e : r->outbox.Take(&closed)) sink(e);
  }
  on_cancel.Reset();  // before taking mu_: a running callback takes it
  absl::MutexLock lock(&mu_);
  return r->status;
}

void DecodeEngine::ExpireReservations() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<Request>> expired;
  for (auto& [id, r] : requests_) {
    if (r->admitted && !r->kv_received && !r->done &&
        now - r->reserved_at > options_.reservation_lease)
      expired.push_back(r);
  }
  for (auto& r : expired) Finish(r, absl::DeadlineExceededError("reservation lease expired"));
}

void DecodeEngine::Loop() {
  while (true) {
    std::vector<StepItem> batch;
    {
      absl::MutexLock lock(&mu_);
      // KV arriving goes first: a handoff in progress needs the backend a
      // moment (its rows into the cache), and the next step would hold it off
      // for a whole step (steps back to back can starve it: its first token,
      // so the client's, waits). The step after it takes the new request too.
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (stopping_) return true;
        if (kv_arriving_ > 0) return false;
        // Blocks freed since the last admission may admit a queued request.
        if (!waiting_.empty() && frees_ != frees_admitted_) return true;
        for (auto& [id, r] : requests_) {
          if (r->running) return true;
        }
        return false;
      };
      mu_.AwaitWithTimeout(absl::Condition(&has_work), absl::Milliseconds(200));
      if (stopping_) return;
      ExpireReservations();
      std::vector<std::shared_ptr<Request>> cancelled;
      for (auto& [id, r] : requests_) {
        if (r->running && r->cancelled) cancelled.push_back(r);
      }
      for (auto& r : cancelled) Finish(r, absl::CancelledError("cancelled by the caller"));
      frees_admitted_ = frees_;
      Admit();
      batch = PlanStep();
    }
    if (!batch.empty()) Step(batch);
  }
}

void DecodeEngine::Step(const std::vector<StepItem>& batch) {
  std::vector<std::vector<int32_t>> tokens(batch.size());
  std::vector<SequenceInput> inputs(batch.size());
  std::vector<SampleRequest> samples(batch.size());
  // Every request's token comes from the backend's sampling step (on a GPU
  // the logits never leave it), with its own parameters and draw. A request
  // computing its prompt (or, resumed, prompt + output: its KV rebuilt) feeds
  // its next chunk and samples its next token from the last chunk's, as if
  // prefilled elsewhere (or never preempted).
  int top_k = 0;
  int step_tokens = 0;
  int chunks = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    Request& r = *batch[i].request;
    int prompt_logprobs = -1;
    if (r.recompute) {
      // Past the rows its sequence holds (from the prefix cache, earlier chunks).
      const int from = r.kv->length();
      const int prompt = static_cast<int>(r.spec.prompt_ids.size());
      for (int t = from; t < from + batch[i].tokens; ++t)
        tokens[i].push_back(t < prompt ? r.spec.prompt_ids[t] : r.output[t - prompt]);
      if (r.output.empty()) prompt_logprobs = r.spec.sampling.prompt_logprobs;
      ++chunks;
    } else {
      tokens[i] = {r.output.back()};
    }
    step_tokens += static_cast<int>(tokens[i].size());
    inputs[i] = {tokens[i], r.kv.get()};
    samples[i] = {&r.spec.sampling, r.sampler->Draw(static_cast<int>(r.output.size())),
                  r.spec.prompt_ids, r.output, prompt_logprobs};
    // A prompt chunk before the last: its last position scores the next
    // chunk's first token.
    const int next = r.kv->length() + static_cast<int>(tokens[i].size());
    if (prompt_logprobs >= 0 && next < static_cast<int>(r.spec.prompt_ids.size()))
      samples[i].prompt_next = r.spec.prompt_ids[next];
    top_k = std::max(top_k, r.spec.sampling.top_logprobs);
  }
  const auto start = std::chrono::steady_clock::now();
  const int mb = experts_ != nullptr && experts_->IsAsync() &&
                         static_cast<int>(batch.size()) >= options_.micro_batch_min
                     ? options_.micro_batches
                     : 1;
  absl::StatusOr<SampledTokens> chosen =
      backend_->ForwardSample(inputs, experts_, samples, top_k, mb);
  const absl::Status status = chosen.status();
  if (step_seconds_ != nullptr) {
    step_seconds_->Observe(SecondsSince(start));
    step_tokens_->Observe(static_cast<double>(step_tokens));
    prompt_chunks_->Increment(static_cast<double>(chunks));
  }
  absl::MutexLock lock(&mu_);
  if (!status.ok()) {
    const absl::Status s =
        status.code() == absl::StatusCode::kInvalidArgument
            ? status
            : absl::UnavailableError(absl::StrCat("decode step failed: ", status.message()));
    for (const StepItem& item : batch) Finish(item.request, s);
    return;
  }
  const int block_size = backend_->kv_usage().block_size;
  int generated = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    Request& r = *batch[i].request;
    // A block its rows just filled joins the prefix cache (a later turn of
    // the chat starts with this prompt and output).
    if (block_size > 0 && (r.recompute || r.kv->length() % block_size == 0)) {
      std::vector<int32_t> known = r.spec.prompt_ids;
      known.insert(known.end(), r.output.begin(), r.output.end());
      r.kv->PublishPrefix(known);
    }
    // This chunk's prompt log-probabilities, after the earlier ones'.
    if (samples[i].prompt_logprobs >= 0)
      r.prompt_logprobs.Append(std::move(chosen->prompt_logprobs[i]));
    // A chunk before the last: its token is not the next one.
    if (r.recompute &&
        r.kv->length() < static_cast<int>(r.spec.prompt_ids.size() + r.output.size()))
      continue;
    r.recompute = false;
    const bool first = r.output.empty();  // its prompt computed here: the first token
    const int want = r.spec.sampling.top_logprobs;
    const int32_t token = chosen->ids[i];
    std::vector<TokenLogprob> top;
    if (want > 0)
      top.assign(chosen->top_logprobs[i].begin(), chosen->top_logprobs[i].begin() + want);
    r.output.push_back(token);
    ++generated;
    TokenEvent m;
    if (first) {
      EndPending(batch[i].request.get());  // a prompt computed here: no longer pending
      m.queue_seconds = std::max(r.queue_seconds, 0.0);
      m.cached_tokens = r.cached_tokens;
      if (r.spec.sampling.prompt_logprobs >= 0) m.prompt_logprobs = std::move(r.prompt_logprobs);
    }
    m.ids.push_back(token);
    if (want > 0) m.logprobs.push_back(std::move(top));
    if (r.spec.sampling.wants_logprob()) m.token_logprobs.push_back(chosen->logprobs[i]);
    m.stopped = std::find(r.spec.stop_token_ids.begin(), r.spec.stop_token_ids.end(), token) !=
                r.spec.stop_token_ids.end();
    m.finished = m.stopped || static_cast<int>(r.output.size()) >= r.spec.max_new_tokens;
    const bool finished = m.finished;
    r.outbox.Push(std::move(m));
    if (finished) Finish(batch[i].request, absl::OkStatus());
  }
  if (tokens_ != nullptr) {
    // Requests that produced a token (a chunk before a prompt's last does
    // not; a step of such chunks alone is not observed): the histogram's _sum
    // stays the tokens generated.
    if (generated > 0) batch_size_->Observe(static_cast<double>(generated));
    tokens_->Increment(static_cast<double>(generated));
  }
  UpdateGauges();
}

void DecodeEngine::Drain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

ServingLoad DecodeEngine::Load() const {
  ServingLoad load;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, r] : requests_) load.num_running += r->running ? 1 : 0;
    load.in_flight = static_cast<int>(requests_.size());
    load.num_waiting = static_cast<int>(waiting_.size());
    load.preemptions = num_preemptions_;
    load.draining = draining_;
  }
  const KvUsage u = backend_->kv_usage();
  load.kv_usage = u.used_fraction();
  load.free_kv_blocks = u.free_blocks;
  ReportPrefixCache(*backend_, &load);
  return load;
}

}  // namespace moesh
