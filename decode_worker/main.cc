// moesh decode worker: holds the paged KV cache of running requests and
// advances them one token per step in a continuously batched loop.
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "common/base/status.h"
#include "common/metrics/metrics.h"
#include "common/rpc/grpc_util.h"
#include "common/service/attention_worker.h"
#include "common/service/device_flags.h"
#include "common/service/serving_proto.h"
#include "common/service/worker_flags.h"
#include "common/service/worker_main.h"
#include "common/transport/data_plane_endpoint.h"
#include "common/transport/grpc_data_plane_service.h"
#include "decode_worker/decode_service.h"

ABSL_FLAG(std::string, model, "", "Model directory (config.json + safetensors).");
ABSL_FLAG(std::string, expert_workers, "",
          "Comma-separated expert worker addresses (empty: the router's placement map, or local "
          "experts without --router).");
ABSL_FLAG(int, expert_discovery_timeout_s, 600,
          "How long to wait at startup for expert workers covering every expert.");
ABSL_FLAG(std::string, transport, "grpc",
          "Data-plane transport to the expert workers: grpc, ucx, nccl or cuda_ipc (GPUs; the KV "
          "handoff then stays on gRPC).");
ABSL_FLAG(std::string, listen, "127.0.0.1:0", "host:port to serve on (port 0: pick a free one).");
ABSL_FLAG(std::string, advertise_host, "127.0.0.1", "Host name peers use to reach this worker.");
ABSL_FLAG(std::string, router, "", "Router address to register with.");
ABSL_FLAG(std::string, ready_file, "", "Write host:port here once serving.");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:0",
          "host:port of the Prometheus /metrics endpoint (port 0: any free one; empty: none).");
ABSL_FLAG(int, kv_blocks, 1024,
          "--device cpu: KV cache blocks (CUDA sizes its cache from --gpu_memory_utilization).");
ABSL_FLAG(int, block_size, 64, "--device cpu: tokens per KV block (CUDA: 64).");
ABSL_FLAG(int, max_batch, 256, "Most requests decoded per step.");
ABSL_FLAG(int, micro_batches, 2, "Ping-pong micro-batches per step with remote experts (1: off).");
ABSL_FLAG(int, micro_batch_min, 16, "Smallest decode batch that is split into micro-batches.");

namespace moesh {
namespace {

absl::Status Run() {
  AttentionWorkerOptions opt;
  opt.model_dir = absl::GetFlag(FLAGS_model);
  if (opt.model_dir.empty()) return absl::InvalidArgumentError("--model is required");
  opt.expert_workers =
      absl::StrSplit(absl::GetFlag(FLAGS_expert_workers), ',', absl::SkipWhitespace());
  opt.transport = absl::GetFlag(FLAGS_transport);
  opt.router = absl::GetFlag(FLAGS_router);
  opt.discovery_timeout = std::chrono::seconds(absl::GetFlag(FLAGS_expert_discovery_timeout_s));
  ASSIGN_OR_RETURN(std::unique_ptr<Metrics> metrics,
                   Metrics::Create(absl::GetFlag(FLAGS_metrics_listen), "decode_worker"));
  const std::string metrics_address =
      metrics->port() > 0 ? absl::StrCat(absl::GetFlag(FLAGS_advertise_host), ":", metrics->port())
                          : "";
  opt.metrics = metrics.get();
  ASSIGN_OR_RETURN(opt.device, DeviceOptionsFromFlags());
  opt.device.num_kv_blocks = absl::GetFlag(FLAGS_kv_blocks);
  opt.device.block_size = absl::GetFlag(FLAGS_block_size);
  opt.device.max_num_seqs = absl::GetFlag(FLAGS_max_batch);
  DecodeEngineOptions eo;
  eo.max_batch = absl::GetFlag(FLAGS_max_batch);
  eo.micro_batches = absl::GetFlag(FLAGS_micro_batches);
  eo.micro_batch_min = absl::GetFlag(FLAGS_micro_batch_min);
  eo.metrics = metrics.get();
  if (opt.device.num_kv_blocks < 1 || opt.device.block_size < 1 || eo.max_batch < 1 ||
      eo.micro_batches < 1) {
    return absl::InvalidArgumentError(
        "--kv_blocks, --block_size, --max_batch and --micro_batches must be >= 1");
  }
  ASSIGN_OR_RETURN(AttentionWorker w, SetUpAttentionWorker(opt));
  DecodeEngine engine(w.backend.get(), w.experts.get(), eo);
  DecodeService service(&engine);
  GrpcDataPlaneService data_plane(nullptr, &engine);
  ASSIGN_OR_RETURN(RunningServer server,
                   StartGrpcServer(absl::GetFlag(FLAGS_listen), {&service, &data_plane}));
  const std::string address = absl::StrCat(absl::GetFlag(FLAGS_advertise_host), ":", server.port);
  ASSIGN_OR_RETURN(DataPlaneEndpoint data,
                   StartDataPlane(opt.transport, absl::GetFlag(FLAGS_advertise_host), address,
                                  nullptr, &engine));
  const KvUsage kv = w.backend->kv_usage();
  std::cerr << "decode worker for " << w.config.Fingerprint() << " on " << address << " ("
            << w.backend->device() << ", " << kv.total_blocks << " KV blocks of " << kv.block_size
            << " tokens)" << std::endl;
  ServeOptions serve;
  serve.name = "decode worker";
  serve.router = absl::GetFlag(FLAGS_router);
  v1::RegisterRequest& reg = serve.registration;
  reg.set_kind(v1::WORKER_KIND_DECODE);
  reg.set_address(address);
  reg.set_model_fingerprint(w.config.Fingerprint());
  reg.set_data_plane_address(data.address);
  serve.load = [&engine] { return LoadToProto(engine.Load()); };
  serve.on_placement_version = w.on_placement_version;
  serve.ready_file = absl::GetFlag(FLAGS_ready_file);
  serve.address = address;
  serve.metrics_address = metrics_address;
  return ServeUntilSignal(server.server.get(), serve);
}

}  // namespace
}  // namespace moesh

int main(int argc, char** argv) {
  return moesh::ServiceMain(
      argc, argv, "moesh decode worker: --model DIR --router host:port [--expert_workers a,b]",
      "decode_worker", moesh::Run);
}
