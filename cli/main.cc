// The `moesh` command.
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"

namespace {

constexpr char kUsage[] =
    "usage: moesh <command> [flags]\n"
    "commands:\n"
    "  generate  --model DIR --prompt-ids 5,17,300 [--max-new-tokens N] [--temperature T]\n"
    "            [--top-k K] [--top-p P] [--min-p P] [--seed S] [--top-logprobs K]\n"
    "            [--stop-token-ids 1,2] [--ignore-eos] [--json] [--device {cpu,cuda,cuda:N}]\n"
    "            [--gpu-memory-utilization F]\n"
    "  mkmodel   --family {v2-lite,v2,v3,v3.2,v4} [--preset {tiny,small,real}] --out DIR [--seed "
    "S]\n"
    "            [--shards N] [--dtype {BF16,F16,F32}] [--rope-parameters] [--config-only] "
    "[--layers N]\n"
    "  bench     --model DIR [--batch 1,4,16] [--prompt-len N] [--decode-steps N]\n"
    "            engine throughput in this process; with --serving: concurrent streams against a\n"
    "            local cluster and colocated mode [--concurrency 1,8,32] [--requests N]\n"
    "            [--max-new-tokens N] [--modes "
    "cluster,cluster-nopp,cluster-ucx,cluster-nccl,cluster-ipc,cluster-ipc-hostkv,colocated]\n"
    "            [--device cuda] [--expert-device cuda:1[,cuda:2...]] [--load-format dummy] "
    "[--expert-workers N]\n"
    "            [--temperature T [--top-p P] [--top-k K]] (seeded per request; default greedy)\n"
    "            [--rebalance-timeline SECONDS [--rebalance-interval S] [--expert-placement "
    "0-47,48-63]]:\n"
    "            a skewed placement with the router rebalancing, tokens/s and balance per second\n"
    "  serve-local --model DIR [--expert-workers N] [--port P] [--bin-dir DIR] [--device cuda]\n"
    "            [--expert-device cuda:1[,cuda:2...]] [--transport {grpc,ucx,nccl,cuda_ipc}]\n"
    "            start router, prefill, decode and expert workers on loopback\n"
    "  complete  --server HOST:PORT (--prompt TEXT | --prompt-ids 1,2) [--max-new-tokens N]\n"
    "            [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S] [--top-logprobs "
    "K]\n"
    "            [--repetition-penalty R] [--presence-penalty P] [--frequency-penalty F]\n"
    "            [--stop STR] [--stop-token-ids 1,2] [--ignore-eos] [--json]\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "help") {
    std::cerr << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  std::vector<std::string> rest(argv + 2, argv + argc);
  absl::Status s;
  if (cmd == "generate") {
    s = moesh::cli::RunGenerate(rest);
  } else if (cmd == "mkmodel") {
    s = moesh::cli::RunMkmodel(rest);
  } else if (cmd == "complete") {
    s = moesh::cli::RunComplete(rest);
  } else if (cmd == "serve-local") {
    s = moesh::cli::RunServeLocal(rest);
  } else if (cmd == "bench") {
    s = moesh::cli::RunBench(rest);
  } else {
    std::cerr << "moesh: unknown command \"" << cmd << "\"\n" << kUsage;
    return 2;
  }
  if (!s.ok()) {
    std::cerr << "moesh " << cmd << ": " << s.message() << "\n";
    return 1;
  }
  return 0;
}
