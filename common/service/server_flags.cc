#include "common/service/server_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"

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
ABSL_FLAG(int, max_receive_message_mb, moesh::ServerOptions().max_receive_message_mb,
          "Largest gRPC message the --listen port accepts, in MiB (larger ones fail "
          "RESOURCE_EXHAUSTED); a decode worker taking KV over --transport grpc needs room for "
          "a whole prompt's rows.");

ABSL_FLAG(int, drain_timeout_s, moesh::ServerOptions().drain_timeout_s,
          "On SIGTERM or SIGINT: stop taking new work (a worker tells the router, which sends it "
          "no more), finish what is in flight for up to this many seconds, then exit (0: exit at "
          "once, failing what is in flight).");

ABSL_FLAG(std::string, tls_cert, moesh::ServerOptions().tls.cert,
          "PEM certificate (chain) of this process on the internal plane, presented to peers as "
          "server and client; it must name \"moesh-internal\" (subjectAltName DNS). With "
          "--tls_key and --tls_ca: mutual TLS on every internal listener and channel (empty: "
          "plaintext).");
ABSL_FLAG(std::string, tls_key, moesh::ServerOptions().tls.key, "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_ca, moesh::ServerOptions().tls.ca,
          "PEM CA certificate(s): peers on the internal plane must present a certificate it "
          "signed; others are refused.");
ABSL_FLAG(int, tls_reload_s, moesh::ServerOptions().tls.reload_s,
          "Read --tls_cert, --tls_key and --tls_ca again every this many seconds: a rotated "
          "certificate or CA (e.g. a renewed Kubernetes secret) takes effect on the next "
          "connection without a restart (0: read once at start).");

namespace moesh {

absl::StatusOr<ServerOptions> ServerOptionsFromFlags() {
  ServerOptions o;
  o.model = absl::GetFlag(FLAGS_model);
  if (o.model.empty()) return absl::InvalidArgumentError("--model is required");
  o.listen = absl::GetFlag(FLAGS_listen);
  o.ready_file = absl::GetFlag(FLAGS_ready_file);
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  o.max_receive_message_mb = absl::GetFlag(FLAGS_max_receive_message_mb);
  if (o.max_receive_message_mb < 1 || o.max_receive_message_mb > kMaxReceiveMessageMbLimit) {
    return absl::InvalidArgumentError(absl::StrCat("--max_receive_message_mb must lie in [1, ",
                                                   kMaxReceiveMessageMbLimit, "], got ",
                                                   o.max_receive_message_mb));
  }
  o.drain_timeout_s = absl::GetFlag(FLAGS_drain_timeout_s);
  if (o.drain_timeout_s < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--drain_timeout_s must be >= 0, not ", o.drain_timeout_s));
  }
  o.tls.cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls.key = absl::GetFlag(FLAGS_tls_key);
  o.tls.ca = absl::GetFlag(FLAGS_tls_ca);
  o.tls.reload_s = absl::GetFlag(FLAGS_tls_reload_s);
  RETURN_IF_ERROR(ValidateTlsFiles(o.tls, "--tls_"));
  return o;
}

absl::Status ConfigureInternalPlane(const ServerOptions& o) {
  return ConfigureInternalPlane(o.tls, o.max_receive_message_mb);
}

}  // namespace moesh
