#include "common/service/worker_util.h"

#include <csignal>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file_util.h"

namespace moesh {

absl::StatusOr<std::set<int>> ParseExpertList(const std::string& spec, int num_experts) {
  std::set<int> out;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    std::vector<absl::string_view> ends = absl::StrSplit(part, '-');
    int lo, hi;
    if (ends.size() > 2 || !absl::SimpleAtoi(ends[0], &lo) || !absl::SimpleAtoi(ends.back(), &hi) ||
        lo > hi) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad expert range \"", part, "\" (e.g. 0-3,6)"));
    }
    if (lo < 0 || hi >= num_experts) {
      return absl::InvalidArgumentError(
          absl::StrCat("expert range \"", part, "\" outside [0, ", num_experts, ")"));
    }
    for (int e = lo; e <= hi; ++e) out.insert(e);
  }
  if (out.empty()) return absl::InvalidArgumentError("empty expert list");
  return out;
}

absl::StatusOr<std::set<int>> ExpertShard(const std::string& spec, int num_experts) {
  std::vector<absl::string_view> parts = absl::StrSplit(spec, '/');
  int i, n;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &i) || !absl::SimpleAtoi(parts[1], &n) ||
      n <= 0 || i < 0 || i >= n || n > num_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad shard \"", spec, "\" (i/n with 0 <= i < n <= ", num_experts, ")"));
  }
  std::set<int> out;
  for (int e = i * num_experts / n; e < (i + 1) * num_experts / n; ++e) out.insert(e);
  return out;
}

absl::Status WriteReadyFile(const std::string& path, const std::string& address,
                            const std::string& metrics_address, const std::string& internal_address,
                            const std::string& http_address) {
  const std::string tmp = path + ".tmp";
  std::string text = address + "\n" + metrics_address + "\n";
  if (!internal_address.empty() || !http_address.empty()) text += internal_address + "\n";
  if (!http_address.empty()) text += http_address + "\n";
  if (absl::Status s = WriteStringToFile(tmp, text); !s.ok()) return s;
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return absl::InternalError(absl::StrCat("cannot rename ", tmp));
  return absl::OkStatus();
}

namespace {

sigset_t ShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

void BlockShutdownSignals() {
  const sigset_t set = ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void WaitForShutdownSignal() {
  const sigset_t set = ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  int sig = 0;
  sigwait(&set, &sig);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

}  // namespace moesh
