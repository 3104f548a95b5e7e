// The `moesh` subcommands. Each reads its flags (parsed by cli/main.cc, which
// lists the flags each accepts) and returns an error status for main to
// print on one line; none calls exit().
#ifndef MOESH_CLI_COMMANDS_H_
#define MOESH_CLI_COMMANDS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace moesh::cli {

absl::Status RunGenerate();
absl::Status RunMkmodel();
absl::Status RunBench();
absl::Status RunComplete();
absl::Status RunServeLocal();

// `moesh bench --serving`: concurrent streams against local clusters, or
// with --server open-loop load against a running one (RunOpenLoopBench,
// cli/bench_open_loop.cc).
absl::Status RunServingBench();
absl::Status RunOpenLoopBench();

// `moesh bench --load --model=DIR`: the checkpoint's load rate against the
// disk's read rate measured in the same run (cli/bench_load.cc).
absl::Status RunLoadBench();

// `moesh bench --dispatch`: the host data plane per --dispatch_dtype on
// loopback, fp32 the same run's baseline (cli/bench_dispatch.cc).
absl::Status RunDispatchBench();

// `moesh bench --device cuda ...` is cuda_model_bench's (the GPU engine
// bench, tools/bench/model_bench.cc, with its own flags), since the moesh
// command does not link CUDA: true when `args` (what follows "bench") ask
// for it.
bool IsCudaEngineBench(const std::vector<std::string>& args);
// Replaces this process with cuda_model_bench and `args`, their names
// spelled as it spells them (--load_format -> --load-format). Returns only on
// failure.
absl::Status ExecCudaBench(const std::vector<std::string>& args);

}  // namespace moesh::cli

#endif  // MOESH_CLI_COMMANDS_H_
