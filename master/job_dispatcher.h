// JobDispatcher: the workers (registry, incarnations, leases) and the jobs they train, cut
// into tasks handed out one at a time. It owns the store keys `worker/<id>`, `job/<name>`
// and `task/<job>/<id>` (and, in `counters`, next_worker_id, table_versions and the
// retired_* totals).
//
// Dispatch rules (documented in docs/architecture.md):
// - A job's tasks are cut at creation: per epoch, its training files in order, cut into
//   ranges of records_per_task; then that epoch's evaluation files likewise. They are handed
//   out in that order, in phases: the evaluation tasks of epoch e only once every training
//   task of epoch e is finished (done or failed), and the training tasks of epoch e+1 only
//   after those. A worker asking meanwhile gets WAIT.
// - Creation is bounded (ValidateJobSpec in job.h: at most options.max_tasks_per_job tasks,
//   every sum overflow-checked) and runs outside this part's lock: the request is checked,
//   its name reserved, the tasks cut and written with no lock held, then installed. So a
//   large job never holds up other workers' calls or status.
// - A worker (id and incarnation) works on one task at a time, and no task stays DOING for
//   a worker that is not working on it:
//   * GetTask is idempotent: a worker that holds a task of the job it asks for gets that
//     same task again (same id, same attempt; nothing written), so a retry after a lost
//     answer strands nothing.
//   * A worker that asks for a task of another job gave up what it held: those tasks are
//     re-queued, each counted as a failure.
//   * A worker that re-registers (a restarted process) or whose lease runs out: its tasks
//     are re-queued, each counted as a failure. One that leaves (LeaveWorker): re-queued
//     without a failure.
//   A re-queued task goes back to the front of the queue and keeps its attempt count. At
//   --max_task_failures failures a task is FAILED: listed in status and in the job's result.
// - Retention (EnforceRetention): a finished job is deleted, tasks and all, once it has been
//   finished for options.job_retention, and beyond the options.max_finished_jobs newest
//   finished ones; DeleteJob deletes one on request (a running one only with force). A
//   deletion first writes a tombstone (the job is gone from then on, and its tasks done and
//   records trained move into the counters' retired_* totals, so the global totals never go
//   back), then deletes the task records in bounded batches with no lock held, the tombstone
//   last; a master restarted midway finishes it. Workers that left or lost their lease are
//   forgotten options.worker_retention later.
// - RegisterWorker with a known id gives it incarnation + 1; with 0 or an id the master
//   does not know (never issued, or forgotten) a new id: pods would take an old id at
//   incarnation 1 for a stale writer, and caller-chosen ids could wrap next_worker_id.
//
// Every change is written to the store (synced) before memory changes; on error nothing
// changed. Worker leases live in memory only: Load gives every worker a fresh one.
//
// Thread-safety: every method is thread-safe, under one mutex of its own, so job creation
// and dispatch never hold up pod heartbeats or GetShardMap (Membership's lock). Work
// proportional to a job's size (cutting, writing or deleting its tasks) runs without it.
// Lock order: this one, then CountersRecord's.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
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

// Failed tasks listed per job in status (JobInfo.tasks_failed counts them all).
inline constexpr int kMaxListedFailedTasks = 100;

class JobDispatcher {
 public:
  // `options`, `store` and `counters` must outlive this. Call Load before anything else.
  JobDispatcher(const MasterOptions& options, MasterStore* store, CountersRecord* counters)
      : options_(options), store_(store), counters_(counters) {}

  // Reads workers (each LIVE one with a lease until `lease_deadline`), jobs and tasks, and
  // rebuilds the queues and who holds what; deletions left half done are resumed by the
  // next EnforceRetention. DATA_LOSS for a malformed or inconsistent record; store errors
  // as they come.
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
  // An admin RPC (job_dispatcher_retention.cc). Returns once the job is deleted; removing
  // its task records is finished by a later EnforceRetention if a write fails here.
  absl::Status DeleteJob(const DeleteJobRequest& req, DeleteJobResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Marks the LIVE workers whose lease ran out by `now` as LOST and re-queues their tasks
  // (a failure each). Stops at and returns the first store error.
  absl::Status ExpireLeases(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // Applies retention as of `now` (see above) and finishes deletions left half done.
  // Returns the first store error (what is left is retried by the next call).
  absl::Status EnforceRetention(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // Fills the status's workers (leases as of `now`), jobs, the tasks DOING, up to
  // kMaxListedFailedTasks failed tasks per job, tasks done and records trained, and the
  // retention settings. O(workers + jobs + tasks listed).
  void Describe(absl::Time now, StatusResponse* resp) const ABSL_LOCKS_EXCLUDED(mu_);

  size_t worker_count() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t job_count() const ABSL_LOCKS_EXCLUDED(mu_);
  // Leases that ran out since Load. Thread-safe.
  uint64_t lease_losses() const { return lease_losses_.load(); }

 private:
  using TaskRef = std::pair<std::string, uint64_t>;  // (job, task id)
  struct Worker {
    WorkerRecord record;
    absl::Time lease_deadline;
    absl::Time ended;         // when it became LEFT or LOST
    std::set<TaskRef> doing;  // tasks it holds
  };
  // A deleted job whose task records are being removed (its tombstone is stored).
  struct Removal {
    uint64_t num_tasks = 0;
    bool claimed = false;  // a call is removing them now (outside the lock)
  };
  using WriteFn = absl::FunctionRef<absl::Status(StoreBatch)>;

  absl::Time Now() const { return CurrentTime(options_); }
  // The worker, if it is LIVE with this incarnation; else NOT_FOUND/FAILED_PRECONDITION.
  absl::StatusOr<Worker*> LiveWorker(uint64_t worker_id, uint64_t incarnation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // NOT_FOUND for an unknown job, saying so when it was deleted.
  absl::Status UnknownJob(const std::string& name) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds to `batch` the re-queue of every task `w` holds except `keep` (a failure each
  // when `count_failure`, with `reason` as the error) and returns the updated tasks, for
  // CommitTasks.
  std::vector<Task> Requeue(const Worker& w, const TaskRef* keep, bool count_failure,
                            const std::string& reason, StoreBatch* batch) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `batch`, which holds the changed `tasks`, plus the records of the jobs these
  // changes finish (stamped finished now), through `write`; then applies it all in memory.
  // On error nothing changed.
  absl::Status CommitTasks(StoreBatch batch, const std::vector<Task>& tasks, WriteFn write)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CommitTasks(StoreBatch batch, const std::vector<Task>& tasks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replaces a task's in-memory state with `t` (already persisted), keeping the job's
  // queue, sets and counts and the holders' sets consistent.
  void ApplyTask(const Task& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes the jobs `names` (in jobs_): writes their tombstones and the retired totals,
  // then drops them from memory (and their tasks from their holders) and records their
  // removal as claimed by the caller, who then calls RemoveRecords for each.
  absl::Status Tombstone(const std::vector<std::string>& names) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes the task records of the claimed removal `name` in bounded batches, the tombstone
  // last, with no lock held; then forgets the removal (on error: unclaims it for a retry).
  absl::Status RemoveRecords(const std::string& name, uint64_t num_tasks) ABSL_LOCKS_EXCLUDED(mu_);
  // The LEFT/LOST workers that retention forgets as of `now`: their records deleted.
  absl::Status ForgetWorkers(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  const MasterOptions& options_;
  MasterStore* const store_;
  CountersRecord* const counters_;

  mutable absl::Mutex mu_ ABSL_ACQUIRED_BEFORE(counters_->write_mutex());
  std::map<uint64_t, Worker> workers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  // Names whose creation (cutting and writing, outside the lock) is under way.
  std::set<std::string> creating_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Removal> removing_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> lease_losses_{0};
};

}  // namespace ps
