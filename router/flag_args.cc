// RouterOptions as flags; no flag is defined here (router/flags.cc does).
#include "common/service/flag_args.h"

#include "common/service/device_flags.h"
#include "router/flags.h"

namespace moesh {

std::vector<std::string> ToArgs(const RouterOptions& o) {
  const RouterOptions d;
  std::vector<std::string> args;
  AppendArgs(o.server, &args);
  AddFlag(&args, "internal_listen", o.internal_listen, d.internal_listen);
  AddFlag(&args, "public_tls", o.public_tls, d.public_tls);
  AddFlag(&args, "http_listen", o.http_listen, d.http_listen);
  AddFlag(&args, "http_max_body_mb", o.http_max_body_mb, d.http_max_body_mb);
  AddFlag(&args, "http_threads", o.http_threads, d.http_threads);
  AddFlag(&args, "http_keep_alive_ms", o.http_keep_alive_ms, d.http_keep_alive_ms);
  AddFlag(&args, "served_model_name", o.served_model_name, d.served_model_name);
  AddFlag(&args, "api_keys_file", o.api_keys_file, d.api_keys_file);
  AddFlag(&args, "heartbeat_interval_ms", o.heartbeat_interval_ms, d.heartbeat_interval_ms);
  AddFlag(&args, "heartbeat_timeout_ms", o.heartbeat_timeout_ms, d.heartbeat_timeout_ms);
  AddFlag(&args, "default_max_new_tokens", o.default_max_new_tokens, d.default_max_new_tokens);
  AddFlag(&args, "max_new_tokens_limit", o.max_new_tokens_limit, d.max_new_tokens_limit);
  AddFlag(&args, "max_context_tokens", o.max_context_tokens, d.max_context_tokens);
  AddFlag(&args, "rebalance_interval_s", o.rebalance_interval_s, d.rebalance_interval_s);
  AddFlag(&args, "rebalance_min_ratio", o.rebalance_min_ratio, d.rebalance_min_ratio);
  AddFlag(&args, "rebalance_slots", o.rebalance_slots, d.rebalance_slots);
  AddFlag(&args, "routing_policy", std::string(RoutingPolicyName(o.routing_policy)),
          std::string(RoutingPolicyName(d.routing_policy)));
  AddFlag(&args, "max_stream_migrations", o.max_stream_migrations, d.max_stream_migrations);
  AddFlag(&args, "max_local_prefill_tokens", o.max_local_prefill_tokens,
          d.max_local_prefill_tokens);
  AddFlag(&args, "colocated", o.colocated, d.colocated);
  AppendArgs(o.kv, &args);
  AppendArgs(o.device, &args);
  return args;
}

}  // namespace moesh
