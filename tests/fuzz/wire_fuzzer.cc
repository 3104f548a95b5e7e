// libFuzzer target: the data plane's message decoders, as an expert worker
// and a decode worker meet them from the network. The first input byte picks
// the message, the rest is its serialized proto: a DispatchRequest
// (DecodeDispatchRequest, then every input row, id and weight read), a
// PushKvRequest (DecodePushKv, then DeserializeKv into a host cache), a
// DispatchResponse against a small dispatch (DecodeDispatchResponse), or
// TopLogprobs (LogprobsFromProto).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/model/kv_cache.h"
#include "common/transport/dispatch_wire.h"
#include "common/transport/kv_handoff.h"
#include "common/transport/kv_wire.h"
#include "common/transport/token_wire.h"
#include "moesh/v1/worker.pb.h"

namespace {

void FuzzDispatchRequest(const uint8_t* data, size_t size) {
  moesh::v1::DispatchRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  absl::StatusOr<moesh::DecodedDispatch> decoded = moesh::DecodeDispatchRequest(request);
  if (!decoded.ok()) return;
  const moesh::MoeDispatch& d = decoded->dispatch;
  if (d.num_tokens < 0 || d.hidden < 1 || d.top_k < 1) abort();
  double sum = 0;
  const float* hidden = d.hidden_f32();
  for (int64_t i = 0; i < int64_t{d.num_tokens} * d.hidden; ++i) sum += hidden[i];
  for (int64_t i = 0; i < int64_t{d.num_tokens} * d.top_k; ++i) {
    sum += d.topk_ids[i] + d.topk_weights[i];
  }
  volatile double sink = sum;
  (void)sink;
}

void FuzzPushKv(const uint8_t* data, size_t size) {
  moesh::v1::PushKvRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  absl::StatusOr<moesh::KvTransfer> t = moesh::DecodePushKv(request);
  if (!t.ok()) return;
  // A decode worker's cache has its model's shape: 2 layers of 8 here.
  moesh::SequenceKvCache kv(2, 8);
  (void)moesh::DeserializeKv(*t, 2, &kv);
}

void FuzzDispatchResponse(const uint8_t* data, size_t size) {
  moesh::v1::DispatchResponse response;
  if (!response.ParseFromArray(data, static_cast<int>(size))) return;
  // The dispatch it answers: 3 tokens of 4 floats, top-2 (a decoded request,
  // as the sending side holds it).
  static const moesh::v1::DispatchRequest* const request = [] {
    auto* r = new moesh::v1::DispatchRequest;
    r->set_num_tokens(3);
    r->set_hidden(4);
    r->set_top_k(2);
    r->set_hidden_states(std::string(3 * 4 * sizeof(float), '\0'));
    r->mutable_topk_ids()->Resize(3 * 2, 0);
    r->mutable_topk_weights()->Resize(3 * 2, 0.5f);
    return r;
  }();
  const moesh::MoeDispatch d = moesh::DecodeDispatchRequest(*request)->dispatch;
  std::vector<float> out(3 * 4);
  (void)moesh::DecodeDispatchResponse(response, d, "fuzz", out.data());
}

void FuzzLogprobs(const uint8_t* data, size_t size) {
  moesh::v1::TopLogprobs p;
  if (!p.ParseFromArray(data, static_cast<int>(size))) return;
  (void)moesh::LogprobsFromProto(p);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using Target = void (*)(const uint8_t*, size_t);
  static constexpr Target kTargets[] = {FuzzDispatchRequest, FuzzPushKv, FuzzDispatchResponse,
                                        FuzzLogprobs};
  if (size == 0) return 0;
  kTargets[data[0] % 4](data + 1, size - 1);
  return 0;
}
