// Checks of every field the moesh.v1.Cluster RPCs take from a peer, before
// any of it reaches the worker registry or the rebalancer: ranges, signs,
// sizes, addresses, expert ids in [0, num_experts). A refusal is
// INVALID_ARGUMENT whose message names the field and its bound.
//
// Pure functions; thread-safe.
#ifndef MOESH_ROUTER_CLUSTER_VALIDATION_H_
#define MOESH_ROUTER_CLUSTER_VALIDATION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "moesh/v1/worker.pb.h"

namespace moesh {

// Bounds of what a worker may report or ask for.
struct ClusterLimits {
  int num_experts = 0;                             // routed experts of the model (E)
  static constexpr size_t kMaxAddressBytes = 255;  // host:port
  static constexpr size_t kMaxWorkerIdBytes = 128;
  static constexpr size_t kMaxFingerprintBytes = 1024;
  static constexpr int64_t kMaxQueuedPromptTokens = int64_t{1} << 40;
  static constexpr int kMaxRunning = 1 << 20;
};

// "host:port": a host name or IPv4 address, or an IPv6 address in brackets,
// and a port in [1, 65535]. `field` names it in the error.
absl::Status ValidateHostPort(absl::string_view field, absl::string_view address);

// RegisterRequest: a kind of the enum (not UNSPECIFIED), an address (and a
// data-plane address when given) as ValidateHostPort, a bounded fingerprint;
// an expert worker names 1..E distinct experts in [0, E), other kinds none.
absl::Status ValidateRegistration(const v1::RegisterRequest& r, const ClusterLimits& limits);

// HeartbeatRequest: a bounded worker id, a non-negative placement version
// and a load no peer can win the router's picking with by lying below zero:
// queued_prompt_tokens in [0, kMaxQueuedPromptTokens], num_running in
// [0, kMaxRunning], free_kv_blocks >= 0, kv_usage in [0, 1] (not NaN), at
// most E expert_tokens, each >= 0, at most kMaxReportedBlockHashes
// cached_block_hashes with a cache_block_size in [1, kMaxReportedBlockSize]
// (0 without hashes). The hashes themselves are claims the router only
// ranks by: a worker lying about its cache draws prompts it then computes
// whole (no wrong output, no more than its share of load: the ranking
// charges its queue too).
absl::Status ValidateHeartbeat(const v1::HeartbeatRequest& r, const ClusterLimits& limits);

// A worker id (Deregister, Heartbeat): not empty, at most kMaxWorkerIdBytes.
absl::Status ValidateWorkerId(absl::string_view worker_id);

// RebalanceRequest.slots_per_worker (and --rebalance_slots): in [0, E]
// (0: as many as the busiest worker hosts now).
absl::Status ValidateSlotsPerWorker(int64_t slots_per_worker, const ClusterLimits& limits);

}  // namespace moesh

#endif  // MOESH_ROUTER_CLUSTER_VALIDATION_H_
