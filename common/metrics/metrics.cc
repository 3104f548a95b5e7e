#include "common/metrics/metrics.h"

#include <CivetServer.h>

#include "absl/strings/str_cat.h"
#include "common/metrics/civetweb_stop.h"

namespace moesh {
namespace {

// civetweb's reason for a failed start (it logs through the callback, then
// mg_start returns null and CivetServer throws without the reason).
thread_local std::string civetweb_error;

int LogCivetwebMessage(const struct mg_connection*, const char* message) {
  if (message != nullptr)
    civetweb_error += (civetweb_error.empty() ? "" : "; ") + std::string(message);
  return 1;  // logged here: civetweb prints nothing
}

}  // namespace

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const std::string& listen,
                                                         const std::string& service) {
  std::unique_ptr<Metrics> m(new Metrics());
  m->service_ = service;
  if (!listen.empty()) {
    CivetCallbacks callbacks;
    callbacks.log_message = LogCivetwebMessage;
    civetweb_error.clear();
    try {  // civetweb reports a failed bind by throwing
      m->exposer_ = std::make_unique<prometheus::Exposer>(listen, 2, &callbacks);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("cannot serve /metrics on ", listen, ": ",
                       civetweb_error.empty() ? e.what() : civetweb_error));
    }
    m->exposer_->RegisterCollectable(m->registry_);
    const std::vector<int> ports = m->exposer_->GetListeningPorts();
    m->port_ = ports.empty() ? 0 : ports.front();
    m->host_ = ListenHost(listen);
  }
  return m;
}

Metrics::~Metrics() {
  StopCivetweb(host_, port_, [this] { exposer_.reset(); });
}

prometheus::Family<prometheus::Counter>& Metrics::CounterFamily(const std::string& name,
                                                                const std::string& help) {
  return prometheus::BuildCounter()
      .Name(name)
      .Help(help)
      .Labels({{"service", service_}})
      .Register(*registry_);
}

prometheus::Family<prometheus::Gauge>& Metrics::GaugeFamily(const std::string& name,
                                                            const std::string& help) {
  return prometheus::BuildGauge()
      .Name(name)
      .Help(help)
      .Labels({{"service", service_}})
      .Register(*registry_);
}

prometheus::Family<prometheus::Histogram>& Metrics::HistogramFamily(const std::string& name,
                                                                    const std::string& help) {
  return prometheus::BuildHistogram()
      .Name(name)
      .Help(help)
      .Labels({{"service", service_}})
      .Register(*registry_);
}

prometheus::Histogram::BucketBoundaries Metrics::LatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
          0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
}

}  // namespace moesh
