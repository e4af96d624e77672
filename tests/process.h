// Helpers for integration tests that run real binaries: a child process that is always
// stopped and reaped by its owner, a port-file wait, and a self-removing temporary directory.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ps {
namespace integration {

// A child process started with fork + execv. Destroying the object stops it (SIGTERM,
// then SIGKILL after a grace period) and reaps it, so a failing assertion never leaves a
// process behind. Signals go only to this pid, and only while it is unreaped (so the pid
// cannot have been reused). Not thread-safe.
//
// The child also gets PR_SET_PDEATHSIG = SIGKILL, which fires when the *thread* that
// forked it exits: start children from the test's main thread. It covers the test process
// being killed itself (e.g. by the ctest timeout).
class ChildProcess {
 public:
  // Runs argv[0] (a path, not searched in PATH) with argv, stdout and stderr appended to
  // `log_path`, no other inherited descriptors. Fails if the fork or the exec fails.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const std::vector<std::string>& argv,
                                                             const std::string& log_path);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }

  // Whether it is still running; reaps it if it has exited.
  bool Running();
  // Waits up to `timeout` for it to exit; true once it has exited and been reaped.
  bool WaitExit(absl::Duration timeout);
  // Sends `sig` unless already reaped.
  void Signal(int sig);
  // SIGTERM, up to `grace` for it to exit, then SIGKILL; reaps it. Idempotent.
  void Stop(absl::Duration grace = absl::Seconds(5));
  // SIGKILL and reap.
  void Kill();
  // "running", "exited with code N" or "killed by signal N".
  std::string Describe();

 private:
  ChildProcess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}

  pid_t pid_;
  std::string log_path_;
  bool reaped_ = false;
  int wait_status_ = 0;
};

// Polls `path` until it holds a port number (the writer must create it atomically, as
// ps-server --port_file does). Fails early, with the end of the child's log, if the child
// exits first, and after `timeout`.
absl::StatusOr<int> WaitForPortFile(const std::string& path, ChildProcess& child,
                                    absl::Duration timeout);

// Starts a server binary on loopback: `argv` plus --host=127.0.0.1 --port=`port` (0: the
// kernel picks one) --port_file=`port_file` (removed first), output appended to `log_path`;
// waits up to `timeout` for the port (WaitForPortFile) and returns it. The process is in
// *child from the start (also when the wait fails, so that the caller stops it).
absl::StatusOr<int> StartServerProcess(std::vector<std::string> argv, int port,
                                       const std::string& port_file, const std::string& log_path,
                                       absl::Duration timeout,
                                       std::unique_ptr<ChildProcess>* child);

// The last `max_bytes` of a file ("" if unreadable).
std::string FileTail(const std::string& path, size_t max_bytes = 4000);

// A fresh directory (mkdtemp under $TMPDIR or /tmp), removed with its contents on
// destruction. path() is empty if creation failed.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace integration
}  // namespace ps
