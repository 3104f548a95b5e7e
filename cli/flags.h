// The flags several `moesh` subcommands share (cli/flags.cc defines them;
// cli/main.cc lists which subcommand accepts which), and the helpers that
// read them.
#ifndef MOESH_CLI_FLAGS_H_
#define MOESH_CLI_FLAGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "common/engine/sampler.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, prompt_ids);
ABSL_DECLARE_FLAG(std::optional<int>, max_new_tokens);
ABSL_DECLARE_FLAG(std::string, stop_token_ids);
ABSL_DECLARE_FLAG(bool, ignore_eos);
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(std::optional<uint64_t>, seed);
ABSL_DECLARE_FLAG(int, expert_workers);
ABSL_DECLARE_FLAG(std::string, expert_device);

namespace moesh {
struct LocalClusterOptions;  // cli/local_cluster.h
}  // namespace moesh

namespace moesh::cli {

// --model; INVALID_ARGUMENT when it is not given.
absl::StatusOr<std::string> ModelFlag();
// --prompt_ids; empty when not given. INVALID_ARGUMENT for an entry that is
// not an integer in [0, INT32_MAX] (never wrapped into int32).
absl::StatusOr<std::vector<int32_t>> PromptIdsFlag();
// --stop_token_ids; empty when not given; as --prompt_ids.
absl::StatusOr<std::vector<int32_t>> StopTokenIdsFlag();
// The sampling flags (--temperature, --top_k, --top_p, --min_p, --seed,
// --top_logprobs, --logprobs, --prompt_logprobs, the penalties); greedy by
// default.
SamplingParams SamplingFromFlags();
// `moesh bench --serving`'s: SamplingFromFlags() validated against `vocab`,
// --logprobs 0 only (each token's own log-probability, which the HTTP rows
// always ask to time tokens by id: a K > 0 would give the API rows unequal
// work). INVALID_ARGUMENT otherwise.
absl::StatusOr<SamplingParams> BenchSamplingFromFlags(int vocab);
// --n: sibling generations of the prompt; INVALID_ARGUMENT below 1.
absl::StatusOr<int> NFlag();
// --bin_dir, else the directory of this moesh binary (where the build and the
// image put the service binaries).
std::string BinDirFlag();
// --expert_device as a list (empty when not given); INVALID_ARGUMENT for an
// empty entry.
absl::StatusOr<std::vector<std::string>> ExpertDevicesFlag();

// Sets `o`'s decode and prefill workers' gpu_memory_utilization from
// --decode_gpu_memory_utilization and --prefill_gpu_memory_utilization: the
// share of the whole GPU they fill, what is in use counted (the expert
// workers start first; the prefill workers' share starts where the decode
// workers' ends). INVALID_ARGUMENT outside (0, 1] or for a prefill share not
// above the decode share.
absl::Status SetWorkerMemoryFromFlags(LocalClusterOptions* o);

// --api_key, else $MOESH_API_KEY; the first line, whitespace stripped (empty:
// none).
std::string ApiKeyFlag();

}  // namespace moesh::cli

#endif  // MOESH_CLI_FLAGS_H_
