// moesh decode worker: holds the paged KV cache of running requests and
// advances them one token per step in a continuously batched loop.
#include <iostream>

#include "base/status.h"
#include "common/metrics/metrics.h"
#include "common/rpc/grpc_util.h"
#include "common/service/attention_worker.h"
#include "common/service/serving_proto.h"
#include "common/service/worker_main.h"
#include "common/serving/decode_engine.h"
#include "common/transport/data_plane_endpoint.h"
#include "common/transport/grpc_data_plane_service.h"
#include "decode_worker/decode_service.h"
#include "decode_worker/flags.h"

namespace moesh {
namespace {

absl::Status Run() {
  ASSIGN_OR_RETURN(const DecodeWorkerOptions o, DecodeWorkerOptionsFromFlags());
  RETURN_IF_ERROR(ConfigureInternalPlane(o.server));
  ASSIGN_OR_RETURN(std::unique_ptr<Metrics> metrics,
                   Metrics::Create(o.server.metrics_listen, "decode_worker"));
  AttentionWorkerOptions opt =
      AttentionWorkerOptionsFrom(o.server, o.worker, o.dispatch, o.device, metrics.get());
  opt.device.num_kv_blocks = o.kv.kv_blocks;
  opt.device.block_size = o.kv.block_size;
  opt.device.prefix_cache = o.kv.enable_prefix_caching;
  opt.device.max_num_seqs = o.kv.max_batch;
  DecodeEngineOptions eo;
  eo.max_batch = o.kv.max_batch;
  eo.max_waiting = o.kv.max_waiting_requests;
  eo.max_num_batched_tokens = o.kv.max_num_batched_tokens;
  ASSIGN_OR_RETURN(eo.preemption_mode, ParsePreemptionMode(o.kv.preemption_mode));
  eo.swap_space_bytes = int64_t{o.kv.swap_space_mb} << 20;
  eo.micro_batches = o.dispatch.micro_batches;
  eo.micro_batch_min = o.micro_batch_min;
  eo.max_pending_kv_share = o.max_pending_kv_share;
  eo.metrics = metrics.get();
  ASSIGN_OR_RETURN(AttentionWorker w, SetUpAttentionWorker(opt));
  DecodeEngine engine(w.backend.get(), w.experts.get(), eo);
  DecodeService service(&engine);
  GrpcDataPlaneService data_plane(nullptr, &engine);
  ASSIGN_OR_RETURN(RunningServer server, StartGrpcServer(o.server.listen, {&service, &data_plane},
                                                         o.server.max_receive_message_mb));
  const std::string address = absl::StrCat(o.worker.advertise_host, ":", server.port);
  ASSIGN_OR_RETURN(DataPlaneEndpoint data, StartDataPlane(opt.transport, o.worker.advertise_host,
                                                          address, nullptr, &engine));
  const KvUsage kv = w.backend->kv_usage();
  std::cerr << "decode worker for " << w.config.Fingerprint() << " on " << address << " ("
            << w.backend->device() << ", " << kv.total_blocks << " KV blocks of " << kv.block_size
            << " tokens)" << std::endl;
  ServeOptions serve = WorkerServeOptions("decode worker", v1::WORKER_KIND_DECODE, address,
                                          w.config.Fingerprint(), o.server, o.worker, *metrics);
  serve.registration.set_data_plane_address(data.address);
  serve.registration.set_computes_prompts(true);
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
      argc, argv, "moesh decode worker: --model DIR --router host:port [--expert_workers a,b]",
      "decode_worker", moesh::Run);
}
