// JobDispatcher on its own, over an in-memory store whose writes a test can hold or fail:
// what no other test can show. The RPCs' rules are tested through MasterCore in
// master_core_test.cc.
#include "master/job_dispatcher.h"

#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "master/keys.h"
#include "master/memory_store_for_test.h"

namespace ps {
namespace {

// Generous: only a deadlock (the behaviour before the fix) comes near it.
constexpr absl::Duration kDeadlock = absl::Seconds(60);

CreateJobRequest JobSpec(const std::string& name, uint64_t records, uint64_t per_task) {
  CreateJobRequest req;
  req.set_name(name);
  req.add_files()->set_path("train.rec");
  req.mutable_files(0)->set_records(records);
  req.set_epochs(1);
  req.set_records_per_task(per_task);
  return req;
}

class JobDispatcherTest : public testing::Test {
 protected:
  void SetUp() override {
    options_.clock = [this] { return now_; };
    options_.retention_interval = absl::ZeroDuration();
    Open();
  }

  // Opens the parts on the store, as MasterCore::Open does (again: a master restart).
  void Open() {
    jobs_.reset();
    counters_ = std::make_unique<CountersRecord>(&store_);
    jobs_ = std::make_unique<JobDispatcher>(options_, &store_, counters_.get());
    ASSERT_TRUE(counters_->Load().ok());
    ASSERT_TRUE(jobs_->Load(now_ + options_.lease).ok());
  }

  absl::Status Create(const CreateJobRequest& req) {
    CreateJobResponse resp;
    return jobs_->CreateJob(req, &resp);
  }

  RegisterWorkerResponse AddWorker() {
    RegisterWorkerResponse resp;
    EXPECT_TRUE(jobs_->RegisterWorker(RegisterWorkerRequest(), &resp).ok());
    return resp;
  }

  absl::StatusOr<GetTaskResponse> Get(const RegisterWorkerResponse& w, const std::string& job) {
    GetTaskRequest req;
    req.set_worker_id(w.worker_id());
    req.set_incarnation(w.incarnation());
    req.set_job(job);
    GetTaskResponse resp;
    if (absl::Status s = jobs_->GetTask(req, &resp); !s.ok()) return s;
    return resp;
  }

  // Runs `job` to its end with worker `w`.
  void Finish(const RegisterWorkerResponse& w, const std::string& job) {
    for (;;) {
      auto t = Get(w, job);
      ASSERT_TRUE(t.ok()) << t.status();
      if (t->result() == GetTaskResponse::DONE) return;
      ASSERT_EQ(t->result(), GetTaskResponse::TASK);
      ReportTaskRequest req;
      req.set_worker_id(w.worker_id());
      req.set_incarnation(w.incarnation());
      req.set_job(job);
      req.set_task_id(t->task().task_id());
      req.set_ok(true);
      ReportTaskResponse resp;
      ASSERT_TRUE(jobs_->ReportTask(req, &resp).ok());
    }
  }

  // Keys of the store under `prefix`.
  int Count(const std::string& prefix) {
    int n = 0;
    EXPECT_TRUE(store_
                    .Scan(prefix,
                          [&](absl::string_view, absl::string_view) {
                            ++n;
                            return absl::OkStatus();
                          })
                    .ok());
    return n;
  }

  MasterOptions options_;
  absl::Time now_ = absl::FromUnixSeconds(1'000'000);
  MemoryStore store_;
  std::unique_ptr<CountersRecord> counters_;
  std::unique_ptr<JobDispatcher> jobs_;
};

// A large job is cut and written with no lock held: while its write hangs, workers
// register, heartbeat, take and report tasks of another job, status is read, and a second
// creation of the same name is told to retry. (Before, all of them waited for it.)
TEST_F(JobDispatcherTest, WorkersAndStatusDoNotWaitForAJobBeingCreated) {
  ASSERT_TRUE(Create(JobSpec("small", 10, 5)).ok());
  absl::Notification writing, release;
  store_.before_write = [&](const StoreBatch& batch) {
    for (const auto& [key, value] : batch.ops()) {
      if (key == keys::Job("big")) {
        writing.Notify();
        release.WaitForNotification();
      }
    }
    return absl::OkStatus();
  };
  std::thread create([&] {
    CreateJobResponse resp;
    absl::Status s = jobs_->CreateJob(JobSpec("big", 200'000, 1), &resp);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(resp.num_tasks(), 200'000u);
  });
  writing.WaitForNotification();
  absl::Notification served;
  std::thread others([&] {
    RegisterWorkerResponse w = AddWorker();
    WorkerHeartbeatRequest hb;
    hb.set_worker_id(w.worker_id());
    hb.set_incarnation(w.incarnation());
    WorkerHeartbeatResponse hb_resp;
    EXPECT_TRUE(jobs_->WorkerHeartbeat(hb, &hb_resp).ok());
    Finish(w, "small");
    StatusResponse status;
    jobs_->Describe(now_, &status);
    EXPECT_EQ(status.jobs_size(), 1);  // "big" shows once it is installed
    CreateJobResponse resp;
    EXPECT_EQ(jobs_->CreateJob(JobSpec("big", 200'000, 1), &resp).code(),
              absl::StatusCode::kAborted);
    EXPECT_EQ(Get(w, "big").status().code(), absl::StatusCode::kNotFound);
    served.Notify();
  });
  EXPECT_TRUE(served.WaitForNotificationWithTimeout(kDeadlock))
      << "worker calls waited for a job being created";
  release.Notify();
  create.join();
  others.join();
  StatusResponse status;
  jobs_->Describe(now_, &status);
  ASSERT_EQ(status.jobs_size(), 2);
  EXPECT_EQ(status.jobs(0).name(), "big");
  EXPECT_EQ(status.jobs(0).tasks_todo(), 200'000u);
  EXPECT_EQ(Count("task/big/"), 200'000);
}

// A creation whose write fails leaves nothing behind: the name is free for a retry.
TEST_F(JobDispatcherTest, AFailedCreationFreesTheName) {
  store_.before_write = [](const StoreBatch&) { return absl::UnavailableError("disk gone"); };
  CreateJobResponse resp;
  EXPECT_EQ(jobs_->CreateJob(JobSpec("j", 10, 5), &resp).code(), absl::StatusCode::kUnavailable);
  store_.before_write = nullptr;
  ASSERT_TRUE(jobs_->CreateJob(JobSpec("j", 10, 5), &resp).ok());
  EXPECT_TRUE(resp.created());
}

// A deletion whose task records cannot be removed (a failed write, then a restart) is
// finished later: the job is gone for workers and status at once, its name is refused
// (ABORTED, retry) until its records are gone, and then free.
TEST_F(JobDispatcherTest, AnInterruptedDeletionIsFinishedLater) {
  ASSERT_TRUE(Create(JobSpec("j", 120'000, 1)).ok());
  RegisterWorkerResponse w = AddWorker();
  auto t = Get(w, "j");
  ASSERT_TRUE(t.ok());
  int deletes = 0;
  store_.before_write = [&](const StoreBatch& batch) {
    const auto& first = batch.ops().front();
    if (!first.second.has_value() && absl::StartsWith(first.first, "task/j/") && ++deletes > 1) {
      return absl::UnavailableError("disk full");  // the second batch of deletes fails
    }
    return absl::OkStatus();
  };
  DeleteJobRequest del;
  del.set_name("j");
  del.set_force(true);
  DeleteJobResponse deleted;
  ASSERT_TRUE(jobs_->DeleteJob(del, &deleted).ok());
  EXPECT_EQ(deleted.job().tasks_total(), 120'000u);
  EXPECT_GT(Count("task/j/"), 0);  // left for later
  StatusResponse status;
  jobs_->Describe(now_, &status);
  EXPECT_EQ(status.jobs_size(), 0);
  EXPECT_EQ(status.workers(0).tasks_doing(), 0u);
  absl::Status got = Get(w, "j").status();
  EXPECT_EQ(got.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(got.message(), "was deleted")) << got;
  CreateJobResponse resp;
  EXPECT_EQ(jobs_->CreateJob(JobSpec("j", 10, 5), &resp).code(), absl::StatusCode::kAborted);

  Open();  // the master restarts with the tombstone and part of the tasks in its store
  jobs_->Describe(now_, &status);
  EXPECT_EQ(status.jobs_size(), 0);
  EXPECT_EQ(jobs_->CreateJob(JobSpec("j", 10, 5), &resp).code(), absl::StatusCode::kAborted);
  deletes = 0;
  EXPECT_EQ(jobs_->EnforceRetention(now_).code(), absl::StatusCode::kUnavailable);
  store_.before_write = nullptr;
  ASSERT_TRUE(jobs_->EnforceRetention(now_).ok());
  EXPECT_EQ(Count("task/j/"), 0);
  EXPECT_EQ(Count("job/"), 0);
  ASSERT_TRUE(jobs_->CreateJob(JobSpec("j", 10, 5), &resp).ok());
  EXPECT_TRUE(resp.created());
  EXPECT_EQ(resp.num_tasks(), 2u);
}

// Status lists every task in progress but at most kMaxListedFailedTasks failed ones per job
// (the count is whole), so its size does not grow with a job's failures.
TEST_F(JobDispatcherTest, StatusListsABoundedNumberOfFailedTasks) {
  options_.max_task_failures = 1;
  Open();
  const uint64_t n = kMaxListedFailedTasks + 20;
  ASSERT_TRUE(Create(JobSpec("j", n, 1)).ok());
  RegisterWorkerResponse w = AddWorker();
  for (uint64_t i = 0; i < n; ++i) {
    auto t = Get(w, "j");
    ASSERT_TRUE(t.ok() && t->result() == GetTaskResponse::TASK);
    ReportTaskRequest req;
    req.set_worker_id(w.worker_id());
    req.set_incarnation(w.incarnation());
    req.set_job("j");
    req.set_task_id(t->task().task_id());
    req.set_error("bad");
    ReportTaskResponse resp;
    ASSERT_TRUE(jobs_->ReportTask(req, &resp).ok());
  }
  StatusResponse status;
  jobs_->Describe(now_, &status);
  EXPECT_EQ(status.jobs(0).state(), JobInfo::FAILED);
  EXPECT_EQ(status.jobs(0).tasks_failed(), n);
  EXPECT_EQ(status.failed_tasks_size(), kMaxListedFailedTasks);
  EXPECT_GT(status.jobs(0).finished_unix_ms(), 0);
}

}  // namespace
}  // namespace ps
