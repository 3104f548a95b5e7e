// The expert dispatch on the wire: the one place where a plain MoeDispatch
// (common/model/expert_client.h) and its result become moesh.v1's
// DispatchRequest/DispatchResponse and back. Every transport that carries a
// dispatch as a message (grpc, ucx, nccl's host calls) converts at its edge
// with these; the DataChannel and DispatchHandler interfaces, and the cores
// behind them, speak the plain types only.
//
// Encodings (MoeDispatch::wire, chosen by the sender: --dispatch_dtype): the
// hidden states go as fp32 (exact), bf16 (round to nearest even) or fp8 —
// e4m3 codes with one float32 scale per token per 128 channels, scale =
// max(amax, 1e-10) / 448 (DeepSeek's act_quant, DeepEP's FP8 dispatch;
// kernels/cpu/fp8.h's QuantizeFp8Rows), the last group narrower where hidden
// % 128 != 0 — and the answer as fp32 or bf16. Each message names its
// encoding, so a receiver reads whatever comes; the receiver's handler always
// sees fp32 (widened into storage DecodedDispatch owns).
#ifndef MOESH_COMMON_TRANSPORT_DISPATCH_WIRE_H_
#define MOESH_COMMON_TRANSPORT_DISPATCH_WIRE_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/expert_client.h"
#include "common/transport/transport.h"
#include "moesh/v1/worker.pb.h"

namespace moesh {

// --dispatch_dtype's values: "fp32" (exact both ways), "bf16" (bf16 both
// ways), "fp8" (e4m3 hidden states with scales, the answer in bf16: DeepEP's
// FP8 dispatch with its bf16 combine). INVALID_ARGUMENT naming the choices
// otherwise.
absl::StatusOr<DispatchWire> ParseDispatchDType(absl::string_view name);
// "fp32", "bf16", "fp8" (the hidden states' encoding: the flag's value for
// ParseDispatchDType's three).
const char* WireDTypeName(WireDType t);

// Bytes of `num_tokens` rows of `hidden` values in `t` on the wire, scales
// included (fp8: hidden + 4 * ceil(hidden / 128) per row).
size_t WireHiddenBytes(WireDType t, int num_tokens, int hidden);

// The sending side: the dispatch as a message in dispatch.wire's encodings
// (its buffers copied, or converted).
// REQUIRES: host memory (the channels check: CheckHostDispatch).
void EncodeDispatchRequest(const MoeDispatch& dispatch, v1::DispatchRequest* request);

// A decoded request: `dispatch` (host fp32, wire = the request's encodings)
// borrows the request's ids and weights (valid while the request is, unchanged)
// and reads its hidden states from the request's bytes (fp32) or from
// `widened`, which this object owns (bf16 and fp8, converted to fp32 here).
// Move-only: moving keeps `dispatch` valid (the vector's buffer moves).
struct DecodedDispatch {
  MoeDispatch dispatch;
  std::vector<float> widened;  // empty for fp32

  DecodedDispatch() = default;
  DecodedDispatch(DecodedDispatch&&) = default;
  DecodedDispatch& operator=(DecodedDispatch&&) = default;
  DecodedDispatch(const DecodedDispatch&) = delete;
  DecodedDispatch& operator=(const DecodedDispatch&) = delete;
};

// The receiving side. INVALID_ARGUMENT naming the field for bad dimensions (a
// negative token count, top_k or hidden not positive), an unknown `encoding`
// or a `reply_encoding` not FP32 or BF16, hidden_states not num_tokens *
// hidden values of the encoding, `scales` not num_tokens * ceil(hidden / 128)
// finite values >= 0 for FP8 (or any for the others), or topk_ids /
// topk_weights not num_tokens * top_k.
absl::StatusOr<DecodedDispatch> DecodeDispatchRequest(const v1::DispatchRequest& request);

// The receiving side's answer: `out` (fp32 [num_tokens, hidden], as the
// handler wrote it) as the response's bytes, in dispatch.wire.reply.
void EncodeDispatchResponse(const MoeDispatch& dispatch, const float* out,
                            v1::DispatchResponse* response);

// The sending side: the response's bytes (fp32 or bf16, as it says) into
// `out` (fp32 [num_tokens, hidden] of `dispatch`, overwritten). DATA_LOSS
// "expert worker <peer> returned N bytes, expected M" if the size is not
// that, or naming an encoding that is not FP32 or BF16; the worker is not to
// be trusted then (RemoteExpertClient marks it down).
absl::Status DecodeDispatchResponse(const v1::DispatchResponse& response,
                                    const MoeDispatch& dispatch, absl::string_view peer,
                                    float* out);

// The receiving side whole: decodes `request`, runs it on `handler` and
// encodes its result into `response` (in the request's reply_encoding); the
// decode's or the handler's error otherwise.
absl::Status ServeDispatch(DispatchHandler& handler, const v1::DispatchRequest& request,
                           v1::DispatchResponse* response);

}  // namespace moesh

#endif  // MOESH_COMMON_TRANSPORT_DISPATCH_WIRE_H_
