// The expert dispatch on the wire: the one place where a plain MoeDispatch
// (common/model/expert_client.h) and its result become moesh.v1's
// DispatchRequest/DispatchResponse and back. Every transport that carries a
// dispatch as a message (grpc, ucx, nccl's host calls) converts at its edge
// with these; the DataChannel and DispatchHandler interfaces, and the cores
// behind them, speak the plain types only.
#ifndef MOESH_COMMON_TRANSPORT_DISPATCH_WIRE_H_
#define MOESH_COMMON_TRANSPORT_DISPATCH_WIRE_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/expert_client.h"
#include "common/transport/transport.h"
#include "moesh/v1/worker.pb.h"

namespace moesh {

// The sending side: the dispatch as a message (its buffers copied).
// REQUIRES: host memory (the channels check: CheckHostDispatch).
void EncodeDispatchRequest(const MoeDispatch& dispatch, v1::DispatchRequest* request);

// The receiving side: a view of the message, borrowing its buffers (valid
// while `request` is, unchanged). INVALID_ARGUMENT for bad dimensions (a
// negative token count, top_k or hidden not positive), hidden_states not
// num_tokens * hidden floats, or topk_ids/topk_weights not num_tokens * top_k.
absl::StatusOr<MoeDispatch> DecodeDispatchRequest(const v1::DispatchRequest& request);

// The receiving side's answer: `out` (fp32 [num_tokens, hidden], as the
// handler wrote it) as the response's bytes.
void EncodeDispatchResponse(const MoeDispatch& dispatch, const float* out,
                            v1::DispatchResponse* response);

// The sending side: the response's bytes into `out` (fp32 [num_tokens,
// hidden] of `dispatch`, overwritten). DATA_LOSS "expert worker <peer>
// returned N bytes, expected M" if the size is not that; the worker is not
// to be trusted then (RemoteExpertClient marks it down).
absl::Status DecodeDispatchResponse(const v1::DispatchResponse& response,
                                    const MoeDispatch& dispatch, absl::string_view peer,
                                    float* out);

// The receiving side whole: decodes `request`, runs it on `handler` and
// encodes its result into `response`; the decode's or the handler's error
// otherwise.
absl::Status ServeDispatch(DispatchHandler& handler, const v1::DispatchRequest& request,
                           v1::DispatchResponse* response);

}  // namespace moesh

#endif  // MOESH_COMMON_TRANSPORT_DISPATCH_WIRE_H_
