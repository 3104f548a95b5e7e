// moesh router: the public Generation API. Workers register with it; it picks
// a prefill and a decode worker per request and relays the token stream. With
// --colocated it serves from engines in this process instead.
#include <iostream>
#include <memory>

#include "absl/flags/flag.h"
#include "common/base/status.h"
#include "common/metrics/metrics.h"
#include "common/model/config.h"
#include "common/rpc/grpc_util.h"
#include "common/service/device_flags.h"
#include "common/service/worker_flags.h"
#include "common/service/worker_main.h"
#include "router/cluster_backend.h"
#include "router/colocated_backend.h"
#include "router/generation_service.h"
#include "router/membership.h"
#include "router/text_codec_loader.h"

ABSL_FLAG(std::string, model, "",
          "Model directory (config.json, tokenizer.json; weights only with --colocated).");
ABSL_FLAG(std::string, listen, "127.0.0.1:0", "host:port to serve on (port 0: pick a free one).");
ABSL_FLAG(std::string, ready_file, "", "Write host:port here once serving.");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:0",
          "host:port of the Prometheus /metrics endpoint (port 0: any free one; empty: none).");
ABSL_FLAG(bool, colocated, false, "Serve from prefill, decode and experts in this process.");
ABSL_FLAG(int, heartbeat_interval_ms, 500, "How often workers heartbeat.");
ABSL_FLAG(int, heartbeat_timeout_ms, 3000, "Drop a worker silent for this long.");
ABSL_FLAG(int, default_max_new_tokens, 256, "max_new_tokens when a request does not set it.");
ABSL_FLAG(int, max_new_tokens_limit, 4096, "Largest max_new_tokens a request may ask for.");
ABSL_FLAG(int, max_context_tokens, 0,
          "Prompt + output limit (0: the model's max_position_embeddings).");
ABSL_FLAG(int, kv_blocks, 1024, "--colocated: KV cache blocks.");
ABSL_FLAG(int, block_size, 64, "--colocated: tokens per KV block.");
ABSL_FLAG(int, max_batch, 256, "--colocated: most requests decoded per step.");
ABSL_FLAG(int, rebalance_interval_s, 0,
          "Check the expert workers' balance this often and rebalance when skewed (0: only on "
          "Cluster.Rebalance).");
ABSL_FLAG(double, rebalance_min_ratio, 1.25,
          "Rebalance automatically when the balance ratio exceeds this.");
ABSL_FLAG(int, rebalance_slots, 0,
          "Experts an expert worker may host after an automatic rebalance (0: as many as the "
          "busiest hosts now).");

namespace moesh {
namespace {

constexpr char kGenerationService[] = "moesh.v1.Generation";

absl::Status Run() {
  const std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) return absl::InvalidArgumentError("--model is required");
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(dir));
  ASSIGN_OR_RETURN(std::unique_ptr<TextCodec> codec, LoadTextCodec(dir));
  ASSIGN_OR_RETURN(std::unique_ptr<Metrics> metrics,
                   Metrics::Create(absl::GetFlag(FLAGS_metrics_listen), "router"));
  const std::string metrics_address =
      metrics->port() > 0 ? absl::StrCat("127.0.0.1:", metrics->port()) : "";

  std::unique_ptr<Membership> membership;
  std::unique_ptr<GenerationBackend> backend;
  if (absl::GetFlag(FLAGS_colocated)) {
    ASSIGN_OR_RETURN(DeviceOptions device, DeviceOptionsFromFlags());
    device.num_kv_blocks = absl::GetFlag(FLAGS_kv_blocks);
    device.block_size = absl::GetFlag(FLAGS_block_size);
    device.max_num_seqs = absl::GetFlag(FLAGS_max_batch);
    DecodeEngineOptions d;
    d.max_batch = absl::GetFlag(FLAGS_max_batch);
    d.metrics = metrics.get();
    ASSIGN_OR_RETURN(backend, ColocatedBackend::Create(dir, device, d, PrefillEngineOptions()));
  } else {
    RebalancePolicy rebalance;
    rebalance.interval = std::chrono::seconds(absl::GetFlag(FLAGS_rebalance_interval_s));
    rebalance.min_ratio = absl::GetFlag(FLAGS_rebalance_min_ratio);
    rebalance.slots_per_worker = absl::GetFlag(FLAGS_rebalance_slots);
    if (rebalance.interval.count() < 0 || rebalance.min_ratio < 1.0 ||
        rebalance.slots_per_worker < 0) {
      return absl::InvalidArgumentError(
          "--rebalance_interval_s and --rebalance_slots must be >= 0, --rebalance_min_ratio >= 1");
    }
    membership = std::make_unique<Membership>(
        config.Fingerprint(), std::chrono::milliseconds(absl::GetFlag(FLAGS_heartbeat_interval_ms)),
        std::chrono::milliseconds(absl::GetFlag(FLAGS_heartbeat_timeout_ms)), rebalance,
        metrics.get());
    backend = std::make_unique<ClusterBackend>(membership.get());
  }
  GenerationServiceOptions opt;
  opt.default_max_new_tokens = absl::GetFlag(FLAGS_default_max_new_tokens);
  opt.max_new_tokens_limit = absl::GetFlag(FLAGS_max_new_tokens_limit);
  opt.max_context_tokens = absl::GetFlag(FLAGS_max_context_tokens);
  opt.metrics = metrics.get();
  GenerationService generation(config, backend.get(), codec.get(), opt);
  std::vector<grpc::Service*> services = {&generation};
  if (membership) services.push_back(membership.get());
  ASSIGN_OR_RETURN(RunningServer server, StartGrpcServer(absl::GetFlag(FLAGS_listen), services));
  // grpc.health.v1: the Generation service is SERVING once it has workers.
  auto* health = server.server->GetHealthCheckService();
  auto update_health = [&] { health->SetServingStatus(kGenerationService, backend->Ready()); };
  update_health();
  if (membership) membership->OnChange(update_health);
  const std::string address = absl::StrCat("127.0.0.1:", server.port);
  std::cerr << "router for " << config.Fingerprint()
            << (absl::GetFlag(FLAGS_colocated) ? " (colocated)" : "") << " on " << address
            << (codec ? "" : " (no tokenizer.json: token ids only)") << std::endl;
  ServeOptions serve;
  serve.name = "router";
  serve.ready_file = absl::GetFlag(FLAGS_ready_file);
  serve.address = address;
  serve.metrics_address = metrics_address;
  const absl::Status s = ServeUntilSignal(server.server.get(), serve);
  membership.reset();  // stops the sweeper before the health service it updates goes
  return s;
}

}  // namespace
}  // namespace moesh

int main(int argc, char** argv) {
  return moesh::ServiceMain(argc, argv,
                            "moesh router: --model DIR [--colocated] [--listen host:port]",
                            "router", moesh::Run);
}
