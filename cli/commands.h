// The `moesh` subcommands. Each returns the process exit code and prints its
// own one-line error; none calls exit().
#ifndef MOESH_CLI_COMMANDS_H_
#define MOESH_CLI_COMMANDS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/engine/sampler.h"

namespace moesh::cli {

absl::Status RunGenerate(const std::vector<std::string>& argv);
absl::Status RunMkmodel(const std::vector<std::string>& argv);
absl::Status RunBench(const std::vector<std::string>& argv);
absl::Status RunComplete(const std::vector<std::string>& argv);
absl::Status RunServeLocal(const std::vector<std::string>& argv);

class Args;
// `moesh bench --serving`: concurrent streams against local clusters.
absl::Status RunServingBench(const Args& args);
// The sampling flags `generate` and `complete` share (--temperature, --top-k,
// --top-p, --min-p, --seed, --top-logprobs, the penalties); greedy by default.
absl::StatusOr<SamplingParams> SamplingFromFlags(const Args& args);

}  // namespace moesh::cli

#endif  // MOESH_CLI_COMMANDS_H_
