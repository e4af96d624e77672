// JobDispatcher: loading, jobs and their tasks. Workers are in job_dispatcher_workers.cc.
#include "master/job_dispatcher.h"

#include <glog/logging.h>
#include <google/protobuf/util/message_differencer.h>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "master/keys.h"

namespace ps {

absl::Status JobDispatcher::Load(absl::Time lease_deadline) {
  std::map<uint64_t, Worker> workers;
  std::map<std::string, Job> jobs;
  RETURN_IF_ERROR(ScanRecords<WorkerRecord>(*store_, keys::kWorkerPrefix,
                                            [&](absl::string_view, WorkerRecord record) {
                                              Worker& w = workers[record.worker_id()];
                                              w.record = std::move(record);
                                              w.lease_deadline = lease_deadline;
                                              return absl::OkStatus();
                                            }));
  RETURN_IF_ERROR(
      ScanRecords<JobRecord>(*store_, keys::kJobPrefix, [&](absl::string_view, JobRecord record) {
        const std::string name = record.spec().name();
        jobs.insert_or_assign(name, Job(std::move(record)));
        return absl::OkStatus();
      }));
  RETURN_IF_ERROR(ScanRecords<Task>(*store_, keys::kTaskPrefix, [&](absl::string_view key, Task t) {
    auto it = jobs.find(t.job());
    if (it == jobs.end() || !it->second.Restore(std::move(t))) {
      return absl::DataLossError(
          absl::StrCat("master store: task record '", key, "' belongs to no job it names"));
    }
    return absl::OkStatus();
  }));
  // Derived state: queues, phase counts, holders.
  for (auto& [name, job] : jobs) {
    RETURN_IF_ERROR(job.Rebuild());
    for (const Task& t : job.tasks()) {
      if (t.state() != Task::DOING) continue;
      auto w = workers.find(t.worker_id());
      if (w == workers.end()) {
        return absl::DataLossError(absl::StrCat("master store: task ", t.task_id(), " of job ",
                                                name, " is held by unknown worker ",
                                                t.worker_id()));
      }
      w->second.doing.insert({name, t.task_id()});
    }
  }
  absl::MutexLock lock(&mu_);
  workers_ = std::move(workers);
  jobs_ = std::move(jobs);
  return absl::OkStatus();
}

void JobDispatcher::ApplyTask(const Task& t) {
  Job& job = jobs_.at(t.job());
  const Task& old = job.tasks().at(t.task_id());
  if (old.state() == Task::DOING) {
    auto w = workers_.find(old.worker_id());
    if (w != workers_.end()) w->second.doing.erase({t.job(), t.task_id()});
  }
  if (t.state() == Task::DOING) workers_[t.worker_id()].doing.insert({t.job(), t.task_id()});
  job.Apply(t);
}

absl::Status JobDispatcher::CreateJob(const CreateJobRequest& req, CreateJobResponse* resp) {
  RETURN_IF_ERROR(ValidateJobSpec(req, options_.max_tasks_per_job));
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(req.name());
  if (it != jobs_.end()) {
    if (!google::protobuf::util::MessageDifferencer::Equals(it->second.record().spec(), req)) {
      return absl::AlreadyExistsError(
          absl::StrCat("job ", req.name(), " exists with another definition"));
    }
    resp->set_created(false);
    resp->set_num_tasks(it->second.tasks().size());
    return absl::OkStatus();
  }
  Job job = Job::Create(req);
  StoreBatch batch;
  batch.Put(keys::Job(req.name()), job.record());
  for (const Task& t : job.tasks()) batch.Put(keys::Task(req.name(), t.task_id()), t);
  RETURN_IF_ERROR(store_->Write(batch));
  resp->set_created(true);
  resp->set_num_tasks(job.tasks().size());
  LOG(INFO) << "job " << req.name() << " created: " << job.tasks().size() << " tasks";
  jobs_.insert_or_assign(req.name(), std::move(job));
  return absl::OkStatus();
}

absl::Status JobDispatcher::GetTask(const GetTaskRequest& req, GetTaskResponse* resp) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Worker * w, LiveWorker(req.worker_id(), req.incarnation()));
  w->lease_deadline = Now() + options_.lease;  // asking for work is a sign of life
  auto it = jobs_.find(req.job());
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", req.job(), "'"));
  const Job& job = it->second;
  if (job.done()) {
    resp->set_result(GetTaskResponse::DONE);
    return absl::OkStatus();
  }
  const Task* next = job.Next();
  if (next == nullptr) {
    resp->set_result(GetTaskResponse::WAIT);
    return absl::OkStatus();
  }
  Task t = *next;
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

absl::Status JobDispatcher::ReportTask(const ReportTaskRequest& req, ReportTaskResponse* resp) {
  absl::MutexLock lock(&mu_);
  auto w = workers_.find(req.worker_id());
  if (w == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker ", req.worker_id(), " is not registered"));
  }
  auto it = jobs_.find(req.job());
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", req.job(), "'"));
  const Job& job = it->second;
  if (req.task_id() >= job.tasks().size()) {
    return absl::NotFoundError(absl::StrCat("job ", req.job(), " has no task ", req.task_id(),
                                            " (it has ", job.tasks().size(), ")"));
  }
  const Task& cur = job.tasks()[req.task_id()];
  const bool holder = cur.worker_id() == req.worker_id() && cur.incarnation() == req.incarnation();
  if (cur.state() == Task::DONE && holder && req.ok()) {
    resp->set_duplicate(true);  // a retry of a report that was already applied
    resp->set_job_done(job.done());
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
  if (req.ok()) {
    t.set_state(Task::DONE);
    t.set_records_done(req.records());
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
  StoreBatch batch;
  batch.Put(keys::Task(t.job(), t.task_id()), t);
  if (req.ok() && !req.table_pushes().empty()) {
    // A finished task's pushes count into the tables' versions, in the same write.
    RETURN_IF_ERROR(counters_->Write(std::move(batch), [&](Counters* c) {
      for (const auto& [table, pushes] : req.table_pushes()) {
        (*c->mutable_table_versions())[table] += pushes;
      }
    }));
  } else {
    RETURN_IF_ERROR(store_->Write(batch));
  }
  ApplyTask(t);
  resp->set_job_done(job.done());
  if (job.done()) LOG(INFO) << "job " << req.job() << " finished";
  return absl::OkStatus();
}

void JobDispatcher::Describe(absl::Time now, StatusResponse* resp) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, w] : workers_) {
    WorkerInfo* info = resp->add_workers();
    info->set_worker_id(id);
    info->set_incarnation(w.record.incarnation());
    info->set_state(w.record.state());
    if (w.record.state() == WorkerInfo::LIVE) {
      info->set_lease_remaining_ms(absl::ToInt64Milliseconds(w.lease_deadline - now));
    }
    info->set_tasks_doing(static_cast<uint32_t>(w.doing.size()));
  }
  uint64_t tasks_done = 0, records = 0;
  for (const auto& [name, job] : jobs_) {
    JobInfo info = job.Describe();
    tasks_done += info.tasks_done();
    records += info.train_records_done();
    *resp->add_jobs() = std::move(info);
    for (const Task& t : job.tasks()) {
      if (t.state() == Task::FAILED) *resp->add_failed_tasks() = t;
      if (t.state() == Task::DOING) *resp->add_doing_tasks() = t;
    }
  }
  resp->set_tasks_done(tasks_done);
  resp->set_records_trained(records);
}

size_t JobDispatcher::worker_count() const {
  absl::MutexLock lock(&mu_);
  return workers_.size();
}

size_t JobDispatcher::job_count() const {
  absl::MutexLock lock(&mu_);
  return jobs_.size();
}

}  // namespace ps
