#include "common/service/heartbeat_client.h"

#include <grpcpp/grpcpp.h>

#include <iostream>

#include "absl/time/time.h"
#include "common/rpc/internal_plane.h"
#include "common/service/router_links.h"

namespace moesh {

HeartbeatClient::HeartbeatClient(std::string router_address, v1::RegisterRequest registration,
                                 std::function<v1::WorkerLoad()> load,
                                 PlacementFollower on_placement_version, RouterElection* election)
    : router_address_(std::move(router_address)),
      registration_(std::move(registration)),
      load_(std::move(load)),
      on_placement_version_(std::move(on_placement_version)),
      election_(election) {
  thread_ = std::thread([this] { Loop(); });
}

HeartbeatClient::~HeartbeatClient() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void HeartbeatClient::BeatNow() {
  absl::MutexLock lock(&mu_);
  beat_now_ = true;
}

void HeartbeatClient::Deregister(v1::Cluster::Stub* stub, const std::string& worker_id) {
  if (worker_id.empty()) return;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
  v1::DeregisterRequest req;
  req.set_worker_id(worker_id);
  v1::DeregisterResponse resp;
  stub->Deregister(&ctx, req, &resp);  // best effort: the heartbeat timeout covers a miss
}

void HeartbeatClient::Loop() {
  auto stub = v1::Cluster::NewStub(CreateInternalChannel(router_address_));
  std::string worker_id;
  absl::Duration interval = absl::Milliseconds(500);
  bool warned = false;
  int64_t placement_version = 0;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) break;
      beat_now_ = false;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    if (worker_id.empty()) {
      v1::RegisterResponse resp;
      grpc::Status s = stub->Register(&ctx, registration_, &resp);
      if (election_ != nullptr) election_->Report(router_address_, s.ok());
      if (s.ok()) {
        worker_id = resp.worker_id();
        if (resp.heartbeat_interval_ms() > 0)
          interval = absl::Milliseconds(resp.heartbeat_interval_ms());
        std::cerr << "registered with router " << router_address_ << " as " << worker_id
                  << std::endl;
        warned = false;
      } else if (!warned) {
        std::cerr << "cannot register with router " << router_address_ << ": " << s.error_message()
                  << " (retrying)" << std::endl;
        warned = true;
      }
    } else {
      // Another router is the placement writer: this one's map is not
      // followed, and is refetched from scratch should this one become it.
      // No router answering (e.g. this one missed a heartbeat): none is followed instead.
      const std::string elected = election_ == nullptr ? "" : election_->Writer();
      const bool writer = elected.empty() || elected == router_address_;
      if (!writer) placement_version = 0;
      v1::HeartbeatRequest req;
      req.set_worker_id(worker_id);
      *req.mutable_load() = load_();
      req.set_placement_version(placement_version);
      req.set_placement_elsewhere(!writer && on_placement_version_ != nullptr);
      v1::HeartbeatResponse resp;
      grpc::Status s = stub->Heartbeat(&ctx, req, &resp);
      if (s.ok() && !resp.known()) worker_id.clear();  // router restarted or dropped us
      if (election_ != nullptr) election_->Report(router_address_, s.ok() && resp.known());
      if (s.ok() && writer && on_placement_version_ &&
          resp.placement_version() != placement_version &&
          on_placement_version_(router_address_, resp.placement_version()).ok()) {
        placement_version = resp.placement_version();  // reported from the next heartbeat on
      }
    }
    absl::MutexLock lock(&mu_);
    auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || beat_now_; };
    mu_.AwaitWithTimeout(absl::Condition(&wake),
                         worker_id.empty() ? absl::Milliseconds(200) : interval);
  }
  Deregister(stub.get(), worker_id);
}

}  // namespace moesh
