// WorkerSession against an in-process master (MasterServer on loopback) whose lease clock
// the test moves: registration, heartbeats, a lost lease and the new incarnation, tasks
// to DONE, the report of a lost task, a superseded session, leaving and stopping.
#include "client/worker_session.h"

#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/worker_membership.h"
#include "common/routing/shard_ownership.h"
#include "gtest/gtest.h"
#include "master/master_server.h"
#include "proto/status_detail.h"
#include "ps/ps_server.h"

namespace ps {
namespace {

// The master's lease clock is real time (heartbeats renew leases as they would) plus a
// skew the test adds to expire them. 3 s: a heartbeat every second, far inside the lease
// however busy the machine is.
constexpr int kLeaseMs = 3000;

class WorkerSessionTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string templ = std::filesystem::temp_directory_path() / "worker_session_test.XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    MasterServerOptions o;
    o.host = "127.0.0.1";
    o.core.data_dir = dir_;
    o.core.lease = absl::Milliseconds(kLeaseMs);
    o.core.clock = [this] { return absl::Now() + absl::Nanoseconds(skew_ns_.load()); };
    auto master = MasterServer::Start(o);
    ASSERT_TRUE(master.ok()) << master.status();
    master_ = *std::move(master);
  }
  void TearDown() override {
    master_->Shutdown(0);
    master_.reset();
    std::filesystem::remove_all(dir_);
  }

  WorkerOptions Options(uint64_t worker_id = 0, bool heartbeat = true) {
    WorkerOptions o;
    o.master = absl::StrCat("127.0.0.1:", master_->port());
    o.job = "job";
    o.worker_id = worker_id;
    o.heartbeat = heartbeat;
    o.poll_interval_ms = 10;
    o.client.deadline_ms = 5000;
    return o;
  }

  std::unique_ptr<WorkerSession> Start(const WorkerOptions& o) {
    auto s = WorkerSession::Start(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  // Moves the master's clock past every lease until it has expired `n` worker leases in
  // all (a heartbeat may renew one between the move and the expiry: then again).
  void ExpireLeases(uint64_t n) {
    while (master_->core().worker_lease_losses() < n) {
      skew_ns_ += absl::ToInt64Nanoseconds(absl::Milliseconds(10 * kLeaseMs));
      ASSERT_TRUE(master_->core().ExpireLeases().ok());
    }
  }

  // Waits (polling, up to a generous bound) until `done` holds.
  static bool Eventually(const std::function<bool()>& done) {
    const absl::Time until = absl::Now() + absl::Seconds(30);
    while (!done()) {
      if (absl::Now() > until) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }

  static JobSpec Job(uint64_t records, uint64_t per_task) {
    JobSpec job;
    job.files = {{"f", records}};
    job.records_per_task = per_task;
    return job;
  }

  WorkerInfo InfoOf(WorkerSession& s, uint64_t worker_id) {
    auto st = s.Status();
    EXPECT_TRUE(st.ok()) << st.status();
    for (const WorkerInfo& w : st->workers()) {
      if (w.worker_id() == worker_id) return w;
    }
    ADD_FAILURE() << "worker " << worker_id << " not in the master's status";
    return {};
  }

  std::string dir_;
  std::atomic<int64_t> skew_ns_{0};
  std::unique_ptr<MasterServer> master_;
};

TEST_F(WorkerSessionTest, RegistersAndRunsTasksToDone) {
  auto w = Start(Options());
  ASSERT_NE(w, nullptr);
  EXPECT_GT(w->worker_id(), 0u);
  EXPECT_EQ(w->incarnation(), 1u);
  EXPECT_EQ(w->lease_ms(), kLeaseMs);

  JobSpec job;
  job.files = {{"a", 100}, {"b", 50}};
  job.epochs = 2;
  job.records_per_task = 40;
  job.eval_files = {{"e", 10}};
  auto n = w->CreateJob(job);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 2u * (3 + 2 + 1));
  EXPECT_EQ(*w->CreateJob(job), *n);  // idempotent
  JobSpec other = Job(1, 1);
  EXPECT_EQ(w->CreateJob(other).status().code(), absl::StatusCode::kAlreadyExists);

  uint64_t tasks = 0, records = 0, evals = 0;
  bool job_done = false;
  for (;;) {
    auto next = w->NextTask();
    ASSERT_TRUE(next.ok()) << next.status();
    if (next->state == TaskState::kDone) break;
    ASSERT_EQ(next->state, TaskState::kTask);
    const WorkerTask& t = next->task;
    EXPECT_EQ(t.job, "job");
    EXPECT_EQ(t.attempt, 1u);
    EXPECT_EQ(t.incarnation, 1u);
    ++tasks;
    evals += t.eval;
    if (!t.eval) records += t.records();
    TaskReport report;
    report.table_pushes = {{"emb", 2}};
    auto outcome = w->ReportTask(t, report);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    EXPECT_FALSE(outcome->lost);
    EXPECT_FALSE(outcome->duplicate);
    job_done = outcome->job_done;
  }
  EXPECT_TRUE(job_done);
  EXPECT_EQ(tasks, *n);
  EXPECT_EQ(evals, 2u);
  EXPECT_EQ(records, 2u * 150);
  auto st = w->Status();
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->jobs_size(), 1);
  EXPECT_EQ(st->jobs(0).state(), JobInfo::SUCCEEDED);
  EXPECT_EQ(st->jobs(0).train_records_done(), 300u);
  ASSERT_EQ(st->tables_size(), 1);
  EXPECT_EQ(st->tables(0).version(), 2 * *n);
}

TEST_F(WorkerSessionTest, HeartbeatsRenewTheLease) {
  auto w = Start(Options());
  ASSERT_NE(w, nullptr);
  // The time left on a lease only shrinks, unless something renews it; this session
  // makes no call but its heartbeats. So it grows from one look to the next only when a
  // heartbeat came in between.
  int64_t last = InfoOf(*w, w->worker_id()).lease_remaining_ms();
  EXPECT_TRUE(Eventually([&] {
    const int64_t now = InfoOf(*w, w->worker_id()).lease_remaining_ms();
    const bool renewed = now > last;
    last = now;
    return renewed;
  }));
  EXPECT_EQ(InfoOf(*w, w->worker_id()).state(), WorkerInfo::LIVE);
  EXPECT_EQ(w->incarnation(), 1u);
  EXPECT_EQ(master_->core().worker_lease_losses(), 0u);
}

TEST_F(WorkerSessionTest, LostLeaseRegistersAgainAndTheClientFollows) {
  // A pod for the client whose push identity the session keeps current.
  PsServerOptions po;
  po.host = "127.0.0.1";
  auto pod = PsServer::Start(po, ShardOwnership::All(16));
  ASSERT_TRUE(pod.ok()) << pod.status();
  ClientOptions co;
  co.servers = {absl::StrCat("127.0.0.1:", (*pod)->port())};
  co.num_vshards = 16;
  auto client = PsClient::Connect(co);
  ASSERT_TRUE(client.ok()) << client.status();
  std::shared_ptr<PsClient> ps(std::move(*client));

  auto w = Start(Options());
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->AttachClient(ps).ok());
  EXPECT_EQ(ps->worker_id(), w->worker_id());
  EXPECT_EQ(ps->incarnation(), 1u);
  ASSERT_TRUE(w->CreateJob(Job(20, 10)).ok());
  auto held = w->NextTask();
  ASSERT_TRUE(held.ok() && held->state == TaskState::kTask);

  ExpireLeases(1);  // the worker stalled: the master re-queued its task
  // By the heartbeat thread. The count moves last, once the new identity is also the
  // client's: waiting on the incarnation alone raced with the rest of the re-registration.
  ASSERT_TRUE(Eventually([&] { return w->reregistrations() == 1; }));
  EXPECT_EQ(w->incarnation(), 2u);
  EXPECT_EQ(ps->worker_id(), w->worker_id());
  EXPECT_EQ(ps->incarnation(), 2u);

  auto lost = w->ReportTask(held->task, TaskReport());
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_TRUE(lost->lost);
  EXPECT_FALSE(lost->job_done);
  EXPECT_NE(lost->lost_reason.find("not held"), std::string::npos) << lost->lost_reason;

  std::vector<uint64_t> done;
  for (;;) {
    auto next = w->NextTask();
    ASSERT_TRUE(next.ok()) << next.status();
    if (next->state == TaskState::kDone) break;
    if (next->task.task_id == held->task.task_id) EXPECT_EQ(next->task.attempt, 2u);
    EXPECT_EQ(next->task.incarnation, 2u);
    auto outcome = w->ReportTask(next->task, TaskReport());
    ASSERT_TRUE(outcome.ok() && !outcome->lost);
    done.push_back(next->task.task_id);
  }
  std::sort(done.begin(), done.end());
  EXPECT_EQ(done, (std::vector<uint64_t>{0, 1}));
}

TEST_F(WorkerSessionTest, GetTaskRegistersAgainWithoutHeartbeats) {
  auto w = Start(Options(0, /*heartbeat=*/false));
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->CreateJob(Job(20, 10)).ok());
  auto held = w->GetTask();
  ASSERT_TRUE(held.ok() && held->state == TaskState::kTask);
  ExpireLeases(1);
  auto lost = w->ReportTask(held->task, TaskReport());
  ASSERT_TRUE(lost.ok());
  EXPECT_TRUE(lost->lost);
  EXPECT_EQ(w->incarnation(), 1u);  // a refused report does not register again by itself
  auto again = w->GetTask();        // LOST: registers again, then asks again
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->state, TaskState::kWait);
  EXPECT_EQ(w->incarnation(), 2u);
  auto task = w->NextTask();
  ASSERT_TRUE(task.ok() && task->state == TaskState::kTask);
  EXPECT_EQ(task->task.incarnation, 2u);
}

TEST_F(WorkerSessionTest, SupersededSessionDoesNotTakeItsIdBack) {
  auto old_process = Start(Options(0, /*heartbeat=*/false));
  ASSERT_NE(old_process, nullptr);
  ASSERT_TRUE(old_process->CreateJob(Job(20, 10)).ok());
  auto restarted = Start(Options(old_process->worker_id()));  // same id: incarnation 2
  ASSERT_NE(restarted, nullptr);
  EXPECT_EQ(restarted->worker_id(), old_process->worker_id());
  EXPECT_EQ(restarted->incarnation(), 2u);

  auto refused = old_process->GetTask();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_TRUE(old_process->superseded());
  EXPECT_EQ(old_process->incarnation(), 1u);
  EXPECT_EQ(old_process->Leave().status().code(), absl::StatusCode::kFailedPrecondition);

  auto task = restarted->NextTask();
  ASSERT_TRUE(task.ok() && task->state == TaskState::kTask) << task.status();
  EXPECT_EQ(InfoOf(*restarted, restarted->worker_id()).incarnation(), 2u);
  EXPECT_EQ(InfoOf(*restarted, restarted->worker_id()).state(), WorkerInfo::LIVE);
}

TEST_F(WorkerSessionTest, LeaveRequeuesOnceAndTheDestructorLeaves) {
  auto w = Start(Options());
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->CreateJob(Job(20, 10)).ok());
  auto held = w->NextTask();
  ASSERT_TRUE(held.ok() && held->state == TaskState::kTask);
  auto left = w->Leave();
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_EQ(*left, 1u);
  EXPECT_EQ(*w->Leave(), 1u);  // idempotent: the first result
  EXPECT_EQ(w->GetTask().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w->Client().status().code(), absl::StatusCode::kFailedPrecondition);

  auto other = Start(Options());
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(InfoOf(*other, w->worker_id()).state(), WorkerInfo::LEFT);
  auto again = other->NextTask();
  ASSERT_TRUE(again.ok() && again->state == TaskState::kTask);
  EXPECT_EQ(again->task.task_id, held->task.task_id);
  EXPECT_EQ(again->task.attempt, 2u);

  const uint64_t other_id = other->worker_id();
  other.reset();  // leaves: its task goes back to the queue
  auto third = Start(Options());
  ASSERT_NE(third, nullptr);
  EXPECT_EQ(InfoOf(*third, other_id).state(), WorkerInfo::LEFT);
  auto st = third->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->jobs(0).tasks_doing(), 0u);
  EXPECT_EQ(st->jobs(0).tasks_failed(), 0u);
}

TEST_F(WorkerSessionTest, FailedReportRequeuesTheTask) {
  auto w = Start(Options());
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->CreateJob(Job(10, 10)).ok());
  auto first = w->NextTask();
  ASSERT_TRUE(first.ok() && first->state == TaskState::kTask);
  TaskReport failed;
  failed.ok = false;
  failed.error = std::string(10000, 'x');  // kept to its first 4000 bytes
  auto outcome = w->ReportTask(first->task, failed);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_FALSE(outcome->lost);
  auto second = w->NextTask();
  ASSERT_TRUE(second.ok() && second->state == TaskState::kTask);
  EXPECT_EQ(second->task.task_id, first->task.task_id);
  EXPECT_EQ(second->task.attempt, 2u);
  auto done = w->ReportTask(second->task, TaskReport());
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(done->job_done);
  EXPECT_TRUE(w->ReportTask(second->task, TaskReport())->duplicate);  // a retried report
}

TEST_F(WorkerSessionTest, RequestStopEndsNextTask) {
  auto holder = Start(Options());
  ASSERT_NE(holder, nullptr);
  ASSERT_TRUE(holder->CreateJob(Job(10, 10)).ok());
  auto only = holder->NextTask();
  ASSERT_TRUE(only.ok() && only->state == TaskState::kTask);

  auto w = Start(Options());
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->GetTask()->state, TaskState::kWait);  // the only task is held
  std::thread stopper([&] { w->RequestStop(); });
  auto next = w->NextTask();  // waits through WAIT until stopped
  stopper.join();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->state, TaskState::kStopped);
  EXPECT_TRUE(w->stopping());
  EXPECT_EQ(w->NextTask()->state, TaskState::kStopped);
}

TEST_F(WorkerSessionTest, BadOptionsAndAnUnreachableMasterFailToStart) {
  WorkerOptions none;
  EXPECT_EQ(WorkerSession::Start(none).status().code(), absl::StatusCode::kInvalidArgument);
  WorkerOptions bad = Options();
  bad.client.max_attempts = 0;
  EXPECT_EQ(WorkerSession::Start(bad).status().code(), absl::StatusCode::kInvalidArgument);
  WorkerOptions tls = Options();
  tls.client.security.ca_file = dir_ + "/missing-ca.pem";
  EXPECT_FALSE(WorkerSession::Start(tls).ok());

  WorkerOptions gone = Options();
  const std::string address = gone.master;
  master_->Shutdown(0);
  gone.client.max_attempts = 2;
  gone.client.deadline_ms = 500;
  auto s = WorkerSession::Start(gone);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable) << s.status();
  EXPECT_NE(s.status().message().find(address), std::string::npos) << s.status();
}

// The master's refusal is told apart by its WorkerRefused detail, never by its words.
TEST(ClassifyRefusalTest, TheDetailDecidesNotTheMessage) {
  using internal::ClassifyRefusal;
  using internal::Refusal;
  WorkerRefused superseded;
  superseded.set_reason(WorkerRefused::SUPERSEDED);
  WorkerRefused lost;
  lost.set_reason(WorkerRefused::LOST);
  // A message that says "superseded" without the detail is a lost lease (register again).
  EXPECT_EQ(ClassifyRefusal(absl::FailedPreconditionError("incarnation 1 is superseded"),
                            /*job_call=*/true),
            Refusal::kLost);
  EXPECT_EQ(ClassifyRefusal(WithDetail(absl::FailedPreconditionError("refused"), superseded),
                            /*job_call=*/true),
            Refusal::kSuperseded);
  EXPECT_EQ(ClassifyRefusal(WithDetail(absl::FailedPreconditionError("superseded"), lost),
                            /*job_call=*/true),
            Refusal::kLost);
  // Other codes are no refusal of the identity (NOT_FOUND only outside job calls).
  EXPECT_EQ(ClassifyRefusal(absl::UnavailableError("superseded"), true), Refusal::kNone);
  EXPECT_EQ(ClassifyRefusal(absl::NotFoundError("no such worker"), false), Refusal::kLost);
}

}  // namespace
}  // namespace ps
