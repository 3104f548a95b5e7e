// RunGeneration against scripted workers: which decode worker it opens the
// request on, when it lets the reservation go, what reaches the sink, and
// which status comes back.
#include "common/serving/generation_flow.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace moesh {
namespace {

class FakePrefill : public PrefillClient {
 public:
  absl::Status Prefill(const PrefillSpec& spec, const CancelToken&) override {
    specs.push_back(spec);
    return status;
  }
  absl::Status status;
  std::vector<PrefillSpec> specs;
};

// A decode worker whose streams replay `events` (the first token's included:
// it came with the KV) and end with `decode_status`.
class FakeDecode : public DecodeClient {
 public:
  explicit FakeDecode(std::string address) : address_(std::move(address)) {}
  const std::string& kv_address() const override { return address_; }
  absl::StatusOr<std::unique_ptr<DecodeStream>> Open(const DecodeSpec& spec,
                                                     const CancelToken& cancel) override {
    opened.push_back(spec.request_id);
    this->spec = spec;
    if (!open_status.ok()) return open_status;
    return std::make_unique<Stream>(this, spec.request_id, cancel);
  }
  absl::Status open_status;
  absl::Status decode_status;
  std::vector<TokenEvent> events;
  std::vector<std::string> opened, released;
  DecodeSpec spec;

 private:
  class Stream : public DecodeStream {
   public:
    Stream(FakeDecode* owner, std::string id, const CancelToken& cancel)
        : owner_(owner), id_(std::move(id)), cancel_(cancel) {}
    ~Stream() override {
      if (!relayed_) owner_->released.push_back(id_);
    }
    absl::Status Relay(const TokenSink& sink) override {
      relayed_ = true;
      for (const TokenEvent& e : owner_->events) {
        if (cancel_.cancelled()) return absl::CancelledError("cancelled");
        if (!sink(e)) return absl::OkStatus();
      }
      return owner_->decode_status;
    }

   private:
    FakeDecode* const owner_;
    const std::string id_;
    const CancelToken& cancel_;
    bool relayed_ = false;
  };
  const std::string address_;
};

GenerationRequest Request(int max_new_tokens) {
  GenerationRequest r;
  r.request_id = "r1";
  r.prompt = {5, 17, 300};
  r.max_new_tokens = max_new_tokens;
  r.stop_token_ids = {2};
  r.sampling.top_logprobs = 1;
  return r;
}

TokenEvent Event(std::vector<int32_t> ids, bool finished = false) {
  TokenEvent e;
  e.ids = std::move(ids);
  e.finished = finished;
  return e;
}

// The first event, as the decode worker streams it once the KV came: the
// prefill worker's token, its alternatives, its prompt's queue time.
TokenEvent First(int32_t token = 7) {
  TokenEvent e = Event({token});
  e.logprobs = {{{token, -0.5f}}};
  e.queue_seconds = 0.25;
  return e;
}

struct Collected {
  std::vector<int32_t> ids;
  std::vector<size_t> logprob_rows;
  double queue_seconds = -1;
  ChunkSink Sink(int accept_chunks = 1000) {
    return [this, accept_chunks](const TokenChunk& c) {
      if (queue_seconds < 0) queue_seconds = c.queue_seconds;
      ids.insert(ids.end(), c.ids.begin(), c.ids.end());
      logprob_rows.push_back(c.logprobs.size());
      return static_cast<int>(logprob_rows.size()) < accept_chunks;
    };
  }
};

const CancelToken kNever;

TEST(GenerationFlowTest, OpensPrefillsThenRelays) {
  FakePrefill prefill;
  FakeDecode decode("decode-a:1");
  decode.events = {First(), Event({8}), Event({9}, true)};
  DecodeClient* const decoders[] = {&decode};
  Collected out;
  ASSERT_TRUE(RunGeneration(Request(4), &prefill, decoders, out.Sink(), kNever).ok());
  EXPECT_EQ(out.ids, (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(out.queue_seconds, 0.25);
  EXPECT_EQ(out.logprob_rows.front(), 1u);  // the first token's, as asked
  EXPECT_EQ(decode.spec.max_tokens(), 3 + 4 - 1);
  EXPECT_EQ(decode.spec.prompt_ids, (std::vector<int32_t>{5, 17, 300}));
  EXPECT_EQ(decode.spec.stop_token_ids, (std::vector<int32_t>{2}));
  ASSERT_EQ(prefill.specs.size(), 1u);
  EXPECT_EQ(prefill.specs[0].decode_address, "decode-a:1");
  EXPECT_EQ(decode.spec.max_new_tokens, 4);
  EXPECT_FALSE(decode.spec.compute_prompt);
  EXPECT_TRUE(decode.released.empty());  // a decoded request frees itself
}

TEST(GenerationFlowTest, WithoutAPrefillWorkerTheDecodeWorkerComputesThePrompt) {
  FakeDecode full("full:1"), decode("decode-a:1");
  full.open_status = absl::ResourceExhaustedError("full");
  decode.events = {First(), Event({8}, true)};
  DecodeClient* const decoders[] = {&full, &decode};
  Collected out;
  GenerationOutcome outcome;
  ASSERT_TRUE(
      RunGeneration(Request(4), /*prefill=*/nullptr, decoders, out.Sink(), kNever, &outcome).ok());
  EXPECT_EQ(out.ids, (std::vector<int32_t>{7, 8}));
  EXPECT_TRUE(full.spec.compute_prompt);  // asked of every worker tried
  EXPECT_TRUE(decode.spec.compute_prompt);
  EXPECT_EQ(outcome.decoder, 1);
  EXPECT_FALSE(outcome.prefilled);  // no prefill worker to have succeeded
}

TEST(GenerationFlowTest, SkipsFullAndVanishedWorkersButNotOtherRefusals) {
  FakePrefill prefill;
  FakeDecode full("full:1"), gone("gone:1"), ok("ok:1");
  full.open_status = absl::ResourceExhaustedError("full");
  gone.open_status = absl::UnavailableError("gone");
  DecodeClient* const decoders[] = {&full, &gone, &ok};
  Collected out;
  ASSERT_TRUE(RunGeneration(Request(1), &prefill, decoders, out.Sink(), kNever).ok());
  EXPECT_EQ(prefill.specs.at(0).decode_address, "ok:1");

  FakeDecode dup("dup:1"), never("never:1");
  dup.open_status = absl::AlreadyExistsError("r1 exists");
  DecodeClient* const refusing[] = {&dup, &never};
  const absl::Status s = RunGeneration(Request(1), &prefill, refusing, out.Sink(), kNever);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(never.opened.empty());
}

TEST(GenerationFlowTest, NoRoomAnywhereIsTheLastRefusal) {
  FakePrefill prefill;
  FakeDecode a("a:1"), b("b:1");
  a.open_status = absl::UnavailableError("a gone");
  b.open_status = absl::ResourceExhaustedError("b full");
  DecodeClient* const decoders[] = {&a, &b};
  Collected out;
  const absl::Status s = RunGeneration(Request(4), &prefill, decoders, out.Sink(), kNever);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(prefill.specs.empty());
}

TEST(GenerationFlowTest, ReleasesTheReservationWhenThePrefillFails) {
  FakeDecode decode("d:1");
  decode.events = {First()};
  DecodeClient* const decoders[] = {&decode};
  FakePrefill prefill;
  prefill.status = absl::UnavailableError("prefill worker died");
  Collected out;
  EXPECT_EQ(RunGeneration(Request(4), &prefill, decoders, out.Sink(), kNever).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(out.ids.empty());
  EXPECT_EQ(decode.released, (std::vector<std::string>{"r1"}));
}

TEST(GenerationFlowTest, OutcomeSaysWhichWorkerFailed) {
  FakePrefill prefill;
  FakeDecode full("full:1"), d("d:1");
  full.open_status = absl::ResourceExhaustedError("full");
  d.events = {First(), Event({8})};
  d.decode_status = absl::UnavailableError("d died");
  DecodeClient* const decoders[] = {&full, &d};
  Collected out;
  GenerationOutcome outcome;
  EXPECT_EQ(RunGeneration(Request(4), &prefill, decoders, out.Sink(), kNever, &outcome).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(outcome.decoder, 1);
  EXPECT_TRUE(outcome.prefilled);  // the decode worker's failure, after 7 8
  EXPECT_EQ(out.ids, (std::vector<int32_t>{7, 8}));
  prefill.status = absl::UnavailableError("prefill died");
  EXPECT_FALSE(RunGeneration(Request(4), &prefill, decoders, out.Sink(), kNever, &outcome).ok());
  EXPECT_EQ(outcome.decoder, 1);
  EXPECT_FALSE(outcome.prefilled);
}

TEST(GenerationFlowTest, ContinuationFoldsTheOutputIntoThePrompt) {
  GenerationRequest r = Request(10);
  r.sampling.prompt_logprobs = 2;
  r.sampling.temperature = 0.5f;
  r.sampling.seed = 99;
  EXPECT_FALSE(GenerationDone(r, {}));
  EXPECT_FALSE(GenerationDone(r, {7, 8}));
  EXPECT_TRUE(GenerationDone(r, {7, 2}));  // a stop id
  EXPECT_TRUE(GenerationDone(r, std::vector<int32_t>(10, 7)));
  const GenerationRequest same = ContinuationOf(r, {});
  EXPECT_EQ(same.prompt, r.prompt);
  EXPECT_EQ(same.sampling.prompt_logprobs, 2);  // nothing went out: asked again
  const GenerationRequest next = ContinuationOf(r, {7, 8, 9});
  EXPECT_EQ(next.request_id, "r1");
  EXPECT_EQ(next.prompt, (std::vector<int32_t>{5, 17, 300, 7, 8, 9}));
  EXPECT_EQ(next.max_new_tokens, 7);
  EXPECT_EQ(next.stop_token_ids, r.stop_token_ids);
  EXPECT_EQ(next.sampling.prompt_logprobs, -1);
  EXPECT_EQ(next.sampling.top_logprobs, 1);
  ASSERT_TRUE(next.sampling.seed.has_value());
  EXPECT_EQ(Sampler(next.sampling).Draw(0), Sampler(r.sampling).Draw(3));
}

TEST(GenerationFlowTest, SinkDecliningStopsDecodeAndCancellationIsReported) {
  FakePrefill prefill;
  FakeDecode decode("d:1");
  decode.events = {First(), Event({8}), Event({9}), Event({10})};
  DecodeClient* const decoders[] = {&decode};
  Collected declined;
  EXPECT_TRUE(RunGeneration(Request(8), &prefill, decoders, declined.Sink(2), kNever).ok());
  EXPECT_EQ(declined.ids, (std::vector<int32_t>{7, 8}));

  Collected cancelled;
  CancelToken cancel;  // the caller gives up once the second token arrived
  const ChunkSink collect = cancelled.Sink();
  const ChunkSink sink = [&](const TokenChunk& c) {
    const bool more = collect(c);
    if (cancelled.ids.size() >= 2) cancel.Cancel();
    return more;
  };
  const absl::Status s = RunGeneration(Request(8), &prefill, decoders, sink, cancel);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(cancelled.ids, (std::vector<int32_t>{7, 8}));
}

TEST(GenerationFlowTest, ACancelledRequestReleasesItsReservationWithoutPrefilling) {
  FakePrefill prefill;
  FakeDecode decode("d:1");
  decode.events = {First()};
  DecodeClient* const decoders[] = {&decode};
  CancelToken cancel;
  cancel.Cancel();
  Collected out;
  EXPECT_EQ(RunGeneration(Request(8), &prefill, decoders, out.Sink(), cancel).code(),
            absl::StatusCode::kCancelled);
  EXPECT_TRUE(prefill.specs.empty());
  EXPECT_TRUE(out.ids.empty());
  EXPECT_EQ(decode.released, (std::vector<std::string>{"r1"}));
}

TEST(GenerationFlowTest, ADecodeWorkerFailureIsTheResult) {
  FakePrefill prefill;
  FakeDecode decode("d:1");
  decode.events = {First(), Event({8})};
  decode.decode_status = absl::UnavailableError("decode worker died");
  DecodeClient* const decoders[] = {&decode};
  Collected out;
  EXPECT_EQ(RunGeneration(Request(8), &prefill, decoders, out.Sink(), kNever).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(out.ids, (std::vector<int32_t>{7, 8}));
}

}  // namespace
}  // namespace moesh
