// The KV handoff on the wire: the one place where a plain KvTransfer
// (kv_handoff.h) becomes moesh.v1's PushKvRequest and back. Every transport
// that carries a transfer as a message (grpc, ucx, nccl's host calls, and
// cuda_ipc through its grpc channel) converts at its edge with these; the
// DataChannel and KvHandler interfaces, and the serving cores behind them,
// speak KvTransfer only. Kept apart from dispatch_wire.h: the two payloads
// share no code, and each file is one message's codec.
#ifndef MOESH_COMMON_TRANSPORT_KV_WIRE_H_
#define MOESH_COMMON_TRANSPORT_KV_WIRE_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/transport/kv_handoff.h"
#include "common/transport/transport.h"
#include "moesh/v1/worker.pb.h"

namespace moesh {

// The sending side: the transfer as a message (its rows copied as bytes:
// float32, or bfloat16 bits with rows_bf16 set; or its device blocks).
void EncodePushKv(const KvTransfer& transfer, v1::PushKvRequest* request);

// The receiving side: the message as a transfer (rows copied out). Its
// shape is checked (CheckKvTransfer): INVALID_ARGUMENT "KV for <id>: N bytes
// do not hold T tokens" for host rows of the wrong size (or a negative
// count), "KV for <id>: B device blocks of S do not hold T tokens (or rows
// sent too)" for device blocks that do not hold the tokens or come with rows.
absl::StatusOr<KvTransfer> DecodePushKv(const v1::PushKvRequest& request);

// The receiving side whole: decodes `request` and hands it to `handler`;
// the decode's or the handler's error otherwise.
absl::Status ServePushKv(KvHandler& handler, const v1::PushKvRequest& request);

}  // namespace moesh

#endif  // MOESH_COMMON_TRANSPORT_KV_WIRE_H_
