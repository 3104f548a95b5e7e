#include "common/transport/dispatch_wire.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace moesh {
namespace {
size_t OutputFloats(const MoeDispatch& d) { return static_cast<size_t>(d.num_tokens) * d.hidden; }
}  // namespace

void EncodeDispatchRequest(const MoeDispatch& d, v1::DispatchRequest* r) {
  r->set_layer(d.layer);
  r->set_num_tokens(d.num_tokens);
  r->set_hidden(d.hidden);
  r->set_top_k(d.top_k);
  r->clear_hidden_states();
  r->clear_topk_ids();
  r->clear_topk_weights();
  if (d.num_tokens <= 0) return;
  if (d.hidden > 0) {
    r->mutable_hidden_states()->assign(static_cast<const char*>(d.hidden_states),
                                       OutputFloats(d) * sizeof(float));
  }
  if (d.top_k > 0) {
    const size_t pairs = static_cast<size_t>(d.num_tokens) * d.top_k;
    r->mutable_topk_ids()->Assign(d.topk_ids, d.topk_ids + pairs);
    r->mutable_topk_weights()->Assign(d.topk_weights, d.topk_weights + pairs);
  }
}

absl::StatusOr<MoeDispatch> DecodeDispatchRequest(const v1::DispatchRequest& r) {
  const int64_t n = r.num_tokens();
  if (n < 0 || r.top_k() <= 0 || r.hidden() <= 0)
    return absl::InvalidArgumentError("dispatch with bad dimensions");
  if (r.hidden_states().size() != static_cast<size_t>(n) * r.hidden() * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat("dispatch hidden_states holds ",
                                                   r.hidden_states().size(), " bytes, expected ",
                                                   n * r.hidden() * 4));
  }
  if (r.topk_ids_size() != n * r.top_k() || r.topk_weights_size() != n * r.top_k()) {
    return absl::InvalidArgumentError(
        "dispatch topk_ids/topk_weights do not match num_tokens * top_k");
  }
  MoeDispatch d;
  d.layer = r.layer();
  d.num_tokens = r.num_tokens();
  d.hidden = r.hidden();
  d.top_k = r.top_k();
  d.hidden_states = reinterpret_cast<const float*>(r.hidden_states().data());
  d.topk_ids = r.topk_ids().data();
  d.topk_weights = r.topk_weights().data();
  return d;
}

void EncodeDispatchResponse(const MoeDispatch& d, const float* out,
                            v1::DispatchResponse* response) {
  response->mutable_output()->assign(reinterpret_cast<const char*>(out),
                                     OutputFloats(d) * sizeof(float));
}

absl::Status DecodeDispatchResponse(const v1::DispatchResponse& response, const MoeDispatch& d,
                                    absl::string_view peer, float* out) {
  const size_t expected = OutputFloats(d) * sizeof(float);
  if (response.output().size() != expected) {
    return absl::DataLossError(absl::StrCat("expert worker ", peer, " returned ",
                                            response.output().size(), " bytes, expected ",
                                            expected));
  }
  if (expected > 0) std::memcpy(out, response.output().data(), expected);
  return absl::OkStatus();
}

absl::Status ServeDispatch(DispatchHandler& handler, const v1::DispatchRequest& request,
                           v1::DispatchResponse* response) {
  ASSIGN_OR_RETURN(const MoeDispatch d, DecodeDispatchRequest(request));
  std::vector<float> out(OutputFloats(d));
  RETURN_IF_ERROR(handler.Dispatch(d, out.data()));
  EncodeDispatchResponse(d, out.data(), response);
  return absl::OkStatus();
}

}  // namespace moesh
