// inproc: direct calls into handlers bound in this process.
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/transport/transport.h"
#include "common/transport/transport_registry.h"

namespace moesh {
namespace {

struct Binding {
  DispatchHandler* dispatch = nullptr;
  KvHandler* kv = nullptr;
};

absl::Mutex& RegistryMutex() {
  static absl::Mutex* mu = new absl::Mutex;  // never destroyed: used at exit
  return *mu;
}
std::map<std::string, Binding>& Registry() {
  static auto* r = new std::map<std::string, Binding>;
  return *r;
}

absl::StatusOr<Binding> Lookup(const std::string& address) {
  absl::MutexLock lock(&RegistryMutex());
  auto it = Registry().find(address);
  if (it == Registry().end())
    return absl::UnavailableError(absl::StrCat("inproc peer ", address, " is not bound"));
  return it->second;
}

class InprocChannel : public DataChannel {
 public:
  explicit InprocChannel(std::string address) : address_(std::move(address)) {}
  absl::Status Dispatch(const MoeDispatch& dispatch, float* out) override {
    if (absl::Status s = CheckHostDispatch(dispatch, address_); !s.ok()) return s;
    absl::StatusOr<Binding> b = Lookup(address_);
    if (!b.ok()) return b.status();
    if (b->dispatch == nullptr)
      return absl::UnimplementedError(absl::StrCat(address_, " serves no expert dispatch"));
    return b->dispatch->Dispatch(dispatch, out);
  }
  absl::Status PushKv(const KvTransfer& transfer) override {
    absl::StatusOr<Binding> b = Lookup(address_);
    if (!b.ok()) return b.status();
    if (b->kv == nullptr) return absl::UnimplementedError(absl::StrCat(address_, " takes no KV"));
    return b->kv->PushKv(transfer);
  }
  const std::string& peer() const override { return address_; }

 private:
  const std::string address_;
};

}  // namespace

absl::Status BindInproc(const std::string& address, DispatchHandler* dispatch, KvHandler* kv) {
  absl::MutexLock lock(&RegistryMutex());
  if (!Registry().emplace(address, Binding{dispatch, kv}).second) {
    return absl::AlreadyExistsError(absl::StrCat("inproc address ", address, " is already bound"));
  }
  return absl::OkStatus();
}

void UnbindInproc(const std::string& address) {
  absl::MutexLock lock(&RegistryMutex());
  Registry().erase(address);
}

std::unique_ptr<Transport> MakeInprocTransport() {
  return std::make_unique<ChannelTransport<InprocChannel>>("inproc");
}

// Same process: handlers bound by address (BindInproc), no server side.
const TransportPlugin& InprocTransportPlugin() {
  static const BasicTransportPlugin plugin(
      "inproc", {},
      [](int) -> absl::StatusOr<std::unique_ptr<Transport>> { return MakeInprocTransport(); },
      [](const DataPlaneServeOptions&) -> absl::StatusOr<DataPlaneEndpoint> {
        return absl::InvalidArgumentError(
            "--transport \"inproc\" has no server side: bind the handlers in-process "
            "(BindInproc)");
      });
  return plugin;
}

}  // namespace moesh
