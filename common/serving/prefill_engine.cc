#include "common/serving/prefill_engine.h"

#include <algorithm>
#include <atomic>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "base/status.h"
#include "common/transport/kv_handoff.h"

namespace moesh {

PrefillEngine::PrefillEngine(AttentionBackend* backend, ExpertClient* experts, Transport* transport,
                             PrefillEngineOptions options)
    : backend_(backend), experts_(experts), transport_(transport), options_(options) {
  if (Metrics* m = options.metrics) {
    waiting_ = &m->GaugeFamily("moesh_num_requests_waiting", "Prompts queued for prefill.").Add({});
    queued_tokens_gauge_ =
        &m->GaugeFamily("moesh_prefill_queued_tokens", "Prompt tokens queued for prefill.").Add({});
    prompt_tokens_ =
        &m->CounterFamily("moesh_prompt_tokens_total", "Prompt tokens prefilled.").Add({});
    chunks_ = &m->CounterFamily("moesh_prefill_chunks_total",
                                "Prompt pieces prefill passes computed: a prompt run whole counts "
                                "one, a chunked one one per pass (--max_num_batched_tokens).")
                   .Add({});
    batch_seconds_ = &m->HistogramFamily("moesh_prefill_batch_seconds",
                                         "Wall time of one batched prefill forward.")
                          .Add({}, Metrics::LatencyBuckets());
    kv_bytes_ = &m->CounterFamily("moesh_kv_transfer_bytes_total",
                                  "KV cache bytes handed to decode workers.")
                     .Add({});
    kv_seconds_ =
        &m->HistogramFamily("moesh_kv_transfer_seconds", "Latency of one request's KV handoff.")
             .Add({}, Metrics::LatencyBuckets());
    if (options.prefix_cache_metrics) prefix_metrics_ = std::make_unique<PrefixCacheMetrics>(m);
  }
  thread_ = std::thread([this] { Loop(); });
}

PrefillEngine::~PrefillEngine() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
  absl::MutexLock lock(&mu_);
  for (Pending* p : queue_) {
    p->kv.reset();
    p->result = absl::UnavailableError("prefill worker shutting down");
    p->done = true;
  }
  queue_.clear();
}

absl::Status PrefillEngine::Prefill(const PrefillSpec& spec, const CancelToken* cancel) {
  const ModelConfig& c = backend_->config();
  RETURN_IF_ERROR(CheckRequestId(spec.request_id));
  if (spec.prompt_ids.empty()) return absl::InvalidArgumentError("empty prompt");
  if (spec.decode_held_tokens < 0 ||
      spec.decode_held_tokens >= static_cast<int>(spec.prompt_ids.size())) {
    return absl::InvalidArgumentError(absl::StrCat("decode_held_tokens ", spec.decode_held_tokens,
                                                   " outside [0, ", spec.prompt_ids.size(),
                                                   ") (the prompt's tokens)"));
  }
  if (absl::Status s = spec.sampling.ValidateServed(c.vocab_size); !s.ok()) return s;
  RETURN_IF_ERROR(CheckPrompt(*backend_, spec.prompt_ids, spec.sampling.prompt_logprobs));
  Pending p(&spec);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("prefill worker shutting down");
    if (draining_) return absl::UnavailableError("prefill worker draining (shutting down)");
    queue_.push_back(&p);
    queued_tokens_ += static_cast<int64_t>(spec.prompt_ids.size());
    UpdateQueueGauges();
  }
  // Registered with no lock held: an already cancelled token runs it at once.
  CancelToken::Registration on_cancel;
  if (cancel != nullptr) on_cancel = cancel->OnCancel([this, &p] { CancelQueued(&p); });
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&p.done));
  }
  on_cancel.Reset();  // a callback running now finishes before `p` goes
  return std::move(p.result);
}

void PrefillEngine::CancelQueued(Pending* p) {
  absl::MutexLock lock(&mu_);
  auto it = std::find(queue_.begin(), queue_.end(), p);
  if (it == queue_.end()) {
    p->cancelled = true;  // in a pass: a chunked prompt ends after it (RunBatch)
    return;
  }
  queue_.erase(it);
  queued_tokens_ -= p->remaining();
  UpdateQueueGauges();
  p->kv.reset();
  p->result = absl::CancelledError("cancelled while queued for prefill");
  p->done = true;
}

void PrefillEngine::UpdateQueueGauges() {
  if (waiting_ == nullptr) return;
  waiting_->Set(static_cast<double>(queue_.size()));
  queued_tokens_gauge_->Set(static_cast<double>(queued_tokens_));
}

void PrefillEngine::Loop() {
  while (true) {
    std::vector<Piece> batch;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      batch = TakeBatch();
      running_ = static_cast<int>(batch.size());
      UpdateQueueGauges();
      if (batch.empty()) {
        // The KV pool is full for now (a GPU's, or the one a colocated decode
        // engine shares): the prompts wait for blocks instead of failing.
        auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
        mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Milliseconds(5));
        continue;
      }
    }
    RunBatch(batch);
  }
}

std::vector<PrefillEngine::Piece> PrefillEngine::TakeBatch() {
  std::vector<Piece> batch;
  int left = options_.max_batch_tokens;
  // A new prompt found no KV blocks: the new ones behind it wait too (first
  // come, first served); prompts holding their sequence (chunked) go on.
  bool blocked = false;
  for (auto it = queue_.begin(); it != queue_.end() && left > 0;) {
    Pending* p = *it;
    const PrefillSpec& spec = *p->spec;
    const int n = static_cast<int>(spec.prompt_ids.size());
    const bool chunkable = options_.max_chunk_tokens > 0;
    const int queued = p->remaining();  // counted in queued_tokens_
    int take = queued;
    if (chunkable) {
      take = std::min({take, options_.max_chunk_tokens, left});
    } else if (!batch.empty() && take > left) {
      break;  // a longer prompt runs in a pass of its own
    }
    if (p->kv == nullptr) {
      if (blocked) {
        ++it;
        continue;
      }
      // Starting with the prefix cache's rows of the prompt: only the rest is
      // computed. Prompt log-probabilities need every position's logits: such
      // a prompt reads no cached rows (its blocks still join the cache).
      absl::StatusOr<std::unique_ptr<KvSequence>> seq = backend_->NewCachedSequence(
          n, spec.sampling.prompt_logprobs >= 0 ? absl::Span<const int32_t>() : spec.prompt_ids);
      const KvUsage u = backend_->kv_usage();
      if (seq.status().code() == absl::StatusCode::kResourceExhausted &&
          (n + u.block_size - 1) / std::max(u.block_size, 1) <= u.total_blocks) {
        blocked = true;
        ++it;
        continue;
      }
      p->queue_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - p->queued_at).count();
      if (!seq.ok()) {
        it = queue_.erase(it);
        queued_tokens_ -= queued;
        p->result = seq.status();
        p->done = true;
        continue;
      }
      p->kv = std::move(*seq);
      p->cached_tokens = p->kv->cached_tokens();
      take = std::min(take, p->remaining());
    }
    batch.push_back({p, take});
    left -= take;
    queued_tokens_ -= queued;
    it = queue_.erase(it);
  }
  return batch;
}

absl::StatusOr<DataChannel*> PrefillEngine::ChannelTo(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<DataChannel>& ch = channels_[address];
  if (ch == nullptr) {
    absl::StatusOr<std::unique_ptr<DataChannel>> made = transport_->Connect(address);
    if (!made.ok()) return made.status();
    ch = std::move(*made);
  }
  return ch.get();
}

bool PrefillEngine::HostKvOnly(const std::string& address) const {
  absl::MutexLock lock(&mu_);
  return host_kv_only_.count(address) > 0;
}

void PrefillEngine::Finish(Pending* p, absl::Status result) {
  p->kv.reset();
  absl::MutexLock lock(&mu_);
  p->result = std::move(result);
  p->done = true;
  --running_;
}

void PrefillEngine::RunBatch(const std::vector<Piece>& batch) {
  const ModelConfig& c = backend_->config();
  std::vector<SequenceInput> inputs(batch.size());
  std::vector<SampleRequest> samples(batch.size());
  int top_k = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    Pending& p = *batch[i].p;
    const PrefillSpec& spec = *p.spec;
    inputs[i] = {absl::MakeConstSpan(spec.prompt_ids).subspan(p.kv->length(), batch[i].tokens),
                 p.kv.get()};
    // The first generated token: step 0 of the request's draws (from the
    // last chunk's pass; earlier chunks' tokens are not used).
    samples[i] = {&spec.sampling,
                  Sampler(spec.sampling).Draw(/*step=*/0),
                  spec.prompt_ids,
                  {},
                  spec.sampling.prompt_logprobs};
    // A chunk before the last: its last position scores the next one's first token.
    const size_t next = p.kv->length() + batch[i].tokens;
    if (spec.sampling.prompt_logprobs >= 0 && next < spec.prompt_ids.size())
      samples[i].prompt_next = spec.prompt_ids[next];
    top_k = std::max(top_k, spec.sampling.top_logprobs);
  }
  if (prompt_tokens_ != nullptr) {
    // The tokens the forward computes: a prompt's cached prefix is not.
    for (const SequenceInput& in : inputs)
      prompt_tokens_->Increment(static_cast<double>(in.tokens.size()));
    chunks_->Increment(static_cast<double>(batch.size()));
  }
  const auto start = std::chrono::steady_clock::now();
  const int mb = experts_ != nullptr && experts_->IsAsync() ? options_.micro_batches : 1;
  absl::StatusOr<SampledTokens> chosen =
      backend_->ForwardSample(inputs, experts_, samples, top_k, mb);
  if (batch_seconds_ != nullptr) {
    batch_seconds_->Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  for (size_t i = 0; i < batch.size() && chosen.ok(); ++i) {
    Pending& p = *batch[i].p;
    // The prompt's full blocks join the prefix cache.
    p.kv->PublishPrefix(p.spec->prompt_ids);
    // This chunk's prompt log-probabilities, after the earlier ones'.
    if (p.spec->sampling.prompt_logprobs >= 0)
      p.prompt_logprobs.Append(std::move(chosen->prompt_logprobs[i]));
  }
  if (prefix_metrics_ != nullptr) prefix_metrics_->Update(backend_->prefix_cache_stats());
  // Each prompt's caller hears back as soon as its KV was handed over (so the
  // decode worker's first token reaches the client then, not after the whole
  // batch's handoffs), its blocks freed first. A pending prompt is not to be
  // touched after: its caller returns.
  std::vector<size_t> handoffs;  // the prompts whose KV goes to a decode worker now
  for (size_t i = 0; i < batch.size(); ++i) {
    Pending* const pending = batch[i].p;
    if (!chosen.ok()) {
      Finish(pending, chosen.status().code() == absl::StatusCode::kInvalidArgument
                          ? chosen.status()
                          : absl::UnavailableError(
                                absl::StrCat("prefill failed: ", chosen.status().message())));
      continue;
    }
    if (pending->remaining() > 0) {
      // A chunk before the last: back to the queue's tail, after the prompts
      // that queued meanwhile; its token is not the first one.
      absl::MutexLock lock(&mu_);
      --running_;
      if (pending->cancelled) {
        pending->kv.reset();
        pending->result = absl::CancelledError("cancelled while queued for prefill");
        pending->done = true;
        continue;
      }
      queue_.push_back(pending);
      queued_tokens_ += pending->remaining();
      UpdateQueueGauges();
      continue;
    }
    handoffs.push_back(i);
  }
  auto hand_off = [&](size_t i) {
    Pending* const pending = batch[i].p;
    const PrefillSpec& spec = *pending->spec;
    KvSequence& kv = *pending->kv;
    absl::StatusOr<DataChannel*> ch = ChannelTo(spec.decode_address);
    const auto kv_start = std::chrono::steady_clock::now();
    absl::Status pushed = ch.status();
    if (ch.ok()) {
      KvHandoff how = options_.kv_handoff;
      if (how == KvHandoff::kDevice && HostKvOnly(spec.decode_address)) how = KvHandoff::kHost;
      // Through the host, the rows the decode worker's reservation holds
      // already (its prefix cache) stay here.
      int first_row = spec.decode_held_tokens;
      auto push = [&](KvHandoff h, absl::StatusOr<KvTransfer>* msg) {
        *msg = SerializeKv(spec.request_id, kv, c.num_hidden_layers, h, first_row);
        if (!msg->ok()) return msg->status();
        (*msg)->first_token = chosen->ids[i];
        if (const int want = spec.sampling.top_logprobs; want > 0) {
          (*msg)->first_logprobs.assign(chosen->top_logprobs[i].begin(),
                                        chosen->top_logprobs[i].begin() + want);
        }
        (*msg)->queue_seconds = pending->queue_seconds;
        (*msg)->first_logprob = chosen->logprobs[i];
        if (spec.sampling.prompt_logprobs >= 0) (*msg)->prompt_logprobs = pending->prompt_logprobs;
        (*msg)->cached_tokens = pending->cached_tokens;
        if (!kv.status().ok()) {
          return absl::InternalError(
              absl::StrCat("reading the KV rows failed: ", kv.status().message()));
        }
        return (*ch)->PushKv(**msg);
      };
      absl::StatusOr<KvTransfer> msg;
      pushed = push(how, &msg);
      if (how == KvHandoff::kDevice && (pushed.code() == absl::StatusCode::kUnimplemented ||
                                        pushed.code() == absl::StatusCode::kFailedPrecondition)) {
        // This pair cannot share device memory (a CPU decode worker, no CUDA IPC between them): say
        // so once, and hand the KV over through the host to that worker from now on.
        std::cerr << "prefill worker: KV handoff to " << spec.decode_address
                  << " in device memory failed (" << pushed
                  << "); handing KV to it through the host from now on" << std::endl;
        {
          absl::MutexLock lock(&mu_);
          host_kv_only_.insert(spec.decode_address);
        }
        pushed = push(KvHandoff::kHost, &msg);
      }
      if (pushed.code() == absl::StatusCode::kFailedPrecondition && msg.ok() &&
          msg->first_row > 0) {
        // The reservation no longer holds what it said: send every row.
        first_row = 0;
        pushed = push(KvHandoff::kHost, &msg);
      }
      if (kv_bytes_ != nullptr && pushed.ok()) {
        kv_bytes_->Increment(msg->device.has_value()
                                 ? 2.0 * msg->num_tokens * msg->num_layers * msg->row_width
                                 : static_cast<double>(msg->row_bytes()));
        kv_seconds_->Observe(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - kv_start).count());
      }
    }
    if (!pushed.ok()) {
      pushed = absl::Status(
          pushed.code() == absl::StatusCode::kInvalidArgument ? absl::StatusCode::kInternal
                                                              : pushed.code(),
          absl::StrCat("KV handoff to ", spec.decode_address, " failed: ", pushed.message()));
    }
    Finish(pending, std::move(pushed));
  };
  // Handed over one after another, the batch's KVs would land at a decode
  // worker one a step (each import waits for the step running there, and the
  // next step starts before the next KV arrives): a burst of prompts would
  // wait a step per prompt ahead of it for its first token. They go out
  // together instead (DataChannel is thread-safe), at most
  // kConcurrentHandoffs at once, and arrive between the same two steps.
  if (handoffs.empty()) return;
  const size_t workers = std::min(handoffs.size(), kConcurrentHandoffs);
  std::atomic<size_t> next{0};
  absl::BlockingCounter left(static_cast<int>(workers));
  auto work = [&] {
    for (size_t j; (j = next.fetch_add(1)) < handoffs.size();) hand_off(handoffs[j]);
    left.DecrementCount();
  };
  for (size_t w = 1; w < workers; ++w) handoff_pool_.Schedule(work);
  work();
  left.Wait();
}

void PrefillEngine::Drain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

ServingLoad PrefillEngine::Load() const {
  ServingLoad load;
  absl::MutexLock lock(&mu_);
  load.queued_prompt_tokens = queued_tokens_;
  load.in_flight = static_cast<int>(queue_.size()) + running_;
  load.draining = draining_;
  ReportPrefixCache(*backend_, &load);
  return load;
}

}  // namespace moesh
