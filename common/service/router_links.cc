#include "common/service/router_links.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"

namespace moesh {
namespace {

struct HostPort {
  std::string host;  // without brackets
  int port = 0;
};

absl::StatusOr<HostPort> ParseEntry(absl::string_view entry) {
  const size_t colon = entry.rfind(':');
  HostPort hp;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(entry.substr(colon + 1), &hp.port) || hp.port <= 0 || hp.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--router: \"", entry, "\" is not host:port (a list is comma-separated)"));
  }
  absl::string_view host = entry.substr(0, colon);
  if (absl::ConsumePrefix(&host, "[") && !absl::ConsumeSuffix(&host, "]")) {
    return absl::InvalidArgumentError(absl::StrCat("--router: \"", entry, "\": an unclosed ["));
  }
  hp.host = std::string(host);
  return hp;
}

// `hp.host`'s addresses, each with the port: the IPv4 ones, else the IPv6 ones.
absl::StatusOr<std::vector<std::string>> Resolve(const HostPort& hp) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int err = getaddrinfo(hp.host.c_str(), nullptr, &hints, &found); err != 0) {
    return absl::UnavailableError(
        absl::StrCat("--router: cannot resolve ", hp.host, ": ", gai_strerror(err)));
  }
  std::vector<std::string> v4, v6;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, text, sizeof(text));
      v4.push_back(absl::StrCat(text, ":", hp.port));
    } else if (a->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, text,
                sizeof(text));
      v6.push_back(absl::StrCat("[", text, "]:", hp.port));
    }
  }
  freeaddrinfo(found);
  // One family: "localhost" is one router, not two.
  return v4.empty() ? v6 : v4;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ResolveRouters(const std::string& routers) {
  std::vector<HostPort> entries;
  for (absl::string_view entry : absl::StrSplit(routers, ',', absl::SkipWhitespace())) {
    absl::StatusOr<HostPort> hp = ParseEntry(absl::StripAsciiWhitespace(entry));
    if (!hp.ok()) return hp.status();
    entries.push_back(*std::move(hp));
  }
  if (entries.empty()) return absl::InvalidArgumentError("--router: no router address");
  std::set<std::string> all;
  for (const HostPort& hp : entries) {
    absl::StatusOr<std::vector<std::string>> addresses = Resolve(hp);
    if (!addresses.ok()) return addresses.status();
    all.insert(addresses->begin(), addresses->end());
  }
  return std::vector<std::string>(all.begin(), all.end());
}

void RouterElection::Report(const std::string& address, bool up) {
  absl::MutexLock lock(&mu_);
  if (up) {
    up_.insert(address);
  } else {
    up_.erase(address);
  }
}

void RouterElection::Forget(const std::string& address) { Report(address, false); }

bool RouterElection::IsWriter(const std::string& address) const {
  absl::MutexLock lock(&mu_);
  return !up_.empty() && *up_.begin() == address;
}

std::string RouterElection::Writer() const {
  absl::MutexLock lock(&mu_);
  return up_.empty() ? "" : *up_.begin();
}

RouterLinks::RouterLinks(std::string routers, v1::RegisterRequest registration,
                         std::function<v1::WorkerLoad()> load,
                         PlacementFollower on_placement_version)
    : routers_(std::move(routers)),
      registration_(std::move(registration)),
      load_(std::move(load)),
      on_placement_version_(std::move(on_placement_version)) {
  Resolve();
  resolver_ = std::thread([this] {
    while (true) {
      bool none;
      {
        absl::MutexLock lock(&mu_);
        none = links_.empty();
      }
      // Until a name resolves (no router pod yet), every second.
      const auto wait = none ? std::chrono::seconds(1) : kRouterResolveInterval;
      if (stop_.WaitForNotificationWithTimeout(absl::FromChrono(wait))) break;
      Resolve();
    }
  });
}

RouterLinks::~RouterLinks() {
  stop_.Notify();
  resolver_.join();
  std::map<std::string, std::unique_ptr<HeartbeatClient>> links;
  {
    absl::MutexLock lock(&mu_);
    links.swap(links_);
  }
  links.clear();  // each deregisters, concurrently with nothing else here
}

void RouterLinks::BeatNow() {
  absl::MutexLock lock(&mu_);
  for (auto& [address, link] : links_) link->BeatNow();
}

void RouterLinks::Resolve() {
  absl::StatusOr<std::vector<std::string>> addresses = ResolveRouters(routers_);
  std::vector<std::unique_ptr<HeartbeatClient>> gone;
  std::vector<std::string> gone_addresses;
  {
    absl::MutexLock lock(&mu_);
    if (!addresses.ok()) {
      // Keep the routers known: a DNS hiccup must not cut the worker off.
      if (!warned_) std::cerr << addresses.status().message() << " (retrying)" << std::endl;
      warned_ = true;
      return;
    }
    warned_ = false;
    const std::set<std::string> now(addresses->begin(), addresses->end());
    for (auto it = links_.begin(); it != links_.end();) {
      if (now.count(it->first)) {
        ++it;
        continue;
      }
      std::cerr << "router " << it->first << " no longer listed in --router " << routers_
                << std::endl;
      gone.push_back(std::move(it->second));
      gone_addresses.push_back(it->first);
      it = links_.erase(it);
    }
    for (const std::string& address : now) {
      if (links_.count(address)) continue;
      links_[address] = std::make_unique<HeartbeatClient>(address, registration_, load_,
                                                          on_placement_version_, &election_);
    }
  }
  gone.clear();  // outside the lock: each deregisters (best effort, bounded)
  for (const std::string& address : gone_addresses) election_.Forget(address);
}

}  // namespace moesh
