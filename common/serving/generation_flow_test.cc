// RunGeneration against scripted workers: which decode worker it reserves on,
// when it releases, what reaches the sink, and which status comes back.
#include "common/serving/generation_flow.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace moesh {
namespace {

class FakePrefill : public PrefillClient {
 public:
  absl::StatusOr<PrefillResult> Prefill(const PrefillSpec& spec, const CancelToken&) override {
    specs.push_back(spec);
    if (!status.ok()) return status;
    PrefillResult r;
    r.first_token = first_token;
    r.queue_seconds = 0.25;
    r.logprobs = {{first_token, -0.5f}};
    return r;
  }
  absl::Status status;
  int32_t first_token = 7;
  std::vector<PrefillSpec> specs;
};

class FakeDecode : public DecodeClient {
 public:
  explicit FakeDecode(std::string address) : address_(std::move(address)) {}
  const std::string& kv_address() const override { return address_; }
  absl::Status Reserve(const std::string& id, int prompt_tokens, int max_tokens) override {
    reserved.push_back(id);
    reserved_max_tokens = max_tokens;
    return reserve_status;
  }
  void Release(const std::string& id) override { released.push_back(id); }
  absl::Status Decode(const DecodeSpec& spec, const TokenSink& sink,
                      const CancelToken& cancel) override {
    decoded = spec;
    for (const TokenEvent& e : events) {
      if (cancel.cancelled()) return absl::CancelledError("cancelled");
      if (!sink(e)) return absl::OkStatus();
    }
    return decode_status;
  }
  absl::Status reserve_status;
  absl::Status decode_status;
  std::vector<TokenEvent> events;
  std::vector<std::string> reserved, released;
  int reserved_max_tokens = 0;
  DecodeSpec decoded;

 private:
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

TEST(GenerationFlowTest, ReservesPrefillsThenDecodes) {
  FakePrefill prefill;
  FakeDecode decode("decode-a:1");
  decode.events = {Event({8}), Event({9}), Event({}, true)};
  DecodeClient* const decoders[] = {&decode};
  Collected out;
  ASSERT_TRUE(RunGeneration(Request(4), prefill, decoders, out.Sink(), kNever).ok());
  EXPECT_EQ(out.ids, (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(out.queue_seconds, 0.25);
  EXPECT_EQ(out.logprob_rows.front(), 1u);  // the first token's, as asked
  EXPECT_EQ(decode.reserved_max_tokens, 3 + 4 - 1);
  ASSERT_EQ(prefill.specs.size(), 1u);
  EXPECT_EQ(prefill.specs[0].decode_address, "decode-a:1");
  EXPECT_EQ(decode.decoded.first_token, 7);
  EXPECT_EQ(decode.decoded.max_new_tokens, 4);
  EXPECT_TRUE(decode.released.empty());  // a decoded request frees itself
}

TEST(GenerationFlowTest, SkipsFullAndVanishedWorkersButNotOtherRefusals) {
  FakePrefill prefill;
  FakeDecode full("full:1"), gone("gone:1"), ok("ok:1");
  full.reserve_status = absl::ResourceExhaustedError("full");
  gone.reserve_status = absl::UnavailableError("gone");
  DecodeClient* const decoders[] = {&full, &gone, &ok};
  Collected out;
  ASSERT_TRUE(RunGeneration(Request(1), prefill, decoders, out.Sink(), kNever).ok());
  EXPECT_EQ(prefill.specs.at(0).decode_address, "ok:1");

  FakeDecode dup("dup:1"), never("never:1");
  dup.reserve_status = absl::AlreadyExistsError("r1 exists");
  DecodeClient* const refusing[] = {&dup, &never};
  const absl::Status s = RunGeneration(Request(1), prefill, refusing, out.Sink(), kNever);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(never.reserved.empty());
}

TEST(GenerationFlowTest, NoRoomAnywhereIsTheLastRefusal) {
  FakePrefill prefill;
  FakeDecode a("a:1"), b("b:1");
  a.reserve_status = absl::UnavailableError("a gone");
  b.reserve_status = absl::ResourceExhaustedError("b full");
  DecodeClient* const decoders[] = {&a, &b};
  Collected out;
  const absl::Status s = RunGeneration(Request(4), prefill, decoders, out.Sink(), kNever);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(prefill.specs.empty());
}

TEST(GenerationFlowTest, ReleasesTheReservationWhenItDoesNotDecode) {
  FakeDecode decode("d:1");
  DecodeClient* const decoders[] = {&decode};
  {  // the prefill failed
    FakePrefill prefill;
    prefill.status = absl::UnavailableError("prefill worker died");
    Collected out;
    EXPECT_EQ(RunGeneration(Request(4), prefill, decoders, out.Sink(), kNever).code(),
              absl::StatusCode::kUnavailable);
    EXPECT_TRUE(out.ids.empty());
  }
  {  // the first token is a stop id
    FakePrefill prefill;
    prefill.first_token = 2;
    Collected out;
    EXPECT_TRUE(RunGeneration(Request(4), prefill, decoders, out.Sink(), kNever).ok());
    EXPECT_EQ(out.ids, (std::vector<int32_t>{2}));
  }
  {  // one token asked for
    FakePrefill prefill;
    Collected out;
    EXPECT_TRUE(RunGeneration(Request(1), prefill, decoders, out.Sink(), kNever).ok());
  }
  {  // the sink declined the first token
    FakePrefill prefill;
    Collected out;
    EXPECT_TRUE(RunGeneration(Request(4), prefill, decoders, out.Sink(1), kNever).ok());
  }
  EXPECT_EQ(decode.released, (std::vector<std::string>{"r1", "r1", "r1", "r1"}));
}

TEST(GenerationFlowTest, SinkDecliningStopsDecodeAndCancellationIsReported) {
  FakePrefill prefill;
  FakeDecode decode("d:1");
  decode.events = {Event({8}), Event({9}), Event({10})};
  DecodeClient* const decoders[] = {&decode};
  Collected declined;
  EXPECT_TRUE(RunGeneration(Request(8), prefill, decoders, declined.Sink(2), kNever).ok());
  EXPECT_EQ(declined.ids, (std::vector<int32_t>{7, 8}));

  Collected cancelled;
  CancelToken cancel;  // the caller gives up once the second token arrived
  const ChunkSink collect = cancelled.Sink();
  const ChunkSink sink = [&](const TokenChunk& c) {
    const bool more = collect(c);
    if (cancelled.ids.size() >= 2) cancel.Cancel();
    return more;
  };
  const absl::Status s = RunGeneration(Request(8), prefill, decoders, sink, cancel);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(cancelled.ids, (std::vector<int32_t>{7, 8}));
}

TEST(GenerationFlowTest, ACancelledRequestReleasesItsReservationWithoutPrefilling) {
  FakePrefill prefill;
  FakeDecode decode("d:1");
  DecodeClient* const decoders[] = {&decode};
  CancelToken cancel;
  cancel.Cancel();
  Collected out;
  EXPECT_EQ(RunGeneration(Request(8), prefill, decoders, out.Sink(), cancel).code(),
            absl::StatusCode::kCancelled);
  EXPECT_TRUE(prefill.specs.empty());
  EXPECT_TRUE(out.ids.empty());
  EXPECT_EQ(decode.released, (std::vector<std::string>{"r1"}));
}

TEST(GenerationFlowTest, ADecodeWorkerFailureIsTheResult) {
  FakePrefill prefill;
  FakeDecode decode("d:1");
  decode.events = {Event({8})};
  decode.decode_status = absl::UnavailableError("decode worker died");
  DecodeClient* const decoders[] = {&decode};
  Collected out;
  EXPECT_EQ(RunGeneration(Request(8), prefill, decoders, out.Sink(), kNever).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(out.ids, (std::vector<int32_t>{7, 8}));
}

}  // namespace
}  // namespace moesh
