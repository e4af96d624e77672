// JobDispatcher: loading, jobs and their tasks. Workers are in job_dispatcher_workers.cc,
// deletion and retention in job_dispatcher_retention.cc.
#include "master/job_dispatcher.h"

#include <glog/logging.h>
#include <google/protobuf/util/message_differencer.h>

#include <memory>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "master/keys.h"

namespace ps {

absl::Status JobDispatcher::Load(absl::Time lease_deadline) {
  const absl::Time now = Now();
  std::map<uint64_t, Worker> workers;
  std::map<std::string, Job> jobs;
  std::map<std::string, Removal> removing;
  RETURN_IF_ERROR(ScanRecords<WorkerRecord>(
      *store_, keys::kWorkerPrefix, [&](absl::string_view, WorkerRecord record) {
        Worker& w = workers[record.worker_id()];
        w.lease_deadline = lease_deadline;
        // Records of earlier versions carry no end time: count from now.
        w.ended = record.ended_unix_ms() > 0 ? absl::FromUnixMillis(record.ended_unix_ms()) : now;
        w.record = std::move(record);
        return absl::OkStatus();
      }));
  RETURN_IF_ERROR(
      ScanRecords<JobRecord>(*store_, keys::kJobPrefix, [&](absl::string_view, JobRecord record) {
        const std::string name = record.spec().name();
        if (record.deleted()) {
          removing[name].num_tasks = record.num_tasks();
        } else {
          jobs.insert_or_assign(name, Job(std::move(record)));
        }
        return absl::OkStatus();
      }));
  RETURN_IF_ERROR(ScanRecords<Task>(*store_, keys::kTaskPrefix, [&](absl::string_view key, Task t) {
    if (removing.count(t.job()) > 0) return absl::OkStatus();  // being deleted
    auto it = jobs.find(t.job());
    if (it == jobs.end() || !it->second.Restore(std::move(t))) {
      return absl::DataLossError(
          absl::StrCat("master store: task record '", key, "' belongs to no job it names"));
    }
    return absl::OkStatus();
  }));
  // Derived state: queues, counts, holders.
  for (auto& [name, job] : jobs) {
    RETURN_IF_ERROR(job.Rebuild());
    if (job.done() && job.record().finished_unix_ms() == 0) {
      JobRecord record = job.record();  // of an earlier version: retention counts from now
      record.set_finished_unix_ms(absl::ToUnixMillis(now));
      job.set_record(std::move(record));
    }
    for (uint64_t id : job.doing()) {
      const Task& t = job.tasks()[id];
      auto w = workers.find(t.worker_id());
      if (w == workers.end()) {
        return absl::DataLossError(absl::StrCat("master store: task ", id, " of job ", name,
                                                " is held by unknown worker ", t.worker_id()));
      }
      w->second.doing.insert({name, id});
    }
  }
  absl::MutexLock lock(&mu_);
  workers_ = std::move(workers);
  jobs_ = std::move(jobs);
  removing_ = std::move(removing);
  creating_.clear();
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

absl::Status JobDispatcher::CommitTasks(StoreBatch batch, const std::vector<Task>& tasks) {
  return CommitTasks(std::move(batch), tasks, [this](StoreBatch b) { return store_->Write(b); });
}

absl::Status JobDispatcher::CommitTasks(StoreBatch batch, const std::vector<Task>& tasks,
                                        WriteFn write) {
  // Jobs whose last unfinished tasks these changes finish get their finish time, in the
  // same write.
  std::map<std::string, int64_t> finishing;  // job -> unfinished tasks these finish
  for (const Task& t : tasks) {
    const bool was = Job::Finished(jobs_.at(t.job()).tasks().at(t.task_id()));
    finishing[t.job()] += (Job::Finished(t) ? 1 : 0) - (was ? 1 : 0);
  }
  std::vector<JobRecord> finished;
  const int64_t now_ms = absl::ToUnixMillis(Now());
  for (const auto& [name, n] : finishing) {
    const Job& job = jobs_.at(name);
    if (n <= 0 || job.unfinished() != static_cast<uint64_t>(n)) continue;
    JobRecord record = job.record();
    record.set_finished_unix_ms(now_ms);
    batch.Put(keys::Job(name), record);
    finished.push_back(std::move(record));
  }
  RETURN_IF_ERROR(write(std::move(batch)));
  for (const Task& t : tasks) ApplyTask(t);
  for (JobRecord& record : finished) {
    Job& job = jobs_.at(record.spec().name());
    job.set_record(std::move(record));
    const JobInfo info = job.Describe();
    LOG(INFO) << "job " << info.name() << " finished " << JobInfo::State_Name(info.state()) << ": "
              << info.tasks_done() << " tasks done, " << info.tasks_failed() << " failed, "
              << info.train_records_done() << " training records";
  }
  return absl::OkStatus();
}

absl::Status JobDispatcher::CreateJob(const CreateJobRequest& req, CreateJobResponse* resp) {
  // Checked with no lock held: O(files), nothing proportional to records or tasks.
  ASSIGN_OR_RETURN(const JobShape shape, ValidateJobSpec(req, options_.max_tasks_per_job));
  std::shared_ptr<const JobRecord> existing;
  {
    absl::MutexLock lock(&mu_);
    if (removing_.count(req.name()) > 0) {
      return absl::AbortedError(absl::StrCat(
          "job ", req.name(), " was deleted and its records are still being removed; retry"));
    }
    if (creating_.count(req.name()) > 0) {
      return absl::AbortedError(
          absl::StrCat("job ", req.name(), " is being created by another call; retry"));
    }
    auto it = jobs_.find(req.name());
    if (it != jobs_.end()) {
      existing = it->second.shared_record();
    } else {
      creating_.insert(req.name());  // the name is ours until installed or given up
    }
  }
  if (existing != nullptr) {
    if (!google::protobuf::util::MessageDifferencer::Equals(existing->spec(), req)) {
      return absl::AlreadyExistsError(
          absl::StrCat("job ", req.name(), " exists with another definition"));
    }
    resp->set_created(false);
    resp->set_num_tasks(existing->num_tasks());
    return absl::OkStatus();
  }
  absl::Cleanup release = [this, &req] {
    absl::MutexLock lock(&mu_);
    creating_.erase(req.name());
  };
  // Cut and written with no lock held: workers, status and other jobs go on meanwhile.
  ASSIGN_OR_RETURN(Job job,
                   Job::Create(req, options_.max_tasks_per_job, absl::ToUnixMillis(Now())));
  {
    StoreBatch batch;
    batch.Put(keys::Job(req.name()), job.record());
    for (const Task& t : job.tasks()) batch.Put(keys::Task(req.name(), t.task_id()), t);
    RETURN_IF_ERROR(store_->Write(batch));
  }
  std::move(release).Cancel();
  resp->set_created(true);
  resp->set_num_tasks(shape.tasks);
  LOG(INFO) << "job " << req.name() << " created: " << shape.tasks << " tasks, "
            << shape.train_records << " training records over " << req.epochs() << " epochs";
  absl::MutexLock lock(&mu_);
  creating_.erase(req.name());
  jobs_.insert_or_assign(req.name(), std::move(job));
  return absl::OkStatus();
}

absl::Status JobDispatcher::UnknownJob(const std::string& name) const {
  if (removing_.count(name) > 0) {
    return absl::NotFoundError(absl::StrCat("job '", name, "' was deleted"));
  }
  return absl::NotFoundError(absl::StrCat("unknown job '", name, "'"));
}

absl::Status JobDispatcher::GetTask(const GetTaskRequest& req, GetTaskResponse* resp) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Worker * w, LiveWorker(req.worker_id(), req.incarnation()));
  w->lease_deadline = Now() + options_.lease;  // asking for work is a sign of life
  auto it = jobs_.find(req.job());
  if (it == jobs_.end()) return UnknownJob(req.job());
  const Job& job = it->second;
  // One task at a time: a task of this job that it holds is its answer again (a retry
  // after a lost answer); tasks of other jobs it gave up.
  std::optional<TaskRef> keep;
  for (const TaskRef& held : w->doing) {
    if (held.first == req.job()) {
      keep = held;
      break;
    }
  }
  if (w->doing.size() > (keep.has_value() ? 1u : 0u)) {
    StoreBatch batch;
    const std::vector<Task> requeued =
        Requeue(*w, keep.has_value() ? &*keep : nullptr, /*count_failure=*/true,
                absl::StrCat("worker ", req.worker_id(), " incarnation ", req.incarnation(),
                             " asked for a task of job ", req.job(),
                             " while holding it (a worker "
                             "works on one task at a time)"),
                &batch);
    RETURN_IF_ERROR(CommitTasks(std::move(batch), requeued));
    LOG(WARNING) << "worker " << req.worker_id() << " gave up " << requeued.size()
                 << " tasks by asking for one of job " << req.job() << "; re-queued";
  }
  if (keep.has_value()) {
    resp->set_result(GetTaskResponse::TASK);
    *resp->mutable_task() = job.tasks()[keep->second];
    return absl::OkStatus();
  }
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
  RETURN_IF_ERROR(CommitTasks(std::move(batch), {t}));
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
  if (it == jobs_.end()) return UnknownJob(req.job());
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
    RETURN_IF_ERROR(CommitTasks(std::move(batch), {t}, [&](StoreBatch b) {
      return counters_->Write(std::move(b), [&](Counters* c) {
        for (const auto& [table, pushes] : req.table_pushes()) {
          (*c->mutable_table_versions())[table] += pushes;
        }
      });
    }));
  } else {
    RETURN_IF_ERROR(CommitTasks(std::move(batch), {t}));
  }
  resp->set_job_done(job.done());
  return absl::OkStatus();
}

void JobDispatcher::Describe(absl::Time now, StatusResponse* resp) const {
  RetentionInfo* retention = resp->mutable_retention();
  retention->set_job_retention_s(absl::ToInt64Seconds(options_.job_retention));
  retention->set_max_finished_jobs(options_.max_finished_jobs);
  retention->set_worker_retention_s(absl::ToInt64Seconds(options_.worker_retention));
  retention->set_max_tasks_per_job(options_.max_tasks_per_job);
  absl::MutexLock lock(&mu_);
  const Counters counters = counters_->Get();  // under mu_: consistent with jobs_
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
  // Deleted jobs' totals stay counted, so these never go back.
  uint64_t tasks_done = counters.retired_tasks_done();
  uint64_t records = counters.retired_records_trained();
  for (const auto& [name, job] : jobs_) {
    JobInfo info = job.Describe();
    tasks_done += info.tasks_done();
    records += info.train_records_done();
    *resp->add_jobs() = std::move(info);
    for (uint64_t id : job.doing()) *resp->add_doing_tasks() = job.tasks()[id];
    int listed = 0;
    for (uint64_t id : job.failed()) {
      if (++listed > kMaxListedFailedTasks) break;
      *resp->add_failed_tasks() = job.tasks()[id];
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
