// JobDispatcher: the workers (registry, incarnations, leases) and the jobs they train, cut
// into tasks handed out one at a time. It owns the store keys `worker/<id>`, `job/<name>`
// and `task/<job>/<id>` (and, in `counters`, next_worker_id and table_versions).
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
//
// Every change is written to the store (synced) before memory changes; on error nothing
// changed. Worker leases live in memory only: Load gives every worker a fresh one.
//
// Thread-safety: every method is thread-safe, under one mutex of its own, so job creation
// and dispatch never hold up pod heartbeats or GetShardMap (Membership's lock). Lock order:
// this one, then CountersRecord's.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "master/counters_record.h"
#include "master/job.h"
#include "master/master_options.h"
#include "master/master_store.h"
#include "proto/master.pb.h"

namespace ps {

class JobDispatcher {
 public:
  // `options`, `store` and `counters` must outlive this. Call Load before anything else.
  JobDispatcher(const MasterOptions& options, MasterStore* store, CountersRecord* counters)
      : options_(options), store_(store), counters_(counters) {}

  // Reads workers (each LIVE one with a lease until `lease_deadline`), jobs and tasks, and
  // rebuilds the queues and who holds what. DATA_LOSS for a malformed or inconsistent
  // record; store errors as they come.
  absl::Status Load(absl::Time lease_deadline) ABSL_LOCKS_EXCLUDED(mu_);

  // The worker and job RPCs of proto/master.proto: OK or the most specific error, nothing
  // changed on error (job_dispatcher_workers.cc and job_dispatcher.cc).
  absl::Status RegisterWorker(const RegisterWorkerRequest& req, RegisterWorkerResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status WorkerHeartbeat(const WorkerHeartbeatRequest& req, WorkerHeartbeatResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status LeaveWorker(const LeaveWorkerRequest& req, LeaveWorkerResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CreateJob(const CreateJobRequest& req, CreateJobResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status GetTask(const GetTaskRequest& req, GetTaskResponse* resp) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ReportTask(const ReportTaskRequest& req, ReportTaskResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Marks the LIVE workers whose lease ran out by `now` as LOST and re-queues their tasks
  // (a failure each). Stops at and returns the first store error.
  absl::Status ExpireLeases(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // Fills the status's workers (leases as of `now`), jobs, failed and held tasks, tasks
  // done and records trained.
  void Describe(absl::Time now, StatusResponse* resp) const ABSL_LOCKS_EXCLUDED(mu_);

  size_t worker_count() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t job_count() const ABSL_LOCKS_EXCLUDED(mu_);
  // Leases that ran out since Load. Thread-safe.
  uint64_t lease_losses() const { return lease_losses_.load(); }

 private:
  struct Worker {
    WorkerRecord record;
    absl::Time lease_deadline;
    std::set<std::pair<std::string, uint64_t>> doing;  // (job, task id) it holds
  };

  absl::Time Now() const { return CurrentTime(options_); }
  // The worker, if it is LIVE with this incarnation; else NOT_FOUND/FAILED_PRECONDITION.
  absl::StatusOr<Worker*> LiveWorker(uint64_t worker_id, uint64_t incarnation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds to `batch` the re-queue of every task `w` holds (a failure each when
  // `count_failure`, with `reason` as the error) and returns the updated tasks; ApplyTask
  // applies them once the batch is written.
  std::vector<Task> RequeueHeld(const Worker& w, bool count_failure, const std::string& reason,
                                StoreBatch* batch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replaces a task's in-memory state with `t` (already persisted), keeping the job's
  // queue, phase counts and the holders' sets consistent.
  void ApplyTask(const Task& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const MasterOptions& options_;
  MasterStore* const store_;
  CountersRecord* const counters_;

  mutable absl::Mutex mu_ ABSL_ACQUIRED_BEFORE(counters_->write_mutex());
  std::map<uint64_t, Worker> workers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> lease_losses_{0};
};

}  // namespace ps
