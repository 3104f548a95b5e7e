// moesh prefill worker: runs prompts through the model, hands their KV cache
// to the decode worker and returns the first token.
#include <algorithm>
#include <iostream>

#include "base/status.h"
#include "common/metrics/metrics.h"
#include "common/model/config.h"
#include "common/rpc/grpc_util.h"
#include "common/service/attention_worker.h"
#include "common/service/serving_proto.h"
#include "common/service/worker_main.h"
#include "common/transport/transport_registry.h"
#include "prefill_worker/flags.h"
#include "prefill_worker/prefill_service.h"

namespace moesh {
namespace {

absl::Status Run() {
  ASSIGN_OR_RETURN(const PrefillWorkerOptions o, PrefillWorkerOptionsFromFlags());
  // The channels to the expert workers receive a prefill batch's expert sums
  // in one message (fp32 [max_batch_tokens, hidden]): their limit covers
  // that even where --max_receive_message_mb (this worker's listener) is lower.
  ASSIGN_OR_RETURN(const ModelConfig model, ModelConfig::Load(o.server.model));
  const int64_t sums_mb = (int64_t{o.max_batch_tokens} * model.hidden_size * 4 >> 20) + 1;
  RETURN_IF_ERROR(ConfigureInternalPlane(
      o.server.tls, static_cast<int>(std::min<int64_t>(
                        std::max<int64_t>(o.server.max_receive_message_mb, sums_mb),
                        kMaxReceiveMessageMbLimit))));
  ASSIGN_OR_RETURN(std::unique_ptr<Metrics> metrics,
                   Metrics::Create(o.server.metrics_listen, "prefill_worker"));
  AttentionWorkerOptions opt =
      AttentionWorkerOptionsFrom(o.server, o.worker, o.dispatch, o.device, metrics.get());
  if (o.kv.enable_prefix_caching) {
    // A pool whose published blocks outlive the prompts that wrote them.
    opt.device.num_kv_blocks = o.kv.kv_blocks;
    opt.device.block_size = o.kv.block_size;
    opt.device.prefix_cache = true;
  }
  ASSIGN_OR_RETURN(AttentionWorker w, SetUpAttentionWorker(opt));
  PrefillEngineOptions eo;
  eo.max_batch_tokens = o.max_batch_tokens;
  eo.max_chunk_tokens = o.kv.max_num_batched_tokens;
  eo.micro_batches = o.dispatch.micro_batches;
  eo.metrics = metrics.get();
  ASSIGN_OR_RETURN(const TransportPlugin* transport, FindTransport(opt.transport));
  const bool device_ok = transport->capabilities().device_kv && w.backend->device() != "cpu";
  if (o.kv_handoff == "device" && !device_ok) {
    return absl::InvalidArgumentError(
        "--kv_handoff device needs a --transport that hands KV over on the device (cuda_ipc or "
        "nccl), and --device cuda");
  }
  eo.kv_handoff = o.kv_handoff == "device" || (o.kv_handoff == "auto" && device_ok)
                      ? KvHandoff::kDevice
                      : KvHandoff::kHost;
  PrefillEngine engine(w.backend.get(), w.experts.get(), w.kv_transport(), eo);
  PrefillService service(&engine);
  ASSIGN_OR_RETURN(RunningServer server,
                   StartGrpcServer(o.server.listen, {&service}, o.server.max_receive_message_mb));
  const std::string address = absl::StrCat(o.worker.advertise_host, ":", server.port);
  std::cerr << "prefill worker for " << w.config.Fingerprint() << " on " << address << " ("
            << w.backend->device() << ", KV handoff "
            << (eo.kv_handoff == KvHandoff::kDevice ? "device" : "host") << ")" << std::endl;
  ServeOptions serve = WorkerServeOptions("prefill worker", v1::WORKER_KIND_PREFILL, address,
                                          w.config.Fingerprint(), o.server, o.worker, *metrics);
  serve.load = [&engine] { return LoadToProto(engine.Load()); };
  serve.drain = [&engine] { engine.Drain(); };
  serve.in_flight = [&engine] { return engine.Load().in_flight; };
  serve.on_placement_version = w.on_placement_version;
  return ServeUntilSignal(server.server.get(), serve);
}

}  // namespace
}  // namespace moesh

int main(int argc, char** argv) {
  return moesh::ServiceMain(
      argc, argv, "moesh prefill worker: --model DIR --router host:port [--expert_workers a,b]",
      "prefill_worker", moesh::Run);
}
