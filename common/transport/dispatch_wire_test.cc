// The dispatch wire's encodings (dispatch_wire.h): fp32 exact, bf16 and fp8
// within their rounding, each message the size it says, and hostile messages
// refused with INVALID_ARGUMENT (requests) or DATA_LOSS (answers) naming the
// field, never read out of bounds.
#include "common/transport/dispatch_wire.h"

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

// Doubles every hidden state it is given (the answer a test can predict).
class Doubler : public DispatchHandler {
 public:
  absl::Status Dispatch(const MoeDispatch& d, float* out) override {
    for (size_t i = 0; i < static_cast<size_t>(d.num_tokens) * d.hidden; ++i)
      out[i] = 2 * d.hidden_f32()[i];
    return absl::OkStatus();
  }
};

// A dispatch of `tokens` x `hidden` normal values whose rows' scales differ
// by orders of magnitude (as residual streams do), top-2.
struct Sample {
  Sample(int tokens, int hidden, DispatchWire wire)
      : h(static_cast<size_t>(tokens) * hidden), ids(tokens * 2), weights(tokens * 2, 0.5f) {
    std::mt19937 rng(3);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (size_t i = 0; i < h.size(); ++i)
      h[i] = n(rng) * std::pow(10.0f, static_cast<int>((i / hidden) % 5) - 2);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % 7);
    d.layer = 2, d.num_tokens = tokens, d.hidden = hidden, d.top_k = 2, d.wire = wire;
    d.hidden_states = h.data(), d.topk_ids = ids.data(), d.topk_weights = weights.data();
  }
  std::vector<float> h;
  std::vector<int32_t> ids;
  std::vector<float> weights;
  MoeDispatch d;
};

constexpr DispatchWire kF32{WireDType::kF32, WireDType::kF32};
constexpr DispatchWire kBf16{WireDType::kBF16, WireDType::kBF16};
constexpr DispatchWire kFp8{WireDType::kFp8, WireDType::kBF16};

TEST(DispatchWireTest, TheFlagNamesEachEncoding) {
  EXPECT_EQ(*ParseDispatchDType("fp32"), kF32);
  EXPECT_EQ(*ParseDispatchDType("bf16"), kBf16);
  EXPECT_EQ(*ParseDispatchDType("fp8"), kFp8);  // DeepEP: FP8 dispatch, bf16 combine
  const absl::Status bad = ParseDispatchDType("fp16").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "--dispatch_dtype 'fp16': expected fp32, bf16 or fp8");
  // Bytes per token at DeepSeek-V3's hidden 7168: 4, 2 and 1 + 4/128 a value.
  EXPECT_EQ(WireHiddenBytes(WireDType::kF32, 1, 7168), 28672u);
  EXPECT_EQ(WireHiddenBytes(WireDType::kBF16, 1, 7168), 14336u);
  EXPECT_EQ(WireHiddenBytes(WireDType::kFp8, 1, 7168), 7168u + 56 * 4);
  EXPECT_EQ(WireHiddenBytes(WireDType::kFp8, 2, 300), 600u + 2 * 3 * 4);  // a narrower last group
}

// Each encoding through request and answer: the message holds the bytes it
// says, the receiver reads fp32 within the encoding's rounding (fp32: exact).
TEST(DispatchWireTest, EachEncodingRoundTripsWithinItsRounding) {
  const int tokens = 6, hidden = 300;  // groups of 128, 128 and 44
  for (const DispatchWire wire : {kF32, kBf16, kFp8}) {
    SCOPED_TRACE(WireDTypeName(wire.hidden));
    const Sample s(tokens, hidden, wire);
    v1::DispatchRequest request;
    EncodeDispatchRequest(s.d, &request);
    EXPECT_EQ(request.hidden_states().size() + request.scales_size() * sizeof(float),
              WireHiddenBytes(wire.hidden, tokens, hidden));
    absl::StatusOr<DecodedDispatch> got = DecodeDispatchRequest(request);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->dispatch.wire, wire);
    const float* back = got->dispatch.hidden_f32();
    const int groups = (hidden + 127) / 128;
    for (int t = 0; t < tokens; ++t) {
      for (int g = 0; g < groups; ++g) {
        const int c0 = g * 128, c1 = std::min(hidden, c0 + 128);
        float amax = 0;
        for (int c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(s.h[t * hidden + c]));
        if (wire.hidden == WireDType::kFp8) {
          EXPECT_FLOAT_EQ(request.scales(t * groups + g), amax / 448) << t << "," << g;
        }
        for (int c = c0; c < c1; ++c) {
          const float x = s.h[t * hidden + c], y = back[t * hidden + c];
          if (wire.hidden == WireDType::kF32) {
            ASSERT_EQ(y, x) << t << "," << c;
          } else if (wire.hidden == WireDType::kBF16) {
            ASSERT_EQ(y, Bf16ToF32(F32ToBf16(x))) << t << "," << c;  // round to nearest even
            ASSERT_LE(std::fabs(y - x), std::ldexp(std::fabs(x), -8)) << t << "," << c;
          } else {
            // e4m3 keeps 3 mantissa bits: within 2^-4 of the value (2^-4 of
            // its group's amax at most; below e4m3's normals, its step).
            ASSERT_LE(std::fabs(y - x), std::ldexp(amax, -4)) << t << "," << c;
            ASSERT_LE(std::fabs(y - x),
                      std::max(std::ldexp(std::fabs(x), -4), std::ldexp(amax / 448, -10)))
                << t << "," << c;
          }
        }
      }
    }
    // The answer (the handler doubled the fp32 it read) in the reply encoding.
    Doubler handler;
    v1::DispatchResponse response;
    ASSERT_TRUE(ServeDispatch(handler, request, &response).ok());
    EXPECT_EQ(response.output().size(),
              WireHiddenBytes(wire.reply, tokens, hidden));  // bf16: half fp32's
    std::vector<float> out(s.h.size(), -1.0f);
    ASSERT_TRUE(DecodeDispatchResponse(response, s.d, "w", out.data()).ok());
    for (size_t i = 0; i < out.size(); ++i) {
      const float want = 2 * back[i];
      if (wire.reply == WireDType::kF32) {
        ASSERT_EQ(out[i], want) << i;
      } else {
        ASSERT_EQ(out[i], Bf16ToF32(F32ToBf16(want))) << i;
      }
    }
  }
}

TEST(DispatchWireTest, AnAllZeroRowAndNoTokensTravel) {
  Sample s(2, 64, kFp8);
  std::fill(s.h.begin(), s.h.begin() + 64, 0.0f);
  v1::DispatchRequest request;
  EncodeDispatchRequest(s.d, &request);
  absl::StatusOr<DecodedDispatch> got = DecodeDispatchRequest(request);
  ASSERT_TRUE(got.ok()) << got.status();
  for (int c = 0; c < 64; ++c) EXPECT_EQ(got->dispatch.hidden_f32()[c], 0.0f) << c;
  s.d.num_tokens = 0;
  EncodeDispatchRequest(s.d, &request);
  EXPECT_TRUE(request.hidden_states().empty());
  EXPECT_EQ(request.scales_size(), 0);
  got = DecodeDispatchRequest(request);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->dispatch.num_tokens, 0);
}

// Internal RPCs are input too: every malformed request is INVALID_ARGUMENT
// naming what is wrong, from the decode and from ServeDispatch.
TEST(DispatchWireTest, HostileRequestsAreInvalidArgument) {
  const Sample s8(2, 200, kFp8), s16(2, 200, kBf16);  // fp8: 2 scales a token
  v1::DispatchRequest fp8, bf16;
  EncodeDispatchRequest(s8.d, &fp8);
  EncodeDispatchRequest(s16.d, &bf16);
  ASSERT_TRUE(DecodeDispatchRequest(fp8).ok());
  ASSERT_TRUE(DecodeDispatchRequest(bf16).ok());
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    const v1::DispatchRequest* base;
    std::function<void(v1::DispatchRequest*)> spoil;
    std::string message;
  };
  const Case cases[] = {
      {&fp8, [](v1::DispatchRequest* r) { r->set_encoding(static_cast<v1::HiddenEncoding>(7)); },
       "dispatch encoding 7 is not FP32, BF16 or FP8_E4M3"},
      {&fp8, [](v1::DispatchRequest* r) { r->set_reply_encoding(v1::HIDDEN_ENCODING_FP8_E4M3); },
       "dispatch reply_encoding 2 is not FP32 or BF16"},
      {&fp8,
       [](v1::DispatchRequest* r) { r->set_reply_encoding(static_cast<v1::HiddenEncoding>(-3)); },
       "dispatch reply_encoding -3 is not FP32 or BF16"},
      {&fp8, [](v1::DispatchRequest* r) { r->mutable_hidden_states()->resize(399); },
       "dispatch hidden_states holds 399 bytes, expected 400 (fp8)"},
      {&fp8, [](v1::DispatchRequest* r) { r->mutable_scales()->RemoveLast(); },
       "dispatch scales holds 3 values, expected 4 (fp8)"},
      {&fp8, [](v1::DispatchRequest* r) { r->add_scales(1.0f); },
       "dispatch scales holds 5 values, expected 4 (fp8)"},
      {&fp8, [](v1::DispatchRequest* r) { r->set_scales(1, std::nanf("")); },
       "dispatch scales[1] is nan, not finite and >= 0"},
      {&fp8, [inf](v1::DispatchRequest* r) { r->set_scales(3, inf); },
       "dispatch scales[3] is inf, not finite and >= 0"},
      {&fp8, [](v1::DispatchRequest* r) { r->set_scales(0, -0.5f); },
       "dispatch scales[0] is -0.5, not finite and >= 0"},
      // A message whose encoding was rewritten under its bytes.
      {&fp8, [](v1::DispatchRequest* r) { r->set_encoding(v1::HIDDEN_ENCODING_BF16); },
       "dispatch hidden_states holds 400 bytes, expected 800 (bf16)"},
      {&bf16, [](v1::DispatchRequest* r) { r->set_encoding(v1::HIDDEN_ENCODING_FP8_E4M3); },
       "dispatch hidden_states holds 800 bytes, expected 400 (fp8)"},
      {&bf16, [](v1::DispatchRequest* r) { r->set_encoding(v1::HIDDEN_ENCODING_FP32); },
       "dispatch hidden_states holds 800 bytes, expected 1600 (fp32)"},
      {&bf16, [](v1::DispatchRequest* r) { r->add_scales(1.0f); },
       "dispatch scales holds 1 values, expected 0 (bf16)"},
      {&bf16, [](v1::DispatchRequest* r) { r->mutable_hidden_states()->resize(799); },
       "dispatch hidden_states holds 799 bytes, expected 800 (bf16)"},
      {&bf16, [](v1::DispatchRequest* r) { r->set_hidden(-200); },
       "dispatch with bad dimensions (num_tokens 2, hidden -200, top_k 2)"},
      {&fp8, [](v1::DispatchRequest* r) { r->set_num_tokens(1 << 30); },
       "dispatch hidden_states holds 400 bytes, expected 214748364800 (fp8)"},
  };
  Doubler handler;
  for (const Case& c : cases) {
    v1::DispatchRequest r = *c.base;
    c.spoil(&r);
    const absl::Status s = DecodeDispatchRequest(r).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(s.message(), c.message);
    v1::DispatchResponse response;
    EXPECT_EQ(ServeDispatch(handler, r, &response).code(), absl::StatusCode::kInvalidArgument)
        << c.message;
  }
}

// An answer in an encoding no worker sends, or of the wrong size for the
// one it names, is DATA_LOSS (the worker is not to be trusted); out untouched.
TEST(DispatchWireTest, HostileAnswersAreDataLoss) {
  const Sample s(3, 4, kBf16);
  v1::DispatchResponse response;
  std::vector<float> out(12, -1.0f);
  EncodeDispatchResponse(s.d, s.h.data(), &response);
  EXPECT_EQ(response.encoding(), v1::HIDDEN_ENCODING_BF16);
  ASSERT_TRUE(DecodeDispatchResponse(response, s.d, "w", out.data()).ok());
  std::fill(out.begin(), out.end(), -1.0f);
  v1::DispatchResponse r = response;
  r.set_encoding(v1::HIDDEN_ENCODING_FP32);  // bf16's 24 bytes read as fp32
  absl::Status st = DecodeDispatchResponse(r, s.d, "10.0.0.1:9", out.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(st.message(), "expert worker 10.0.0.1:9 returned 24 bytes, expected 48");
  r = response;
  r.set_encoding(v1::HIDDEN_ENCODING_FP8_E4M3);
  st = DecodeDispatchResponse(r, s.d, "10.0.0.1:9", out.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(st.message(), "expert worker 10.0.0.1:9 answered in encoding 2, not FP32 or BF16");
  r.set_encoding(static_cast<v1::HiddenEncoding>(99));
  EXPECT_EQ(DecodeDispatchResponse(r, s.d, "w", out.data()).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(out, std::vector<float>(12, -1.0f));
}

}  // namespace
}  // namespace moesh
