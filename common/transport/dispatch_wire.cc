#include "common/transport/dispatch_wire.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/dtype.h"
#include "base/status.h"
#include "kernels/cpu/fp8.h"

namespace moesh {
namespace {

size_t OutputFloats(const MoeDispatch& d) { return static_cast<size_t>(d.num_tokens) * d.hidden; }
size_t ScaleCount(int64_t num_tokens, int hidden) {
  return static_cast<size_t>(num_tokens) * cpu::Fp8Blocks(hidden);
}
// hidden_states' bytes in `t` (fp8: the codes; the scales go beside them).
size_t HiddenStatesBytes(WireDType t, int64_t num_tokens, int hidden) {
  const size_t values = static_cast<size_t>(num_tokens) * hidden;
  switch (t) {
    case WireDType::kBF16:
      return values * sizeof(uint16_t);
    case WireDType::kFp8:
      return values;
    case WireDType::kF32:
      break;
  }
  return values * sizeof(float);
}

v1::HiddenEncoding ToProto(WireDType t) {
  switch (t) {
    case WireDType::kBF16:
      return v1::HIDDEN_ENCODING_BF16;
    case WireDType::kFp8:
      return v1::HIDDEN_ENCODING_FP8_E4M3;
    case WireDType::kF32:
      break;
  }
  return v1::HIDDEN_ENCODING_FP32;
}

// The encoding `e` names (the field `field`'s value); INVALID_ARGUMENT for a
// number no HiddenEncoding has, or FP8_E4M3 where `fp8_ok` is false.
absl::StatusOr<WireDType> FromProto(int e, bool fp8_ok, absl::string_view field) {
  switch (e) {
    case v1::HIDDEN_ENCODING_FP32:
      return WireDType::kF32;
    case v1::HIDDEN_ENCODING_BF16:
      return WireDType::kBF16;
    case v1::HIDDEN_ENCODING_FP8_E4M3:
      if (fp8_ok) return WireDType::kFp8;
      break;
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("dispatch ", field, " ", e, " is not FP32",
                                                 fp8_ok ? ", BF16 or FP8_E4M3" : " or BF16"));
}

// `n` floats as `t` (kF32 or kBF16) into `bytes`.
void PutFloats(const float* src, size_t n, WireDType t, std::string* bytes) {
  if (t == WireDType::kBF16) {
    bytes->resize(n * sizeof(uint16_t));
    char* dst = bytes->data();
    for (size_t i = 0; i < n; ++i) {
      const uint16_t b = F32ToBf16(src[i]);
      std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
    }
    return;
  }
  bytes->assign(reinterpret_cast<const char*>(src), n * sizeof(float));
}

}  // namespace

absl::StatusOr<DispatchWire> ParseDispatchDType(absl::string_view name) {
  if (name == "fp32") return DispatchWire{WireDType::kF32, WireDType::kF32};
  if (name == "bf16") return DispatchWire{WireDType::kBF16, WireDType::kBF16};
  if (name == "fp8") return DispatchWire{WireDType::kFp8, WireDType::kBF16};
  return absl::InvalidArgumentError(
      absl::StrCat("--dispatch_dtype '", name, "': expected fp32, bf16 or fp8"));
}

const char* WireDTypeName(WireDType t) {
  switch (t) {
    case WireDType::kBF16:
      return "bf16";
    case WireDType::kFp8:
      return "fp8";
    case WireDType::kF32:
      break;
  }
  return "fp32";
}

size_t WireHiddenBytes(WireDType t, int num_tokens, int hidden) {
  return HiddenStatesBytes(t, num_tokens, hidden) +
         (t == WireDType::kFp8 ? ScaleCount(num_tokens, hidden) * sizeof(float) : 0);
}

void EncodeDispatchRequest(const MoeDispatch& d, v1::DispatchRequest* r) {
  r->set_layer(d.layer);
  r->set_num_tokens(d.num_tokens);
  r->set_hidden(d.hidden);
  r->set_top_k(d.top_k);
  r->set_encoding(ToProto(d.wire.hidden));
  r->set_reply_encoding(ToProto(d.wire.reply));
  r->clear_hidden_states();
  r->clear_scales();
  r->clear_topk_ids();
  r->clear_topk_weights();
  if (d.num_tokens <= 0) return;
  if (d.hidden > 0) {
    if (d.wire.hidden == WireDType::kFp8) {
      r->mutable_hidden_states()->resize(OutputFloats(d));
      r->mutable_scales()->Resize(static_cast<int>(ScaleCount(d.num_tokens, d.hidden)), 0.0f);
      cpu::QuantizeFp8Rows(d.hidden_f32(),
                           reinterpret_cast<uint8_t*>(r->mutable_hidden_states()->data()),
                           r->mutable_scales()->mutable_data(), d.num_tokens, d.hidden);
    } else {
      PutFloats(d.hidden_f32(), OutputFloats(d), d.wire.hidden, r->mutable_hidden_states());
    }
  }
  if (d.top_k > 0) {
    const size_t pairs = static_cast<size_t>(d.num_tokens) * d.top_k;
    r->mutable_topk_ids()->Assign(d.topk_ids, d.topk_ids + pairs);
    r->mutable_topk_weights()->Assign(d.topk_weights, d.topk_weights + pairs);
  }
}

absl::StatusOr<DecodedDispatch> DecodeDispatchRequest(const v1::DispatchRequest& r) {
  const int64_t n = r.num_tokens();
  if (n < 0 || r.top_k() <= 0 || r.hidden() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("dispatch with bad dimensions (num_tokens ", n,
                                                   ", hidden ", r.hidden(), ", top_k ", r.top_k(),
                                                   ")"));
  }
  ASSIGN_OR_RETURN(const WireDType encoding, FromProto(r.encoding(), true, "encoding"));
  ASSIGN_OR_RETURN(const WireDType reply, FromProto(r.reply_encoding(), false, "reply_encoding"));
  const size_t expected = HiddenStatesBytes(encoding, n, r.hidden());
  if (r.hidden_states().size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat("dispatch hidden_states holds ",
                                                   r.hidden_states().size(), " bytes, expected ",
                                                   expected, " (", WireDTypeName(encoding), ")"));
  }
  const size_t scales = encoding == WireDType::kFp8 ? ScaleCount(n, r.hidden()) : 0;
  if (static_cast<size_t>(r.scales_size()) != scales) {
    return absl::InvalidArgumentError(absl::StrCat("dispatch scales holds ", r.scales_size(),
                                                   " values, expected ", scales, " (",
                                                   WireDTypeName(encoding), ")"));
  }
  for (int i = 0; i < r.scales_size(); ++i) {
    if (!std::isfinite(r.scales(i)) || r.scales(i) < 0.0f) {
      return absl::InvalidArgumentError(
          absl::StrCat("dispatch scales[", i, "] is ", r.scales(i), ", not finite and >= 0"));
    }
  }
  if (r.topk_ids_size() != n * r.top_k() || r.topk_weights_size() != n * r.top_k()) {
    return absl::InvalidArgumentError(
        "dispatch topk_ids/topk_weights do not match num_tokens * top_k");
  }
  DecodedDispatch out;
  MoeDispatch& d = out.dispatch;
  d.layer = r.layer();
  d.num_tokens = r.num_tokens();
  d.hidden = r.hidden();
  d.top_k = r.top_k();
  d.wire = {encoding, reply};
  const size_t values = OutputFloats(d);
  if (encoding == WireDType::kF32) {
    d.hidden_states = r.hidden_states().data();
  } else {
    out.widened.resize(values);
    if (encoding == WireDType::kBF16) {
      ConvertToF32(DType::kBF16, r.hidden_states().data(), values, out.widened.data());
    } else {
      cpu::DequantizeFp8Rows(reinterpret_cast<const uint8_t*>(r.hidden_states().data()),
                             r.scales().data(), out.widened.data(), d.num_tokens, d.hidden);
    }
    d.hidden_states = out.widened.data();
  }
  d.topk_ids = r.topk_ids().data();
  d.topk_weights = r.topk_weights().data();
  return out;
}

void EncodeDispatchResponse(const MoeDispatch& d, const float* out,
                            v1::DispatchResponse* response) {
  const WireDType t = d.wire.reply == WireDType::kBF16 ? WireDType::kBF16 : WireDType::kF32;
  response->set_encoding(ToProto(t));
  PutFloats(out, OutputFloats(d), t, response->mutable_output());
}

absl::Status DecodeDispatchResponse(const v1::DispatchResponse& response, const MoeDispatch& d,
                                    absl::string_view peer, float* out) {
  absl::StatusOr<WireDType> t = FromProto(response.encoding(), false, "encoding");
  if (!t.ok()) {
    return absl::DataLossError(absl::StrCat("expert worker ", peer, " answered in encoding ",
                                            response.encoding(), ", not FP32 or BF16"));
  }
  const size_t expected = WireHiddenBytes(*t, d.num_tokens, d.hidden);
  if (response.output().size() != expected) {
    return absl::DataLossError(absl::StrCat("expert worker ", peer, " returned ",
                                            response.output().size(), " bytes, expected ",
                                            expected));
  }
  if (expected == 0) return absl::OkStatus();
  if (*t == WireDType::kBF16) {
    ConvertToF32(DType::kBF16, response.output().data(), OutputFloats(d), out);
  } else {
    std::memcpy(out, response.output().data(), expected);
  }
  return absl::OkStatus();
}

absl::Status ServeDispatch(DispatchHandler& handler, const v1::DispatchRequest& request,
                           v1::DispatchResponse* response) {
  ASSIGN_OR_RETURN(const DecodedDispatch decoded, DecodeDispatchRequest(request));
  const MoeDispatch& d = decoded.dispatch;
  std::vector<float> out(OutputFloats(d));
  RETURN_IF_ERROR(handler.Dispatch(d, out.data()));
  EncodeDispatchResponse(d, out.data(), response);
  return absl::OkStatus();
}

}  // namespace moesh
