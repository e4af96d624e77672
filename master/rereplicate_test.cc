// Re-replication on the master (R = 2), over a real store and fake pods and clock: a lost
// follower's copies are made again on the pods left, a dropped follower that comes back is
// filled, and each step is durable or undone: a failed copy, a destination lost before the
// commit and a master restart mid-copy all leave the ack sets as they were.
#include <stdlib.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "master/master_core.h"
#include "master/master_store.h"

namespace ps {
namespace {

constexpr absl::Duration kLease = absl::Seconds(1);

// Stands in for the pods: records what the master asks; an import runs `on_import` first
// and fails with `fail_import` when set.
class FakePods final : public PodControl {
 public:
  absl::Status ApplyAssignment(const std::string& address, const Assignment& req) override {
    absl::MutexLock lock(&mu);
    assignments[address] = req;
    return absl::OkStatus();
  }
  absl::Status MigrateBegin(const std::string& address, const MigrateBeginRequest& req,
                            MigrateBeginResponse* resp) override {
    return absl::OkStatus();
  }
  absl::Status Checkpoint(const std::string& address, const PodCheckpointRequest& req,
                          PodCheckpointResponse* resp) override {
    return absl::OkStatus();
  }
  absl::Status MigrateImport(const std::string& address, const MigrateImportRequest& req,
                             MigrateImportResponse* resp) override {
    if (on_import) on_import();
    absl::MutexLock lock(&mu);
    imports.emplace_back(address, req);
    if (!fail_import.ok()) return fail_import;
    resp->set_rows(10 * req.vshards_size());
    return absl::OkStatus();
  }

  absl::Mutex mu;
  std::map<std::string, Assignment> assignments;  // the last, by address
  std::vector<std::pair<std::string, MigrateImportRequest>> imports;
  absl::Status fail_import;
  std::function<void()> on_import;
};

class RereplicateTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string templ = std::filesystem::temp_directory_path() / "rereplicate_test.XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
  }
  void TearDown() override {
    core_.reset();
    std::filesystem::remove_all(dir_);
  }

  // A master with `pods` pods ps-0.. registered at ps-i:1 (first start only).
  void Start(uint32_t pods) {
    num_ps_ = pods;
    Reopen();
    for (uint32_t i = 0; i < pods; ++i) Register(absl::StrCat("ps-", i), "1");
  }
  void Reopen() {
    core_.reset();
    MasterOptions o;
    o.data_dir = dir_;
    o.num_vshards = 16;
    o.num_ps = num_ps_;
    o.replication = replication_;
    o.lease = kLease;
    o.clock = [this] { return now_; };
    o.pod_control = pods_;
    o.vshards_per_move = 4;
    o.retention_interval = absl::ZeroDuration();
    o.rereplicate_interval = absl::ZeroDuration();  // rounds run when the test says
    auto core = MasterCore::Open(o);
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = *std::move(core);
  }
  void Register(const std::string& id, const std::string& port) {
    RegisterPodRequest req;
    req.set_pod_id(id);
    req.set_address(id + ":" + port);
    RegisterPodResponse resp;
    ASSERT_TRUE(core_->RegisterPod(req, &resp).ok());
  }
  // Time passes beyond the lease; every pod but `lost` heartbeats meanwhile.
  void Lose(const std::string& lost) {
    ShardMapResponse map = Map();
    now_ += kLease / 2;
    for (const PodInfo& p : map.pods()) {
      if (p.pod_id() == lost || p.state() != PodInfo::LIVE) continue;
      PodHeartbeatRequest req;
      req.set_pod_id(p.pod_id());
      req.set_address(p.address());
      PodHeartbeatResponse resp;
      ASSERT_TRUE(core_->PodHeartbeat(req, &resp).ok());
    }
    now_ += kLease * 3 / 4;
    ASSERT_TRUE(core_->ExpireLeases().ok());
  }
  ShardMapResponse Map() {
    ShardMapResponse map;
    EXPECT_TRUE(core_->GetShardMap(GetShardMapRequest(), &map).ok());
    return map;
  }
  // Per vshard: "owner:follower,follower".
  std::vector<std::string> Copies() {
    const ShardMapResponse map = Map();
    std::vector<std::string> out;
    for (int v = 0; v < map.owner_size(); ++v) {
      std::string s = map.pods(map.owner(v)).pod_id() + ":";
      for (uint32_t f : map.followers(v).pods()) s += map.pods(f).pod_id() + ",";
      out.push_back(s);
    }
    return out;
  }
  // Every vshard has one follower, which is not its owner; with `one_stream`, each
  // primary's vshards share a follower (one stream per primary).
  void ExpectTwoCopiesEach(bool one_stream = true) {
    const ShardMapResponse map = Map();
    std::map<std::string, std::set<std::string>> followers_of;
    for (int v = 0; v < map.owner_size(); ++v) {
      ASSERT_EQ(map.followers(v).pods_size(), 1) << "vshard " << v;
      EXPECT_NE(map.followers(v).pods(0), map.owner(v)) << "vshard " << v;
      followers_of[map.pods(map.owner(v)).pod_id()].insert(
          map.pods(map.followers(v).pods(0)).pod_id());
    }
    if (!one_stream) return;
    for (const auto& [primary, set] : followers_of) EXPECT_EQ(set.size(), 1u) << primary;
  }
  // The vshards pod `address` was last told it follows, by primary.
  std::map<std::string, std::set<uint32_t>> Following(const std::string& address) {
    absl::MutexLock lock(&pods_->mu);
    std::map<std::string, std::set<uint32_t>> out;
    for (const FollowedVShards& f : pods_->assignments[address].replication().following()) {
      out[f.primary()].insert(f.vshards().begin(), f.vshards().end());
    }
    return out;
  }

  std::shared_ptr<FakePods> pods_ = std::make_shared<FakePods>();
  std::string dir_;
  uint32_t num_ps_ = 3;
  uint32_t replication_ = 2;  // set before Start
  absl::Time now_ = absl::FromUnixSeconds(1'000'000);
  std::unique_ptr<MasterCore> core_;
};

TEST_F(RereplicateTest, ALostPodsCopiesAreMadeAgainOnThePodsLeft) {
  Start(3);
  // The ring: ps-0 leads 0-5 (followed by ps-1), ps-1 6-10 (ps-2), ps-2 11-15 (ps-0).
  ASSERT_EQ(Copies()[0], "ps-0:ps-1,");
  Lose("ps-2");
  // ps-0 took over 11-15 with no follower left; 6-10 lost their follower.
  EXPECT_EQ(Copies()[11], "ps-0:");
  EXPECT_EQ(Copies()[6], "ps-1:");
  const uint64_t epoch = Map().epoch();
  ASSERT_TRUE(core_->Rereplicate().ok());
  ExpectTwoCopiesEach();
  // ps-1 already followed ps-0, so it follows 11-15 too; ps-0 follows ps-1's 6-10.
  EXPECT_EQ(Copies()[11], "ps-0:ps-1,");
  EXPECT_EQ(Copies()[6], "ps-1:ps-0,");
  EXPECT_EQ(Following("ps-1:1")["ps-0"],
            (std::set<uint32_t>{0, 1, 2, 3, 4, 5, 11, 12, 13, 14, 15}));
  EXPECT_EQ(Following("ps-0:1")["ps-1"], (std::set<uint32_t>{6, 7, 8, 9, 10}));
  EXPECT_GE(Map().epoch(), epoch + 8);  // begin and commit of each copy
  {
    absl::MutexLock lock(&pods_->mu);
    // Into each new follower from its primary, 5 vshards each in copies of at most 4.
    ASSERT_EQ(pods_->imports.size(), 4u);
  }
  EXPECT_EQ(core_->rereplication_stats().copies, 4u);
  StatusResponse status;
  ASSERT_TRUE(core_->Status(StatusRequest(), &status).ok());
  ASSERT_GE(status.moves_size(), 2);
  EXPECT_TRUE(status.moves(0).follower());
  EXPECT_EQ(status.moves(0).state(), MoveInfo::COMMITTED);
  // Nothing more to do, and a restarted master has the new ack sets.
  ASSERT_TRUE(core_->Rereplicate().ok());
  EXPECT_EQ(core_->rereplication_stats().copies, 4u);
  const std::vector<std::string> before = Copies();
  Reopen();
  EXPECT_EQ(Copies(), before);
}

TEST_F(RereplicateTest, ADroppedFollowerThatComesBackIsFilledAgain) {
  Start(2);
  Lose("ps-1");
  // ps-0 leads everything alone, and no other pod is live: the copies wait.
  for (const std::string& c : Copies()) EXPECT_EQ(c, "ps-0:");
  ASSERT_TRUE(core_->Rereplicate().ok());
  EXPECT_EQ(core_->rereplication_stats().copies, 0u);
  // Back (a new process): it follows everything again once copied, in moves of 4.
  Register("ps-1", "2");
  ASSERT_TRUE(core_->Rereplicate().ok());
  for (const std::string& c : Copies()) EXPECT_EQ(c, "ps-0:ps-1,");
  EXPECT_EQ(core_->rereplication_stats().copies, 4u);
  EXPECT_EQ(Following("ps-1:2")["ps-0"].size(), 16u);
}

TEST_F(RereplicateTest, AFailedCopyLeavesTheAckSetsAsTheyWere) {
  Start(2);
  Lose("ps-1");
  Register("ps-1", "2");
  pods_->fail_import = absl::UnavailableError("pod went away");
  const absl::Status s = core_->Rereplicate();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  for (const std::string& c : Copies()) EXPECT_EQ(c, "ps-0:");
  EXPECT_EQ(core_->rereplication_stats().failures, 1u);
  StatusResponse status;
  ASSERT_TRUE(core_->Status(StatusRequest(), &status).ok());
  ASSERT_GE(status.moves_size(), 1);
  EXPECT_EQ(status.moves(0).state(), MoveInfo::ABORTED);
  EXPECT_TRUE(status.moves(0).follower());
  // The pod is told it receives nothing any more (it drops what it copied).
  {
    absl::MutexLock lock(&pods_->mu);
    EXPECT_EQ(pods_->assignments["ps-1:2"].moving_in_size(), 0);
  }
  // The next round retries.
  pods_->fail_import = absl::OkStatus();
  ASSERT_TRUE(core_->Rereplicate().ok());
  for (const std::string& c : Copies()) EXPECT_EQ(c, "ps-0:ps-1,");
}

TEST_F(RereplicateTest, ADestinationLostBeforeTheCommitIsNotAdded) {
  Start(2);
  Lose("ps-1");
  Register("ps-1", "2");
  // ps-1's lease runs out while it copies: adding it would make ps-0's pushes wait for a
  // pod whose lease loss was already handled.
  pods_->on_import = [this] { now_ += 2 * kLease; };
  const absl::Status s = core_->Rereplicate();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  for (const std::string& c : Copies()) EXPECT_EQ(c, "ps-0:");
}

TEST_F(RereplicateTest, ACopyInFlightAtAMasterRestartIsAborted) {
  Start(2);
  Lose("ps-1");
  Register("ps-1", "2");
  const uint64_t epoch = Map().epoch();
  core_.reset();
  {
    // The dead master had recorded a copy of vshards 0-3 into ps-1.
    auto store = MasterStore::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    MoveRecord move;
    move.set_move_id(9);
    for (uint32_t v : {0, 1, 2, 3}) move.add_vshards(v);
    move.set_source("ps-0");
    move.set_destination("ps-1");
    move.set_follower(true);
    StoreBatch batch;
    batch.Put("move/00000000000000000009", move);
    ASSERT_TRUE((*store)->Write(batch).ok());
  }
  Reopen();
  EXPECT_GT(Map().epoch(), epoch);
  EXPECT_EQ(Map().moves_size(), 0);
  for (const std::string& c : Copies()) EXPECT_EQ(c, "ps-0:");
  Register("ps-1", "2");  // its lease, given afresh at the restart, is renewed
  ASSERT_TRUE(core_->Rereplicate().ok());
  for (const std::string& c : Copies()) EXPECT_EQ(c, "ps-0:ps-1,");
}

TEST_F(RereplicateTest, ADrainAtTwoCopiesMovesBothRolesAndKeepsTwoCopies) {
  Start(4);  // the ring over ps-0..3, 4 vshards each
  DrainRequest req;
  req.set_pod_id("ps-1");
  DrainResponse resp;
  ASSERT_TRUE(core_->Drain(req, &resp).ok());
  ExpectTwoCopiesEach(/*one_stream=*/false);
  for (const std::string& c : Copies()) {
    EXPECT_EQ(c.find("ps-1"), std::string::npos) << c;
  }
  // ps-1 was told at each commit that it no longer follows what it followed (told only at
  // its next heartbeat, it would accept its old primaries' records meanwhile).
  EXPECT_TRUE(Following("ps-1:1").empty());
  // Durable: a restarted master has the same copies.
  const std::vector<std::string> before = Copies();
  Reopen();
  EXPECT_EQ(Copies(), before);
}

TEST_F(RereplicateTest, AMovedPrimarysFollowersAreToldAtTheCommit) {
  Start(3);
  Register("ps-3", "1");
  RebalanceResponse resp;
  ASSERT_TRUE(core_->Rebalance(RebalanceRequest(), &resp).ok());
  ASSERT_GT(resp.moved_vshards(), 0u);
  // Each vshard ps-3 now leads kept its follower, which was told its new primary by the
  // commit, without a heartbeat: told later, it would refuse ps-3's records meanwhile, and
  // ps-3's pushes to the vshards would wait for it.
  const ShardMapResponse map = Map();
  int moved = 0;
  for (int v = 0; v < map.owner_size(); ++v) {
    if (map.pods(map.owner(v)).pod_id() != "ps-3") continue;
    ++moved;
    ASSERT_EQ(map.followers(v).pods_size(), 1) << "vshard " << v;
    const PodInfo& follower = map.pods(map.followers(v).pods(0));
    EXPECT_EQ(Following(follower.address())["ps-3"].count(v), 1u)
        << "vshard " << v << ": follower " << follower.pod_id() << " was not told";
  }
  EXPECT_EQ(moved, static_cast<int>(resp.moved_vshards()));
}

TEST_F(RereplicateTest, AMoveWhoseSourceFailedOverMeanwhileIsNotCommitted) {
  Start(3);
  // ps-1 dies while its vshards 6-9 are copied away: ps-2, its follower, takes them over,
  // and may take pushes the copy does not have. The move must not commit.
  bool lost = false;
  pods_->on_import = [this, &lost] {
    if (!lost) Lose("ps-1");
    lost = true;
  };
  DrainRequest req;
  req.set_pod_id("ps-1");
  DrainResponse resp;
  const absl::Status s = core_->Drain(req, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  for (uint32_t v = 6; v < 11; ++v) EXPECT_EQ(Copies()[v], "ps-2:") << v;
}

TEST_F(RereplicateTest, AtThreeCopiesAFailoverRecopiesTheOtherFollowers) {
  // R = 3 over 4 pods: ps-0 leads 0-3, followed by ps-1 and ps-2.
  replication_ = 3;
  Start(4);
  ASSERT_EQ(Copies()[0], "ps-0:ps-1,ps-2,");
  Lose("ps-0");
  // ps-1 is promoted. ps-2 may lack records ps-0 shipped to ps-1 only (not acknowledged):
  // a retry of one is a duplicate at ps-1, so ps-2 would never get it, and a second
  // failover to ps-2 would lose it. ps-2 leaves the ack set: ps-1 has one copy until
  // re-replication.
  for (uint32_t v = 0; v < 4; ++v) EXPECT_EQ(Copies()[v], "ps-1:") << v;
  EXPECT_TRUE(Following("ps-2:1")["ps-0"].empty());
  const std::set<uint32_t> ps2_followed_ps1 = Following("ps-2:1")["ps-1"];
  for (uint32_t v = 0; v < 4; ++v) EXPECT_EQ(ps2_followed_ps1.count(v), 0u) << v;
  // Re-replication copies ps-1's state (rows and push keys) to two followers again: ps-2,
  // which already follows ps-1's own vshards, among them.
  ASSERT_TRUE(core_->Rereplicate().ok());
  const ShardMapResponse map = Map();
  for (int v = 0; v < map.owner_size(); ++v) {
    EXPECT_EQ(map.followers(v).pods_size(), 2) << "vshard " << v;
    if (v >= 4) continue;
    std::set<std::string> followers;
    for (uint32_t f : map.followers(v).pods()) followers.insert(map.pods(f).pod_id());
    EXPECT_EQ(map.pods(map.owner(v)).pod_id(), "ps-1") << v;
    EXPECT_EQ(followers, (std::set<std::string>{"ps-2", "ps-3"})) << "vshard " << v;
  }
  {
    absl::MutexLock lock(&pods_->mu);
    std::set<uint32_t> into_ps2;
    for (const auto& [address, req] : pods_->imports) {
      if (address == "ps-2:1") into_ps2.insert(req.vshards().begin(), req.vshards().end());
    }
    for (uint32_t v = 0; v < 4; ++v) EXPECT_EQ(into_ps2.count(v), 1u) << v;
  }
}

TEST_F(RereplicateTest, AtTwoCopiesAFailoverKeepsNoFollowerToRecopy) {
  // R = 2: the promoted follower was the only one; nothing else leaves an ack set.
  Start(3);
  Lose("ps-0");
  for (uint32_t v = 0; v < 6; ++v) EXPECT_EQ(Copies()[v], "ps-1:") << v;
  EXPECT_EQ(Copies()[6], "ps-1:ps-2,");
}

}  // namespace
}  // namespace ps
