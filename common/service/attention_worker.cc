#include "common/service/attention_worker.h"

#include <grpcpp/grpcpp.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "common/model/safetensors.h"
#include "common/model/weights.h"
#include "common/service/grpc_util.h"
#include "common/status.h"
#include "moesh/v1/worker.grpc.pb.h"

namespace moesh {

absl::StatusOr<ExpertPlacement> DiscoverPlacement(const std::vector<std::string>& addresses,
                                                  const std::string& fingerprint, std::chrono::seconds timeout) {
  ExpertPlacement placement;
  const auto give_up = std::chrono::system_clock::now() + timeout;
  for (const std::string& address : addresses) {
    auto stub = v1::ExpertWorker::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    while (true) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
      ctx.set_wait_for_ready(true);
      v1::ExpertInfoResponse info;
      grpc::Status s = stub->Info(&ctx, v1::ExpertInfoRequest(), &info);
      if (s.ok()) {
        if (info.model_fingerprint() != fingerprint) {
          return absl::FailedPreconditionError(absl::StrCat("expert worker ", address, " serves ",
                                                            info.model_fingerprint(), ", this worker ", fingerprint));
        }
        const std::string& data = info.data_plane_address().empty() ? address : info.data_plane_address();
        placement[data] = std::vector<int>(info.expert_ids().begin(), info.expert_ids().end());
        break;
      }
      if (std::chrono::system_clock::now() > give_up) {
        return absl::UnavailableError(absl::StrCat("expert worker ", address, " did not answer: ", s.error_message()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  return placement;
}

absl::StatusOr<AttentionWorker> SetUpAttentionWorker(const AttentionWorkerOptions& options) {
  AttentionWorker w;
  ASSIGN_OR_RETURN(w.config, ModelConfig::Load(options.model_dir));
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(options.model_dir));
  RETURN_IF_ERROR(ValidateCheckpoint(w.config, *ckpt));
  ASSIGN_OR_RETURN(std::unique_ptr<AttentionWeights> weights, AttentionWeights::Load(w.config, *ckpt));
  w.model = std::make_unique<AttentionModel>(w.config, std::move(weights));
  ASSIGN_OR_RETURN(w.transport, MakeTransport(options.transport));
  if (options.expert_workers.empty()) {
    ASSIGN_OR_RETURN(std::unique_ptr<ExpertShardWeights> experts, ExpertShardWeights::Load(w.config, *ckpt, {}));
    w.experts = std::make_unique<LocalExpertClient>(std::make_unique<ExpertStage>(w.config, std::move(experts)));
  } else {
    ASSIGN_OR_RETURN(ExpertPlacement placement,
                     DiscoverPlacement(options.expert_workers, w.config.Fingerprint(), options.discovery_timeout));
    ASSIGN_OR_RETURN(w.experts, RemoteExpertClient::Create(w.transport.get(), placement, w.config.n_routed_experts,
                                                               std::chrono::seconds(5), options.metrics));
  }
  return w;
}

}  // namespace moesh
