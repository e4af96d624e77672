// Membership with replication (R = 2, 3 pods: ps-i's vshards followed by ps-(i+1)), over an
// in-memory store and a fake clock: a primary's report of a lagging or unreachable follower
// takes it out of that primary's ack sets (durably, with an epoch bump, counted) and the
// report's answer already carries the role without it; a report under the bound, or about
// a pod that is not the reporter's follower, changes nothing; status and shards show the
// lags.
#include "gtest/gtest.h"
#include "master/cluster_config.h"
#include "master/membership.h"
#include "master/memory_store_for_test.h"

namespace ps {
namespace {

class LagReportTest : public testing::Test {
 protected:
  void SetUp() override {
    options_.num_vshards = 12;
    options_.num_ps = 3;
    options_.replication = 2;
    options_.lease = absl::Seconds(10);
    options_.replication_max_lag = absl::Milliseconds(500);
    options_.clock = [this] { return now_; };
    auto config = LoadOrCreateCluster(store_, options_);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    Open();
    for (int i = 0; i < 3; ++i) {
      RegisterPodRequest req;
      req.set_pod_id(absl::StrCat("ps-", i));
      req.set_address(absl::StrCat("h:", i));
      RegisterPodResponse resp;
      ASSERT_TRUE(membership_->RegisterPod(req, &resp, nullptr).ok());
    }
  }

  void Open() {
    counters_ = std::make_unique<CountersRecord>(&store_);
    membership_ = std::make_unique<Membership>(options_, config_, &store_, counters_.get());
    ASSERT_TRUE(counters_->Load().ok());
    ASSERT_TRUE(membership_->Load(now_ + options_.lease).ok());
  }

  // ps-`primary` heartbeats, reporting `follower` `lag_ms` behind; returns its new role.
  ReplicationRole Report(int primary, int follower, uint64_t lag_ms) {
    PodHeartbeatRequest req;
    req.set_pod_id(absl::StrCat("ps-", primary));
    req.set_address(absl::StrCat("h:", primary));
    FollowerLag* f = req.add_followers();
    f->set_follower(absl::StrCat("ps-", follower));
    f->set_records(7);
    f->set_bytes(700);
    f->set_lag_ms(lag_ms);
    f->set_failed_calls(3);
    PodHeartbeatResponse resp;
    EXPECT_TRUE(membership_->PodHeartbeat(req, &resp).ok());
    return resp.assignment().replication();
  }
  std::vector<std::string> FollowersOf(const ShardMapResponse& map, uint32_t v) {
    std::vector<std::string> out;
    for (uint32_t p : map.followers(v).pods()) out.push_back(map.pods(p).pod_id());
    return out;
  }
  ShardMapResponse Map() {
    ShardMapResponse map;
    EXPECT_TRUE(membership_->GetShardMap(GetShardMapRequest(), &map).ok());
    return map;
  }
  StatusResponse Status() {
    StatusResponse s;
    membership_->Describe(now_, &s);
    return s;
  }

  MasterOptions options_;
  absl::Time now_ = absl::FromUnixSeconds(1'000'000);
  MemoryStore store_;
  ClusterConfig config_;
  std::unique_ptr<CountersRecord> counters_;
  std::unique_ptr<Membership> membership_;
};

TEST_F(LagReportTest, LaggingFollowerLeavesTheReportersAckSetsDurably) {
  const uint64_t epoch = Map().epoch();
  const ReplicationRole role = Report(0, 1, 500);
  EXPECT_EQ(role.max_lag_ms(), 500u);
  EXPECT_TRUE(role.followers().empty());  // the answer already acknowledges without ps-1
  const ShardMapResponse map = Map();
  EXPECT_EQ(map.epoch(), epoch + 1);
  for (uint32_t v = 0; v < 4; ++v) EXPECT_TRUE(FollowersOf(map, v).empty()) << v;
  // The other primaries' ack sets are untouched: ps-1 still ships to ps-2, ps-2 to ps-0.
  for (uint32_t v = 4; v < 8; ++v) EXPECT_EQ(FollowersOf(map, v), std::vector<std::string>{"ps-2"});
  for (uint32_t v = 8; v < 12; ++v)
    EXPECT_EQ(FollowersOf(map, v), std::vector<std::string>{"ps-0"});
  EXPECT_EQ(membership_->ack_set_removals_lag(), 4u);
  EXPECT_EQ(membership_->ack_set_removals_lease(), 0u);
  // ps-1 no longer follows ps-0's vshards.
  for (const FollowedVShards& f :
       membership_->AssignmentOf("ps-1")->assignment.replication().following()) {
    EXPECT_NE(f.primary(), "ps-0");
  }

  const StatusResponse s = Status();
  ASSERT_TRUE(s.has_replication());
  EXPECT_EQ(s.replication().factor(), 2u);
  EXPECT_EQ(s.replication().removed_lag(), 4u);
  EXPECT_EQ(s.replication().under_replicated_vshards(), 4u);
  ASSERT_EQ(s.replication().lags_size(), 1);
  EXPECT_EQ(s.replication().lags(0).primary(), "ps-0");
  EXPECT_EQ(s.replication().lags(0).lag().follower(), "ps-1");

  // The same report again changes nothing (ps-1 is already out).
  Report(0, 1, 900);
  EXPECT_EQ(Map().epoch(), epoch + 1);
  EXPECT_EQ(membership_->ack_set_removals_lag(), 4u);

  // A restarted master has the map without ps-1 in ps-0's ack sets.
  Open();
  const ShardMapResponse reopened = Map();
  EXPECT_EQ(reopened.epoch(), epoch + 1);
  for (uint32_t v = 0; v < 4; ++v) EXPECT_TRUE(FollowersOf(reopened, v).empty()) << v;
}

TEST_F(LagReportTest, ReportUnderTheBoundIsShownAndChangesNothing) {
  const uint64_t epoch = Map().epoch();
  const ReplicationRole role = Report(0, 1, 499);
  ASSERT_EQ(role.followers_size(), 1);
  EXPECT_EQ(role.followers(0).pod_id(), "ps-1");
  now_ += absl::Milliseconds(250);
  const ShardMapResponse map = Map();
  EXPECT_EQ(map.epoch(), epoch);
  ASSERT_EQ(map.lags_size(), 1);
  EXPECT_EQ(map.lags(0).primary(), "ps-0");
  EXPECT_EQ(map.lags(0).lag().records(), 7u);
  EXPECT_EQ(map.lags(0).lag().lag_ms(), 499u);
  EXPECT_EQ(map.lags(0).reported_ms_ago(), 250);
  EXPECT_EQ(Status().replication().under_replicated_vshards(), 0u);
  EXPECT_EQ(membership_->ack_set_removals_lag(), 0u);
}

TEST_F(LagReportTest, ReportAboutAnotherPrimarysFollowerChangesNothing) {
  const uint64_t epoch = Map().epoch();
  Report(0, 2, 10'000);  // ps-2 follows ps-1, not ps-0
  const ShardMapResponse map = Map();
  EXPECT_EQ(map.epoch(), epoch);
  for (uint32_t v = 4; v < 8; ++v) EXPECT_EQ(FollowersOf(map, v), std::vector<std::string>{"ps-2"});
  EXPECT_EQ(membership_->ack_set_removals_lag(), 0u);
}

}  // namespace
}  // namespace ps
