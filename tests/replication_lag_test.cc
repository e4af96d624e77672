// A follower alive but unreachable from its primary, in process on loopback: a master
// (R = 2) and two pods (PsServer + MasterAgent), ps-0's replication calls to its follower
// ps-1 made to fail while ps-1 keeps heartbeating. ps-0 reports ps-1's lag to the master,
// which takes ps-1 out of ps-0's ack sets (epoch + 1, counted as a lag removal, not a lease
// loss or a failover); the push that waited for ps-1 is then acknowledged, with no push
// hanging for good. Timing is never asserted: the test waits for each state, under
// ctest's timeout.
#include <stdlib.h>

#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/routing/hash.h"
#include "gtest/gtest.h"
#include "master/master_server.h"
#include "proto/packed.h"
#include "ps/master_agent.h"
#include "ps/ps_server.h"

namespace ps {
namespace {

constexpr uint32_t kVShards = 16;
constexpr uint32_t kDim = 4;

// Forwards to the real gRPC sender while open; fails every call while closed (the
// follower is alive, but this pod cannot reach it).
class GateSender : public ReplicaSender {
 public:
  explicit GateSender(std::shared_ptr<ReplicaSender> real) : real_(std::move(real)) {}
  void Close() { open_.store(false); }
  int failed() const { return failed_.load(); }
  absl::Status Send(const ReplicaPeer& follower, const ReplicateRecordsRequest& req,
                    ReplicateRecordsResponse* resp) override {
    if (!open_.load()) {
      failed_.fetch_add(1);
      return absl::UnavailableError("gate closed: the follower is unreachable");
    }
    return real_->Send(follower, req, resp);
  }

 private:
  const std::shared_ptr<ReplicaSender> real_;
  std::atomic<bool> open_{true};
  std::atomic<int> failed_{0};
};

template <typename F>
void WaitFor(F done) {
  while (!done()) absl::SleepFor(absl::Milliseconds(10));
}

class ReplicationLagTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string templ = std::filesystem::temp_directory_path() / "replication_lag_test.XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    MasterServerOptions mo;
    mo.host = "127.0.0.1";
    mo.core.data_dir = dir_ + "/master";
    mo.core.num_vshards = kVShards;
    mo.core.num_ps = 2;
    mo.core.replication = 2;
    // A long lease: ps-1 never loses it, however busy the machine; only the lag report
    // can take it out of the ack set.
    mo.core.lease = absl::Seconds(30);
    mo.core.replication_max_lag = absl::Milliseconds(300);
    auto master = MasterServer::Start(mo);
    ASSERT_TRUE(master.ok()) << master.status();
    master_ = *std::move(master);
    // The table first: a pod's registration brings the catalog.
    CreateTableRequest req;
    req.mutable_spec()->set_name("emb");
    req.mutable_spec()->set_dim(kDim);
    req.mutable_spec()->mutable_optimizer()->set_kind(OptimizerSpec::SGD);
    CreateTableResponse created;
    ASSERT_TRUE(master_->core().CreateTable(req, &created).ok());
    gate_ = std::make_shared<GateSender>(NewGrpcReplicaSender(ChannelMaker(), absl::Seconds(5)));
    for (int i = 0; i < 2; ++i) {
      PsServerOptions po;
      po.host = "127.0.0.1";
      if (i == 0) po.core.replica_sender = gate_;
      auto pod = PsServer::Start(po, *ShardOwnership::Create(kVShards, 0, {}));
      ASSERT_TRUE(pod.ok()) << pod.status();
      pods_.push_back(*std::move(pod));
    }
    // ps-1 registers first, so ps-0's registration already names its follower's address
    // (heartbeats, every 10 s here, would bring it otherwise).
    agents_.resize(2);
    for (int i : {1, 0}) {
      MasterAgentOptions ao;
      ao.master = absl::StrCat("127.0.0.1:", master_->port());
      ao.pod_id = absl::StrCat("ps-", i);
      ao.address = absl::StrCat("127.0.0.1:", pods_[i]->port());
      ao.num_vshards = kVShards;
      auto agent = MasterAgent::Start(ao, &pods_[i]->core());
      ASSERT_TRUE(agent.ok()) << agent.status();
      agents_[i] = *std::move(agent);
      WaitFor([&] { return agents_[i]->registered(); });
    }
    WaitFor([&] {
      for (auto& pod : pods_) {
        if (pod->core().store().FindTable("emb") == nullptr) return false;
        if (pod->core().ownership()->owned_count() == 0) return false;
      }
      return !pods_[0]->core().replication_stats().followers.empty() &&
             pods_[1]->core().replication_stats().following > 0;
    });
  }
  void TearDown() override {
    agents_.clear();
    for (auto& pod : pods_) pod->Shutdown(0);
    pods_.clear();
    master_->Shutdown(0);
    master_.reset();
    std::filesystem::remove_all(dir_);
  }

  // A push of ids ps-0 owns (the primary under test).
  PushRequest PushToPs0(uint64_t seq) {
    PsCore& core = pods_[0]->core();
    const auto table = core.store().FindTable("emb");
    const auto own = core.ownership();
    std::vector<int64_t> ids;
    for (int64_t id = 0; ids.size() < 8; ++id) {
      if (own->Owns(VShardOf(RouteHash(table->name_hash(), id), kVShards))) ids.push_back(id);
    }
    PushRequest req;
    TableGrads* t = req.add_tables();
    t->set_table("emb");
    t->set_ids(Pack<int64_t>(ids));
    t->set_grads(Pack<float>(std::vector<float>(ids.size() * kDim, 1.0f)));
    t->set_learning_rate(1.0f);
    req.mutable_key()->set_worker_id(7);
    req.mutable_key()->set_incarnation(1);
    req.mutable_key()->set_sequence(seq);
    req.set_epoch(own->epoch());
    return req;
  }
  StatusResponse Status() {
    StatusResponse s;
    EXPECT_TRUE(master_->core().Status(StatusRequest(), &s).ok());
    return s;
  }

  std::string dir_;
  std::unique_ptr<MasterServer> master_;
  std::shared_ptr<GateSender> gate_;
  std::vector<std::unique_ptr<PsServer>> pods_;
  std::vector<std::unique_ptr<MasterAgent>> agents_;
};

TEST_F(ReplicationLagTest, UnreachableFollowerIsReportedAndDroppedThenPushesFlow) {
  PushResponse resp;
  ASSERT_TRUE(pods_[0]->core().Push(PushToPs0(1), &resp).ok());  // held by both
  const uint64_t epoch = Status().epoch();

  gate_->Close();
  absl::Notification acked;
  absl::Status result;
  PushResponse waiting;
  pods_[0]->core().PushAsync(PushToPs0(2), &waiting, [&](absl::Status s) {
    result = s;
    acked.Notify();
  });
  // It waits for ps-1 until the master takes ps-1 out of the ack set, then is acknowledged.
  acked.WaitForNotification();
  EXPECT_TRUE(result.ok()) << result;
  EXPECT_GT(gate_->failed(), 0);

  const StatusResponse s = Status();
  EXPECT_GT(s.epoch(), epoch);
  ASSERT_TRUE(s.has_replication());
  EXPECT_GT(s.replication().removed_lag(), 0u);
  EXPECT_EQ(s.replication().removed_lease(), 0u);  // ps-1 is alive: not a lease loss
  EXPECT_EQ(s.replication().failovers(), 0u);
  EXPECT_EQ(s.replication().under_replicated_vshards(),
            pods_[0]->core().ownership()->owned_count());
  for (const PodInfo& p : s.pods()) EXPECT_EQ(p.state(), PodInfo::LIVE) << p.pod_id();
  // ps-0 has no follower left; further pushes do not wait.
  WaitFor([&] { return pods_[0]->core().replication_stats().followers.empty(); });
  ASSERT_TRUE(pods_[0]->core().Push(PushToPs0(3), &resp).ok());
}

}  // namespace
}  // namespace ps
