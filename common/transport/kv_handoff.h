// KV handoff between a prefill and a decode worker: a sequence's cache rows
// as a PushKvRequest, and back into the decode side's reserved sequence.
#ifndef MOESH_COMMON_TRANSPORT_KV_HANDOFF_H_
#define MOESH_COMMON_TRANSPORT_KV_HANDOFF_H_

#include <string>

#include "absl/status/status.h"
#include "common/model/kv_cache.h"
#include "moesh/v1/worker.pb.h"

namespace moesh {

// rows: [num_layers, length, row_width] of `kv`, float32, or bfloat16 where
// kv.bf16_rows() (exact, half the bytes).
v1::PushKvRequest SerializeKv(const std::string& request_id, const KvSequence& kv, int num_layers);

// Appends the message's rows to `kv` (which must be empty and wide enough).
// INVALID_ARGUMENT on shape mismatch, RESOURCE_EXHAUSTED over capacity.
absl::Status DeserializeKv(const v1::PushKvRequest& msg, int num_layers, KvSequence* kv);

}  // namespace moesh

#endif  // MOESH_COMMON_TRANSPORT_KV_HANDOFF_H_
