// The `moesh` command: a subcommand, then its flags (cli/args.h).
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "common/model/safetensors.h"

namespace moesh::cli {
namespace {

// The sampling flags generate and complete share (cli/flags.cc).
std::vector<std::string> WithSampling(std::vector<std::string> flags) {
  for (const char* f :
       {"temperature", "top_k", "top_p", "min_p", "seed", "top_logprobs", "logprobs",
        "prompt_logprobs", "n", "repetition_penalty", "presence_penalty", "frequency_penalty"}) {
    flags.push_back(f);
  }
  return flags;
}

// Each subcommand and the flags it accepts (each defined once: cli/flags.cc,
// the subcommand's file, or common/service/device_flags.cc).
const std::vector<Command>& Commands() {
  static const std::vector<Command>* commands = new std::vector<Command>{
      {"generate",
       "--model=DIR --prompt_ids=5,17,300 [--max_new_tokens=N] [sampling flags]\n"
       "      [--stop_token_ids=1,2] [--ignore_eos] [--json] [--device={cpu,cuda,cuda:N}]\n"
       "      [--gpu_memory_utilization=F] [--max_model_len=N] [--kv_cache_dtype={auto,fp8}]\n"
       "    offline generation in this process",
       WithSampling({"model", "prompt_ids", "max_new_tokens", "stop_token_ids", "ignore_eos",
                     "json", "device", "gpu_memory_utilization", "max_model_len",
                     "kv_cache_dtype"}),
       RunGenerate},
      {"mkmodel",
       "--family={v2-lite,v2,v3,v3.2,v4} [--preset={tiny,small,real}] --out=DIR [--seed=S]\n"
       "      [--shards=N] [--dtype={BF16,F16,F32,FP8}] [--rope_parameters] [--config_only]\n"
       "      [--layers=N]\n"
       "    a random checkpoint in DeepSeek's format",
       {"family", "preset", "out", "seed", "shards", "dtype", "layers", "rope_parameters",
        "config_only"},
       RunMkmodel},
      {"bench",
       "--model=DIR [--batch=1,4,16] [--prompt_len=N] [--decode_steps=N]\n"
       "    engine throughput in this process (--device=cuda: cuda_model_bench, its flags);\n"
       "  --load --model=DIR [--expert_workers=N] [--device=cuda]\n"
       "    load rate vs the disk's read rate (cold page cache where it can be dropped);\n"
       "  --dispatch [--batch=1,32,256] [--hidden=7168] [--reps=N] [--transports=grpc,ucx]\n"
       "    the host data plane per --dispatch_dtype (fp32, bf16, fp8) on loopback;\n"
       "  --serving --model=DIR [--concurrency=1,8,32] [--requests=N] [--prompt_len=N]\n"
       "      [--max_new_tokens=N] [--modes=cluster,cluster-nopp,cluster-ucx,cluster-nccl,\n"
       "      cluster-ipc,cluster-ipc-hostkv,colocated,<mode>-swap,<mode>-http,\n"
       "      <mode>-http-close] [--kv_blocks=N]\n"
       "      [--device=cuda] [--kv_cache_dtype={auto,fp8}]\n"
       "      [--expert_device=cuda:1] [--decode_gpu_memory_utilization=0.6]\n"
       "      [--prefill_gpu_memory_utilization=0.8]\n"
       "      [--load_format=dummy] [--expert_workers=N] [--temperature=T [--top_p=P]\n"
       "      [--top_k=K]] [--logprobs=0 (gRPC rows ask each token's log-probability, as the\n"
       "      HTTP rows do to time tokens by id)] [--rebalance_timeline=SECONDS "
       "[--rebalance_interval=S]\n"
       "      [--expert_placement=0-47,48-63]]\n"
       "    concurrent streams against a local cluster and colocated mode;\n"
       "  --serving --server=HOST:PORT|http://HOST:PORT [--request_rate=inf,4] [--concurrency=N]\n"
       "      [--requests=N] [--model=DIR (an HTTP server's vocabulary)] [--api_key=KEY]\n"
       "      [--dataset={random,sharegpt,multiturn}] [--dataset_path=FILE] [--prompt_len=MEAN]\n"
       "      [--max_new_tokens=MEAN] [--length_sigma=S] [--turns=N] [--system_prompts=N]\n"
       "      [--system_prompt_len=N] [--slo_ttft_ms=MS] [--slo_itl_ms=MS] [--seed=N]\n"
       "    open-loop (Poisson) or closed-loop load against a running cluster",
       {"model",
        "batch",
        "prompt_len",
        "decode_steps",
        "serving",
        "load",
        "dispatch",
        "hidden",
        "reps",
        "transports",
        "concurrency",
        "requests",
        "max_new_tokens",
        "modes",
        "kv_blocks",
        "bin_dir",
        "device",
        "expert_device",
        "load_format",
        "kv_cache_dtype",
        "expert_workers",
        "rebalance_timeline",
        "rebalance_interval",
        "expert_placement",
        "temperature",
        "top_p",
        "top_k",
        "logprobs",
        "server",
        "api_key",
        "request_rate",
        "dataset",
        "dataset_path",
        "length_sigma",
        "turns",
        "system_prompts",
        "system_prompt_len",
        "slo_ttft_ms",
        "slo_itl_ms",
        "seed",
        "decode_gpu_memory_utilization",
        "prefill_gpu_memory_utilization"},
       RunBench},
      {"serve-local",
       "--model=DIR [--expert_workers=N] [--prefill_workers=N] [--decode_workers=N] "
       "[--routers=N]\n      [--routing_policy={kv_aware,load,round_robin}] [--port=P]"
       " [--http_port=P] [--bin_dir=DIR]\n     "
       " [--work_dir=DIR] [--api_keys_file=FILE] [--kv_blocks=N] [--device=cuda] "
       "[--expert_device=cuda:1[,cuda:2...]]\n"
       "      [--load_format=dummy] [--transport={grpc,ucx,nccl,cuda_ipc}]"
       " [--dispatch_dtype={fp32,bf16,fp8}] [--tls]\n"
       "      [--kv_cache_dtype={auto,fp8}] [--max_local_prefill_tokens=N]"
       " [--enable_prefix_caching=false]\n"
       "      [--decode_gpu_memory_utilization=0.6] [--prefill_gpu_memory_utilization=0.8]\n"
       "    routers (gRPC, and the OpenAI HTTP API), prefill, decode and expert workers on\n"
       "    loopback, until Ctrl-C",
       {"model",
        "port",
        "http_port",
        "api_keys_file",
        "expert_workers",
        "prefill_workers",
        "decode_workers",
        "routing_policy",
        "routers",
        "bin_dir",
        "work_dir",
        "kv_blocks",
        "device",
        "expert_device",
        "transport",
        "dispatch_dtype",
        "load_format",
        "tls",
        "kv_cache_dtype",
        "max_local_prefill_tokens",
        "enable_prefix_caching",
        "decode_gpu_memory_utilization",
        "prefill_gpu_memory_utilization"},
       RunServeLocal},
      {"complete",
       "--server=HOST:PORT[,HOST:PORT...] (--prompt=TEXT | --prompt_ids=1,2) [--max_new_tokens=N]\n"
       "      [sampling flags] [--stop=STR] [--stop_token_ids=1,2] [--ignore_eos] [--json]\n"
       "      [--timeout=SECONDS] [--request_id=ID] [--api_key=KEY] [--server_ca=PEM]\n"
       "    a streaming request to a router",
       WithSampling({"server", "prompt", "prompt_ids", "max_new_tokens", "stop_token_ids", "stop",
                     "timeout", "request_id", "ignore_eos", "json", "api_key", "server_ca"}),
       RunComplete},
  };
  return *commands;
}

std::string Usage() {
  std::string out = "usage: moesh <command> [--flag=value ...]\ncommands:\n";
  for (const Command& c : Commands()) absl::StrAppend(&out, "  ", c.name, " ", c.synopsis, "\n");
  absl::StrAppend(&out,
                  "sampling flags: --temperature=T --top_k=K --top_p=P --min_p=P --seed=S\n"
                  "  --top_logprobs=K --logprobs=K --prompt_logprobs=K --n=N\n"
                  "  --repetition_penalty=R --presence_penalty=P --frequency_penalty=F\n"
                  "`moesh <command> --help` describes its flags; flags are snake_case.\n");
  return out;
}

}  // namespace
}  // namespace moesh::cli

int main(int argc, char** argv) {
  using moesh::cli::Command;
  const std::string usage = moesh::cli::Usage();
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "help") {
    std::cerr << usage;
    return argc < 2 ? 2 : 0;
  }
  const std::string name = argv[1];
  const Command* command = nullptr;
  for (const Command& c : moesh::cli::Commands()) {
    if (c.name == name) command = &c;
  }
  if (command == nullptr) {
    std::cerr << "moesh: unknown command \"" << name << "\"\n" << usage;
    return 2;
  }
  const std::vector<std::string> args(argv + 2, argv + argc);
  // Weight loads print their progress (MOESH_QUIET_LOAD=1 silences it).
  moesh::SetDefaultLoadProgress(moesh::StderrLoadProgress("moesh: loading weights"));
  absl::Status s;
  if (name == "bench" && moesh::cli::IsCudaEngineBench(args)) {
    s = moesh::cli::ExecCudaBench(args);  // returns only on failure
  } else {
    absl::SetProgramUsageMessage(usage);
    absl::StatusOr<bool> run =
        moesh::cli::ParseCommandFlags(*command, moesh::cli::Commands(), args);
    if (run.ok() && !*run) return 0;  // --help
    s = run.ok() ? command->run() : run.status();
  }
  if (!s.ok()) {
    std::cerr << "moesh " << name << ": " << s.message() << "\n";
    return 1;
  }
  return 0;
}
