// KV handoff between a prefill and a decode worker: a sequence's cache rows
// as a PushKvRequest, and back into the decode side's reserved sequence.
#ifndef MOESH_COMMON_TRANSPORT_KV_HANDOFF_H_
#define MOESH_COMMON_TRANSPORT_KV_HANDOFF_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/kv_cache.h"
#include "moesh/v1/worker.pb.h"

namespace moesh {

// How the rows travel: in the message, or (kDevice) as a reference to the
// sender's device memory that the receiver copies from (cuda_ipc).
enum class KvHandoff { kHost, kDevice };

// kHost: rows [num_layers, length, row_width] of `kv`, float32, or bfloat16
// where kv.bf16_rows() (exact, half the bytes). kDevice: kv.DeviceBlocks();
// `kv` must then stay unchanged until the receiver has answered.
// Errors: kv.DeviceBlocks()'s (UNIMPLEMENTED for host caches).
absl::StatusOr<v1::PushKvRequest> SerializeKv(const std::string& request_id, const KvSequence& kv,
                                              int num_layers, KvHandoff how = KvHandoff::kHost);

// Appends the message's rows to `kv` (which must be empty and wide enough),
// from the message or from the sender's device memory.
// INVALID_ARGUMENT on shape mismatch, RESOURCE_EXHAUSTED over capacity;
// device references: kv.AppendDeviceBlocks()'s errors.
absl::Status DeserializeKv(const v1::PushKvRequest& msg, int num_layers, KvSequence* kv);

}  // namespace moesh

#endif  // MOESH_COMMON_TRANSPORT_KV_HANDOFF_H_
