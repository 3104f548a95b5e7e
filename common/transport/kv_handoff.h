// KV handoff between a prefill and a decode worker: a sequence's cache rows
// (and the request's first token) as a plain KvTransfer, and back into the
// decode side's reserved sequence.
// The transports that carry a transfer as a message convert it at their edge
// (kv_wire.h); the KvHandler and DataChannel interfaces, and the serving
// cores behind them, speak KvTransfer only.
#ifndef MOESH_COMMON_TRANSPORT_KV_HANDOFF_H_
#define MOESH_COMMON_TRANSPORT_KV_HANDOFF_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/engine/sampler.h"
#include "common/model/kv_cache.h"

namespace moesh {

// How the rows travel: in the transfer, or (kDevice) as a reference to the
// sender's device memory that the receiver copies from (cuda_ipc).
enum class KvHandoff { kHost, kDevice };

// One sequence's KV, as handed from a prefill to a decode worker. Owns its
// rows (host) or names the sender's device blocks (device).
struct KvTransfer {
  std::string request_id;
  int num_layers = 0;
  int num_tokens = 0;
  int row_width = 0;
  // Host rows [num_layers, num_tokens - first_row, row_width], layer-major,
  // of tokens [first_row, num_tokens) (the receiver's reservation holds the
  // rows before: its prefix cache): float32 in `rows`, or, where rows_bf16,
  // bfloat16 bits in `bf16_rows` (exact, half the bytes). The other vector
  // is empty. Both empty when `device` is set (first_row 0 then).
  int first_row = 0;
  bool rows_bf16 = false;
  std::vector<float> rows;
  std::vector<uint16_t> bf16_rows;
  // Device rows: the sender's KV blocks (cuda_ipc); holding num_tokens
  // tokens in blocks.size() * block_size slots. The sender's sequence must
  // stay unchanged until the receiver has answered.
  std::optional<DeviceKvBlocks> device;

  // The request's first generated token, sampled by the prefill worker at
  // the prompt's last position, with its top log-probabilities (iff the
  // request asked for them) and how long the prompt queued for prefill: the
  // decode worker streams them as the request's first event.
  int32_t first_token = 0;
  std::vector<TokenLogprob> first_logprobs;
  double queue_seconds = 0;
  // The first token's own log-probability (0 unless the sampling asks) and
  // the prompt's (the prefill pass's, when the sampling asks).
  float first_logprob = 0.0f;
  std::optional<PromptLogprobs> prompt_logprobs;
  int cached_tokens = 0;  // leading tokens the sender's prefix cache held, [0, num_tokens]

  // The host rows' bytes (as they go on the wire).
  size_t row_bytes() const {
    return rows.size() * sizeof(float) + bf16_rows.size() * sizeof(uint16_t);
  }
};

// kHost: the rows of `kv`'s first `num_layers` layers from token
// `first_row` on (clamped to [0, kv.length()]), float32, or bfloat16 where
// kv.bf16_rows(). kDevice: kv.DeviceBlocks() (first_row unused); `kv` must
// then stay unchanged until the receiver has answered.
// Errors: kv.DeviceBlocks()'s (UNIMPLEMENTED for host caches).
absl::StatusOr<KvTransfer> SerializeKv(const std::string& request_id, const KvSequence& kv,
                                       int num_layers, KvHandoff how = KvHandoff::kHost,
                                       int first_row = 0);

// INVALID_ARGUMENT unless the transfer holds its shape: device blocks that
// hold num_tokens (with no host rows besides, first_row 0), or host rows of
// exactly num_layers * (num_tokens - first_row) * row_width values in the
// vector rows_bf16 names (non-negative counts, first_row in [0, num_tokens]). The wire decode
// (kv_wire.h) and DeserializeKv both check this.
absl::Status CheckKvTransfer(const KvTransfer& transfer);

// Appends the transfer's rows to `kv` (which must be empty but for the rows
// of its kv.cached_tokens() tokens from a prefix cache, which are skipped,
// and wide enough), from the transfer or from the sender's device memory
// (the blocks past the cached ones).
// INVALID_ARGUMENT on shape mismatch (with `num_layers`, kv's row width, or
// CheckKvTransfer's), FAILED_PRECONDITION if `kv` is not empty or holds
// fewer cached tokens than the transfer's first_row (the sender may resend
// from row 0), RESOURCE_EXHAUSTED over capacity; INVALID_ARGUMENT if the
// cached rows leave nothing to append; device references:
// kv.AppendDeviceBlocks()'s errors.
absl::Status DeserializeKv(const KvTransfer& transfer, int num_layers, KvSequence* kv);

}  // namespace moesh

#endif  // MOESH_COMMON_TRANSPORT_KV_HANDOFF_H_
