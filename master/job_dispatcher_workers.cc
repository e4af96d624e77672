// JobDispatcher: workers, their incarnations and leases, and the tasks they hold.
#include <glog/logging.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "master/job_dispatcher.h"
#include "master/keys.h"
#include "proto/status_detail.h"

namespace ps {

absl::StatusOr<JobDispatcher::Worker*> JobDispatcher::LiveWorker(uint64_t worker_id,
                                                                 uint64_t incarnation) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("worker ", worker_id, " is not registered; call RegisterWorker first"));
  }
  Worker& w = it->second;
  WorkerRefused refused;
  refused.set_current_incarnation(w.record.incarnation());
  if (w.record.incarnation() != incarnation) {
    refused.set_reason(WorkerRefused::SUPERSEDED);
    return WithDetail(absl::FailedPreconditionError(
                          absl::StrCat("worker ", worker_id, " incarnation ", incarnation,
                                       " is superseded by incarnation ", w.record.incarnation())),
                      refused);
  }
  if (w.record.state() != WorkerInfo::LIVE) {
    refused.set_reason(WorkerRefused::LOST);
    return WithDetail(absl::FailedPreconditionError(
                          absl::StrCat("worker ", worker_id, " incarnation ", incarnation, " is ",
                                       WorkerInfo::State_Name(w.record.state()),
                                       " (its tasks went back to the queue); register again")),
                      refused);
  }
  return &w;
}

std::vector<Task> JobDispatcher::Requeue(const Worker& w, const TaskRef* keep, bool count_failure,
                                         const std::string& reason, StoreBatch* batch) const {
  std::vector<Task> out;
  for (const auto& [job, id] : w.doing) {
    if (keep != nullptr && *keep == TaskRef(job, id)) continue;
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
  const uint64_t next_id = counters_->Get().next_worker_id();
  uint64_t id = req.worker_id();
  if (id != 0 && workers_.count(id) == 0) {
    // Never issued, or forgotten by retention: its last incarnation is unknown, and pods
    // would take (id, 1) for a stale writer of that id. Nor may a caller pick ids (one near
    // 2^64 would make next_worker_id wrap onto an id in use). A new id is safe.
    LOG(INFO) << "worker id " << id << " is unknown (never issued, or forgotten by "
              << "retention); registering as worker " << next_id;
    id = 0;
  }
  if (id == 0) id = next_id;
  WorkerRecord record;
  std::vector<Task> requeued;
  StoreBatch batch;
  auto it = workers_.find(id);
  if (it != workers_.end()) {
    record = it->second.record;
    record.set_incarnation(record.incarnation() + 1);
    requeued = Requeue(it->second, /*keep=*/nullptr, /*count_failure=*/true,
                       absl::StrCat("worker ", id, " re-registered as incarnation ",
                                    record.incarnation(), " while holding it"),
                       &batch);
  } else {
    record.set_worker_id(id);
    record.set_incarnation(1);
  }
  record.set_state(WorkerInfo::LIVE);
  record.clear_ended_unix_ms();
  batch.Put(keys::Worker(id), record);
  RETURN_IF_ERROR(CommitTasks(std::move(batch), requeued, [this, id](StoreBatch b) {
    return counters_->Write(std::move(b), [id](Counters* c) {
      c->set_next_worker_id(std::max(c->next_worker_id(), id + 1));
    });
  }));
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
  const std::vector<Task> requeued =
      Requeue(*w, /*keep=*/nullptr, /*count_failure=*/false, "", &batch);
  const absl::Time now = Now();
  WorkerRecord record = w->record;
  record.set_state(WorkerInfo::LEFT);
  record.set_ended_unix_ms(absl::ToUnixMillis(now));
  batch.Put(keys::Worker(record.worker_id()), record);
  RETURN_IF_ERROR(CommitTasks(std::move(batch), requeued));
  w->record = std::move(record);
  w->ended = now;
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
    const std::vector<Task> requeued =
        Requeue(w, /*keep=*/nullptr, /*count_failure=*/true,
                absl::StrCat("worker ", id, " incarnation ", w.record.incarnation(),
                             " lost its lease while holding it"),
                &batch);
    WorkerRecord record = w.record;
    record.set_state(WorkerInfo::LOST);
    record.set_ended_unix_ms(absl::ToUnixMillis(now));
    batch.Put(keys::Worker(id), record);
    RETURN_IF_ERROR(CommitTasks(std::move(batch), requeued));
    w.record = std::move(record);
    w.ended = now;
    lease_losses_.fetch_add(1);
    LOG(WARNING) << "worker " << id << " LOST; " << requeued.size() << " tasks re-queued";
  }
  return absl::OkStatus();
}

}  // namespace ps
