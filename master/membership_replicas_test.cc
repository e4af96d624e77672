// Membership with replication (R = 2, 3 pods), over an in-memory store and a fake clock:
// the first map's followers, the roles pods are told, failover on a primary's lease loss
// (durable: a reopened master has it), a lost follower leaving the ack set, and what stays
// refused (moves, another R for the data dir), and a pod that comes back without its data
// (another storage id) or with a log that lost its tail (a periodic crash) losing its
// copies at once.
#include <algorithm>
#include <map>

#include "gtest/gtest.h"
#include "master/cluster_config.h"
#include "master/membership.h"
#include "master/memory_store_for_test.h"

namespace ps {
namespace {

class ReplicasTest : public testing::Test {
 protected:
  void SetUp() override { Start(/*replication=*/2); }

  void Start(uint32_t replication) {
    options_.num_vshards = 12;
    options_.num_ps = 3;
    options_.replication = replication;
    options_.lease = absl::Seconds(1);
    options_.clock = [this] { return now_; };
    auto config = LoadOrCreateCluster(store_, options_);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    Open();
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(Register(absl::StrCat("ps-", i), absl::StrCat("h:", i)).ok());
    }
  }

  void Open() {
    counters_ = std::make_unique<CountersRecord>(&store_);
    membership_ = std::make_unique<Membership>(options_, config_, &store_, counters_.get());
    ASSERT_TRUE(counters_->Load().ok());
    ASSERT_TRUE(membership_->Load(now_ + options_.lease).ok());
  }

  absl::Status Register(const std::string& id, const std::string& address,
                        const std::string& storage_id = "", bool fresh = false,
                        std::vector<std::string>* tell = nullptr) {
    RegisterPodRequest req;
    req.set_pod_id(id);
    req.set_address(address);
    req.set_storage_id(storage_id);
    req.set_fresh_storage(fresh);
    RegisterPodResponse resp;
    return membership_->RegisterPod(req, &resp, nullptr, tell);
  }
  // A registration after a crash whose log may lack records it acknowledged (periodic
  // durability: RegisterPodRequest.log_tail_lost), with the storage id it had.
  absl::Status RegisterWithLostTail(const std::string& id, const std::string& address,
                                    std::vector<std::string>* tell = nullptr) {
    RegisterPodRequest req;
    req.set_pod_id(id);
    req.set_address(address);
    req.set_log_tail_lost(true);
    RegisterPodResponse resp;
    return membership_->RegisterPod(req, &resp, nullptr, tell);
  }
  // `unheld`: the lag report a primary sends, follower -> records not yet acknowledged.
  void Heartbeat(const std::string& id, const std::string& address,
                 const std::map<std::string, uint64_t>& unheld = {}) {
    PodHeartbeatRequest req;
    req.set_pod_id(id);
    req.set_address(address);
    for (const auto& [follower, records] : unheld) {
      FollowerLag* lag = req.add_followers();
      lag->set_follower(follower);
      lag->set_records(records);
      lag->set_bytes(records * 100);
    }
    PodHeartbeatResponse resp;
    ASSERT_TRUE(membership_->PodHeartbeat(req, &resp).ok());
  }
  PodAssignment AssignmentOf(const std::string& id) {
    return membership_->AssignmentOf(id)->assignment;
  }
  ShardMapResponse Map() {
    ShardMapResponse map;
    EXPECT_TRUE(membership_->GetShardMap(GetShardMapRequest(), &map).ok());
    return map;
  }
  std::string OwnerOf(const ShardMapResponse& map, uint32_t v) {
    return map.pods(map.owner(v)).pod_id();
  }
  std::vector<std::string> FollowersOf(const ShardMapResponse& map, uint32_t v) {
    std::vector<std::string> out;
    for (uint32_t p : map.followers(v).pods()) out.push_back(map.pods(p).pod_id());
    return out;
  }

  MasterOptions options_;
  absl::Time now_ = absl::FromUnixSeconds(1'000'000);
  MemoryStore store_;
  ClusterConfig config_;
  std::unique_ptr<CountersRecord> counters_;
  std::unique_ptr<Membership> membership_;
};

TEST_F(ReplicasTest, EachPrimaryHasTheNextPodAsItsFollower) {
  const ShardMapResponse map = Map();
  EXPECT_EQ(map.replication(), 2u);
  ASSERT_EQ(map.followers_size(), 12);
  for (uint32_t v = 0; v < 12; ++v) {
    const std::string owner = OwnerOf(map, v);
    const int i = owner.back() - '0';
    EXPECT_EQ(FollowersOf(map, v), std::vector<std::string>{absl::StrCat("ps-", (i + 1) % 3)});
  }
  // ps-0 ships to ps-1 and follows ps-2's vshards 8..11.
  const ReplicationRole role = AssignmentOf("ps-0").replication();
  EXPECT_EQ(role.pod_id(), "ps-0");
  EXPECT_EQ(role.factor(), 2u);
  ASSERT_EQ(role.followers_size(), 1);
  EXPECT_EQ(role.followers(0).pod_id(), "ps-1");
  EXPECT_EQ(role.followers(0).address(), "h:1");
  ASSERT_EQ(role.following_size(), 1);
  EXPECT_EQ(role.following(0).primary(), "ps-2");
  EXPECT_EQ(
      std::vector<uint32_t>(role.following(0).vshards().begin(), role.following(0).vshards().end()),
      (std::vector<uint32_t>{8, 9, 10, 11}));
}

TEST_F(ReplicasTest, LostPrimaryIsReplacedByItsFollowerDurably) {
  const uint64_t epoch = Map().epoch();
  now_ += absl::Milliseconds(700);
  Heartbeat("ps-1", "h:1");
  Heartbeat("ps-2", "h:2");
  now_ += absl::Milliseconds(700);  // ps-0's lease (1 s) ran out; the others' did not
  std::vector<std::string> tell = membership_->ExpireLeases(now_);
  std::sort(tell.begin(), tell.end());
  // ps-1 now leads ps-0's vshards; ps-2 lost its follower ps-0 (of ps-2's vshards).
  EXPECT_EQ(tell, (std::vector<std::string>{"ps-0", "ps-1", "ps-2"}));
  EXPECT_EQ(membership_->failovers(), 1u);
  const ShardMapResponse map = Map();
  EXPECT_EQ(map.epoch(), epoch + 1);
  for (uint32_t v = 0; v < 4; ++v) {
    EXPECT_EQ(OwnerOf(map, v), "ps-1") << v;
    EXPECT_TRUE(FollowersOf(map, v).empty()) << v;  // one copy left until re-replication
  }
  for (uint32_t v = 8; v < 12; ++v) EXPECT_TRUE(FollowersOf(map, v).empty()) << v;
  EXPECT_TRUE(AssignmentOf("ps-2").replication().followers().empty());
  EXPECT_EQ(AssignmentOf("ps-0").owned_vshards_size(), 0);  // the deposed pod owns nothing
  // Nothing happens twice, and a restarted master has the same map.
  EXPECT_TRUE(membership_->ExpireLeases(now_).empty());
  Open();
  const ShardMapResponse reopened = Map();
  EXPECT_EQ(reopened.epoch(), map.epoch());
  for (uint32_t v = 0; v < 12; ++v) EXPECT_EQ(OwnerOf(reopened, v), OwnerOf(map, v));
}

TEST_F(ReplicasTest, NoLiveFollowerLeavesTheVShardWithItsPrimary) {
  now_ += absl::Milliseconds(700);
  Heartbeat("ps-2", "h:2");
  now_ += absl::Milliseconds(700);  // ps-0 and its follower ps-1 both lost
  membership_->ExpireLeases(now_);
  const ShardMapResponse map = Map();
  for (uint32_t v = 0; v < 4; ++v) EXPECT_EQ(OwnerOf(map, v), "ps-0") << v;
  for (uint32_t v = 4; v < 8; ++v) EXPECT_EQ(OwnerOf(map, v), "ps-2") << v;  // ps-1's, moved
}

TEST_F(ReplicasTest, PodBackWithAnotherStorageLosesItsCopiesAtOnce) {
  // The pods' first registrations with their storage ids (SetUp's carried none).
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        Register(absl::StrCat("ps-", i), absl::StrCat("h:", i), absl::StrCat("disk-", i)).ok());
  }
  const uint64_t epoch = Map().epoch();
  EXPECT_EQ(membership_->storage_losses(), 0u);
  // ps-0 restarts with its data (same id, same address, lease live): nothing changes.
  ASSERT_TRUE(Register("ps-0", "h:0", "disk-0").ok());
  EXPECT_EQ(Map().epoch(), epoch);
  EXPECT_EQ(membership_->storage_losses(), 0u);

  // ps-0 restarts at once, its volume gone (a new database): its lease is still live, but
  // its follower ps-1 leads its vshards now, and it leaves ps-2's ack set.
  std::vector<std::string> tell;
  ASSERT_TRUE(Register("ps-0", "h:0", "disk-0b", /*fresh=*/true, &tell).ok());
  std::sort(tell.begin(), tell.end());
  EXPECT_EQ(tell, (std::vector<std::string>{"ps-1", "ps-2"}));
  EXPECT_EQ(membership_->storage_losses(), 1u);
  EXPECT_EQ(membership_->failovers(), 1u);
  const ShardMapResponse map = Map();
  EXPECT_EQ(map.epoch(), epoch + 1);
  for (uint32_t v = 0; v < 4; ++v) {
    EXPECT_EQ(OwnerOf(map, v), "ps-1") << v;
    EXPECT_TRUE(FollowersOf(map, v).empty()) << v;
  }
  for (uint32_t v = 8; v < 12; ++v) EXPECT_TRUE(FollowersOf(map, v).empty()) << v;
  const PodAssignment a = AssignmentOf("ps-0");
  EXPECT_EQ(a.owned_vshards_size(), 0);  // it holds nothing until re-replication
  EXPECT_TRUE(a.replication().following().empty());

  // The new id is recorded durably: the same registration again, or after a master
  // restart, loses nothing more.
  ASSERT_TRUE(Register("ps-0", "h:0", "disk-0b", /*fresh=*/false).ok());
  Open();
  ASSERT_TRUE(Register("ps-0", "h:0", "disk-0b", /*fresh=*/false).ok());
  EXPECT_EQ(Map().epoch(), epoch + 1);
  EXPECT_EQ(membership_->storage_losses(), 0u);  // counted since this master started
  // At a new address too, after its lease: another id is a loss, the same one is not.
  now_ += absl::Seconds(2);
  ASSERT_TRUE(Register("ps-1", "h:1", "disk-1").ok());
  ASSERT_TRUE(Register("ps-2", "h:2", "disk-2").ok());
  ASSERT_TRUE(Register("ps-0", "h:0b", "disk-0b").ok());
  EXPECT_EQ(membership_->storage_losses(), 0u);
  ASSERT_TRUE(Register("ps-1", "h:1", "disk-1c", /*fresh=*/true).ok());
  EXPECT_EQ(membership_->storage_losses(), 1u);
}

TEST_F(ReplicasTest, FreshDataWhereNoStorageIdWasRecordedIsALoss) {
  // SetUp registered the pods without ids (an older pod). ps-1 comes back with a fresh
  // database: it had data, so its copies are gone; ps-2 comes back with an existing one.
  ASSERT_TRUE(Register("ps-2", "h:2", "disk-2", /*fresh=*/false).ok());
  EXPECT_EQ(membership_->storage_losses(), 0u);
  ASSERT_TRUE(Register("ps-1", "h:1", "disk-1", /*fresh=*/true).ok());
  EXPECT_EQ(membership_->storage_losses(), 1u);
  const ShardMapResponse map = Map();
  for (uint32_t v = 4; v < 8; ++v) EXPECT_EQ(OwnerOf(map, v), "ps-2") << v;
  for (uint32_t v = 0; v < 4; ++v) EXPECT_TRUE(FollowersOf(map, v).empty()) << v;
}

// A periodic primary SIGKILLed and back at once (same address, lease live) lost up to
// --flush_ms of its log, which its follower holds: it must not lead its vshards (nor stay
// in ps-2's ack set, since it may lack what it acknowledged to ps-2). Before the fix it kept
// them: the replicas differed and acknowledged pushes were lost (crash_test_periodic_r2).
TEST_F(ReplicasTest, PodBackWithALostLogTailGivesUpItsCopiesAtOnce) {
  const uint64_t epoch = Map().epoch();
  std::vector<std::string> tell;
  ASSERT_TRUE(RegisterWithLostTail("ps-0", "h:0", &tell).ok());
  std::sort(tell.begin(), tell.end());
  EXPECT_EQ(tell, (std::vector<std::string>{"ps-1", "ps-2"}));
  EXPECT_EQ(membership_->log_tail_losses(), 1u);
  EXPECT_EQ(membership_->failovers(), 1u);
  EXPECT_EQ(membership_->storage_losses(), 0u);
  const ShardMapResponse map = Map();
  EXPECT_EQ(map.epoch(), epoch + 1);
  for (uint32_t v = 0; v < 4; ++v) {
    EXPECT_EQ(OwnerOf(map, v), "ps-1") << v;  // its follower, which holds the whole log
    EXPECT_TRUE(FollowersOf(map, v).empty()) << v;
  }
  for (uint32_t v = 8; v < 12; ++v) EXPECT_TRUE(FollowersOf(map, v).empty()) << v;
  const PodAssignment a = AssignmentOf("ps-0");
  EXPECT_EQ(a.owned_vshards_size(), 0);  // it holds nothing until re-replication refills it
  EXPECT_TRUE(a.replication().following().empty());
  EXPECT_TRUE(AssignmentOf("ps-2").replication().followers().empty());
  // Recorded durably: a restarted master has the same map.
  Open();
  const ShardMapResponse reopened = Map();
  EXPECT_EQ(reopened.epoch(), map.epoch());
  for (uint32_t v = 0; v < 12; ++v) EXPECT_EQ(OwnerOf(reopened, v), OwnerOf(map, v)) << v;
}

TEST_F(ReplicasTest, ARestartAfterACleanCloseKeepsItsCopies) {
  // The same restart without the flag (a clean close, or a mode that writes before it
  // acknowledges): the pod keeps leading and following, nothing is written.
  const ShardMapResponse before = Map();
  ASSERT_TRUE(Register("ps-0", "h:0").ok());
  const ShardMapResponse after = Map();
  EXPECT_EQ(after.epoch(), before.epoch());
  EXPECT_EQ(membership_->failovers(), 0u);
  EXPECT_EQ(membership_->log_tail_losses(), 0u);
  for (uint32_t v = 0; v < 12; ++v) {
    EXPECT_EQ(OwnerOf(after, v), OwnerOf(before, v)) << v;
    EXPECT_EQ(FollowersOf(after, v), FollowersOf(before, v)) << v;
  }
}

class OneCopyTest : public ReplicasTest {
 protected:
  void SetUp() override { Start(/*replication=*/1); }
};

TEST_F(OneCopyTest, ALostLogTailChangesNothing) {
  const ShardMapResponse before = Map();
  ASSERT_TRUE(RegisterWithLostTail("ps-0", "h:0").ok());
  const ShardMapResponse after = Map();
  EXPECT_EQ(after.epoch(), before.epoch());
  for (uint32_t v = 0; v < 12; ++v) EXPECT_EQ(OwnerOf(after, v), OwnerOf(before, v)) << v;
  EXPECT_EQ(membership_->log_tail_losses(), 0u);
}

// R = 3: ps-0's vshards 0..3 have the followers ps-1 and ps-2.
class ThreeCopiesTest : public ReplicasTest {
 protected:
  void SetUp() override { Start(/*replication=*/3); }

  // ps-0 reports `unheld`, then its lease runs out while ps-1 and ps-2 stay live.
  void LosePs0After(const std::map<std::string, uint64_t>& unheld) {
    ASSERT_EQ(FollowersOf(Map(), 0), (std::vector<std::string>{"ps-1", "ps-2"}));
    Heartbeat("ps-0", "h:0", unheld);
    now_ += absl::Milliseconds(700);
    Heartbeat("ps-1", "h:1");
    Heartbeat("ps-2", "h:2");
    now_ += absl::Milliseconds(700);
    membership_->ExpireLeases(now_);
  }
};

TEST_F(ThreeCopiesTest, FailoverPromotesTheFollowerHoldingTheMostOfTheLog) {
  // ps-2 is first in nothing but holds everything ps-0 shipped; ps-1 lags by 7 records.
  LosePs0After({{"ps-1", 7}, {"ps-2", 0}});
  const ShardMapResponse map = Map();
  for (uint32_t v = 0; v < 4; ++v) {
    EXPECT_EQ(OwnerOf(map, v), "ps-2") << v;
    // ps-1 may lack what ps-2 holds: out of the ack set until re-replication copies it.
    EXPECT_TRUE(FollowersOf(map, v).empty()) << v;
  }
}

TEST_F(ThreeCopiesTest, EqualOrUnreportedFollowersKeepTheAckSetOrder) {
  LosePs0After({{"ps-1", 3}, {"ps-2", 3}});
  EXPECT_EQ(OwnerOf(Map(), 0), "ps-1");
}

TEST_F(ThreeCopiesTest, AReportedFollowerIsPreferredToAnUnreportedOne) {
  LosePs0After({{"ps-2", 12}});
  EXPECT_EQ(OwnerOf(Map(), 0), "ps-2");
}

TEST_F(ReplicasTest, MovesAndAnotherFactorAreRefused) {
  EXPECT_EQ(membership_->BeginMove("ps-0", "ps-1", {0}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  MasterOptions other = options_;
  other.replication = 3;
  EXPECT_EQ(LoadOrCreateCluster(store_, other).status().code(),
            absl::StatusCode::kFailedPrecondition);
  other.replication = 4;  // more copies than pods
  EXPECT_EQ(ValidateMasterOptions(other).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps
