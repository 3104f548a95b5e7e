#include "cli/local_certs.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_util.h"
#include "base/status.h"

extern char** environ;

namespace moesh {
namespace {

// Runs `argv` (argv[0] found on PATH) with its output appended to `log`.
absl::Status RunTool(const std::vector<std::string>& argv, const std::string& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) {
    return absl::UnavailableError(absl::StrCat("cannot run ", argv[0], " (", strerror(err), ")"));
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::UnavailableError(
        absl::StrCat("`", absl::StrJoin(argv, " "), "` failed; its output is in ", log));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TlsFiles> MakeLocalCertificates(const std::string& dir) {
  mkdir(dir.c_str(), 0700);
  const std::string log = JoinPath(dir, "openssl.log");
  const std::string ca_key = JoinPath(dir, "ca.key"), csr = JoinPath(dir, "tls.csr");
  const std::string ext = JoinPath(dir, "tls.ext");
  TlsFiles files{JoinPath(dir, "tls.crt"), JoinPath(dir, "tls.key"), JoinPath(dir, "ca.crt")};
  {
    std::ofstream out(ext);
    out << "subjectAltName=DNS:" << kInternalTlsServerName
        << ",DNS:localhost,IP:127.0.0.1,IP:::1\n"
           "extendedKeyUsage=serverAuth,clientAuth\n"
           "basicConstraints=CA:FALSE\n";
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", ext));
  }
  const std::vector<std::string> ec = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                                       "-nodes"};
  std::vector<std::string> ca = {"openssl", "req", "-x509"};
  ca.insert(ca.end(), ec.begin(), ec.end());
  ca.insert(ca.end(),
            {"-days", "7", "-subj", "/CN=moesh-local-ca", "-keyout", ca_key, "-out", files.ca});
  RETURN_IF_ERROR(RunTool(ca, log));
  std::vector<std::string> req = {"openssl", "req", "-new"};
  req.insert(req.end(), ec.begin(), ec.end());
  req.insert(req.end(), {"-subj", absl::StrCat("/CN=", kInternalTlsServerName), "-keyout",
                         files.key, "-out", csr});
  RETURN_IF_ERROR(RunTool(req, log));
  RETURN_IF_ERROR(RunTool({"openssl", "x509", "-req", "-in", csr, "-CA", files.ca, "-CAkey", ca_key,
                           "-CAcreateserial", "-days", "7", "-extfile", ext, "-out", files.cert},
                          log));
  return files;
}

}  // namespace moesh
