#include "router/cluster_validation.h"

#include <cmath>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/serving/serving_load.h"

namespace moesh {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

bool IsHostChar(char c) { return absl::ascii_isalnum(c) || c == '.' || c == '-' || c == '_'; }

}  // namespace

absl::Status ValidateHostPort(absl::string_view field, absl::string_view address) {
  if (address.empty()) return Invalid(field, "is empty (want host:port)");
  if (address.size() > ClusterLimits::kMaxAddressBytes) {
    return Invalid(field, absl::StrCat("is ", address.size(), " bytes (at most ",
                                       ClusterLimits::kMaxAddressBytes, ")"));
  }
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) {
    return Invalid(field, absl::StrCat("\"", address, "\" is not host:port"));
  }
  const absl::string_view host = address.substr(0, colon);
  const absl::string_view port = address.substr(colon + 1);
  int port_number = 0;
  bool digits = !port.empty() && port.size() <= 5;
  for (char c : port) digits = digits && absl::ascii_isdigit(c);
  if (!digits || !absl::SimpleAtoi(port, &port_number) || port_number < 1 || port_number > 65535) {
    return Invalid(field, absl::StrCat("\"", address, "\" has no port in [1, 65535]"));
  }
  bool ok = !host.empty();
  if (ok && host.front() == '[') {
    // An IPv6 literal: hex digits, colons and dots between brackets.
    ok = host.size() > 2 && host.back() == ']';
    for (size_t i = 1; ok && i + 1 < host.size(); ++i) {
      ok = absl::ascii_isxdigit(host[i]) || host[i] == ':' || host[i] == '.';
    }
  } else {
    for (char c : host) ok = ok && IsHostChar(c);
  }
  if (!ok) {
    return Invalid(field, absl::StrCat("\"", address,
                                       "\" has no valid host (a name, an IPv4 address or "
                                       "[an IPv6 address])"));
  }
  return absl::OkStatus();
}

namespace {

// Expert ids in [0, E), each once.
absl::Status ValidateExpertIds(absl::string_view field,
                               const google::protobuf::RepeatedField<int32_t>& ids,
                               const ClusterLimits& limits) {
  std::set<int> seen;
  for (int e : ids) {
    if (e < 0 || e >= limits.num_experts) {
      return Invalid(field,
                     absl::StrCat("expert ", e, " is outside [0, ", limits.num_experts, ")"));
    }
    if (!seen.insert(e).second) return Invalid(field, absl::StrCat("expert ", e, " twice"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateRegistration(const v1::RegisterRequest& r, const ClusterLimits& limits) {
  if (!v1::WorkerKind_IsValid(r.kind()) || r.kind() == v1::WORKER_KIND_UNSPECIFIED) {
    return Invalid("kind", absl::StrCat(static_cast<int>(r.kind()),
                                        " is not a worker kind (PREFILL, DECODE or EXPERT)"));
  }
  if (absl::Status s = ValidateHostPort("address", r.address()); !s.ok()) return s;
  if (!r.data_plane_address().empty()) {
    if (absl::Status s = ValidateHostPort("data_plane_address", r.data_plane_address()); !s.ok())
      return s;
  }
  if (r.model_fingerprint().size() > ClusterLimits::kMaxFingerprintBytes) {
    return Invalid("model_fingerprint",
                   absl::StrCat("is ", r.model_fingerprint().size(), " bytes (at most ",
                                ClusterLimits::kMaxFingerprintBytes, ")"));
  }
  if (r.computes_prompts() && r.kind() != v1::WORKER_KIND_DECODE)
    return Invalid("computes_prompts", "only decode workers take prompts to compute");
  if (r.kind() != v1::WORKER_KIND_EXPERT) {
    if (r.expert_ids_size() > 0) return Invalid("expert_ids", "only expert workers host experts");
    return absl::OkStatus();
  }
  if (r.expert_ids_size() < 1 || r.expert_ids_size() > limits.num_experts) {
    return Invalid("expert_ids", absl::StrCat("an expert worker hosts 1 to ", limits.num_experts,
                                              " experts, got ", r.expert_ids_size()));
  }
  return ValidateExpertIds("expert_ids", r.expert_ids(), limits);
}

absl::Status ValidateWorkerId(absl::string_view worker_id) {
  if (worker_id.empty()) return Invalid("worker_id", "is empty");
  if (worker_id.size() > ClusterLimits::kMaxWorkerIdBytes) {
    return Invalid("worker_id", absl::StrCat("is ", worker_id.size(), " bytes (at most ",
                                             ClusterLimits::kMaxWorkerIdBytes, ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateHeartbeat(const v1::HeartbeatRequest& r, const ClusterLimits& limits) {
  if (absl::Status s = ValidateWorkerId(r.worker_id()); !s.ok()) return s;
  if (r.placement_version() < 0) {
    return Invalid("placement_version", absl::StrCat("must be >= 0, got ", r.placement_version()));
  }
  const v1::WorkerLoad& load = r.load();
  if (load.hosted_expert_ids_size() > limits.num_experts) {
    return Invalid("load.hosted_expert_ids",
                   absl::StrCat("has ", load.hosted_expert_ids_size(), " entries (at most ",
                                limits.num_experts, ")"));
  }
  if (absl::Status s =
          ValidateExpertIds("load.hosted_expert_ids", load.hosted_expert_ids(), limits);
      !s.ok())
    return s;
  if (load.queued_prompt_tokens() < 0 ||
      load.queued_prompt_tokens() > ClusterLimits::kMaxQueuedPromptTokens) {
    return Invalid("load.queued_prompt_tokens",
                   absl::StrCat("must lie in [0, ", ClusterLimits::kMaxQueuedPromptTokens,
                                "], got ", load.queued_prompt_tokens()));
  }
  if (load.num_running() < 0 || load.num_running() > ClusterLimits::kMaxRunning) {
    return Invalid("load.num_running", absl::StrCat("must lie in [0, ", ClusterLimits::kMaxRunning,
                                                    "], got ", load.num_running()));
  }
  if (load.free_kv_blocks() < 0) {
    return Invalid("load.free_kv_blocks",
                   absl::StrCat("must be >= 0, got ", load.free_kv_blocks()));
  }
  if (!(load.kv_usage() >= 0.0f && load.kv_usage() <= 1.0f)) {
    return Invalid("load.kv_usage", absl::StrCat("must lie in [0, 1], got ", load.kv_usage()));
  }
  if (load.cached_block_hashes_size() > kMaxReportedBlockHashes) {
    return Invalid("load.cached_block_hashes",
                   absl::StrCat("has ", load.cached_block_hashes_size(), " entries (at most ",
                                kMaxReportedBlockHashes, ")"));
  }
  if (load.cache_block_size() < 0 || load.cache_block_size() > kMaxReportedBlockSize ||
      (load.cached_block_hashes_size() > 0 && load.cache_block_size() == 0)) {
    return Invalid(
        "load.cache_block_size",
        absl::StrCat("must lie in [1, ", kMaxReportedBlockSize,
                     "] with cached_block_hashes (0 without), got ", load.cache_block_size()));
  }
  if (load.expert_tokens_size() > limits.num_experts) {
    return Invalid("load.expert_tokens",
                   absl::StrCat("has ", load.expert_tokens_size(), " entries; the model has ",
                                limits.num_experts, " experts"));
  }
  for (int e = 0; e < load.expert_tokens_size(); ++e) {
    if (load.expert_tokens(e) < 0) {
      return Invalid(
          "load.expert_tokens",
          absl::StrCat("expert ", e, " served ", load.expert_tokens(e), " tokens (must be >= 0)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateSlotsPerWorker(int64_t slots_per_worker, const ClusterLimits& limits) {
  if (slots_per_worker < 0 || slots_per_worker > limits.num_experts) {
    return Invalid("slots_per_worker",
                   absl::StrCat("must lie in [0, ", limits.num_experts,
                                "] (the model's experts; 0: as many as the busiest worker hosts), "
                                "got ",
                                slots_per_worker));
  }
  return absl::OkStatus();
}

}  // namespace moesh
