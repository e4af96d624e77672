// WorkerSession: the task calls, over a WorkerMembership (client/worker_membership.h).
#include "client/worker_session.h"

#include <glog/logging.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "client/rpc_runner.h"
#include "client/worker_membership.h"
#include "common/base/status_macros.h"
#include "common/rpc/retry_policy.h"
#include "common/rpc/transport_security.h"
#include "proto/master.grpc.pb.h"

namespace ps {
namespace internal {
namespace {

// Most bytes of a failure's text a report carries.
constexpr size_t kMaxErrorBytes = 4000;

WorkerTask TaskOf(const Task& t, uint64_t incarnation) {
  WorkerTask task;
  task.job = t.job();
  task.task_id = t.task_id();
  task.file = t.file();
  task.first_record = t.first_record();
  task.end_record = t.end_record();
  task.eval = t.kind() == Task::EVAL;
  task.epoch = t.epoch();
  task.attempt = t.attempt();
  task.incarnation = incarnation;
  return task;
}

absl::Status CheckOptions(const WorkerOptions& o) {
  if (o.master.empty()) return absl::InvalidArgumentError("a worker needs the master's address");
  if (o.poll_interval_ms < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("poll_interval_ms must be >= 1 (got ", o.poll_interval_ms, ")"));
  }
  return RetryPolicy::Validate(RetryOptionsOf(o.client));
}

class WorkerSessionImpl final : public WorkerSession {
 public:
  WorkerSessionImpl(const WorkerOptions& options, const ChannelMaker& channels)
      : options_(options),
        policy_(RetryOptionsOf(options_.client)),
        master_(Master::NewStub(channels.Make(options_.master, MasterChannelArgs()))) {}

  ~WorkerSessionImpl() override {
    if (membership_ != nullptr) membership_->Leave().IgnoreError();  // logged there
  }

  absl::Status Init() {
    ASSIGN_OR_RETURN(membership_, WorkerMembership::Start(options_, master_.get(), &policy_));
    return absl::OkStatus();
  }

  uint64_t worker_id() const override { return membership_->identity().worker_id; }
  uint64_t incarnation() const override { return membership_->identity().incarnation; }
  int64_t lease_ms() const override { return membership_->lease_ms(); }
  uint64_t reregistrations() const override { return membership_->reregistrations(); }
  bool superseded() const override { return membership_->superseded(); }

  absl::StatusOr<uint64_t> CreateJob(const JobSpec& job) override {
    RETURN_IF_ERROR(NeedJob());
    CreateJobRequest req;
    req.set_name(options_.job);
    req.set_epochs(job.epochs);
    req.set_records_per_task(job.records_per_task);
    for (const DataFileSpec& f : job.files) {
      DataFile* d = req.add_files();
      d->set_path(f.path);
      d->set_records(f.records);
    }
    for (const DataFileSpec& f : job.eval_files) {
      DataFile* d = req.add_eval_files();
      d->set_path(f.path);
      d->set_records(f.records);
    }
    CreateJobResponse resp;
    RETURN_IF_ERROR(Call("CreateJob", [&](grpc::ClientContext* ctx) {
      return master_->CreateJob(ctx, req, &resp);
    }));
    return resp.num_tasks();
  }

  absl::StatusOr<TaskAnswer> GetTask() override {
    RETURN_IF_ERROR(NeedJob());
    if (membership_->left()) return absl::FailedPreconditionError("the worker left the job");
    const WorkerMembership::Identity id = membership_->identity();
    GetTaskRequest req;
    req.set_worker_id(id.worker_id);
    req.set_incarnation(id.incarnation);
    req.set_job(options_.job);
    GetTaskResponse resp;
    // Retried with the same request: the master hands a worker that already holds a task
    // of the job that same task again.
    absl::Status s = Call(
        "GetTask", [&](grpc::ClientContext* ctx) { return master_->GetTask(ctx, req, &resp); });
    TaskAnswer answer;
    if (!s.ok()) {
      // A lost lease: registered again (a new incarnation); ask again.
      if (membership_->OnRefused(s, id.incarnation, /*job_call=*/true) == Refusal::kLost) {
        return answer;  // kWait
      }
      return s;
    }
    switch (resp.result()) {
      case GetTaskResponse::TASK:
        answer.state = TaskState::kTask;
        answer.task = TaskOf(resp.task(), id.incarnation);
        break;
      case GetTaskResponse::DONE:
        answer.state = TaskState::kDone;
        break;
      default:
        answer.state = TaskState::kWait;
    }
    return answer;
  }

  absl::StatusOr<TaskAnswer> NextTask() override {
    for (;;) {
      if (stopping()) return TaskAnswer{TaskState::kStopped, {}};
      ASSIGN_OR_RETURN(TaskAnswer answer, GetTask());
      if (answer.state != TaskState::kWait) return answer;
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                           absl::Milliseconds(options_.poll_interval_ms));
    }
  }

  absl::StatusOr<ReportOutcome> ReportTask(const WorkerTask& task,
                                           const TaskReport& report) override {
    ReportTaskRequest req;
    req.set_worker_id(membership_->identity().worker_id);
    req.set_incarnation(task.incarnation);
    req.set_job(task.job);
    req.set_task_id(task.task_id);
    req.set_ok(report.ok);
    if (report.ok) {
      req.set_records(report.records < 0 ? task.records() : static_cast<uint64_t>(report.records));
    } else {
      req.set_error(report.error.substr(0, kMaxErrorBytes));
    }
    for (const auto& [table, pushes] : report.table_pushes)
      (*req.mutable_table_pushes())[table] = pushes;
    ReportTaskResponse resp;
    int attempts = 0;
    absl::Status s = Call(
        "ReportTask",
        [&](grpc::ClientContext* ctx) { return master_->ReportTask(ctx, req, &resp); }, &attempts);
    ReportOutcome outcome;
    if (s.ok()) {
      outcome.job_done = resp.job_done();
      outcome.duplicate = resp.duplicate();
      return outcome;
    }
    if (s.code() != absl::StatusCode::kFailedPrecondition) return s;
    // The master refuses a report only when the reporter does not hold the task.
    if (!report.ok && attempts > 1) {
      // An earlier attempt of this failure report was applied (the task went back to the
      // queue), its answer lost.
      outcome.duplicate = true;
      return outcome;
    }
    outcome.lost = true;
    outcome.lost_reason = std::string(s.message());
    LOG(WARNING) << "task " << task.task_id << " of job " << task.job
                 << " is no longer this worker's; its result is discarded: " << s;
    return outcome;
  }

  absl::StatusOr<uint32_t> Leave() override { return membership_->Leave(); }

  absl::StatusOr<StatusResponse> Status() override {
    StatusResponse resp;
    RETURN_IF_ERROR(Call("Status", [&](grpc::ClientContext* ctx) {
      return master_->Status(ctx, StatusRequest(), &resp);
    }));
    return resp;
  }

  void RequestStop() override {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      LOG(WARNING) << "worker " << membership_->identity().worker_id
                   << " stops taking tasks (preemption): finish the current one, then leave";
    }
    stopping_ = true;
  }
  bool stopping() const override {
    absl::MutexLock lock(&mu_);
    return stopping_;
  }

  absl::StatusOr<std::shared_ptr<PsClient>> Client() override { return membership_->Client(); }
  absl::Status AttachClient(std::shared_ptr<PsClient> client) override {
    return membership_->AttachClient(std::move(client));
  }

  void PauseHeartbeatsForTest(int ms) override {
    membership_->PauseHeartbeats(absl::Milliseconds(ms));
  }

 private:
  // A master channel that finds a restarted master soon, and no transparent retries
  // (the policy retries).
  grpc::ChannelArguments MasterChannelArgs() const {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, options_.client.initial_backoff_ms);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, options_.client.initial_backoff_ms);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, options_.client.max_backoff_ms);
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    return args;
  }

  absl::Status NeedJob() const {
    if (options_.job.empty()) return absl::InvalidArgumentError("WorkerOptions::job is empty");
    return absl::OkStatus();
  }

  absl::Status Call(absl::string_view method,
                    const std::function<grpc::Status(grpc::ClientContext*)>& attempt,
                    int* attempts = nullptr) {
    return policy_.Run(attempt, absl::StrCat("master ", options_.master, " ", method), attempts);
  }

  // Constant after construction (membership_ after Init).
  const WorkerOptions options_;
  const RetryPolicy policy_;
  const std::unique_ptr<Master::Stub> master_;
  std::unique_ptr<WorkerMembership> membership_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace
}  // namespace internal

absl::StatusOr<std::unique_ptr<WorkerSession>> WorkerSession::Start(const WorkerOptions& options) {
  RETURN_IF_ERROR(internal::CheckOptions(options));
  // Read once, here: an unreadable file fails the start, never a plain-text fallback.
  ASSIGN_OR_RETURN(const ChannelMaker channels, ChannelMaker::Create(options.client.security));
  auto session = std::make_unique<internal::WorkerSessionImpl>(options, channels);
  RETURN_IF_ERROR(session->Init());
  return std::unique_ptr<WorkerSession>(std::move(session));
}

}  // namespace ps
