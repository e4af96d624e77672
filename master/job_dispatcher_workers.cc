// JobDispatcher: workers, their incarnations and leases, and the tasks they hold.
#include <glog/logging.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "master/job_dispatcher.h"
#include "master/keys.h"

namespace ps {

absl::StatusOr<JobDispatcher::Worker*> JobDispatcher::LiveWorker(uint64_t worker_id,
                                                                 uint64_t incarnation) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("worker ", worker_id, " is not registered; call RegisterWorker first"));
  }
  Worker& w = it->second;
  if (w.record.incarnation() != incarnation) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", worker_id, " incarnation ",
                                                      incarnation, " is superseded by incarnation ",
                                                      w.record.incarnation()));
  }
  if (w.record.state() != WorkerInfo::LIVE) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker_id, " incarnation ", incarnation, " is ",
                     WorkerInfo::State_Name(w.record.state()),
                     " (its tasks went back to the queue); register again"));
  }
  return &w;
}

std::vector<Task> JobDispatcher::RequeueHeld(const Worker& w, bool count_failure,
                                             const std::string& reason, StoreBatch* batch) const {
  std::vector<Task> out;
  for (const auto& [job, id] : w.doing) {
    Task t = jobs_.at(job).tasks().at(id);
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

absl::Status JobDispatcher::RegisterWorker(const RegisterWorkerRequest& req,
                                           RegisterWorkerResponse* resp) {
  absl::MutexLock lock(&mu_);
  // next_worker_id is ours (see counters_record.h): read now, written with the worker.
  uint64_t id = req.worker_id();
  if (id == 0) id = counters_->Get().next_worker_id();
  WorkerRecord record;
  std::vector<Task> requeued;
  StoreBatch batch;
  auto it = workers_.find(id);
  if (it != workers_.end()) {
    record = it->second.record;
    record.set_incarnation(record.incarnation() + 1);
    requeued = RequeueHeld(it->second, /*count_failure=*/true,
                           absl::StrCat("worker ", id, " re-registered as incarnation ",
                                        record.incarnation(), " while holding it"),
                           &batch);
  } else {
    record.set_worker_id(id);
    record.set_incarnation(1);
  }
  record.set_state(WorkerInfo::LIVE);
  batch.Put(keys::Worker(id), record);
  RETURN_IF_ERROR(counters_->Write(std::move(batch), [id](Counters* c) {
    c->set_next_worker_id(std::max(c->next_worker_id(), id + 1));
  }));
  for (const Task& t : requeued) ApplyTask(t);
  Worker& w = workers_[id];
  w.record = record;
  w.lease_deadline = Now() + options_.lease;
  resp->set_worker_id(id);
  resp->set_incarnation(record.incarnation());
  resp->set_lease_ms(absl::ToInt64Milliseconds(options_.lease));
  LOG(INFO) << "worker " << id << " registered, incarnation " << record.incarnation()
            << (requeued.empty() ? std::string()
                                 : absl::StrCat("; ", requeued.size(), " tasks re-queued"));
  return absl::OkStatus();
}

absl::Status JobDispatcher::WorkerHeartbeat(const WorkerHeartbeatRequest& req,
                                            WorkerHeartbeatResponse* resp) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Worker * w, LiveWorker(req.worker_id(), req.incarnation()));
  w->lease_deadline = Now() + options_.lease;
  resp->set_lease_ms(absl::ToInt64Milliseconds(options_.lease));
  return absl::OkStatus();
}

absl::Status JobDispatcher::LeaveWorker(const LeaveWorkerRequest& req, LeaveWorkerResponse* resp) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Worker * w, LiveWorker(req.worker_id(), req.incarnation()));
  StoreBatch batch;
  std::vector<Task> requeued = RequeueHeld(*w, /*count_failure=*/false, "", &batch);
  WorkerRecord record = w->record;
  record.set_state(WorkerInfo::LEFT);
  batch.Put(keys::Worker(record.worker_id()), record);
  RETURN_IF_ERROR(store_->Write(batch));
  w->record = std::move(record);
  for (const Task& t : requeued) ApplyTask(t);
  resp->set_requeued_tasks(static_cast<uint32_t>(requeued.size()));
  LOG(INFO) << "worker " << req.worker_id() << " incarnation " << req.incarnation() << " left; "
            << requeued.size() << " tasks re-queued";
  return absl::OkStatus();
}

absl::Status JobDispatcher::ExpireLeases(absl::Time now) {
  absl::MutexLock lock(&mu_);
  for (auto& [id, w] : workers_) {
    if (w.record.state() != WorkerInfo::LIVE || w.lease_deadline > now) continue;
    StoreBatch batch;
    std::vector<Task> requeued =
        RequeueHeld(w, /*count_failure=*/true,
                    absl::StrCat("worker ", id, " incarnation ", w.record.incarnation(),
                                 " lost its lease while holding it"),
                    &batch);
    WorkerRecord record = w.record;
    record.set_state(WorkerInfo::LOST);
    batch.Put(keys::Worker(id), record);
    RETURN_IF_ERROR(store_->Write(batch));
    w.record = std::move(record);
    for (const Task& t : requeued) ApplyTask(t);
    lease_losses_.fetch_add(1);
    LOG(WARNING) << "worker " << id << " LOST; " << requeued.size() << " tasks re-queued";
  }
  return absl::OkStatus();
}

}  // namespace ps
