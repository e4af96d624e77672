// The fixture of the multi-process tests that run ps-master and ps-server pods as child
// processes on loopback (migration_test, rereplication_test, observability_test): a run
// directory, the processes by name (each started again under its name replaces the old one, kept
// until then so that a failed test shows its log), the master's address and stub, and its shard
// map. TearDown stops every process it started (by pid) and, after a failure, prints the
// end of each one's log.
//
// Not thread-safe: start and stop processes from the test's main thread (children get
// PR_SET_PDEATHSIG, which fires when the thread that forked them exits).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "proto/master.grpc.pb.h"
#include "tests/process.h"

namespace ps::integration {

// `built` (a binary's path from the build), or the environment variable `env` when set.
std::string BinaryPath(const char* env, const char* built);

class ClusterProcessTest : public testing::Test {
 protected:
  // `name` prefixes the run directory; the binaries are those the test runs.
  ClusterProcessTest(const std::string& name, std::string master_binary, std::string server_binary)
      : tmp_(name),
        master_binary_(std::move(master_binary)),
        server_binary_(std::move(server_binary)) {}

  void SetUp() override;
  void TearDown() override;

  // <run dir>/<name>.
  std::string Path(const std::string& name) const;

  // Starts `argv` as process `name` (replacing one of that name) on loopback at `port` (0:
  // any free one), output in <name>.log; waits up to a minute for its port file and
  // returns the port.
  absl::StatusOr<int> StartServer(const std::string& name, std::vector<std::string> argv,
                                  int port = 0);
  // ps-master on data dir "master-db" with `flags` (later flags win), at `port` (0: any);
  // sets master_address_, master_port_ and master_.
  absl::Status StartMaster(const std::vector<std::string>& flags, int port = 0);
  // Pod ps-<i> of that master: data dir "ps-<i>-data", process durability, then `flags`
  // (later flags win). Returns its port.
  absl::StatusOr<int> StartPod(int i, const std::vector<std::string>& flags, int port = 0);
  // The flags that make process `name` serve metrics on a free port and write it to
  // <run dir>/<name>.mport (ps-master and ps-server); MetricsPort waits up to a minute for
  // that file and returns the port.
  std::vector<std::string> MetricsFlags(const std::string& name) const;
  absl::StatusOr<int> MetricsPort(const std::string& name);
  // SIGKILLs process `name` (kept, so that its log is shown if the test fails).
  void Kill(const std::string& name);

  // The master's shard map (a failed call fails the test and gives an empty map).
  ShardMapResponse Map();
  // The state of pod `pod` in the master's map (UNKNOWN if it is not there).
  PodInfo::State StateOf(const std::string& pod);

  TempDir tmp_;
  std::map<std::string, std::unique_ptr<ChildProcess>> children_;
  std::string master_address_;
  int master_port_ = 0;
  std::unique_ptr<Master::Stub> master_;

 private:
  const std::string master_binary_, server_binary_;
};

}  // namespace ps::integration
