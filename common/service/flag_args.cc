// The renderers of the flag groups' options (common/service/*_flags.h). No
// flag is defined here: programs that start services link this file alone.
#include "common/service/flag_args.h"

#include "common/service/device_flags.h"
#include "common/service/dispatch_flags.h"
#include "common/service/kv_flags.h"
#include "common/service/server_flags.h"
#include "common/service/worker_flags.h"

namespace moesh {

void AppendArgs(const ServerOptions& o, std::vector<std::string>* args) {
  const ServerOptions d;
  AddFlag(args, "model", o.model, d.model);
  AddFlag(args, "listen", o.listen, d.listen);
  AddFlag(args, "ready_file", o.ready_file, d.ready_file);
  AddFlag(args, "metrics_listen", o.metrics_listen, d.metrics_listen);
  AddFlag(args, "max_receive_message_mb", o.max_receive_message_mb, d.max_receive_message_mb);
  AddFlag(args, "drain_timeout_s", o.drain_timeout_s, d.drain_timeout_s);
  AddFlag(args, "tls_cert", o.tls.cert, d.tls.cert);
  AddFlag(args, "tls_key", o.tls.key, d.tls.key);
  AddFlag(args, "tls_ca", o.tls.ca, d.tls.ca);
  AddFlag(args, "tls_reload_s", o.tls.reload_s, d.tls.reload_s);
}

void AppendArgs(const WorkerOptions& o, std::vector<std::string>* args) {
  const WorkerOptions d;
  AddFlag(args, "router", o.router, d.router);
  AddFlag(args, "advertise_host", o.advertise_host, d.advertise_host);
  AddFlag(args, "transport", o.transport, d.transport);
}

void AppendArgs(const ExpertDispatchOptions& o, std::vector<std::string>* args) {
  const ExpertDispatchOptions d;
  AddFlag(args, "expert_workers", o.expert_workers, d.expert_workers);
  AddFlag(args, "expert_discovery_timeout_s", o.expert_discovery_timeout_s,
          d.expert_discovery_timeout_s);
  AddFlag(args, "micro_batches", o.micro_batches, d.micro_batches);
  AddFlag(args, "dispatch_dtype", o.dispatch_dtype, d.dispatch_dtype);
}

void AppendArgs(const KvOptions& o, std::vector<std::string>* args) {
  const KvOptions d;
  AddFlag(args, "kv_blocks", o.kv_blocks, d.kv_blocks);
  AddFlag(args, "block_size", o.block_size, d.block_size);
  AddFlag(args, "max_batch", o.max_batch, d.max_batch);
  AddFlag(args, "max_waiting_requests", o.max_waiting_requests, d.max_waiting_requests);
  AddFlag(args, "enable_prefix_caching", o.enable_prefix_caching, d.enable_prefix_caching);
  AddFlag(args, "max_num_batched_tokens", o.max_num_batched_tokens, d.max_num_batched_tokens);
  AddFlag(args, "preemption_mode", o.preemption_mode, d.preemption_mode);
  AddFlag(args, "swap_space_mb", o.swap_space_mb, d.swap_space_mb);
}

void AppendArgs(const DeviceOptions& o, std::vector<std::string>* args) {
  const DeviceOptions d;
  AddFlag(args, "device", o.device, d.device);
  AddFlag(args, "gpu_memory_utilization", o.gpu_memory_utilization, d.gpu_memory_utilization);
  AddFlag(args, "max_model_len", o.max_model_len, d.max_model_len);
  AddFlag<std::string>(args, "load_format", o.dummy_weights ? "dummy" : "auto", "auto");
  AddFlag<std::string>(args, "quantization", o.fp8_linears ? "fp8" : "", "");
  AddFlag<std::string>(args, "kv_cache_dtype", o.fp8_kv_cache ? "fp8" : "auto", "auto");
}

}  // namespace moesh
