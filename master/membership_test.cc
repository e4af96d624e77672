// Membership on its own, over an in-memory store, beside a JobDispatcher sharing that store
// (as in MasterCore). The pod RPCs' rules are tested through MasterCore in
// master_core_test.cc; here, what the split into parts promises.
#include "master/membership.h"

#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "master/cluster_config.h"
#include "master/job_dispatcher.h"
#include "master/keys.h"
#include "master/memory_store_for_test.h"

namespace ps {
namespace {

class MembershipTest : public testing::Test {
 protected:
  void SetUp() override {
    options_.num_vshards = 16;
    options_.num_ps = 2;
    options_.clock = [this] { return now_; };
    auto config = LoadOrCreateCluster(store_, options_);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
  }

  // Opens the parts on the store, as MasterCore::Open does.
  void Open() {
    counters_ = std::make_unique<CountersRecord>(&store_);
    membership_ = std::make_unique<Membership>(options_, config_, &store_, counters_.get());
    jobs_ = std::make_unique<JobDispatcher>(options_, &store_, counters_.get());
    ASSERT_TRUE(counters_->Load().ok());
    auto aborted = membership_->Load(now_ + options_.lease);
    ASSERT_TRUE(aborted.ok()) << aborted.status();
    aborted_ = *aborted;
    ASSERT_TRUE(jobs_->Load(now_ + options_.lease).ok());
  }

  absl::Status Register(const std::string& id, const std::string& address) {
    RegisterPodRequest req;
    req.set_pod_id(id);
    req.set_address(address);
    RegisterPodResponse resp;
    return membership_->RegisterPod(req, &resp, nullptr);
  }

  MasterOptions options_;
  absl::Time now_ = absl::FromUnixSeconds(1'000'000);
  MemoryStore store_;
  ClusterConfig config_;
  std::unique_ptr<CountersRecord> counters_;
  std::unique_ptr<Membership> membership_;
  std::unique_ptr<JobDispatcher> jobs_;
  std::vector<MoveRecord> aborted_;
};

TEST_F(MembershipTest, HeartbeatsAndTheMapDoNotWaitForJobCreation) {
  Open();
  ASSERT_TRUE(Register("ps-0", "h:1").ok());
  // CreateJob's synced write hangs until released.
  absl::Notification writing, release;
  store_.before_write = [&](const StoreBatch& batch) {
    for (const auto& [key, value] : batch.ops()) {
      if (absl::StartsWith(key, keys::kJobPrefix)) {
        writing.Notify();
        release.WaitForNotification();
      }
    }
    return absl::OkStatus();
  };
  std::thread create([&] {
    CreateJobRequest req;
    req.set_name("j");
    req.add_files()->set_path("train.rec");
    req.mutable_files(0)->set_records(100);
    req.set_epochs(1);
    req.set_records_per_task(10);
    CreateJobResponse resp;
    EXPECT_TRUE(jobs_->CreateJob(req, &resp).ok());
  });
  writing.WaitForNotification();
  // Meanwhile pods heartbeat, clients read the map, and a pod registers (a write of its own).
  absl::Notification served;
  std::thread pods([&] {
    PodHeartbeatRequest hb;
    hb.set_pod_id("ps-0");
    hb.set_address("h:1");
    PodHeartbeatResponse hb_resp;
    EXPECT_TRUE(membership_->PodHeartbeat(hb, &hb_resp).ok());
    EXPECT_EQ(hb_resp.assignment().owned_vshards_size(), 8);
    ShardMapResponse map;
    EXPECT_TRUE(membership_->GetShardMap(GetShardMapRequest(), &map).ok());
    EXPECT_TRUE(Register("ps-1", "h:2").ok());
    served.Notify();
  });
  EXPECT_TRUE(served.WaitForNotificationWithTimeout(absl::Seconds(30)))
      << "pod calls waited for a job's write";
  release.Notify();
  create.join();
  pods.join();
}

TEST_F(MembershipTest, AMoveLeftInFlightIsAbortedAtLoad) {
  Open();
  ASSERT_TRUE(Register("ps-0", "h:1").ok());
  ASSERT_TRUE(Register("ps-1", "h:2").ok());
  auto started = membership_->BeginMove("ps-0", "ps-1", {0, 1});
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_EQ(started->destination_address, "h:2");
  EXPECT_EQ(membership_->BeginMove("ps-0", "ps-1", {2}).status().code(),
            absl::StatusCode::kAborted);  // one at a time
  auto a = membership_->AssignmentOf("ps-1");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->assignment.moving_in_size(), 2);
  const uint64_t epoch = membership_->epoch();

  // The master stops here; the next one aborts the move: ps-0 keeps the vshards.
  Open();
  ASSERT_EQ(aborted_.size(), 1u);
  EXPECT_EQ(aborted_[0].move_id(), started->move.move_id());
  EXPECT_EQ(membership_->epoch(), epoch + 1);
  EXPECT_TRUE(membership_->MovesInFlight().empty());
  EXPECT_EQ(membership_->View().OwnedBy("ps-0"), 8u);
  EXPECT_FALSE(store_.Get(keys::Move(started->move.move_id()))->has_value());
  // The pods are live (the restart's grace); the next move gets a new id and commits.
  auto next = membership_->BeginMove("ps-0", "ps-1", {0});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->move.move_id(), started->move.move_id() + 1);
  auto committed = membership_->CommitMove(next->move.move_id());
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(*committed, epoch + 3);
  EXPECT_EQ(membership_->View().owner[0], "ps-1");
}

}  // namespace
}  // namespace ps
