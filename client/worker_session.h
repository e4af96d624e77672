// The worker protocol: a training process's membership in a job, in C++ for C++ workers
// and for the Python SDK's `Worker` (a thin wrapper over this class).
//
//   WorkerOptions options;
//   options.master = "HOST:PORT";
//   options.job = "ctr-day-1";
//   auto session = WorkerSession::Start(options).value();   // RegisterWorker
//   JobSpec job;
//   job.files = {{"day-1.tsv", 45'000'000}};
//   job.records_per_task = 100'000;
//   session->CreateJob(job);
//   std::shared_ptr<PsClient> ps = session->Client().value();  // pushes as this worker
//   for (;;) {
//     auto next = session->NextTask();                      // waits through WAIT
//     if (!next.ok() || next->state != TaskState::kTask) break;   // DONE, or stopped
//     TaskReport report;
//     report.ok = Train(next->task, *ps).ok();
//     auto outcome = session->ReportTask(next->task, report);
//     if (outcome.ok() && outcome->lost) { /* discard: the task went to someone else */ }
//   }
//   session->Leave();                                       // also done by the destructor
//
// Membership: Start registers (worker_id 0: the master assigns a new id; a given id: a new
// incarnation of it, e.g. a restarted process). A heartbeat thread renews the lease every
// lease/3. When the master says the lease was lost (the worker stalled, or the master
// expired it: its tasks were re-queued), the session registers again under the same id
// (a new incarnation), logs it, and gives the new identity to its PsClient
// (PsClient::SetIdentity), so pushes carry it. Results of tasks held before are refused
// (ReportOutcome::lost) and must be discarded. A session superseded by another process
// registering the same id does not register again (that would take the id back): its
// calls fail with FAILED_PRECONDITION and superseded() turns true.
//
// Master calls retry under the one retry policy (common/rpc/retry_policy.h, with
// WorkerOptions::client's deadline_ms, max_attempts and backoffs), with the same request:
// each call the worker makes is idempotent or de-duplicated by the master. Channels use
// WorkerOptions::client.security (TLS, token), read once at Start.
//
// Thread-safe: every method may be called from any thread (NextTask and a heartbeat run
// concurrently, RequestStop from another thread); blocking calls hold no lock while they
// wait on the network.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/ps_client.h"
#include "proto/master.pb.h"

namespace ps {

struct WorkerOptions {
  // The master (host:port); required.
  std::string master;
  // The job this worker creates (CreateJob) and trains (GetTask, ReportTask).
  std::string job;
  // 0: the master assigns a new id. Otherwise that id registers again (a restarted
  // worker keeping its identity): incarnation + 1, and the master re-queues the tasks the
  // previous incarnation held.
  uint64_t worker_id = 0;
  // Run the heartbeat thread. Off only to test a worker that stalls.
  bool heartbeat = true;
  // NextTask's wait between two WAIT answers: short enough to pick up a task soon after
  // an epoch barrier opens, long enough not to load the master (one call per worker).
  int poll_interval_ms = 200;
  // Master calls: deadline_ms, max_attempts, initial/max_backoff_ms and security. The
  // PsClient that Client() makes: all of it, with `master` set to this master and the
  // push identity to the session's (worker_id, incarnation are overwritten).
  ClientOptions client;
};

// A data file of a job: its path (as the workers read it) and how many records it has.
struct DataFileSpec {
  std::string path;
  uint64_t records = 0;
};

// A job (CreateJobRequest): training passes over `files`, cut into tasks of
// records_per_task, each epoch followed by an evaluation over `eval_files` (if any).
struct JobSpec {
  std::vector<DataFileSpec> files;
  uint32_t epochs = 1;
  uint64_t records_per_task = 1000;
  std::vector<DataFileSpec> eval_files;
};

// Records [first_record, end_record) of `file`, to train on or evaluate.
struct WorkerTask {
  std::string job;
  uint64_t task_id = 0;  // unique within the job
  std::string file;
  uint64_t first_record = 0;
  uint64_t end_record = 0;
  bool eval = false;     // an evaluation task (else training)
  uint32_t epoch = 0;    // 0-based
  uint32_t attempt = 0;  // 1 on the first hand-out
  // The session's incarnation when the task was handed out; its report carries it.
  uint64_t incarnation = 0;

  uint64_t records() const { return end_record - first_record; }
};

enum class TaskState {
  kTask,     // `task` is this worker's until reported or its lease is lost
  kWait,     // nothing to hand out now (others' tasks in flight, an epoch barrier)
  kDone,     // the job is finished
  kStopped,  // NextTask only: RequestStop was called
};

struct TaskAnswer {
  TaskState state = TaskState::kWait;
  WorkerTask task;  // when state == kTask
};

// What a task's report says.
struct TaskReport {
  bool ok = true;
  // Records processed (counted into the job's progress when ok); -1: the task's count.
  int64_t records = -1;
  // Why it failed, when !ok (the first 4000 bytes are kept); the master hands the task out
  // again, up to its --max_task_failures.
  std::string error;
  // Pushes the task made per table, summed into the tables' versions (model progress).
  std::map<std::string, uint64_t> table_pushes;
};

struct ReportOutcome {
  bool job_done = false;
  // An earlier attempt of this report was accepted already (a retry); nothing changed.
  bool duplicate = false;
  // The master no longer counts this worker as the task's holder (its lease was lost and
  // the task re-queued, or the worker registered again): nothing was counted; discard the
  // task's result. `lost_reason` is the master's message.
  bool lost = false;
  std::string lost_reason;
};

class WorkerSession {
 public:
  // Checks the options, reads the TLS files, registers with the master (retried under the
  // policy) and starts the heartbeat thread. INVALID_ARGUMENT for bad options; the
  // master's error (after retries) if it cannot register.
  static absl::StatusOr<std::unique_ptr<WorkerSession>> Start(const WorkerOptions& options);
  // Leave(), then stops the heartbeat thread. Must not run on a PsClient completion thread.
  virtual ~WorkerSession() = default;

  // The current identity (both change when the session registers again).
  virtual uint64_t worker_id() const = 0;
  virtual uint64_t incarnation() const = 0;
  virtual int64_t lease_ms() const = 0;
  // Registrations after the first (lost leases), counted once each is complete: the new
  // identity is the session's and its PsClient's.
  virtual uint64_t reregistrations() const = 0;
  // True once the master said another process holds this worker id now.
  virtual bool superseded() const = 0;

  // Creates options.job (idempotent for an identical definition; ALREADY_EXISTS for
  // another). Returns the job's task count.
  virtual absl::StatusOr<uint64_t> CreateJob(const JobSpec& job) = 0;

  // One GetTask: kTask, kWait or kDone. A lost lease makes the session register again
  // and answers kWait (ask again). FAILED_PRECONDITION once superseded or after Leave.
  virtual absl::StatusOr<TaskAnswer> GetTask() = 0;
  // GetTask until it answers kTask or kDone, waiting poll_interval_ms after each kWait;
  // kStopped as soon as RequestStop was called (at once if it was before).
  virtual absl::StatusOr<TaskAnswer> NextTask() = 0;

  // Reports `task` (as GetTask handed it out), retried with the same request. A refusal
  // because the task is no longer this worker's is not an error: ReportOutcome::lost. A
  // failed report (!ok) whose earlier attempt was accepted reads as duplicate. Other
  // errors: NOT_FOUND (unknown job or task), the master's errors after retries.
  virtual absl::StatusOr<ReportOutcome> ReportTask(const WorkerTask& task,
                                                   const TaskReport& report) = 0;

  // Leaves the job for good: stops heartbeating, tells the master (LeaveWorker: the
  // tasks still held go back to the queue without counting a failure) and drops the
  // session's reference to its PsClient. Idempotent: later calls return the first call's
  // result (the number of tasks re-queued, or its error).
  virtual absl::StatusOr<uint32_t> Leave() = 0;

  // The master's StatusResponse (pods, workers, jobs, progress).
  virtual absl::StatusOr<StatusResponse> Status() = 0;

  // Graceful preemption (SIGTERM): NextTask answers kStopped from now on; the caller
  // finishes and reports its current task, then calls Leave. Not async-signal-safe: call
  // it from a thread that waits for the signal (common/base/shutdown_signal.h does).
  virtual void RequestStop() = 0;
  virtual bool stopping() const = 0;

  // A PsClient through the same master whose pushes carry this worker's identity, made
  // on the first call (PsClient::Connect with options.client) and shared afterwards;
  // re-registrations update its identity. FAILED_PRECONDITION after Leave.
  virtual absl::StatusOr<std::shared_ptr<PsClient>> Client() = 0;
  // Uses `client` as the session's client instead (it gets the session's identity now
  // and at every re-registration). FAILED_PRECONDITION after Leave.
  virtual absl::Status AttachClient(std::shared_ptr<PsClient> client) = 0;

  // Tests: no heartbeat is sent for `ms` milliseconds from now (a stalled process).
  virtual void PauseHeartbeatsForTest(int ms) = 0;
};

}  // namespace ps
