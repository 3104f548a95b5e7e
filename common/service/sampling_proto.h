// moesh.v1.SamplingParams <-> SamplingParams, with the API's defaults applied
// for unset fields (temperature 1, top_p 1, penalties off, ...). (The
// sampler's top log-probabilities on the wire: common/transport/token_wire.h.)
#ifndef MOESH_COMMON_SERVICE_SAMPLING_PROTO_H_
#define MOESH_COMMON_SERVICE_SAMPLING_PROTO_H_

#include "common/engine/sampler.h"
#include "moesh/v1/common.pb.h"

namespace moesh {

SamplingParams SamplingFromProto(const v1::SamplingParams& p);
// Every field set explicitly, so the receiver sees exactly these values.
void SamplingToProto(const SamplingParams& s, v1::SamplingParams* p);

}  // namespace moesh

#endif  // MOESH_COMMON_SERVICE_SAMPLING_PROTO_H_
