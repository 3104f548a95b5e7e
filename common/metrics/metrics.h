// One Prometheus registry per process, exposed on /metrics, with the metric
// families every moesh service exports. Names follow what serving dashboards
// already know (moesh_time_to_first_token_seconds, moesh_num_requests_running,
// moesh_kv_cache_usage_perc, ...) plus moesh's own expert and data-plane
// series. docs/METRICS.md is the catalogue.
//
// Thread-safe (prometheus-cpp metrics are atomic).
#ifndef MOESH_COMMON_METRICS_METRICS_H_
#define MOESH_COMMON_METRICS_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace moesh {

class Metrics {
 public:
  // Serves /metrics on `listen` ("host:port", port 0: any free port); empty:
  // keep the registry without an HTTP endpoint (tests, embedded engines).
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const std::string& listen,
                                                         const std::string& service);
  ~Metrics();  // stops the endpoint at once (StopCivetweb)

  // The bound port, 0 without an endpoint.
  int port() const { return port_; }
  prometheus::Registry& registry() { return *registry_; }

  prometheus::Family<prometheus::Counter>& CounterFamily(const std::string& name,
                                                         const std::string& help);
  prometheus::Family<prometheus::Gauge>& GaugeFamily(const std::string& name,
                                                     const std::string& help);
  prometheus::Family<prometheus::Histogram>& HistogramFamily(const std::string& name,
                                                             const std::string& help);

  // Latency buckets (seconds) from 100 µs to 60 s.
  static prometheus::Histogram::BucketBoundaries LatencyBuckets();

 private:
  Metrics() = default;
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  std::string host_;  // the endpoint's listen host
  std::string service_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_METRICS_METRICS_H_
