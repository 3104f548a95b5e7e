// moesh expert worker: hosts a shard of the routed experts and serves expert
// dispatch for every MoE layer over the data plane.
#include <iostream>
#include <memory>

#include "base/status.h"
#include "common/backend/backends.h"
#include "common/metrics/metrics.h"
#include "common/model/config.h"
#include "common/model/safetensors.h"
#include "common/model/weights.h"
#include "common/rpc/grpc_util.h"
#include "common/service/worker_main.h"
#include "common/service/worker_util.h"
#include "common/transport/data_plane_endpoint.h"
#include "common/transport/grpc_data_plane_service.h"
#include "common/transport/transport_registry.h"
#include "expert_worker/expert_service.h"
#include "expert_worker/flags.h"
#include "expert_worker/placement_guard.h"

namespace moesh {
namespace {

absl::Status Run() {
  ASSIGN_OR_RETURN(const ExpertWorkerOptions o, ExpertWorkerOptionsFromFlags());
  RETURN_IF_ERROR(ConfigureInternalPlane(o.server));
  const std::string& dir = o.server.model;
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(dir));
  const DeviceOptions& device = o.device;
  std::unique_ptr<Checkpoint> ckpt;  // none with dummy weights: config.json is all there is
  if (!device.dummy_weights) {
    ASSIGN_OR_RETURN(ckpt, Checkpoint::Open(dir));
    RETURN_IF_ERROR(ValidateCheckpoint(config, *ckpt));
  }
  std::set<int> experts;
  if (!o.experts.empty()) {
    ASSIGN_OR_RETURN(experts, ParseExpertList(o.experts, config.n_routed_experts));
  } else if (!o.shard.empty()) {
    ASSIGN_OR_RETURN(experts, ExpertShard(o.shard, config.n_routed_experts));
  }
  // The shard's weights: on the CPU read as float32; a GPU reads them from the
  // checkpoint itself as stored (FP8 stays FP8, no host copy of the shard);
  // (dummy) a placeholder the GPU fills. Replicas the rebalancer places here
  // come the same way.
  const bool on_device = IsCudaDevice(device.device);
  auto load = [&config, &ckpt, on_device](
                  const std::set<int>& ids) -> absl::StatusOr<std::unique_ptr<ExpertShardWeights>> {
    if (ckpt == nullptr) return ExpertShardWeights::Placeholder(config, ids);
    if (on_device) return ExpertShardWeights::Deferred(config, *ckpt, ids);
    return ExpertShardWeights::Load(config, *ckpt, ids);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<ExpertShardWeights> weights, load(experts));
  const std::set<int> hosted = weights->expert_ids;
  ASSIGN_OR_RETURN(std::unique_ptr<Metrics> metrics,
                   Metrics::Create(o.server.metrics_listen, "expert_worker"));
  ExpertServiceOptions options;
  options.metrics = metrics.get();
  options.loader = load;
  options.batch_window = std::chrono::microseconds(o.batch_window_us);
  // Set before serving: the address the router's placement map knows this worker by.
  std::string self;
  options.may_drop = [&o, &self](const std::set<int>& drop) {
    return CheckDropWithRouter(o.worker.router, self, drop);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<ExpertStage> stage,
                   MakeExpertStage(config, std::move(weights), device));
  const std::string where = stage->device();
  ExpertService service(std::move(stage), config.Fingerprint(), options);
  GrpcDataPlaneService data_plane(&service, nullptr);
  ASSIGN_OR_RETURN(RunningServer server, StartGrpcServer(o.server.listen, {&service, &data_plane},
                                                         o.server.max_receive_message_mb));
  const std::string address = absl::StrCat(o.worker.advertise_host, ":", server.port);
  int cuda_device = 0;
  const std::string& transport = o.worker.transport;
  ASSIGN_OR_RETURN(const TransportPlugin* plugin, FindTransport(transport));
  if (plugin->capabilities().device_dispatch) {
    ASSIGN_OR_RETURN(cuda_device, CudaOrdinal(device.device, "--transport " + transport));
  }
  ASSIGN_OR_RETURN(DataPlaneEndpoint data, StartDataPlane(transport, o.worker.advertise_host,
                                                          address, &service, nullptr, cuda_device));
  service.set_data_plane_address(data.address);
  self = data.address;
  std::cerr << "expert worker serving experts " << *hosted.begin() << ".." << *hosted.rbegin()
            << " (" << hosted.size() << ") of " << config.Fingerprint() << " on " << address << " ("
            << where << ", data plane " << transport << " " << data.address << ")" << std::endl;
  ServeOptions serve = WorkerServeOptions("expert worker", v1::WORKER_KIND_EXPERT, address,
                                          config.Fingerprint(), o.server, o.worker, *metrics);
  serve.registration.set_data_plane_address(data.address);
  for (int e : hosted) serve.registration.add_expert_ids(e);
  serve.load = [&service] { return service.Load(); };
  // SIGTERM: leave the placement map first, then serve until the attention
  // workers stopped sending (they follow a new map within a heartbeat
  // interval, 500 ms by default: quiet for 2 s is past that) or
  // --drain_timeout_s. Streams whose experts have a replica elsewhere lose
  // nothing.
  serve.leave_first = true;
  serve.in_flight = [&service] { return service.InFlight(std::chrono::seconds(2)); };
  return ServeUntilSignal(server.server.get(), serve);
}

}  // namespace
}  // namespace moesh

int main(int argc, char** argv) {
  return moesh::ServiceMain(
      argc, argv,
      "moesh expert worker: --model DIR [--shard i/n | --experts 0-3] [--router host:port]",
      "expert_worker", moesh::Run);
}
