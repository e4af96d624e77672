// JobDispatcher: deleting jobs (DeleteJob, retention) and forgetting workers.
#include <glog/logging.h>

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "master/job_dispatcher.h"
#include "master/keys.h"

namespace ps {
namespace {

// Keys deleted per write when a job's task records are removed, and worker records per
// write when workers are forgotten: bounded batches (a few MB).
constexpr uint64_t kDeleteBatch = 50'000;

}  // namespace

absl::Status JobDispatcher::Tombstone(const std::vector<std::string>& names) {
  StoreBatch batch;
  uint64_t tasks_done = 0, records = 0;
  for (const std::string& name : names) {
    const Job& job = jobs_.at(name);
    const JobInfo info = job.Describe();
    tasks_done += info.tasks_done();
    records += info.train_records_done();
    JobRecord tombstone;
    tombstone.mutable_spec()->set_name(name);
    tombstone.set_num_tasks(job.tasks().size());
    tombstone.set_created_unix_ms(job.record().created_unix_ms());
    tombstone.set_finished_unix_ms(job.record().finished_unix_ms());
    tombstone.set_deleted(true);
    batch.Put(keys::Job(name), tombstone);
  }
  RETURN_IF_ERROR(counters_->Write(std::move(batch), [&](Counters* c) {
    c->set_retired_tasks_done(c->retired_tasks_done() + tasks_done);
    c->set_retired_records_trained(c->retired_records_trained() + records);
  }));
  for (const std::string& name : names) {
    auto it = jobs_.find(name);
    const Job& job = it->second;
    const JobInfo info = job.Describe();
    // Its holders (a forced delete of a running job) hold nothing of it any more.
    for (uint64_t id : job.doing()) {
      auto w = workers_.find(job.tasks()[id].worker_id());
      if (w != workers_.end()) w->second.doing.erase({name, id});
    }
    removing_[name] = Removal{job.tasks().size(), /*claimed=*/true};
    jobs_.erase(it);
    // The one line that stays of it (its totals stay in status's counts).
    LOG(INFO) << "job " << name << " deleted: " << JobInfo::State_Name(info.state()) << ", "
              << info.tasks_done() << "/" << info.tasks_total() << " tasks done, "
              << info.tasks_failed() << " failed, " << info.train_records_done() << "/"
              << info.train_records_total() << " training records, " << info.eval_records_done()
              << " evaluation records";
  }
  return absl::OkStatus();
}

absl::Status JobDispatcher::RemoveRecords(const std::string& name, uint64_t num_tasks) {
  absl::Status status;
  for (uint64_t first = 0; status.ok();) {
    const uint64_t end = std::min(num_tasks, first + std::min(kDeleteBatch, num_tasks - first));
    StoreBatch batch;
    for (uint64_t id = first; id < end; ++id) batch.Delete(keys::Task(name, id));
    if (end == num_tasks) batch.Delete(keys::Job(name));  // the tombstone goes last
    status = store_->Write(batch);
    if (end == num_tasks) break;
    first = end;
  }
  absl::MutexLock lock(&mu_);
  if (!status.ok()) {
    removing_[name].claimed = false;  // the next EnforceRetention tries again
    LOG(WARNING) << "removing the records of deleted job " << name
                 << " failed (retried later): " << status;
    return status;
  }
  removing_.erase(name);
  return absl::OkStatus();
}

absl::Status JobDispatcher::DeleteJob(const DeleteJobRequest& req, DeleteJobResponse* resp) {
  uint64_t num_tasks = 0;
  {
    absl::MutexLock lock(&mu_);
    if (creating_.count(req.name()) > 0) {
      return absl::AbortedError(
          absl::StrCat("job ", req.name(), " is being created by another call; retry"));
    }
    auto it = jobs_.find(req.name());
    if (it == jobs_.end()) return UnknownJob(req.name());
    const JobInfo info = it->second.Describe();
    if (!it->second.done() && !req.force()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", req.name(), " is RUNNING (", it->second.unfinished(), " of ", info.tasks_total(),
          " tasks unfinished); delete it anyway with force (--force)"));
    }
    num_tasks = it->second.tasks().size();
    RETURN_IF_ERROR(Tombstone({req.name()}));
    *resp->mutable_job() = info;
  }
  // Deleted from here on (the tombstone is stored): removing the records may fail and be
  // finished later, and the caller is told it is deleted either way.
  RemoveRecords(req.name(), num_tasks).IgnoreError();
  return absl::OkStatus();
}

absl::Status JobDispatcher::ForgetWorkers(absl::Time now) {
  if (options_.worker_retention <= absl::ZeroDuration()) return absl::OkStatus();
  for (;;) {
    absl::MutexLock lock(&mu_);
    StoreBatch batch;
    std::vector<uint64_t> ids;
    for (const auto& [id, w] : workers_) {
      if (w.record.state() == WorkerInfo::LIVE || !w.doing.empty() ||
          w.ended + options_.worker_retention > now) {
        continue;
      }
      batch.Delete(keys::Worker(id));
      ids.push_back(id);
      if (ids.size() == kDeleteBatch) break;
    }
    if (ids.empty()) return absl::OkStatus();
    RETURN_IF_ERROR(store_->Write(batch));
    for (uint64_t id : ids) workers_.erase(id);
    LOG(INFO) << "retention: forgot " << ids.size() << " workers that left or were lost "
              << absl::FormatDuration(options_.worker_retention) << " ago or more";
    if (ids.size() < kDeleteBatch) return absl::OkStatus();
  }
}

absl::Status JobDispatcher::EnforceRetention(absl::Time now) {
  absl::Status status = ForgetWorkers(now);
  std::vector<std::pair<std::string, uint64_t>> claimed;  // removals this call runs
  {
    absl::MutexLock lock(&mu_);
    // Finished jobs, the most recently finished first.
    std::vector<std::tuple<int64_t, std::string>> finished;
    for (const auto& [name, job] : jobs_) {
      if (job.done()) finished.emplace_back(job.record().finished_unix_ms(), name);
    }
    std::sort(finished.rbegin(), finished.rend());
    std::vector<std::string> victims;
    const int64_t now_ms = absl::ToUnixMillis(now);
    const int64_t retention_ms = absl::ToInt64Milliseconds(options_.job_retention);
    for (size_t i = 0; i < finished.size(); ++i) {
      const auto& [finished_ms, name] = finished[i];
      const bool expired = retention_ms > 0 && finished_ms <= now_ms - retention_ms;
      const bool beyond = options_.max_finished_jobs > 0 && i >= options_.max_finished_jobs;
      if (expired || beyond) victims.push_back(name);
    }
    if (!victims.empty()) {
      if (absl::Status s = Tombstone(victims); !s.ok()) {
        status.Update(s);
      } else {
        LOG(INFO) << "retention: deleted " << victims.size() << " finished jobs";
      }
    }
    // Removals claimed just now, and any left over (a failed write, a restart).
    for (auto& [name, removal] : removing_) {
      const bool ours = std::find(victims.begin(), victims.end(), name) != victims.end();
      if (removal.claimed && !ours) continue;
      removal.claimed = true;
      claimed.emplace_back(name, removal.num_tasks);
    }
  }
  for (const auto& [name, num_tasks] : claimed) status.Update(RemoveRecords(name, num_tasks));
  return status;
}

}  // namespace ps
