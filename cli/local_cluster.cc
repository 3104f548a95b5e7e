#include "cli/local_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/file_util.h"
#include "base/status.h"
#include "common/model/config.h"
#include "grpc/health/v1/health.grpc.pb.h"

extern char** environ;

namespace moesh {
namespace {

// Polls for the worker's ready file ("grpc address\nmetrics address\n");
// fails early if the process exited.
absl::StatusOr<std::string> AwaitReadyFile(const std::string& path, pid_t pid,
                                           const std::string& log,
                                           std::chrono::steady_clock::time_point give_up) {
  while (std::chrono::steady_clock::now() < give_up) {
    absl::StatusOr<std::string> text = ReadFileToString(path);
    if (text.ok() && !text->empty()) return *text;
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      absl::StatusOr<std::string> tail = ReadFileToString(log);
      return absl::UnavailableError(absl::StrCat("process ", pid,
                                                 " exited before serving; its log (", log, "):\n",
                                                 tail.ok() ? *tail : ""));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("timed out waiting for ", path));
}

}  // namespace

PrefillWorkerOptions LocalPrefillDefaults() {
  PrefillWorkerOptions o;
  o.device.gpu_memory_utilization = 0.8;
  return o;
}

DecodeWorkerOptions LocalDecodeDefaults() {
  DecodeWorkerOptions o;
  o.kv.kv_blocks = 512;
  o.device.gpu_memory_utilization = 0.6;
  return o;
}

void SetWorkerDevice(const DeviceOptions& device, LocalClusterOptions* o) {
  for (DeviceOptions* d : {&o->prefill.device, &o->decode.device, &o->expert.device}) {
    d->device = device.device;
    d->dummy_weights = device.dummy_weights;
    d->fp8_linears = device.fp8_linears;
    d->fp8_kv_cache = device.fp8_kv_cache;
  }
}

void SetWorkerTransport(const std::string& transport, LocalClusterOptions* o) {
  for (WorkerOptions* w : {&o->prefill.worker, &o->decode.worker, &o->expert.worker}) {
    w->transport = transport;
  }
}

std::string LocalCluster::ReadyFile(const std::string& name) const {
  return JoinPath(options_.work_dir, name + ".ready");
}

void LocalCluster::SetServer(const std::string& name, ServerOptions* server) const {
  server->model = options_.model_dir;
  server->ready_file = ReadyFile(name);
  server->tls = options_.tls;
}

absl::Status LocalCluster::Launch(const std::string& name, const std::string& binary,
                                  const std::vector<std::string>& flags) {
  Process p;
  p.name = name;
  p.log_path = JoinPath(options_.work_dir, name + ".log");
  const std::string ready = ReadyFile(name);
  std::remove(ready.c_str());
  const std::string path = JoinPath(options_.bin_dir, binary);
  if (!FileExists(path))
    return absl::NotFoundError(absl::StrCat(path, ": no such binary (build it first)"));
  std::vector<std::string> argv_s = {path};
  argv_s.insert(argv_s.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (std::string& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, p.log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  const int rc = posix_spawn(&p.pid, path.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return absl::InternalError(absl::StrCat("cannot start ", path, ": ", strerror(rc)));
  p.binary = binary;
  p.flags = flags;
  processes_.push_back(p);  // tracked before waiting, so a failure still stops it
  return absl::OkStatus();
}

absl::StatusOr<LocalCluster::Process> LocalCluster::AwaitReady(size_t index) {
  Process& p = processes_[index];
  ASSIGN_OR_RETURN(std::string text,
                   AwaitReadyFile(ReadyFile(p.name), p.pid, p.log_path,
                                  std::chrono::steady_clock::now() + options_.startup_timeout));
  // A line per address, in WriteReadyFile's order (an absent one empty).
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  p.address = lines.empty() ? "" : lines[0];
  p.metrics_address = lines.size() > 1 ? lines[1] : "";
  p.internal_address = lines.size() > 2 ? lines[2] : "";
  p.http_address = lines.size() > 3 ? lines[3] : "";
  return p;
}

absl::StatusOr<LocalCluster::Process> LocalCluster::Spawn(const std::string& name,
                                                          const std::string& binary,
                                                          const std::vector<std::string>& flags) {
  RETURN_IF_ERROR(Launch(name, binary, flags));
  return AwaitReady(processes_.size() - 1);
}

absl::Status LocalCluster::SpawnAll(const std::vector<Launchable>& group, bool together) {
  if (!together) {
    for (const Launchable& l : group) RETURN_IF_ERROR(Spawn(l.name, l.binary, l.flags).status());
    return absl::OkStatus();
  }
  const size_t first = processes_.size();
  for (const Launchable& l : group) RETURN_IF_ERROR(Launch(l.name, l.binary, l.flags));
  for (size_t i = first; i < processes_.size(); ++i) RETURN_IF_ERROR(AwaitReady(i).status());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    const LocalClusterOptions& options) {
  std::unique_ptr<LocalCluster> c(new LocalCluster(options));
  RETURN_IF_ERROR(MakeDirs(options.work_dir));
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(options.model_dir));
  if (options.num_routers < 1 || options.num_routers > 16)
    return absl::InvalidArgumentError("num_routers must be in [1, 16]");
  for (int i = 0; i < options.num_routers; ++i) {
    const std::string name = options.num_routers == 1 ? "router" : absl::StrCat("router-", i);
    RouterOptions router_options = options.router;
    // The first router takes the listen address asked for; the others any free port.
    if (i > 0) router_options.server.listen = "127.0.0.1:0";
    if (i > 0 && !router_options.http_listen.empty()) router_options.http_listen = "127.0.0.1:0";
    c->SetServer(name, &router_options.server);
    ASSIGN_OR_RETURN(Process router, c->Spawn(name, "moesh_router", ToArgs(router_options)));
    // A restart takes the same ports: the workers' --router names them.
    router_options.server.listen = router.address;
    router_options.internal_listen = router.internal_address;
    if (!router.http_address.empty()) router_options.http_listen = router.http_address;
    c->processes_.back().flags = ToArgs(router_options);
  }
  const std::string routers = c->router_internal_address();

  std::vector<std::string> experts = options.expert_workers;
  if (experts.empty()) experts = {"0/2", "1/2"};
  if (config.n_routed_experts < 2) experts = {"0-0"};
  // Workers on the CPU start together; those on a GPU one at a time, since
  // each sizes its pools by the device memory the ones before it left.
  std::vector<Launchable> group;
  bool together = true;
  for (const std::string& spec : experts) {
    ASSIGN_OR_RETURN(Launchable l, c->ExpertWorker(spec, static_cast<int>(group.size())));
    together = together && l.on_cpu;
    group.push_back(std::move(l));
  }
  const size_t first_expert = c->processes_.size();
  RETURN_IF_ERROR(c->SpawnAll(group, together));
  std::vector<std::string> expert_addresses;
  for (size_t i = first_expert; i < c->processes_.size(); ++i)
    expert_addresses.push_back(c->processes_[i].address);
  if (options.placement_from_router) expert_addresses.clear();  // the router's map instead
  // Decode and prefill workers: `n` of `binary`, from `o`, joined to the router and the experts.
  group.clear();
  together = true;
  // A GPU worker sizes its pools up to its --gpu_memory_utilization of the
  // whole device, counting what is already in use: n workers of one kind on
  // one GPU step through the span from `base` (what the kind started before
  // them may fill) to their own target, worker i up to base + (i + 1) / n of
  // it, so the later ones find room too.
  auto attention_workers = [&](const char* kind, const char* binary, auto o, int n, double base) {
    o.worker.router = routers;
    o.dispatch.expert_workers = expert_addresses;
    const double target = o.device.gpu_memory_utilization;
    for (int i = 0; i < n; ++i) {
      const std::string name = absl::StrCat(kind, "-", i);
      c->SetServer(name, &o.server);
      if (o.device.device != "cpu" && n > 1 && target > base)
        o.device.gpu_memory_utilization = base + (target - base) * (i + 1) / n;
      group.push_back({name, binary, ToArgs(o), o.device.device == "cpu"});
      together = together && group.back().on_cpu;
    }
  };
  attention_workers("decode", "moesh_decode_worker", options.decode, options.num_decode, 0.0);
  const bool shared_gpu =
      options.decode.device.device == options.prefill.device.device && options.num_decode > 0;
  attention_workers("prefill", "moesh_prefill_worker", options.prefill, options.num_prefill,
                    shared_gpu ? options.decode.device.gpu_memory_utilization : 0.0);
  RETURN_IF_ERROR(c->SpawnAll(group, together));
  RETURN_IF_ERROR(c->WaitUntilServing(options.startup_timeout));
  RETURN_IF_ERROR(c->WaitUntilJoined(options.startup_timeout));
  return c;
}

absl::StatusOr<LocalCluster::Launchable> LocalCluster::ExpertWorker(const std::string& spec,
                                                                    int pending) const {
  int n = pending;
  for (const Process& p : processes_) n += p.name.rfind("expert-", 0) == 0 ? 1 : 0;
  const std::string name = absl::StrCat("expert-", n);
  ExpertWorkerOptions o = options_.expert;
  SetServer(name, &o.server);
  o.worker.router = router_internal_address();
  (spec.find('/') != std::string::npos ? o.shard : o.experts) = spec;
  // The n-th expert worker takes the n-th device of the list, round robin.
  if (!options_.expert_devices.empty()) {
    o.device.device = options_.expert_devices[n % options_.expert_devices.size()];
    if (o.device.device.empty())
      return absl::InvalidArgumentError("expert_devices: an empty entry in the list");
  }
  return Launchable{name, "moesh_expert_worker", ToArgs(o), o.device.device == "cpu"};
}

absl::Status LocalCluster::AddExpertWorker(const std::string& spec) {
  ASSIGN_OR_RETURN(Launchable l, ExpertWorker(spec, 0));
  return Spawn(l.name, l.binary, l.flags).status();
}

std::vector<std::string> LocalCluster::router_addresses() const {
  std::vector<std::string> out;
  for (const Process& p : processes_) {
    if (absl::StartsWith(p.name, "router")) out.push_back(p.address);
  }
  return out;
}

std::string LocalCluster::router_internal_address() const {
  std::vector<std::string> out;
  for (const Process& p : processes_) {
    if (absl::StartsWith(p.name, "router")) out.push_back(p.internal_address);
  }
  return absl::StrJoin(out, ",");
}

absl::Status LocalCluster::Restart(const std::string& name) {
  for (size_t i = 0; i < processes_.size(); ++i) {
    Process& p = processes_[i];
    if (p.name != name) continue;
    if (p.pid > 0) return absl::FailedPreconditionError(absl::StrCat(name, " still runs"));
    const Process old = p;
    processes_.erase(processes_.begin() + static_cast<std::ptrdiff_t>(i));
    ASSIGN_OR_RETURN(Process fresh, Spawn(old.name, old.binary, old.flags));
    // Back in its place (routers first: router_address() is the first's).
    processes_.pop_back();
    processes_.insert(processes_.begin() + static_cast<std::ptrdiff_t>(i), fresh);
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("no process ", name));
}

absl::Status LocalCluster::WaitUntilServing(std::chrono::seconds timeout) const {
  for (const std::string& address : router_addresses()) {
    RETURN_IF_ERROR(WaitUntilRouterServing(address, timeout));
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::WaitUntilRouterServing(const std::string& address,
                                                  std::chrono::seconds timeout) const {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options_.router.public_tls) {
    grpc::SslCredentialsOptions ssl;
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFileToString(options_.tls.ca));
    credentials = grpc::SslCredentials(ssl);
  }
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(address, credentials));
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  std::string last;
  while (std::chrono::steady_clock::now() < give_up) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    grpc::health::v1::HealthCheckRequest req;
    req.set_service("moesh.v1.Generation");
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status s = stub->Check(&ctx, req, &resp);
    if (s.ok() && resp.status() == grpc::health::v1::HealthCheckResponse::SERVING)
      return absl::OkStatus();
    last = s.ok() ? grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status())
                  : s.error_message();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("router ", address, " not SERVING: ", last));
}

absl::Status LocalCluster::WaitUntilJoined(std::chrono::seconds timeout) const {
  if (options_.router.colocated) return absl::OkStatus();  // no members
  std::map<std::string, int> want;                         // kind label -> processes
  for (const Process& p : processes_) {
    for (const char* kind : {"prefill", "decode", "expert"}) {
      if (p.pid > 0 && absl::StartsWith(p.name, absl::StrCat(kind, "-"))) ++want[kind];
    }
  }
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  for (const Process& router : processes_) {
    if (!absl::StartsWith(router.name, "router") || router.pid <= 0) continue;
    std::string last;
    for (;;) {
      absl::StatusOr<std::string> text = ScrapeMetrics(router.metrics_address);
      std::map<std::string, int> have;
      for (absl::string_view line : absl::StrSplit(text.ok() ? *text : "", '\n')) {
        double v;
        if (!absl::StartsWith(line, "moesh_router_workers{") ||
            !absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v))
          continue;
        for (const auto& [kind, n] : want) {
          if (absl::StrContains(line, absl::StrCat("kind=\"", kind, "\"")))
            have[kind] = static_cast<int>(v);
        }
      }
      if (have == want) break;
      last = text.ok() ? absl::StrCat(have["prefill"], " prefill, ", have["decode"], " decode, ",
                                      have["expert"], " expert workers joined")
                       : std::string(text.status().message());
      if (std::chrono::steady_clock::now() > give_up) {
        return absl::DeadlineExceededError(
            absl::StrCat(router.name, ": not every worker joined (", want["prefill"], " prefill, ",
                         want["decode"], " decode, ", want["expert"], " expert started): ", last));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::Signal(const std::string& name, int signal) {
  for (Process& p : processes_) {
    if (p.name != name || p.pid < 0) continue;
    if (kill(p.pid, signal) != 0)
      return absl::InternalError(absl::StrCat("kill ", name, ": ", strerror(errno)));
    if (signal == SIGKILL) {
      waitpid(p.pid, nullptr, 0);
      p.pid = -1;
    }
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("no running process ", name));
}

absl::StatusOr<int> LocalCluster::Reap(Process& p, std::chrono::steady_clock::time_point give_up) {
  while (true) {
    int status = 0;
    if (waitpid(p.pid, &status, WNOHANG) == p.pid) {
      p.pid = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (std::chrono::steady_clock::now() > give_up) {
      return absl::DeadlineExceededError(absl::StrCat(p.name, " still runs"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

absl::StatusOr<int> LocalCluster::WaitForExit(const std::string& name,
                                              std::chrono::milliseconds timeout) {
  for (Process& p : processes_) {
    if (p.name == name && p.pid > 0) return Reap(p, std::chrono::steady_clock::now() + timeout);
  }
  return absl::NotFoundError(absl::StrCat("no running process ", name));
}

void LocalCluster::StopAll() {
  // In waves, each reaped before the next starts: the prefill and decode
  // workers drain their streams (the routers and expert workers still serve
  // them), then the routers (a colocated one's streams still reach the expert
  // workers), then the expert workers. An expert worker's drain serves on
  // until its dispatches stopped for 2 s (attention workers elsewhere follow
  // a new map within a heartbeat); with every attention worker of the cluster
  // gone nothing can come, and another SIGTERM during the drain ends it at
  // once (sent until it exits: one sent before the first was taken merges
  // with it).
  enum Wave { kAttention, kRouter, kExpert };
  auto wave_of = [](const Process& p) {
    if (absl::StartsWith(p.name, "router")) return kRouter;
    return absl::StartsWith(p.name, "expert-") ? kExpert : kAttention;
  };
  for (Wave wave : {kAttention, kRouter, kExpert}) {
    for (Process& p : processes_) {
      if (p.pid > 0 && wave_of(p) == wave) kill(p.pid, SIGCONT), kill(p.pid, SIGTERM);
    }
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (Process& p : processes_) {
      if (p.pid <= 0 || wave_of(p) != wave) continue;
      while (wave == kExpert && std::chrono::steady_clock::now() < give_up &&
             !Reap(p, std::chrono::steady_clock::now() + std::chrono::milliseconds(100)).ok()) {
        kill(p.pid, SIGTERM);
      }
      if (p.pid > 0 && !Reap(p, give_up).ok()) {
        kill(p.pid, SIGKILL);
        waitpid(p.pid, nullptr, 0);
        p.pid = -1;
      }
    }
  }
}

LocalCluster::~LocalCluster() { StopAll(); }

absl::StatusOr<std::string> ScrapeMetrics(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(absl::StrCat("not host:port: ", address));
  }
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("not an IPv4 address: ", address));
  }
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::UnavailableError("socket");
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("no /metrics at ", address));
  }
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: moesh\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("writing to ", address));
  }
  std::string body;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) body.append(buf, n);
  close(fd);
  return body;
}

double MetricValue(absl::string_view text, absl::string_view series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    double v;
    if (absl::StartsWith(line, series) && absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v))
      return v;
  }
  return -1;
}

double MetricSum(absl::string_view text, absl::string_view prefix) {
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    double v;
    if (absl::StartsWith(line, prefix) && absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v))
      sum += v;
  }
  return sum;
}

}  // namespace moesh
