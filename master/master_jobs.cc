// MasterCore: jobs and the task dispatcher (see the dispatch rules in master_core.h).
#include <glog/logging.h>
#include <google/protobuf/util/message_differencer.h>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "embedding/spec.h"
#include "master/keys.h"
#include "master/master_core.h"

namespace ps {
namespace {

uint64_t TasksOf(const google::protobuf::RepeatedPtrField<DataFile>& files, uint64_t per_task) {
  uint64_t n = 0;
  for (const DataFile& f : files) n += (f.records() + per_task - 1) / per_task;
  return n;
}

absl::Status ValidateFiles(const google::protobuf::RepeatedPtrField<DataFile>& files,
                           absl::string_view what) {
  for (int i = 0; i < files.size(); ++i) {
    if (files[i].path().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " file ", i, " has an empty path"));
    }
  }
  return absl::OkStatus();
}

void AppendTasks(const CreateJobRequest& spec,
                 const google::protobuf::RepeatedPtrField<DataFile>& files, Task::Kind kind,
                 uint32_t epoch, std::vector<Task>* out) {
  for (const DataFile& f : files) {
    for (uint64_t first = 0; first < f.records(); first += spec.records_per_task()) {
      Task t;
      t.set_job(spec.name());
      t.set_task_id(out->size());
      t.set_file(f.path());
      t.set_first_record(first);
      t.set_end_record(std::min(f.records(), first + spec.records_per_task()));
      t.set_kind(kind);
      t.set_epoch(epoch);
      t.set_state(Task::TODO);
      out->push_back(std::move(t));
    }
  }
}

}  // namespace

uint32_t MasterCore::PhaseOf(const Job&, const Task& t) const {
  return 2 * t.epoch() + (t.kind() == Task::EVAL ? 1 : 0);
}

void MasterCore::ApplyTask(const Task& t) {
  Job& job = jobs_.at(t.job());
  Task& old = job.tasks.at(t.task_id());
  if (!Finished(old)) {
    --job.unfinished;
    --job.unfinished_per_phase[PhaseOf(job, old)];
  }
  if (old.state() == Task::TODO) job.todo.erase(old.task_id());
  if (old.state() == Task::DOING) {
    auto w = workers_.find(old.worker_id());
    if (w != workers_.end()) w->second.doing.erase({t.job(), t.task_id()});
  }
  if (!Finished(t)) {
    ++job.unfinished;
    ++job.unfinished_per_phase[PhaseOf(job, t)];
  }
  if (t.state() == Task::TODO) job.todo.insert(t.task_id());
  if (t.state() == Task::DOING) workers_[t.worker_id()].doing.insert({t.job(), t.task_id()});
  old = t;
}

std::vector<Task> MasterCore::RequeueHeld(const Worker& w, bool count_failure,
                                          const std::string& reason, StoreBatch* batch) const {
  std::vector<Task> out;
  for (const auto& [job, id] : w.doing) {
    Task t = jobs_.at(job).tasks.at(id);
    t.clear_worker_id();
    t.clear_incarnation();
    t.set_state(Task::TODO);
    if (count_failure) {
      t.set_failures(t.failures() + 1);
      t.set_last_error(reason);
      if (t.failures() >= options_.max_task_failures) {
        t.set_state(Task::FAILED);
        LOG(WARNING) << "task " << id << " of job " << job << " FAILED after " << t.failures()
                     << " failures; last: " << reason;
      }
    }
    batch->Put(keys::Task(job, id), t);
    out.push_back(std::move(t));
  }
  return out;
}

absl::Status MasterCore::CreateJob(const CreateJobRequest& req, CreateJobResponse* resp) {
  RETURN_IF_ERROR(ValidateName(req.name()));
  if (req.epochs() < 1 || req.records_per_task() < 1 || req.files_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", req.name(), " needs epochs >= 1 (got ", req.epochs(),
                     "), records_per_task >= 1 (got ", req.records_per_task(),
                     ") and at least one file (got ", req.files_size(), ")"));
  }
  RETURN_IF_ERROR(ValidateFiles(req.files(), "training"));
  RETURN_IF_ERROR(ValidateFiles(req.eval_files(), "evaluation"));
  const uint64_t per_epoch = TasksOf(req.files(), req.records_per_task()) +
                             TasksOf(req.eval_files(), req.records_per_task());
  if (per_epoch == 0 || per_epoch > options_.max_tasks_per_job / req.epochs()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", req.name(), " would have ", per_epoch, " tasks per epoch over ",
                     req.epochs(), " epochs; it must have between 1 and ",
                     options_.max_tasks_per_job, " tasks (raise records_per_task)"));
  }
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(req.name());
  if (it != jobs_.end()) {
    if (!google::protobuf::util::MessageDifferencer::Equals(it->second.record.spec(), req)) {
      return absl::AlreadyExistsError(
          absl::StrCat("job ", req.name(), " exists with another definition"));
    }
    resp->set_created(false);
    resp->set_num_tasks(it->second.tasks.size());
    return absl::OkStatus();
  }
  Job job;
  for (uint32_t e = 0; e < req.epochs(); ++e) {
    AppendTasks(req, req.files(), Task::TRAIN, e, &job.tasks);
    AppendTasks(req, req.eval_files(), Task::EVAL, e, &job.tasks);
  }
  *job.record.mutable_spec() = req;
  job.record.set_num_tasks(job.tasks.size());
  StoreBatch batch;
  batch.Put(keys::Job(req.name()), job.record);
  for (const Task& t : job.tasks) batch.Put(keys::Task(req.name(), t.task_id()), t);
  RETURN_IF_ERROR(store_->Write(batch));
  job.unfinished_per_phase.assign(2 * req.epochs(), 0);
  for (const Task& t : job.tasks) {
    job.todo.insert(t.task_id());
    ++job.unfinished_per_phase[PhaseOf(job, t)];
  }
  job.unfinished = job.tasks.size();
  resp->set_created(true);
  resp->set_num_tasks(job.tasks.size());
  LOG(INFO) << "job " << req.name() << " created: " << job.tasks.size() << " tasks";
  jobs_[req.name()] = std::move(job);
  return absl::OkStatus();
}

absl::Status MasterCore::GetTask(const GetTaskRequest& req, GetTaskResponse* resp) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Worker * w, LiveWorker(req.worker_id(), req.incarnation()));
  w->lease_deadline = Now() + options_.lease;  // asking for work is a sign of life
  auto it = jobs_.find(req.job());
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", req.job(), "'"));
  Job& job = it->second;
  if (job.unfinished == 0) {
    resp->set_result(GetTaskResponse::DONE);
    return absl::OkStatus();
  }
  uint32_t current_phase = 0;
  while (job.unfinished_per_phase[current_phase] == 0) ++current_phase;
  if (job.todo.empty() || PhaseOf(job, job.tasks[*job.todo.begin()]) > current_phase) {
    resp->set_result(GetTaskResponse::WAIT);
    return absl::OkStatus();
  }
  Task t = job.tasks[*job.todo.begin()];
  t.set_state(Task::DOING);
  t.set_attempt(t.attempt() + 1);
  t.set_worker_id(req.worker_id());
  t.set_incarnation(req.incarnation());
  StoreBatch batch;
  batch.Put(keys::Task(t.job(), t.task_id()), t);
  RETURN_IF_ERROR(store_->Write(batch));
  ApplyTask(t);
  resp->set_result(GetTaskResponse::TASK);
  *resp->mutable_task() = std::move(t);
  return absl::OkStatus();
}

absl::Status MasterCore::ReportTask(const ReportTaskRequest& req, ReportTaskResponse* resp) {
  absl::MutexLock lock(&mu_);
  auto w = workers_.find(req.worker_id());
  if (w == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker ", req.worker_id(), " is not registered"));
  }
  auto it = jobs_.find(req.job());
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", req.job(), "'"));
  Job& job = it->second;
  if (req.task_id() >= job.tasks.size()) {
    return absl::NotFoundError(absl::StrCat("job ", req.job(), " has no task ", req.task_id(),
                                            " (it has ", job.tasks.size(), ")"));
  }
  const Task& cur = job.tasks[req.task_id()];
  const bool holder = cur.worker_id() == req.worker_id() && cur.incarnation() == req.incarnation();
  if (cur.state() == Task::DONE && holder && req.ok()) {
    resp->set_duplicate(true);  // a retry of a report that was already applied
    resp->set_job_done(job.unfinished == 0);
    return absl::OkStatus();
  }
  if (cur.state() != Task::DOING || !holder) {
    return absl::FailedPreconditionError(absl::StrCat(
        "task ", req.task_id(), " of job ", req.job(), " is not held by worker ", req.worker_id(),
        " incarnation ", req.incarnation(), ": it is ", Task::State_Name(cur.state()),
        cur.state() == Task::DOING
            ? absl::StrCat(" by worker ", cur.worker_id(), " incarnation ", cur.incarnation())
            : "",
        " (a lost lease re-queues a task); discard this result"));
  }
  w->second.lease_deadline = Now() + options_.lease;
  Task t = cur;
  Counters counters = counters_;
  StoreBatch batch;
  if (req.ok()) {
    t.set_state(Task::DONE);
    t.set_records_done(req.records());
    for (const auto& [table, pushes] : req.table_pushes()) {
      (*counters.mutable_table_versions())[table] += pushes;
    }
    if (!req.table_pushes().empty()) batch.Put(std::string(keys::kCounters), counters);
  } else {
    t.set_failures(t.failures() + 1);
    t.set_last_error(req.error().empty() ? "failed (no message)" : req.error());
    if (t.failures() >= options_.max_task_failures) {
      t.set_state(Task::FAILED);
      LOG(WARNING) << "task " << t.task_id() << " of job " << t.job() << " FAILED after "
                   << t.failures() << " failures; last: " << t.last_error();
    } else {
      t.set_state(Task::TODO);
      t.clear_worker_id();
      t.clear_incarnation();
    }
  }
  batch.Put(keys::Task(t.job(), t.task_id()), t);
  RETURN_IF_ERROR(store_->Write(batch));
  counters_ = std::move(counters);
  ApplyTask(t);
  resp->set_job_done(job.unfinished == 0);
  if (job.unfinished == 0) LOG(INFO) << "job " << req.job() << " finished";
  return absl::OkStatus();
}

JobInfo MasterCore::DescribeJob(const Job& job) const {
  const CreateJobRequest& spec = job.record.spec();
  JobInfo info;
  info.set_name(spec.name());
  info.set_epochs(spec.epochs());
  info.set_records_per_task(spec.records_per_task());
  info.set_tasks_total(job.tasks.size());
  uint64_t per_epoch = 0;
  for (const DataFile& f : spec.files()) per_epoch += f.records();
  info.set_train_records_total(per_epoch * spec.epochs());
  for (const Task& t : job.tasks) {
    switch (t.state()) {
      case Task::TODO:
        info.set_tasks_todo(info.tasks_todo() + 1);
        break;
      case Task::DOING:
        info.set_tasks_doing(info.tasks_doing() + 1);
        break;
      case Task::DONE:
        info.set_tasks_done(info.tasks_done() + 1);
        if (t.kind() == Task::TRAIN) {
          info.set_train_records_done(info.train_records_done() + t.records_done());
        } else {
          info.set_eval_records_done(info.eval_records_done() + t.records_done());
        }
        break;
      default:
        info.set_tasks_failed(info.tasks_failed() + 1);
    }
  }
  uint32_t phase = 0;
  while (phase < job.unfinished_per_phase.size() && job.unfinished_per_phase[phase] == 0) ++phase;
  info.set_current_epoch(phase / 2);
  if (job.unfinished > 0) {
    info.set_state(JobInfo::RUNNING);
  } else {
    info.set_state(info.tasks_failed() > 0 ? JobInfo::FAILED : JobInfo::SUCCEEDED);
  }
  return info;
}

}  // namespace ps
