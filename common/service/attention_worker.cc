#include "common/service/attention_worker.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <iostream>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "common/model/safetensors.h"
#include "common/model/weights.h"
#include "common/rpc/grpc_util.h"
#include "common/rpc/internal_plane.h"
#include "common/service/router_links.h"
#include "common/transport/dispatch_wire.h"
#include "common/transport/transport_registry.h"
#include "moesh/v1/worker.grpc.pb.h"

namespace moesh {

absl::StatusOr<ExpertPlacement> DiscoverPlacement(const std::vector<std::string>& addresses,
                                                  const std::string& fingerprint,
                                                  std::chrono::seconds timeout) {
  ExpertPlacement placement;
  const auto give_up = std::chrono::system_clock::now() + timeout;
  for (const std::string& address : addresses) {
    auto stub = v1::ExpertWorker::NewStub(CreateInternalChannel(address));
    while (true) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
      ctx.set_wait_for_ready(true);
      v1::ExpertInfoResponse info;
      grpc::Status s = stub->Info(&ctx, v1::ExpertInfoRequest(), &info);
      if (s.ok()) {
        if (info.model_fingerprint() != fingerprint) {
          return absl::FailedPreconditionError(absl::StrCat("expert worker ", address, " serves ",
                                                            info.model_fingerprint(),
                                                            ", this worker ", fingerprint));
        }
        const std::string& data =
            info.data_plane_address().empty() ? address : info.data_plane_address();
        placement[data] = std::vector<int>(info.expert_ids().begin(), info.expert_ids().end());
        break;
      }
      if (std::chrono::system_clock::now() > give_up) {
        return absl::UnavailableError(
            absl::StrCat("expert worker ", address, " did not answer: ", s.error_message()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  return placement;
}

absl::StatusOr<ExpertPlacement> FetchPlacement(const std::string& routers, int num_experts,
                                               std::chrono::seconds timeout) {
  const auto give_up = std::chrono::system_clock::now() + timeout;
  std::string last;
  while (true) {
    absl::StatusOr<std::vector<std::string>> addresses = ResolveRouters(routers);
    if (!addresses.ok()) last = std::string(addresses.status().message());
    for (const std::string& router : addresses.ok() ? *addresses : std::vector<std::string>()) {
      auto stub = v1::Cluster::NewStub(CreateInternalChannel(router));
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
      // One router: wait for it to come up; several: a down one is skipped at once.
      ctx.set_wait_for_ready(addresses->size() == 1);
      v1::PlacementMap map;
      grpc::Status s = stub->GetPlacement(&ctx, v1::GetPlacementRequest(), &map);
      if (!s.ok()) {
        last = absl::StrCat("router ", router, ": ", s.error_message());
        continue;
      }
      ExpertPlacement placement;
      std::vector<bool> covered(num_experts, false);
      for (const auto& w : map.workers()) {
        std::vector<int>& ids = placement[w.data_plane_address()];
        for (int e : w.expert_ids()) {
          ids.push_back(e);
          if (e >= 0 && e < num_experts) covered[e] = true;
        }
      }
      const int missing = static_cast<int>(std::count(covered.begin(), covered.end(), false));
      if (missing == 0) return placement;
      last = absl::StrCat("router ", router, ": ", missing, " of ", num_experts,
                          " experts have no live expert worker yet");
    }
    if (std::chrono::system_clock::now() > give_up) return absl::UnavailableError(last);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

absl::StatusOr<AttentionWorker> SetUpAttentionWorker(const AttentionWorkerOptions& options) {
  AttentionWorker w;
  ASSIGN_OR_RETURN(w.config, ModelConfig::Load(options.model_dir));
  RETURN_IF_ERROR(ValidateDevice(options.device.device));
  std::unique_ptr<Checkpoint> ckpt;  // none with dummy weights: config.json is all there is
  if (!options.device.dummy_weights) {
    ASSIGN_OR_RETURN(ckpt, Checkpoint::Open(options.model_dir));
    RETURN_IF_ERROR(ValidateCheckpoint(w.config, *ckpt));
  }
  const bool local_experts = options.expert_workers.empty() && options.router.empty();
  const bool experts_in_backend = local_experts && IsCudaDevice(options.device.device);
  ASSIGN_OR_RETURN(w.backend,
                   MakeAttentionBackend(w.config, ckpt.get(), options.device, experts_in_backend));
  int cuda_device = 0;
  ASSIGN_OR_RETURN(const TransportPlugin* plugin, FindTransport(options.transport));
  if (plugin->capabilities().device_dispatch) {
    ASSIGN_OR_RETURN(cuda_device,
                     CudaOrdinal(options.device.device, "--transport " + options.transport));
  }
  if (!plugin->capabilities().carries_kv) {
    ASSIGN_OR_RETURN(w.grpc_for_kv, MakeTransport("grpc"));  // the KV goes over gRPC beside it
  }
  ASSIGN_OR_RETURN(w.transport, MakeTransport(options.transport, cuda_device));
  ASSIGN_OR_RETURN(const DispatchWire wire, ParseDispatchDType(options.dispatch_dtype));
  if (options.expert_workers.empty() && !options.router.empty()) {
    ASSIGN_OR_RETURN(
        ExpertPlacement placement,
        FetchPlacement(options.router, w.config.n_routed_experts, options.discovery_timeout));
    ASSIGN_OR_RETURN(
        std::unique_ptr<RemoteExpertClient> remote,
        RemoteExpertClient::Create(w.transport.get(), placement, w.config.n_routed_experts,
                                   std::chrono::seconds(5), options.metrics, wire));
    RemoteExpertClient* client = remote.get();
    const int num_experts = w.config.n_routed_experts;
    // Retried at every heartbeat until it switches; a failure is logged once per version.
    auto failed_version = std::make_shared<std::atomic<int64_t>>(-1);
    w.on_placement_version = [client, num_experts, failed_version](const std::string& router,
                                                                   int64_t version) {
      absl::StatusOr<ExpertPlacement> p =
          FetchPlacement(router, num_experts, std::chrono::seconds(0));
      absl::Status s = p.ok() ? client->UpdatePlacement(*p) : p.status();
      if (s.ok() || failed_version->exchange(version) != version) {
        std::cerr << "placement version " << version
                  << (s.ok() ? ": switched" : ": kept the old one: ") << (s.ok() ? "" : s.message())
                  << " (router " << router << ")" << std::endl;
      }
      return s;
    };
    w.experts = std::move(remote);
  } else if (experts_in_backend) {
    // Nothing more: the CUDA backend holds every routed expert.
  } else if (local_experts) {
    ASSIGN_OR_RETURN(std::unique_ptr<ExpertShardWeights> experts,
                     ExpertShardWeights::Load(w.config, *ckpt, {}));
    w.experts = std::make_unique<LocalExpertClient>(
        std::make_unique<ExpertStage>(w.config, std::move(experts)));
  } else {
    ASSIGN_OR_RETURN(ExpertPlacement placement,
                     DiscoverPlacement(options.expert_workers, w.config.Fingerprint(),
                                       options.discovery_timeout));
    ASSIGN_OR_RETURN(w.experts, RemoteExpertClient::Create(
                                    w.transport.get(), placement, w.config.n_routed_experts,
                                    std::chrono::seconds(5), options.metrics, wire));
  }
  return w;
}

AttentionWorkerOptions AttentionWorkerOptionsFrom(const ServerOptions& server,
                                                  const WorkerOptions& worker,
                                                  const ExpertDispatchOptions& dispatch,
                                                  const DeviceOptions& device, Metrics* metrics) {
  AttentionWorkerOptions opt;
  opt.model_dir = server.model;
  opt.expert_workers = dispatch.expert_workers;
  opt.transport = worker.transport;
  opt.router = worker.router;
  opt.discovery_timeout = std::chrono::seconds(dispatch.expert_discovery_timeout_s);
  opt.dispatch_dtype = dispatch.dispatch_dtype;
  opt.metrics = metrics;
  opt.device = device;
  return opt;
}

}  // namespace moesh
