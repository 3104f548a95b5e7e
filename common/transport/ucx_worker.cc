#include "common/transport/ucx_worker.h"

#include <arpa/inet.h>
#include <netdb.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

namespace moesh {

absl::Status UcxError(const std::string& what, ucs_status_t status) {
  return absl::UnavailableError(absl::StrCat("UCX ", what, ": ", ucs_status_string(status)));
}

absl::Status ParseSockaddr(const std::string& address, struct sockaddr_in* out) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad address \"", address, "\" (want host:port)"));
  }
  const std::string host = address.substr(0, colon);
  *out = {};
  out->sin_family = AF_INET;
  out->sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty() || host == "0.0.0.0") {
    out->sin_addr.s_addr = INADDR_ANY;
  } else if (inet_pton(AF_INET, host.c_str(), &out->sin_addr) != 1) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("cannot resolve host \"", host, "\""));
    }
    out->sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
    freeaddrinfo(res);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxWorker::Create(const std::string& name) {
  std::unique_ptr<UcxWorker> w(new UcxWorker());
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return UcxError("config", s);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = name.c_str();
  s = ucp_init(&params, config, &w->context_);
  ucp_config_release(config);
  if (s != UCS_OK) return UcxError("init", s);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread calls in
  s = ucp_worker_create(w->context_, &wp, &w->worker_);
  if (s != UCS_OK) return UcxError("worker", s);
  w->thread_ = std::thread([p = w.get()] { p->Loop(); });
  return w;
}

UcxWorker::~UcxWorker() {
  if (thread_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    ucp_worker_signal(worker_);
    thread_.join();
  }
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

void UcxWorker::Post(std::function<void()> task) {
  {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
  }
  ucp_worker_signal(worker_);
}

ucs_status_t UcxWorker::SetAmHandler(uint16_t id, ucp_am_recv_callback_t cb, void* arg) {
  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG;
  hp.id = id;
  hp.cb = cb;
  hp.arg = arg;
  return ucp_worker_set_am_recv_handler(worker_, &hp);
}

void UcxWorker::Run(std::function<void()> task) {
  if (OnProgressThread()) {
    task();
    return;
  }
  absl::Notification done;
  Post([&] {
    task();
    done.Notify();
  });
  done.WaitForNotification();
}

void UcxWorker::Loop() {
  while (true) {
    std::deque<std::function<void()>> tasks;
    {
      absl::MutexLock lock(&mu_);
      tasks.swap(tasks_);
      if (stop_ && tasks.empty()) break;
    }
    for (auto& t : tasks) t();
    while (ucp_worker_progress(worker_) != 0) {
    }
    {
      absl::MutexLock lock(&mu_);
      if (!tasks_.empty() || stop_) continue;
    }
    const ucs_status_t s = ucp_worker_arm(worker_);
    if (s == UCS_ERR_BUSY) continue;  // events arrived meanwhile
    if (s == UCS_OK) ucp_worker_wait(worker_);
  }
  // Drain what is left so pending callbacks run before the worker goes.
  for (int i = 0; i < 1000 && ucp_worker_progress(worker_) != 0; ++i) {
  }
}

}  // namespace moesh
