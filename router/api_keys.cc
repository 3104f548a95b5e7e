#include "router/api_keys.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/file_util.h"
#include "common/metrics/civetweb_stop.h"

namespace moesh {
namespace {

// Equal bytes, in time that depends on the lengths only (a timing side channel
// must not reveal how much of a key a guess got right).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// One "host:port" (or bare port) binds the loopback only.
bool IsLoopbackAddress(absl::string_view listen) {
  if (listen.find(':') == absl::string_view::npos) return false;  // a bare port: every interface
  const std::string host = ListenHost(std::string(listen));
  if (absl::EqualsIgnoreCase(host, "localhost")) return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

}  // namespace

bool IsLoopbackListen(absl::string_view listen) {
  for (absl::string_view one : absl::StrSplit(listen, ',')) {
    if (!IsLoopbackAddress(absl::StripAsciiWhitespace(one))) return false;
  }
  return true;
}

std::string MissingApiKeysWarning(
    const ApiKeys* keys, const std::vector<std::pair<std::string, std::string>>& listeners) {
  if (keys != nullptr) return "";
  std::vector<std::string> exposed;
  for (const auto& [flag, address] : listeners) {
    if (!address.empty() && !IsLoopbackListen(address)) exposed.push_back(flag + " " + address);
  }
  if (exposed.empty()) return "";
  return absl::StrCat("WARNING: no API keys (--api_keys_file) and ", absl::StrJoin(exposed, ", "),
                      " bind", exposed.size() == 1 ? "s" : "",
                      " beyond the loopback: anyone who reaches ",
                      exposed.size() == 1 ? "it" : "them", " may generate");
}

absl::StatusOr<std::unique_ptr<ApiKeys>> ApiKeys::Load(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::NotFoundError(
        absl::StrCat("--api_keys_file ", path, ": ", text.status().message()));
  }
  std::vector<std::string> keys;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    keys.emplace_back(line);
  }
  if (keys.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--api_keys_file ", path, " holds no key"));
  }
  return std::make_unique<ApiKeys>(std::move(keys));
}

absl::Status ApiKeys::Check(absl::string_view authorization) const {
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "no API key: send the header 'Authorization: Bearer <key>' (gRPC: the metadata "
        "'authorization')");
  }
  constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWithIgnoreCase(authorization, kBearer)) {
    return absl::UnauthenticatedError("the authorization is not 'Bearer <key>'");
  }
  const absl::string_view key = absl::StripAsciiWhitespace(authorization.substr(kBearer.size()));
  bool found = false;
  for (const std::string& k : keys_) found |= ConstantTimeEquals(key, k);
  if (!found) return absl::UnauthenticatedError("the API key is not valid");
  return absl::OkStatus();
}

}  // namespace moesh
