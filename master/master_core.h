// The master's state machine, independent of the transport: a thin facade over its parts,
// each in its own files with its own lock and its own store keys:
//   Membership     PS pods, their leases, the vshard map with its epoch, the move in flight
//   Catalog        tables and dense tensors
//   JobDispatcher  workers, their leases, jobs and tasks (the dispatch and retention rules
//                  are there)
//   MoveRunner     one live vshard move, start to commit or abort; recent moves
//   Balancer       Drain and Rebalance (plans of moves), auto-rebalance
//   Checkpoints    cluster checkpoints
// and CountersRecord, the one stored record whose fields several parts own.
//
// Every state change is written to the MasterStore (synced) before the call returns OK, and
// applied in memory only after that write succeeded, so memory never runs ahead of disk.
// Open() on the same data dir resumes where the last process stopped: each part loads its
// own state. The gRPC service (master_service.h) is a thin adapter over this class.
//
// Leases live in memory: after a restart every known LIVE pod and worker gets a fresh lease
// (a grace period) from the time of Open().
//
// Locks, in order: a lock is only taken while holding locks listed above it, never below.
//   1. the operation lock: held across a Drain, Rebalance or Checkpoint (operation_lock.h);
//      taken with TryLock only.
//   2. MoveRunner's: held across aborting a move, and reading moves for status.
//   3. Membership's, Catalog's, JobDispatcher's: one part's at a time, never two together;
//      so pod heartbeats and GetShardMap (Membership) do not wait for the catalog's or the
//      dispatcher's work, nor the other way round. (Parts meet only at CountersRecord's
//      write lock: a move's start may wait there for another part's synced write of the
//      counters record.)
//   4. CountersRecord's write lock, then its value lock: the innermost.
// Balancer's and Checkpoints' own locks guard only what they show in status; nothing is
// taken under them. The ABSL_ACQUIRED_BEFORE annotations on the parts' mutexes say the same.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "master/balancer.h"
#include "master/catalog.h"
#include "master/checkpoints.h"
#include "master/counters_record.h"
#include "master/job_dispatcher.h"
#include "master/master_options.h"
#include "master/master_store.h"
#include "master/membership.h"
#include "master/move_runner.h"
#include "master/periodic.h"
#include "master/pod_control.h"
#include "master/rereplicator.h"
#include "proto/master.pb.h"
#include "proto/master_state.pb.h"

namespace ps {

class MasterCore {
 public:
  // Opens the store in options.data_dir and loads the state. INVALID_ARGUMENT for bad
  // options (e.g. num_vshards not a power of two), FAILED_PRECONDITION when the data dir
  // was created with another num_vshards, store errors as they come.
  static absl::StatusOr<std::unique_ptr<MasterCore>> Open(const MasterOptions& options);
  // Stops the retention and auto-rebalance threads (waiting for work they run).
  ~MasterCore() = default;

  // The RPCs of proto/master.proto. Each returns OK or the most specific error (see the
  // proto's header comment); on error nothing changed. Thread-safe. Status reads each
  // part in turn: each part's section is consistent in itself.
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
  absl::Status DeleteJob(const DeleteJobRequest& req, DeleteJobResponse* resp);

  // Marks pods and workers whose lease ran out as LOST and re-queues the lost workers'
  // tasks. Called periodically by the server's lease thread (and by tests). Thread-safe.
  absl::Status ExpireLeases();
  // Deletes the finished jobs and forgets the workers that retention no longer keeps
  // (job_dispatcher.h). Called every options.retention_interval by a thread of the core's
  // own (and by tests). Thread-safe.
  absl::Status EnforceRetention();

  const MasterOptions& options() const { return options_; }

  // One move of `vshards` from pod `source` to pod `destination` (both live), start to
  // commit or abort (move_runner.h). Drain and Rebalance are sequences of these; public
  // for tests. ABORTED while another move runs; the error of the failed step otherwise.
  absl::StatusOr<MoveInfo> MoveVShards(const std::string& source, const std::string& destination,
                                       const std::vector<uint32_t>& vshards);
  // One re-replication round now (rereplicator.h; its thread runs them at R >= 2); public
  // for tests. And its counts since Open, for metrics and status. Thread-safe.
  absl::Status Rereplicate() { return rereplicator_.RunOnce(); }
  Rereplicator::Stats rereplication_stats() const { return rereplicator_.stats(); }
  // Vshard copies taken out of ack sets for being beyond R (Rereplicator's trims) since
  // Open; for metrics. Thread-safe.
  uint64_t ack_set_removals_surplus() const { return membership_.ack_set_removals_surplus(); }
  // Leases that ran out since Open (pods, workers); for metrics. Thread-safe.
  uint64_t pod_lease_losses() const { return membership_.lease_losses(); }
  uint64_t worker_lease_losses() const { return jobs_.lease_losses(); }

 private:
  MasterCore(const MasterOptions& options, std::unique_ptr<MasterStore> store,
             const ClusterConfig& config);
  // Each part loads its own state, in this order: counters, membership (aborting a move
  // the previous master left in flight), catalog, jobs, recent moves, checkpoints.
  absl::Status Load();

  // Constant after construction; the parts keep pointers to these.
  const MasterOptions options_;
  const absl::Time started_;
  const std::unique_ptr<MasterStore> store_;
  absl::Mutex operation_mu_;  // see operation_lock.h

  // The parts, in dependency order (each only uses those above it).
  CountersRecord counters_;
  Membership membership_;
  Catalog catalog_;
  JobDispatcher jobs_;
  MoveRunner moves_;
  Checkpoints checkpoints_;
  Balancer balancer_;          // stops its thread while the parts above exist
  Rereplicator rereplicator_;  // likewise
  Periodic retention_;         // last: destroyed first, stopping its thread while the rest exists
};

}  // namespace ps
