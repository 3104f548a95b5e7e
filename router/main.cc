// moesh router: the public Generation API. Workers register with it; it picks
// a prefill and a decode worker per request and relays the token stream. With
// --colocated it serves from engines in this process instead.
#include <atomic>
#include <iostream>
#include <memory>

#include "base/status.h"
#include "common/metrics/metrics.h"
#include "common/model/config.h"
#include "common/rpc/grpc_util.h"
#include "common/rpc/internal_plane.h"
#include "common/service/worker_main.h"
#include "common/serving/decode_engine.h"
#include "common/tokenizer/chat_template.h"
#include "router/api_keys.h"
#include "router/cluster_backend.h"
#include "router/colocated_backend.h"
#include "router/flags.h"
#include "router/generation_service.h"
#include "router/http_front.h"
#include "router/membership.h"
#include "router/text_codec_loader.h"

namespace moesh {
namespace {

constexpr char kGenerationService[] = "moesh.v1.Generation";

// "/models/DeepSeek-V3/" -> "DeepSeek-V3": the HTTP API's default model name.
std::string ModelBaseName(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const size_t slash = dir.rfind('/');
  return slash == std::string::npos ? dir : dir.substr(slash + 1);
}

absl::Status Run() {
  ASSIGN_OR_RETURN(const RouterOptions o, RouterOptionsFromFlags());
  RETURN_IF_ERROR(ConfigureInternalPlane(o.server));
  const std::string& dir = o.server.model;
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(dir));
  ASSIGN_OR_RETURN(std::unique_ptr<TextCodec> codec, LoadTextCodec(dir));
  ASSIGN_OR_RETURN(std::unique_ptr<Metrics> metrics,
                   Metrics::Create(o.server.metrics_listen, "router"));
  const std::string metrics_address =
      metrics->port() > 0 ? absl::StrCat("127.0.0.1:", metrics->port()) : "";

  std::unique_ptr<Membership> membership;
  std::unique_ptr<GenerationBackend> backend;
  if (o.colocated) {
    DeviceOptions device = o.device;
    device.num_kv_blocks = o.kv.kv_blocks;
    device.block_size = o.kv.block_size;
    device.prefix_cache = o.kv.enable_prefix_caching;
    device.max_num_seqs = o.kv.max_batch;
    DecodeEngineOptions d;
    d.max_batch = o.kv.max_batch;
    d.max_waiting = o.kv.max_waiting_requests;
    d.max_num_batched_tokens = o.kv.max_num_batched_tokens;
    ASSIGN_OR_RETURN(d.preemption_mode, ParsePreemptionMode(o.kv.preemption_mode));
    d.swap_space_bytes = int64_t{o.kv.swap_space_mb} << 20;
    d.metrics = metrics.get();
    ASSIGN_OR_RETURN(backend, ColocatedBackend::Create(dir, device, d, PrefillEngineOptions()));
  } else {
    RebalancePolicy rebalance;
    rebalance.interval = std::chrono::seconds(o.rebalance_interval_s);
    rebalance.min_ratio = o.rebalance_min_ratio;
    rebalance.slots_per_worker = o.rebalance_slots;
    ClusterLimits limits;
    limits.num_experts = config.n_routed_experts;
    if (absl::Status s = ValidateSlotsPerWorker(o.rebalance_slots, limits); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--rebalance_slots: ", s.message()));
    }
    membership = std::make_unique<Membership>(
        config.Fingerprint(), limits, std::chrono::milliseconds(o.heartbeat_interval_ms),
        std::chrono::milliseconds(o.heartbeat_timeout_ms), rebalance, metrics.get());
    ClusterBackendOptions cb;
    cb.routing = o.routing_policy;
    cb.max_migrations = o.max_stream_migrations;
    cb.max_local_prefill_tokens = o.max_local_prefill_tokens;
    cb.metrics = metrics.get();
    backend = std::make_unique<ClusterBackend>(membership.get(), cb);
  }
  std::unique_ptr<ApiKeys> keys;
  if (!o.api_keys_file.empty()) {
    ASSIGN_OR_RETURN(keys, ApiKeys::Load(o.api_keys_file));
  }
  if (const std::string warning = MissingApiKeysWarning(
          keys.get(), {{"--listen", o.server.listen}, {"--http_listen", o.http_listen}});
      !warning.empty()) {
    std::cerr << "router: " << warning << std::endl;
  }
  GenerationServiceOptions opt;
  opt.api_keys = keys.get();
  opt.default_max_new_tokens = o.default_max_new_tokens;
  opt.max_new_tokens_limit = o.max_new_tokens_limit;
  opt.max_context_tokens = o.max_context_tokens;
  opt.metrics = metrics.get();
  GenerationService generation(config, backend.get(), codec.get(), opt);
  // Two planes: the public port serves Generation (and health), the internal
  // one Cluster, so a client of the API cannot register or rebalance.
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> public_credentials,
                   PublicServerCredentials(o.public_tls));
  ASSIGN_OR_RETURN(RunningServer server,
                   StartGrpcServer(o.server.listen, {&generation}, o.server.max_receive_message_mb,
                                   public_credentials));
  RunningServer internal;
  if (membership) {
    ASSIGN_OR_RETURN(internal, StartGrpcServer(o.internal_listen, {membership.get()},
                                               o.server.max_receive_message_mb));
  }
  // grpc.health.v1: the Generation service is SERVING once it has workers.
  auto* health = server.server->GetHealthCheckService();
  std::atomic<bool> draining{false};
  auto update_health = [&] {
    health->SetServingStatus(kGenerationService, !draining && backend->Ready());
  };
  update_health();
  if (membership) membership->OnChange(update_health);
  std::unique_ptr<ChatTemplate> chat;
  std::unique_ptr<HttpFront> http;
  if (!o.http_listen.empty()) {
    HttpFrontOptions h;
    // A template of another family leaves chat completions refused, saying why.
    // Without a template, DeepSeek-V3.2's and V4's own encoders.
    absl::StatusOr<std::unique_ptr<ChatTemplate>> loaded =
        ChatTemplate::Load(dir, config.model_type);
    if (loaded.ok()) {
      chat = std::move(*loaded);
      if (chat == nullptr) {
        h.no_chat_reason =
            "the checkpoint has no chat template (tokenizer_config.json's chat_template or "
            "chat_template.jinja) and its model_type '" +
            config.model_type + "' no built-in encoder";
      }
    } else {
      h.no_chat_reason = std::string(loaded.status().message());
      std::cerr << "router: no chat completions: " << h.no_chat_reason << std::endl;
    }
    h.listen = o.http_listen;
    h.threads = o.http_threads;
    h.keep_alive_ms = o.http_keep_alive_ms;
    h.max_body_bytes = static_cast<int64_t>(o.http_max_body_mb) << 20;
    h.model_names = {o.served_model_name.empty() ? ModelBaseName(dir) : o.served_model_name, dir};
    h.max_context_tokens = generation.max_context_tokens();
    h.vocab_size = config.vocab_size;
    ASSIGN_OR_RETURN(http, HttpFront::Start(h, &generation, codec.get(), chat.get(), keys.get(),
                                            [&] { return !draining && backend->Ready(); }));
  }
  const std::string address = absl::StrCat("127.0.0.1:", server.port);
  const std::string internal_address =
      membership ? absl::StrCat("127.0.0.1:", internal.port) : std::string();
  std::cerr << "router for " << config.Fingerprint() << (o.colocated ? " (colocated)" : "")
            << " on " << address
            << (membership ? absl::StrCat(", workers register on ", internal_address) : "")
            << (http ? absl::StrCat(", HTTP API on http://127.0.0.1:", http->port()) : "")
            << (codec ? "" : " (no tokenizer.json: token ids only)") << std::endl;
  ServeOptions serve;
  serve.name = "router";
  serve.ready_file = o.server.ready_file;
  serve.address = address;
  serve.metrics_address = metrics_address;
  serve.internal_address = internal_address;
  serve.http_address = http ? absl::StrCat("127.0.0.1:", http->port()) : "";
  serve.drain = [&] {
    draining = true;
    generation.Drain();
    update_health();  // NOT_SERVING: load balancers send new clients elsewhere
  };
  serve.in_flight = [&generation] { return generation.num_running(); };
  serve.drain_timeout = std::chrono::seconds(o.server.drain_timeout_s);
  const absl::Status s = ServeUntilSignal(server.server.get(), serve);
  http.reset();  // before the generation service its requests run on
  if (internal.server) internal.server->Shutdown(std::chrono::system_clock::now());
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
