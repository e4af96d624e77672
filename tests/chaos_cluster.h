// ps-chaos's local cluster: ps-master, durable ps-server pods and test_worker `train`
// workers as child processes on loopback, each of which can be SIGKILLed and started again
// (tests/process.h does the process handling). Pods restart on their data dir at a new
// port (a new address: the master takes it once the old lease expires, and undrains a
// drained pod); the master restarts on its data dir at the port it first got, since pods
// and workers know it by address.
//
// Not thread-safe: call everything from the thread that made the cluster (children get
// PR_SET_PDEATHSIG, which fires when the thread that forked them exits). Destroying it
// stops every process it started.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/process.h"

namespace ps::chaos {

struct ClusterOptions {
  std::string dir;  // the run's directory: data dirs, logs, port files, journals
  std::string master_binary;
  std::string server_binary;
  std::string worker_binary;  // test_worker
  uint32_t pods = 3;
  uint32_t num_vshards = 64;
  std::string durability = "process";  // ps-server --durability
  // ps-master --lease_ms (pods and workers). Short, so that a pod restarted at a new
  // address is taken back soon; long enough for heartbeats (every lease/3) on a busy box.
  int lease_ms = 3000;
  // ps-master --max_task_failures. Every worker kill counts a failure against its task;
  // a chaos run kills on purpose, so a task must not fail for that.
  uint32_t max_task_failures = 1000;
  // ps-master --replication (copies of each vshard; 1: one, as before).
  uint32_t replication = 1;
  // More ps-server flags (e.g. --flush_ms for periodic durability).
  std::vector<std::string> server_flags;
  // More ps-master flags (e.g. --replication_max_lag_ms).
  std::vector<std::string> master_flags;
  // The wait for a started server's port (a pod replays its log first).
  absl::Duration start_timeout = absl::Seconds(120);
};

class Cluster {
 public:
  explicit Cluster(ClusterOptions options);
  ~Cluster();

  // Starts the master (first call: any free port; later: the same port, retried while the
  // old socket lingers).
  absl::Status StartMaster();
  void KillMaster();
  const std::string& master_address() const { return master_address_; }

  // Pod `i` (ps-i, data dir `dir`/ps-i) starts or restarts: at a new port, or with
  // `same_port` at the port it had (as a StatefulSet pod keeps its name), retried while
  // the killed process's socket lingers.
  absl::Status StartPod(uint32_t i, bool same_port = false);
  void KillPod(uint32_t i);
  // Sends `sig` to pod i (SIGSTOP / SIGCONT: a paused pod).
  void SignalPod(uint32_t i, int sig);
  // Deletes pod i's data dir (kill it first): its next start is a pod with a lost volume.
  void LosePodData(uint32_t i);
  std::string PodId(uint32_t i) const;
  // The data dirs the master and pod i start on (to restore a checkpoint into them).
  std::string MasterDataDir() const { return Path("master-data"); }
  std::string PodDataDir(uint32_t i) const { return Path(PodId(i) + "-data"); }

  // Starts a worker in `slot` (replacing a killed one) training `job`; worker_id 0 for a
  // new id, else a new incarnation of that id. Each process writes its own journal
  // (`dir`/worker-SLOT-N.journal).
  absl::Status StartWorker(uint32_t slot, uint64_t worker_id, const std::string& job,
                           int record_pause_ms);
  void KillWorker(uint32_t slot);
  // The id the worker in `slot` registered with (from its log); 0 if not registered yet.
  uint64_t WorkerId(uint32_t slot);
  // Waits up to `timeout` for the worker in `slot` to exit; its exit description.
  bool WaitWorker(uint32_t slot, absl::Duration timeout);
  std::string DescribeWorker(uint32_t slot);
  uint32_t workers() const { return static_cast<uint32_t>(workers_.size()); }

  // The end of every current process's log, for a failed run.
  std::string Logs();

 private:
  std::string Path(const std::string& name) const { return options_.dir + "/" + name; }

  const ClusterOptions options_;
  int master_port_ = 0;
  std::string master_address_;
  std::unique_ptr<integration::ChildProcess> master_;
  std::vector<std::unique_ptr<integration::ChildProcess>> pods_;
  std::vector<int> pod_ports_;
  std::vector<std::unique_ptr<integration::ChildProcess>> workers_;
  uint32_t processes_started_ = 0;
};

}  // namespace ps::chaos
