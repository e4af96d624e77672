#include "tests/process.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace ps {
namespace integration {
namespace {

// Only async-signal-safe calls between fork and exec: the parent has gRPC threads.
[[noreturn]] void ExecChild(pid_t parent, int log_fd, int report_fd, const char* path,
                            char* const* argv) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the parent died before prctl took effect
  // Signal state is inherited across exec: start from defaults.
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  for (int sig : {SIGTERM, SIGINT, SIGPIPE, SIGHUP}) sigaction(sig, &dfl, nullptr);
  int null_fd = open("/dev/null", O_RDONLY);
  if (null_fd >= 0) dup2(null_fd, 0);
  dup2(log_fd, 1);
  dup2(log_fd, 2);
  // Keep the exec report pipe (close-on-exec) above the others and close everything else
  // the test process has open (sockets, files).
  if (report_fd != 3) {
    dup3(report_fd, 3, O_CLOEXEC);
    report_fd = 3;
  }
  syscall(SYS_close_range, 4u, ~0u, 0u);
  execv(path, argv);
  const int err = errno;
  ssize_t ignored = write(report_fd, &err, sizeof(err));
  (void)ignored;
  _exit(127);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::vector<std::string>& argv, const std::string& log_path) {
  if (argv.empty()) return absl::InvalidArgumentError("no program given");
  // Everything the child needs is built before fork.
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::InternalError(absl::StrCat("open ", log_path, ": ", std::strerror(errno)));
  }
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) {
    const int err = errno;
    close(log_fd);
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(err)));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) ExecChild(parent, log_fd, report[1], args[0], args.data());
  const int fork_errno = errno;
  close(log_fd);
  close(report[1]);
  if (pid < 0) {
    close(report[0]);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(fork_errno)));
  }
  auto child = std::unique_ptr<ChildProcess>(new ChildProcess(pid, log_path));
  // EOF: exec succeeded (the pipe closed on exec). Otherwise the child sent exec's errno.
  int exec_errno = 0;
  ssize_t n;
  do {
    n = read(report[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  close(report[0]);
  if (n > 0) {
    child->WaitExit(absl::Seconds(5));
    return absl::FailedPreconditionError(
        absl::StrCat("cannot execute ", argv[0], ": ", std::strerror(exec_errno)));
  }
  return child;
}

ChildProcess::~ChildProcess() { Stop(); }

bool ChildProcess::Running() {
  if (reaped_) return false;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_ || (r < 0 && errno == ECHILD)) {
    reaped_ = true;
    wait_status_ = status;
    return false;
  }
  return true;
}

bool ChildProcess::WaitExit(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (Running()) {
    if (absl::Now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

void ChildProcess::Signal(int sig) {
  // Unreaped, the pid is ours (a zombie at worst) and cannot name another process.
  if (!reaped_) kill(pid_, sig);
}

void ChildProcess::Stop(absl::Duration grace) {
  if (!Running()) return;
  Signal(SIGTERM);
  if (WaitExit(grace)) return;
  Kill();
}

void ChildProcess::Kill() {
  Signal(SIGKILL);
  while (!reaped_) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, 0);
    if (r == pid_ || (r < 0 && errno != EINTR)) {
      reaped_ = true;
      wait_status_ = status;
    }
  }
}

std::string ChildProcess::Describe() {
  if (Running()) return absl::StrCat("pid ", pid_, " running");
  if (WIFEXITED(wait_status_)) {
    return absl::StrCat("pid ", pid_, " exited with code ", WEXITSTATUS(wait_status_));
  }
  if (WIFSIGNALED(wait_status_)) {
    return absl::StrCat("pid ", pid_, " killed by signal ", WTERMSIG(wait_status_));
  }
  return absl::StrCat("pid ", pid_, " ended with wait status ", wait_status_);
}

std::string FileTail(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string all = buffer.str();
  if (all.size() > max_bytes) all = "..." + all.substr(all.size() - max_bytes);
  return all;
}

absl::StatusOr<int> WaitForPortFile(const std::string& path, ChildProcess& child,
                                    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    std::ifstream in(path);
    std::string text;
    int port = 0;
    if (in && std::getline(in, text) && absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &port) &&
        port > 0) {
      return port;
    }
    if (!child.Running()) {
      return absl::UnavailableError(absl::StrCat("server ", child.Describe(), " before writing ",
                                                 path, "; its log:\n", FileTail(child.log_path())));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("server pid ", child.pid(), " wrote no port to ", path, " within ",
                       absl::FormatDuration(timeout), "; its log:\n", FileTail(child.log_path())));
    }
    // Short: the restart test races the client's retries against this wait.
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

absl::StatusOr<int> StartServerProcess(std::vector<std::string> argv, int port,
                                       const std::string& port_file, const std::string& log_path,
                                       absl::Duration timeout,
                                       std::unique_ptr<ChildProcess>* child) {
  std::remove(port_file.c_str());
  argv.push_back("--host=127.0.0.1");
  argv.push_back(absl::StrCat("--port=", port));
  argv.push_back("--port_file=" + port_file);
  auto started = ChildProcess::Start(argv, log_path);
  if (!started.ok()) return started.status();
  *child = *std::move(started);
  return WaitForPortFile(port_file, **child, timeout);
}

TempDir::TempDir(const std::string& prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string templ =
      absl::StrCat(base != nullptr && *base != '\0' ? base : "/tmp", "/", prefix, "XXXXXX");
  if (mkdtemp(templ.data()) != nullptr) path_ = templ;
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace integration
}  // namespace ps
