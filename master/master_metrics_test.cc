// The master's job series, rendered from a MasterCore driven through a job: each series
// says what the job's tasks are at that moment (the counts are kept as tasks change, not
// counted at scrape time), and the totals never go back when a job is deleted.
#include "master/master_metrics.h"

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "master/pod_control.h"

namespace ps {
namespace {

// Answers every call OK: the pods the master tells of a registration or a failover.
class AcceptingPods final : public PodControl {
 public:
  absl::Status ApplyAssignment(const std::string&, const Assignment&) override {
    return absl::OkStatus();
  }
  absl::Status MigrateBegin(const std::string&, const MigrateBeginRequest&,
                            MigrateBeginResponse*) override {
    return absl::OkStatus();
  }
  absl::Status MigrateImport(const std::string&, const MigrateImportRequest&,
                             MigrateImportResponse*) override {
    return absl::OkStatus();
  }
  absl::Status Checkpoint(const std::string&, const PodCheckpointRequest&,
                          PodCheckpointResponse*) override {
    return absl::OkStatus();
  }
};

// A master core in a temporary directory with its series in registry_.
class MetricsFixture : public testing::Test {
 protected:
  void SetUp() override {
    std::string templ = std::filesystem::temp_directory_path() / "master_metrics_test.XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
  }
  void TearDown() override {
    core_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Opens core_ with `o` (its data dir, 4 vshards, `pods` pods, no retention thread and
  // pods that accept every call set here), adds its series to registry_, and registers
  // pods ps-0 .. ps-<pods - 1> at h:0 ...
  void Open(MasterOptions o, int pods) {
    o.data_dir = dir_;
    o.num_vshards = 4;
    if (pods > 0) o.num_ps = pods;
    o.retention_interval = absl::ZeroDuration();
    o.pod_control = std::make_shared<AcceptingPods>();
    auto core = MasterCore::Open(o);
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = *std::move(core);
    AddMasterMetrics(core_.get(), &registry_);
    for (int i = 0; i < pods; ++i) {
      RegisterPodRequest req;
      req.set_pod_id(absl::StrCat("ps-", i));
      req.set_address(absl::StrCat("h:", i));
      RegisterPodResponse resp;
      ASSERT_TRUE(core_->RegisterPod(req, &resp).ok());
    }
  }

  // Replication factor `replication`, a 1 s lease and a 10 s lag bound on the clock now_
  // (which only the test moves), no re-replication rounds.
  MasterOptions FakeClockOptions(uint32_t replication) {
    MasterOptions o;
    o.replication = replication;
    o.lease = absl::Seconds(1);
    o.replication_max_lag = absl::Seconds(10);
    o.rereplicate_interval = absl::ZeroDuration();
    o.clock = [this] { return now_; };
    return o;
  }

  // Whether the exposition has the sample line `line` ("name{labels} value").
  ::testing::AssertionResult Has(const std::string& line) { return HasText(line + "\n"); }
  // Whether a line of the exposition starts with `text`.
  ::testing::AssertionResult HasText(const std::string& text) {
    const std::string rendered = registry_.Render();
    if (absl::StrContains(absl::StrCat("\n", rendered), absl::StrCat("\n", text))) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure() << "no line '" << text << "' in:\n" << rendered;
  }

  // Pod ps-<pod> (at h:<pod>) heartbeats, reporting each of `followers` (ps-<f>) 5 records
  // and `lag_ms` behind.
  void Report(int pod, const std::vector<int>& followers, uint64_t lag_ms) {
    PodHeartbeatRequest req;
    req.set_pod_id(absl::StrCat("ps-", pod));
    req.set_address(absl::StrCat("h:", pod));
    for (int follower : followers) {
      FollowerLag* f = req.add_followers();
      f->set_follower(absl::StrCat("ps-", follower));
      f->set_records(5);
      f->set_lag_ms(lag_ms);
    }
    PodHeartbeatResponse resp;
    ASSERT_TRUE(core_->PodHeartbeat(req, &resp).ok());
  }

  std::string dir_;
  // The clock of FakeClockOptions.
  absl::Time now_ = absl::FromUnixSeconds(1'000'000);
  std::unique_ptr<MasterCore> core_;
  MetricsRegistry registry_;
};

class MasterMetricsTest : public MetricsFixture {
 protected:
  void SetUp() override {
    MetricsFixture::SetUp();
    if (HasFatalFailure()) return;
    Open(MasterOptions(), 0);
  }

  Task Take(const RegisterWorkerResponse& w) {
    GetTaskRequest req;
    req.set_worker_id(w.worker_id());
    req.set_incarnation(w.incarnation());
    req.set_job("j");
    GetTaskResponse resp;
    EXPECT_TRUE(core_->GetTask(req, &resp).ok());
    EXPECT_EQ(resp.result(), GetTaskResponse::TASK);
    return resp.task();
  }

  void Report(const RegisterWorkerResponse& w, const Task& t, bool ok) {
    ReportTaskRequest req;
    req.set_worker_id(w.worker_id());
    req.set_incarnation(w.incarnation());
    req.set_job("j");
    req.set_task_id(t.task_id());
    req.set_ok(ok);
    req.set_records(t.end_record() - t.first_record());
    ReportTaskResponse resp;
    ASSERT_TRUE(core_->ReportTask(req, &resp).ok());
  }
};

TEST_F(MasterMetricsTest, JobSeriesFollowTheTasks) {
  CreateJobRequest job;
  job.set_name("j");
  job.add_files()->set_path("f");
  job.mutable_files(0)->set_records(10);
  job.set_epochs(1);
  job.set_records_per_task(4);  // [0,4) [4,8) [8,10)
  CreateJobResponse created;
  ASSERT_TRUE(core_->CreateJob(job, &created).ok());
  EXPECT_TRUE(Has("ps_master_tasks{job=\"j\",state=\"todo\"} 3"));
  EXPECT_TRUE(Has("ps_master_job_running{job=\"j\"} 1"));

  RegisterWorkerResponse a, b;
  ASSERT_TRUE(core_->RegisterWorker(RegisterWorkerRequest(), &a).ok());
  ASSERT_TRUE(core_->RegisterWorker(RegisterWorkerRequest(), &b).ok());
  const Task t0 = Take(a);
  const Task t1 = Take(b);
  EXPECT_TRUE(Has("ps_master_tasks{job=\"j\",state=\"todo\"} 1"));
  EXPECT_TRUE(Has("ps_master_tasks{job=\"j\",state=\"doing\"} 2"));
  Report(a, t0, true);
  Report(b, t1, false);  // back to the queue (a failure)
  EXPECT_TRUE(Has("ps_master_tasks{job=\"j\",state=\"todo\"} 2"));
  EXPECT_TRUE(Has("ps_master_tasks{job=\"j\",state=\"doing\"} 0"));
  EXPECT_TRUE(Has("ps_master_tasks{job=\"j\",state=\"done\"} 1"));
  EXPECT_TRUE(Has("ps_master_job_records_trained{job=\"j\"} 4"));
  EXPECT_TRUE(Has("ps_master_tasks_done_total 1"));
  EXPECT_TRUE(Has("ps_master_records_trained_total 4"));
  for (int i = 0; i < 2; ++i) Report(a, Take(a), true);
  EXPECT_TRUE(Has("ps_master_tasks{job=\"j\",state=\"done\"} 3"));
  EXPECT_TRUE(Has("ps_master_job_records_trained{job=\"j\"} 10"));
  EXPECT_TRUE(Has("ps_master_job_running{job=\"j\"} 0"));
  EXPECT_TRUE(Has("ps_master_jobs{state=\"succeeded\"} 1"));
  EXPECT_TRUE(Has("ps_master_jobs{state=\"running\"} 0"));

  // Deleted: its series go, the totals stay.
  DeleteJobRequest del;
  del.set_name("j");
  DeleteJobResponse deleted;
  ASSERT_TRUE(core_->DeleteJob(del, &deleted).ok());
  EXPECT_FALSE(absl::StrContains(registry_.Render(), "job=\"j\""));
  EXPECT_TRUE(Has("ps_master_tasks_done_total 3"));
  EXPECT_TRUE(Has("ps_master_records_trained_total 10"));
  EXPECT_TRUE(Has("ps_master_jobs{state=\"succeeded\"} 0"));
}

TEST_F(MasterMetricsTest, ReplicationSeriesExistWithoutReplication) {
  for (const char* line : {"ps_master_replication_factor 1", "ps_master_failovers_total 0",
                           "ps_master_ack_set_removals_total{cause=\"lost\"} 0",
                           "ps_master_ack_set_removals_total{cause=\"lag\"} 0",
                           "ps_master_ack_set_removals_total{cause=\"failover\"} 0",
                           "ps_master_ack_set_removals_total{cause=\"surplus\"} 0",
                           "ps_master_under_replicated_vshards 0"}) {
    EXPECT_TRUE(Has(line));
  }
}

using MasterReplicationMetricsTest = MetricsFixture;

// R = 2 over two pods (ps-0 owns vshards 0-1, followed by ps-1; ps-1 owns 2-3, followed by
// ps-0): ps-0 reports ps-1 under the bound, then beyond it.
TEST_F(MasterReplicationMetricsTest, LagReportsAndAckSetRemovals) {
  MasterOptions o;
  o.replication = 2;
  o.lease = absl::Seconds(60);
  o.replication_max_lag = absl::Seconds(1);
  Open(o, 2);
  EXPECT_TRUE(Has("ps_master_replication_factor 2"));
  EXPECT_TRUE(Has("ps_master_under_replicated_vshards 0"));
  Report(0, {1}, 250);
  EXPECT_TRUE(Has("ps_master_replication_lag_seconds{primary=\"ps-0\",follower=\"ps-1\"} 0.25"));
  EXPECT_TRUE(Has("ps_master_replication_lag_records{primary=\"ps-0\",follower=\"ps-1\"} 5"));
  EXPECT_TRUE(Has("ps_master_ack_set_removals_total{cause=\"lag\"} 0"));
  Report(0, {1}, 1000);
  EXPECT_TRUE(Has("ps_master_ack_set_removals_total{cause=\"lag\"} 2"));
  EXPECT_TRUE(Has("ps_master_ack_set_removals_total{cause=\"lost\"} 0"));
  EXPECT_TRUE(Has("ps_master_under_replicated_vshards 2"));
  EXPECT_TRUE(Has("ps_master_failovers_total 0"));
}

// R = 2 over two pods, both reporting their follower's lag; then ps-0's lease runs out.
// Its series go (it reports no more: a frozen lag would page for a stream that no longer
// exists), ps-1's stay, and status keeps ps-0's last report (ps-admin marks it).
TEST_F(MasterReplicationMetricsTest, ALostPrimarysLagSeriesAreDropped) {
  Open(FakeClockOptions(2), 2);
  Report(0, {1}, 250);
  Report(1, {0}, 250);
  const std::string ps0 = "ps_master_replication_lag_seconds{primary=\"ps-0\"";
  const std::string ps0_records = "ps_master_replication_lag_records{primary=\"ps-0\"";
  const std::string ps1 = "ps_master_replication_lag_seconds{primary=\"ps-1\"";
  EXPECT_TRUE(HasText(ps0));
  EXPECT_TRUE(HasText(ps1));

  now_ += absl::Milliseconds(600);
  Report(1, {0}, 250);  // ps-1 stays live; ps-0 falls silent
  now_ += absl::Milliseconds(600);
  ASSERT_TRUE(core_->ExpireLeases().ok());
  EXPECT_FALSE(HasText(ps0)) << registry_.Render();
  EXPECT_FALSE(HasText(ps0_records)) << registry_.Render();
  EXPECT_TRUE(HasText(ps1));
  EXPECT_TRUE(Has("ps_master_pods{state=\"lost\"} 1"));
  StatusResponse status;
  ASSERT_TRUE(core_->Status(StatusRequest(), &status).ok());
  bool kept = false;
  for (const ReplicaLag& l : status.replication().lags()) kept = kept || l.primary() == "ps-0";
  EXPECT_TRUE(kept) << "status lost ps-0's last report, which ps-admin shows (marked LOST)";
}

// R = 3 over three pods: ps-0's lease runs out. Each vshard it led is promoted to one of
// its two followers, and the other leaves the ack set (it may lack records the promoted one
// holds: membership_replicas.cc, FailOver): cause "failover", one per such vshard. Each
// vshard it followed drops it: cause "lost". Both in status too (ps-admin shows them).
TEST_F(MasterReplicationMetricsTest, AFailoverAtR3CountsTheOtherFollowersRemovals) {
  Open(FakeClockOptions(3), 3);
  ShardMapResponse map;
  ASSERT_TRUE(core_->GetShardMap(GetShardMapRequest(), &map).ok());
  uint64_t led = 0, followed = 0;
  for (int v = 0; v < map.owner_size(); ++v) {
    ASSERT_EQ(map.followers(v).pods_size(), 2) << "vshard " << v;
    if (map.pods(map.owner(v)).pod_id() == "ps-0") {
      ++led;
    } else {
      for (uint32_t f : map.followers(v).pods()) followed += map.pods(f).pod_id() == "ps-0";
    }
  }
  ASSERT_GT(led, 0u);
  EXPECT_TRUE(Has("ps_master_ack_set_removals_total{cause=\"failover\"} 0"));

  now_ += absl::Milliseconds(600);
  Report(1, {}, 0);  // ps-1 and ps-2 stay live; ps-0 falls silent
  Report(2, {}, 0);
  now_ += absl::Milliseconds(600);
  ASSERT_TRUE(core_->ExpireLeases().ok());
  EXPECT_TRUE(Has(absl::StrCat("ps_master_ack_set_removals_total{cause=\"failover\"} ", led)));
  EXPECT_TRUE(Has(absl::StrCat("ps_master_ack_set_removals_total{cause=\"lost\"} ", followed)));
  EXPECT_TRUE(Has(absl::StrCat("ps_master_under_replicated_vshards ", led + followed)));
  StatusResponse status;
  ASSERT_TRUE(core_->Status(StatusRequest(), &status).ok());
  EXPECT_EQ(status.replication().removed_failover(), led);
  EXPECT_EQ(status.replication().removed_lease(), followed);
  EXPECT_GE(status.replication().failovers(), 1u);
}

}  // namespace
}  // namespace ps
