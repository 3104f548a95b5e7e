#include "common/service/server_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, model, moesh::ServerOptions().model,
          "Model directory: config.json, and tokenizer.json for text (the router); the "
          "safetensors weights (the workers, and the router with --colocated; none with "
          "--load_format dummy).");
ABSL_FLAG(std::string, listen, moesh::ServerOptions().listen,
          "host:port to serve gRPC on (port 0: any free one).");
ABSL_FLAG(std::string, ready_file, moesh::ServerOptions().ready_file,
          "Once serving, write \"<grpc host:port>\\n<metrics host:port>\\n\" to this file "
          "(atomically), for a supervisor to wait on (empty: none).");
ABSL_FLAG(std::string, metrics_listen, moesh::ServerOptions().metrics_listen,
          "host:port of the Prometheus /metrics endpoint (port 0: any free one; empty: none).");

namespace moesh {

absl::StatusOr<ServerOptions> ServerOptionsFromFlags() {
  ServerOptions o;
  o.model = absl::GetFlag(FLAGS_model);
  if (o.model.empty()) return absl::InvalidArgumentError("--model is required");
  o.listen = absl::GetFlag(FLAGS_listen);
  o.ready_file = absl::GetFlag(FLAGS_ready_file);
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  return o;
}

}  // namespace moesh
