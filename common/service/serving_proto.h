// The serving cores' plain types (common/serving) <-> the prefill and decode
// workers' wire messages (moesh.v1.PrefillWorker, DecodeWorker, WorkerLoad):
// one conversion each way, used by the services and the router's clients.
#ifndef MOESH_COMMON_SERVICE_SERVING_PROTO_H_
#define MOESH_COMMON_SERVICE_SERVING_PROTO_H_

#include "common/serving/generation_flow.h"
#include "common/serving/serving_load.h"
#include "moesh/v1/worker.pb.h"

namespace moesh {

void PrefillSpecToProto(const PrefillSpec& spec, v1::PrefillRequest* p);
PrefillSpec PrefillSpecFromProto(const v1::PrefillRequest& p);

void DecodeSpecToProto(const DecodeSpec& spec, v1::DecodeRequest* p);
DecodeSpec DecodeSpecFromProto(const v1::DecodeRequest& p);
void TokenEventToProto(const TokenEvent& event, v1::DecodeResponse* p);
TokenEvent TokenEventFromProto(const v1::DecodeResponse& p);

v1::WorkerLoad LoadToProto(const ServingLoad& load);

}  // namespace moesh

#endif  // MOESH_COMMON_SERVICE_SERVING_PROTO_H_
