// moesh prefill worker: runs prompts through the model, hands their KV cache
// to the decode worker and returns the first token.
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
#include "prefill_worker/prefill_service.h"

ABSL_FLAG(std::string, model, "", "Model directory (config.json + safetensors).");
ABSL_FLAG(std::string, expert_workers, "",
          "Comma-separated expert worker addresses (empty: the router's placement map, or local "
          "experts without --router).");
ABSL_FLAG(int, expert_discovery_timeout_s, 600,
          "How long to wait at startup for expert workers covering every expert.");
ABSL_FLAG(std::string, transport, "grpc",
          "Data-plane transport to the expert workers: grpc, ucx, nccl (GPUs) or cuda_ipc (GPUs of "
          "one node); with nccl the KV handoff's message goes over gRPC (see --kv_handoff).");
ABSL_FLAG(std::string, listen, "127.0.0.1:0", "host:port to serve on (port 0: pick a free one).");
ABSL_FLAG(std::string, advertise_host, "127.0.0.1", "Host name peers use to reach this worker.");
ABSL_FLAG(std::string, router, "", "Router address to register with.");
ABSL_FLAG(std::string, ready_file, "", "Write host:port here once serving.");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:0",
          "host:port of the Prometheus /metrics endpoint (port 0: any free one; empty: none).");
ABSL_FLAG(int, max_batch_tokens, 8192, "Prompt tokens per forward pass.");
ABSL_FLAG(int, micro_batches, 2,
          "Ping-pong micro-batches per forward with remote experts (1: off).");
ABSL_FLAG(std::string, kv_handoff, "auto",
          "How the KV cache reaches decode workers: host (rows in the message), device (the decode "
          "worker copies "
          "it from this worker's GPU memory; --transport cuda_ipc or nccl and --device cuda, "
          "workers on one node), or "
          "auto (device where those hold, else host; a decode worker that cannot map this GPU's "
          "memory gets the "
          "host form from then on).");

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
                   Metrics::Create(absl::GetFlag(FLAGS_metrics_listen), "prefill_worker"));
  const std::string metrics_address =
      metrics->port() > 0 ? absl::StrCat(absl::GetFlag(FLAGS_advertise_host), ":", metrics->port())
                          : "";
  opt.metrics = metrics.get();
  ASSIGN_OR_RETURN(opt.device, DeviceOptionsFromFlags());
  ASSIGN_OR_RETURN(AttentionWorker w, SetUpAttentionWorker(opt));
  PrefillEngineOptions eo;
  eo.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  eo.micro_batches = absl::GetFlag(FLAGS_micro_batches);
  eo.metrics = metrics.get();
  const std::string handoff = absl::GetFlag(FLAGS_kv_handoff);
  const bool device_ok =
      (opt.transport == "cuda_ipc" || opt.transport == "nccl") && w.backend->device() != "cpu";
  if (handoff == "device" && !device_ok) {
    return absl::InvalidArgumentError(
        "--kv_handoff device needs --transport cuda_ipc or nccl, and --device cuda");
  }
  if (handoff != "auto" && handoff != "host" && handoff != "device") {
    return absl::InvalidArgumentError("--kv_handoff: auto, host or device, got " + handoff);
  }
  eo.kv_handoff = handoff == "device" || (handoff == "auto" && device_ok) ? KvHandoff::kDevice
                                                                          : KvHandoff::kHost;
  if (eo.max_batch_tokens < 1 || eo.micro_batches < 1) {
    return absl::InvalidArgumentError("--max_batch_tokens and --micro_batches must be >= 1");
  }
  PrefillEngine engine(w.backend.get(), w.experts.get(), w.kv_transport(), eo);
  PrefillService service(&engine);
  ASSIGN_OR_RETURN(RunningServer server, StartGrpcServer(absl::GetFlag(FLAGS_listen), {&service}));
  const std::string address = absl::StrCat(absl::GetFlag(FLAGS_advertise_host), ":", server.port);
  std::cerr << "prefill worker for " << w.config.Fingerprint() << " on " << address << " ("
            << w.backend->device() << ", KV handoff "
            << (eo.kv_handoff == KvHandoff::kDevice ? "device" : "host") << ")" << std::endl;
  ServeOptions serve;
  serve.name = "prefill worker";
  serve.router = absl::GetFlag(FLAGS_router);
  v1::RegisterRequest& reg = serve.registration;
  reg.set_kind(v1::WORKER_KIND_PREFILL);
  reg.set_address(address);
  reg.set_model_fingerprint(w.config.Fingerprint());
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
      argc, argv, "moesh prefill worker: --model DIR --router host:port [--expert_workers a,b]",
      "prefill_worker", moesh::Run);
}
