// The master's state machine, independent of the transport: PS pod membership and the
// shard map, the table catalog, worker membership and the task dispatcher. Every state
// change is written to the MasterStore (synced) before the call returns OK, and applied in
// memory only after that write succeeded, so memory never runs ahead of disk. Open() on the
// same data dir resumes where the last process stopped. The gRPC service
// (master_service.h) is a thin adapter over it.
//
// Leases live in memory: after a restart every known LIVE pod and worker gets a fresh lease
// (a grace period) from the time of Open().
//
// Dispatch rules (documented in docs/architecture.md):
// - A job's tasks are cut at creation: per epoch, its training files in order, cut into
//   ranges of records_per_task; then that epoch's evaluation files likewise. They are handed
//   out in that order, in phases: the evaluation tasks of epoch e only once every training
//   task of epoch e is finished (done or failed), and the training tasks of epoch e+1 only
//   after those. A worker asking meanwhile gets WAIT.
// - A task re-queued (failed report, holder's lease lost, holder re-registered) goes back to
//   the front of the queue and keeps its attempt count. Each of those counts as a failure;
//   at --max_task_failures the task is FAILED: listed in status and in the job's result.
//   A worker that leaves (LeaveWorker) re-queues its tasks without a failure.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "master/master_store.h"
#include "master/pod_control.h"
#include "proto/master.pb.h"
#include "proto/master_state.pb.h"

namespace ps {

struct MasterOptions {
  std::string data_dir;  // RocksDB directory; required
  // Virtual shards in the cluster: a power of two in [1, 65536], fixed for the data dir.
  // 256 spreads load evenly over up to ~64 pods while keeping the map small.
  uint32_t num_vshards = 256;
  // Expected PS pods: vshards start assigned to ps-0 .. ps-(num_ps-1) in contiguous ranges
  // (StaticOwner), as `ps-server --shard=i/num_ps` would own them. Fixed for the data dir.
  uint32_t num_ps = 1;
  // Pods and workers that do not heartbeat for this long are LOST. 10 s rides out a GC
  // pause or a brief network blip yet re-queues a dead worker's task quickly.
  absl::Duration lease = absl::Seconds(10);
  // A task failing this many times (failed reports plus lost holders) becomes FAILED.
  uint32_t max_task_failures = 3;
  // Most tasks one job may have (all epochs): bounds creation time and the master's memory.
  uint64_t max_tasks_per_job = 10'000'000;
  // Time source; null means absl::Now. Tests inject a fake clock.
  std::function<absl::Time()> clock;
  // How moves reach the pods; null: gRPC (NewGrpcPodControl). Tests inject a fake.
  std::shared_ptr<PodControl> pod_control;
  // Vshards copied by one move. A move fences its vshards once at the end, so a small
  // batch keeps each fence short while amortizing the per-move round trips.
  uint32_t vshards_per_move = 4;
  // A move's catch-up rounds stop (and its fence starts) at this many changed rows.
  uint32_t fence_rows = 2000;
  // Rebalance by itself (on a background thread) when a new pod registers: a pod id not
  // seen before, or a drained one back at a new address.
  bool auto_rebalance = false;
  // Where cluster checkpoints go (ckpt-<id> below it, on each pod's filesystem and the
  // master's); empty: Checkpoint is refused.
  std::string checkpoint_dir;
};

class MasterCore {
 public:
  // Opens the store in options.data_dir and loads the state. INVALID_ARGUMENT for bad
  // options (e.g. num_vshards not a power of two), FAILED_PRECONDITION when the data dir
  // was created with another num_vshards/num_ps, store errors as they come.
  static absl::StatusOr<std::unique_ptr<MasterCore>> Open(const MasterOptions& options);
  // Stops the auto-rebalance thread (waiting for a rebalance it runs).
  ~MasterCore();

  // The RPCs of proto/master.proto. Each returns OK or the most specific error (see the
  // proto's header comment); on error nothing changed. Thread-safe.
  absl::Status RegisterPod(const RegisterPodRequest& req, RegisterPodResponse* resp);
  absl::Status PodHeartbeat(const PodHeartbeatRequest& req, PodHeartbeatResponse* resp);
  absl::Status LeavePod(const LeavePodRequest& req, LeavePodResponse* resp);
  absl::Status GetShardMap(const GetShardMapRequest& req, ShardMapResponse* resp);
  absl::Status CreateTable(const CreateTableRequest& req, CreateTableResponse* resp);
  absl::Status CreateDense(const CreateDenseRequest& req, CreateDenseResponse* resp);
  absl::Status ListTables(const ListTablesRequest& req, ListTablesResponse* resp);
  absl::Status RegisterWorker(const RegisterWorkerRequest& req, RegisterWorkerResponse* resp);
  absl::Status WorkerHeartbeat(const WorkerHeartbeatRequest& req, WorkerHeartbeatResponse* resp);
  absl::Status LeaveWorker(const LeaveWorkerRequest& req, LeaveWorkerResponse* resp);
  absl::Status CreateJob(const CreateJobRequest& req, CreateJobResponse* resp);
  absl::Status GetTask(const GetTaskRequest& req, GetTaskResponse* resp);
  absl::Status ReportTask(const ReportTaskRequest& req, ReportTaskResponse* resp);
  absl::Status Status(const StatusRequest& req, StatusResponse* resp);
  absl::Status Drain(const DrainRequest& req, DrainResponse* resp);
  absl::Status Rebalance(const RebalanceRequest& req, RebalanceResponse* resp);
  absl::Status Checkpoint(const CheckpointRequest& req, CheckpointResponse* resp);

  // Marks pods and workers whose lease ran out as LOST and re-queues the lost workers'
  // tasks. Called periodically by the server's lease thread (and by tests). Thread-safe.
  absl::Status ExpireLeases();

  const MasterOptions& options() const { return options_; }

  // One move of `vshards` from pod `source` to pod `destination` (both live), start to
  // commit or abort (master_moves.cc). Drain and Rebalance are sequences of these; public
  // for tests. ABORTED while another move runs; the error of the failed step otherwise.
  absl::StatusOr<MoveInfo> MoveVShards(const std::string& source, const std::string& destination,
                                       const std::vector<uint32_t>& vshards);
  // Leases that ran out since Open (pods, workers); for metrics. Thread-safe.
  uint64_t pod_lease_losses() const { return pod_lease_losses_.load(); }
  uint64_t worker_lease_losses() const { return worker_lease_losses_.load(); }

 private:
  struct Pod {
    PodRecord record;
    absl::Time lease_deadline;
    bool lost_logged = false;
  };
  struct Worker {
    WorkerRecord record;
    absl::Time lease_deadline;
    std::set<std::pair<std::string, uint64_t>> doing;  // (job, task id) it holds
  };
  struct Job {
    JobRecord record;
    std::vector<Task> tasks;  // index = task id
    std::set<uint64_t> todo;  // ascending: phase order, re-queued tasks first
    std::vector<uint64_t> unfinished_per_phase;
    uint64_t unfinished = 0;
  };

  explicit MasterCore(const MasterOptions& options);
  absl::Status Load(const ClusterConfig& config) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Time Now() const { return options_.clock ? options_.clock() : absl::Now(); }

  void FillAssignment(const std::string& pod_id, PodAssignment* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pods named by the map or registered, in natural order (ps-2 before ps-10).
  std::vector<std::string> KnownPodIds() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PodInfo DescribePod(const std::string& pod_id, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker, if it is LIVE with this incarnation; else NOT_FOUND/FAILED_PRECONDITION.
  absl::StatusOr<Worker*> LiveWorker(uint64_t worker_id, uint64_t incarnation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds to `batch` the re-queue of every task `w` holds (a failure each when
  // `count_failure`, with `reason` as the error) and returns the updated tasks; Commit
  // applies them once the batch is written.
  std::vector<Task> RequeueHeld(const Worker& w, bool count_failure, const std::string& reason,
                                StoreBatch* batch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replaces a task's in-memory state with `t` (already persisted), keeping the job's
  // queue, phase counts and the holders' sets consistent.
  void ApplyTask(const Task& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t PhaseOf(const Job& job, const Task& t) const;
  static bool Finished(const Task& t) {
    return t.state() == Task::DONE || t.state() == Task::FAILED;
  }
  JobInfo DescribeJob(const Job& job) const;
  // Moves: the assignment a pod gets now, sent to it directly (best effort).
  void NotifyPod(const std::string& pod_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Aborts move `id` (the source keeps its vshards) and tells both pods.
  void AbortMove(uint64_t id, const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs planned moves one after another, recording progress in operation_.
  absl::StatusOr<uint32_t> RunMoves(
      const std::vector<std::tuple<std::string, std::string, std::vector<uint32_t>>>& plan)
      ABSL_LOCKS_EXCLUDED(mu_);
  uint32_t OwnedBy(const std::string& pod_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Live(const std::string& pod_id, absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const MasterOptions options_;
  const absl::Time started_;
  std::unique_ptr<MasterStore> store_;

  mutable absl::Mutex mu_;
  ClusterConfig config_ ABSL_GUARDED_BY(mu_);
  Counters counters_ ABSL_GUARDED_BY(mu_);
  ShardMapRecord map_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Pod> pods_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, TableSpec> tables_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, DenseSpec> dense_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Worker> workers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  // Moves being copied (at most one), and the last finished ones for status.
  std::map<uint64_t, MoveRecord> moves_ ABSL_GUARDED_BY(mu_);
  std::vector<MoveInfo> recent_moves_ ABSL_GUARDED_BY(mu_);
  OperationInfo operation_ ABSL_GUARDED_BY(mu_);
  uint64_t next_operation_ ABSL_GUARDED_BY(mu_) = 0;
  CheckpointInfo last_checkpoint_ ABSL_GUARDED_BY(mu_);
  absl::Mutex operation_mu_;  // held by the running Drain / Rebalance
  std::atomic<uint64_t> pod_lease_losses_{0}, worker_lease_losses_{0};
  // --auto_rebalance: a registration sets rebalance_wanted_; the thread runs Rebalance.
  void RunAutoRebalance();
  bool rebalance_wanted_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread auto_rebalance_;  // last: started after everything above exists
};

}  // namespace ps
