// Live vshard migration end to end: ps-master and durable ps-server pods as real processes
// on loopback, several client threads pushing continuously through the C++ client
// connected via the master. The cluster grows from 2 to 3 pods (rebalance) and shrinks back
// (drain) while they push; then every row must equal exactly what the threads pushed
// (nothing lost, nothing applied twice), and no error may have reached a caller; the new pod
// is SIGKILLed right after the rebalance and restarted, so what it received must be durable.
// Also: a pod SIGKILLed and restarted (same identity and data dir, a new port) while
// clients push. Every test runs with one copy of each vshard (R1) and with two (R2: the
// moves keep each vshard's follower, a killed primary may fail over to it, and a
// re-routed push whose fate was unknown keeps its key).
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/ps_client.h"
#include "common/rpc/grpc_status.h"
#include "gtest/gtest.h"
#include "proto/master.grpc.pb.h"
#include "tests/cluster_test_fixture.h"

#if !defined(PS_MASTER_BINARY) || !defined(PS_SERVER_BINARY)
#error "PS_MASTER_BINARY and PS_SERVER_BINARY must be defined"
#endif

namespace ps {
namespace {

constexpr uint32_t kVShards = 64;
constexpr int kIds = 3000;
constexpr uint32_t kDim = 4;
constexpr absl::Duration kStartTimeout = absl::Seconds(20);

// Threads that push known gradients (1.0 per element per occurrence, SGD with lr 1 from
// zeros: a row ends at minus the number of times it was pushed) until stopped, counting
// what they pushed and any error a call returned.
class Pushers {
 public:
  Pushers(const std::string& master, int threads) {
    for (int t = 0; t < threads; ++t) {
      threads_.emplace_back([this, master, t] { Run(master, t); });
    }
  }
  ~Pushers() { Stop(); }

  void Stop() {
    stop_ = true;
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  uint64_t pushes() const { return pushes_.load(); }
  std::vector<std::string> errors() {
    absl::MutexLock lock(&mu_);
    return errors_;
  }
  std::map<int64_t, int64_t> counts() {
    absl::MutexLock lock(&mu_);
    return counts_;
  }

 private:
  void Run(const std::string& master, int t) {
    ClientOptions options;
    options.master = master;
    auto client = PsClient::Connect(options);
    if (!client.ok()) return Error(client.status().ToString());
    std::mt19937_64 rng(1000 + t);
    std::map<int64_t, int64_t> mine;
    std::vector<float> rows;
    while (!stop_) {
      std::vector<int64_t> ids(64);
      for (auto& id : ids) id = static_cast<int64_t>(rng() % kIds);
      std::vector<float> grads(ids.size() * kDim, 1.0f);
      absl::Status s = (*client)->Push({{"emb", ids, grads.data()}});
      if (!s.ok()) {
        Error(absl::StrCat("push: ", s.ToString()));
        break;
      }
      for (int64_t id : ids) mine[id]++;
      pushes_++;
      if (pushes_ % 8 == 0) {  // pulls must not fail either
        rows.resize(ids.size() * kDim);
        absl::Status p = (*client)->Pull({{"emb", ids, rows.data()}});
        if (!p.ok()) Error(absl::StrCat("pull: ", p.ToString()));
      }
    }
    absl::MutexLock lock(&mu_);
    for (auto [id, n] : mine) counts_[id] += n;
  }

  void Error(const std::string& e) {
    absl::MutexLock lock(&mu_);
    errors_.push_back(e);
  }

  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> pushes_{0};
  absl::Mutex mu_;
  std::vector<std::string> errors_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, int64_t> counts_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

// Each test runs with ps-master --replication=GetParam(): 1 (one copy) and 2 (each vshard
// followed by another pod; moves keep the followers, never land on one).
class MigrationTest : public integration::ClusterProcessTest,
                      public testing::WithParamInterface<uint32_t> {
 protected:
  MigrationTest()
      : ClusterProcessTest("migration_test",
                           integration::BinaryPath("PS_MASTER_BINARY", PS_MASTER_BINARY),
                           integration::BinaryPath("PS_SERVER_BINARY", PS_SERVER_BINARY)) {}

  // Starts ps-master (again, on the same data dir and port, when `port` is given).
  void StartMaster(int lease_ms, int port_wanted = 0) {
    absl::Status s = ClusterProcessTest::StartMaster(
        {absl::StrCat("--num_vshards=", kVShards), "--num_ps=2",
         absl::StrCat("--lease_ms=", lease_ms), "--vshards_per_move=4",
         "--checkpoint_dir=" + Path("checkpoints"), absl::StrCat("--replication=", GetParam())},
        port_wanted);
    ASSERT_TRUE(s.ok()) << s;
  }

  // Returns the pod's port.
  int StartPod(int i, int port = 0) {
    auto p = ClusterProcessTest::StartPod(
        i,
        {absl::StrCat("--num_vshards=", kVShards), "--checkpoint_root=" + Path("checkpoints"),
         "--materialize_ms=300"},
        port);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : 0;
  }

  std::map<std::string, int> Owned() {
    ShardMapResponse m = Map();
    std::map<std::string, int> owned;
    for (uint32_t o : m.owner()) owned[m.pods(o).pod_id()]++;
    return owned;
  }

  void WaitLive(const std::string& pod) {
    const absl::Time deadline = absl::Now() + kStartTimeout;
    while (StateOf(pod) != PodInfo::LIVE && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    ASSERT_EQ(StateOf(pod), PodInfo::LIVE);
  }

  std::unique_ptr<PsClient> Client() {
    ClientOptions options;
    options.master = master_address_;
    auto client = PsClient::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  void CreateTable(PsClient& client) {
    TableSpec spec;
    spec.set_name("emb");
    spec.set_dim(kDim);
    spec.mutable_optimizer()->set_kind(OptimizerSpec::SGD);
    spec.mutable_optimizer()->set_learning_rate(1);
    ASSERT_TRUE(client.CreateTable(spec).ok());
  }

  // Every row equals minus its push count, in every element.
  void ExpectRows(PsClient& client, const std::map<int64_t, int64_t>& counts) {
    std::vector<int64_t> ids(kIds);
    for (int i = 0; i < kIds; ++i) ids[i] = i;
    std::vector<float> rows(ids.size() * kDim);
    ASSERT_TRUE(client.Pull({{"emb", ids, rows.data()}}).ok());
    int wrong = 0;  // rows, each reported once (up to 40): which rows tells which vshards
    for (int i = 0; i < kIds; ++i) {
      auto it = counts.find(i);
      const float expected = it == counts.end() ? 0.0f : -static_cast<float>(it->second);
      for (uint32_t j = 0; j < kDim; ++j) {
        if (rows[i * kDim + j] == expected) continue;
        if (wrong++ < 40) {
          ADD_FAILURE() << "row " << i << " element " << j << " is " << rows[i * kDim + j]
                        << ", expected " << expected;
        }
        break;
      }
    }
    EXPECT_EQ(wrong, 0) << "rows wrong";
  }

  // Rows of a second table, so that moves take long enough to be interrupted.
  void Preload(PsClient& client, int rows) {
    TableSpec spec;
    spec.set_name("big");
    spec.set_dim(16);
    spec.mutable_optimizer()->set_kind(OptimizerSpec::ADAGRAD);
    ASSERT_TRUE(client.CreateTable(spec).ok());
    std::vector<int64_t> ids(4096);
    std::vector<float> grads(ids.size() * 16, 0.5f);
    for (int begin = 0; begin < rows; begin += ids.size()) {
      for (size_t k = 0; k < ids.size(); ++k) ids[k] = begin + k;
      ASSERT_TRUE(client.Push({{"big", ids, grads.data()}}).ok());
    }
  }

  // Rebalance on another thread; returns its status once done.
  std::thread RebalanceAsync(absl::Status* out) {
    return std::thread([this, out] {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(40)));
      RebalanceResponse resp;
      grpc::Status s = master_->Rebalance(&ctx, RebalanceRequest(), &resp);
      *out = FromGrpcStatus(s);
    });
  }

  absl::Status Rebalance() {
    absl::Status s;
    RebalanceAsync(&s).join();
    return s;
  }
};

// At R = 2 a part in flight at ps-2 when it is SIGKILLed may have reached ps-2's followers
// but not its log: a follower that kept some of its vshards, and imports the others from
// ps-2 in the drain, must apply the client's retry of those (push keys per vshard,
// ps/storage/push_dedup.h; it lost a push in about 1 run in 12-24 before).
TEST_P(MigrationTest, ScaleOutThenDrainWhileClientsPushIsExact) {
  StartMaster(/*lease_ms=*/3000);
  StartPod(0);
  StartPod(1);
  auto client = Client();
  ASSERT_NE(client, nullptr);
  CreateTable(*client);
  Pushers pushers(master_address_, 4);
  absl::SleepFor(absl::Milliseconds(800));

  // Scale out: ps-2 joins (the map had 2 pods) and rebalance moves vshards onto it.
  const int port2 = StartPod(2);
  WaitLive("ps-2");
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(40)));
    RebalanceResponse resp;
    grpc::Status s = master_->Rebalance(&ctx, RebalanceRequest(), &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.moved_vshards(), 21u);  // 64 over 3: 22, 21, 21
  }
  auto owned = Owned();
  EXPECT_EQ(owned["ps-2"], 21);
  // What ps-2 received is durable: SIGKILLed at once and restarted (same identity, data
  // dir and address), it serves the moved rows again.
  children_["ps-2"]->Kill();
  ASSERT_EQ(StartPod(2, port2), port2);
  // Pushing on across the new map (waited for, not timed: the restarted pod re-ships its
  // recovered log first, and the machine may be busy).
  const uint64_t before_drain = pushers.pushes();
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  while (pushers.pushes() < before_drain + 20 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_GE(pushers.pushes(), before_drain + 20);

  // Scale in: drain ps-2; it then owns nothing and shows DRAINED.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(40)));
    DrainRequest req;
    req.set_pod_id("ps-2");
    DrainResponse resp;
    grpc::Status s = master_->Drain(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.moved_vshards(), 21u);
  }
  owned = Owned();
  EXPECT_EQ(owned.count("ps-2"), 0u);
  EXPECT_EQ(owned["ps-0"] + owned["ps-1"], static_cast<int>(kVShards));
  EXPECT_EQ(StateOf("ps-2"), PodInfo::DRAINED);
  absl::SleepFor(absl::Milliseconds(300));
  pushers.Stop();
  EXPECT_TRUE(pushers.errors().empty()) << pushers.errors().front();
  EXPECT_GT(pushers.pushes(), 50u);
  ExpectRows(*client, pushers.counts());

  // Fence times and copy rates, for the record.
  grpc::ClientContext ctx;
  StatusResponse status;
  ASSERT_TRUE(master_->Status(&ctx, StatusRequest(), &status).ok());
  double max_fence = 0;
  for (const MoveInfo& m : status.moves()) {
    EXPECT_EQ(m.state(), MoveInfo::COMMITTED) << m.error();
    max_fence = std::max(max_fence, m.fence_ms());
  }
  std::printf("%d moves; longest fence %.1f ms; %lu pushes\n", status.moves_size(), max_fence,
              static_cast<unsigned long>(pushers.pushes()));

  // A cluster checkpoint: each owner's copy and the master's, each a database to start from.
  grpc::ClientContext cp_ctx;
  cp_ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  CheckpointResponse cp;
  grpc::Status s = master_->Checkpoint(&cp_ctx, CheckpointRequest(), &cp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(cp.checkpoint().pods_size(), 2);  // ps-2 owns nothing
  for (const char* part : {"ps-0", "ps-1", "master"}) {
    EXPECT_EQ(access(absl::StrCat(cp.checkpoint().dir(), "/", part, "/CURRENT").c_str(), F_OK), 0)
        << part;
  }
}

// The destination dies mid-rebalance: its move is aborted (the source keeps the vshards),
// moves it had finished stay (its copy is durable), and after it restarts a second
// rebalance completes; rows stay exact and callers see no error.
TEST_P(MigrationTest, DestinationKilledMidRebalance) {
  StartMaster(/*lease_ms=*/3000);
  StartPod(0);
  StartPod(1);
  const int port2 = StartPod(2);
  WaitLive("ps-2");
  auto client = Client();
  ASSERT_NE(client, nullptr);
  CreateTable(*client);
  Preload(*client, 150000);
  Pushers pushers(master_address_, 3);
  absl::SleepFor(absl::Milliseconds(300));
  absl::Status first;
  std::thread rebalance = RebalanceAsync(&first);
  absl::SleepFor(absl::Milliseconds(150));
  children_["ps-2"]->Kill();
  // Back at once (a supervisor's restart), while the rebalance notices and aborts.
  ASSERT_EQ(StartPod(2, port2), port2);
  rebalance.join();
  const int moved_before = Owned()["ps-2"];
  std::printf("rebalance with ps-2 killed: %s; ps-2 owned %d vshards\n", first.ToString().c_str(),
              moved_before);
  WaitLive("ps-2");
  absl::Status second = Rebalance();
  ASSERT_TRUE(second.ok()) << second;
  EXPECT_EQ(Owned()["ps-2"], 21);
  absl::SleepFor(absl::Milliseconds(300));
  pushers.Stop();
  EXPECT_TRUE(pushers.errors().empty()) << pushers.errors().front();
  ExpectRows(*client, pushers.counts());
}

// The master dies mid-rebalance and restarts on its data dir: the move it was running is
// aborted (its record is found at start), the pods drop the move's state at their next
// heartbeat (the source unfences), and a rebalance then completes; rows stay exact.
TEST_P(MigrationTest, MasterKilledMidRebalance) {
  StartMaster(/*lease_ms=*/1500);
  StartPod(0);
  StartPod(1);
  StartPod(2);
  WaitLive("ps-2");
  auto client = Client();
  ASSERT_NE(client, nullptr);
  CreateTable(*client);
  Preload(*client, 150000);
  Pushers pushers(master_address_, 3);
  absl::SleepFor(absl::Milliseconds(300));
  absl::Status first;
  std::thread rebalance = RebalanceAsync(&first);
  absl::SleepFor(absl::Milliseconds(150));
  children_["master"]->Kill();
  rebalance.join();
  EXPECT_FALSE(first.ok());
  StartMaster(/*lease_ms=*/1500, master_port_);
  absl::SleepFor(absl::Milliseconds(1000));  // heartbeats bring the pods the aborted state
  absl::Status second = Rebalance();
  ASSERT_TRUE(second.ok()) << second;
  EXPECT_EQ(Owned()["ps-2"], 21);
  absl::SleepFor(absl::Milliseconds(300));
  pushers.Stop();
  EXPECT_TRUE(pushers.errors().empty()) << pushers.errors().front();
  ExpectRows(*client, pushers.counts());
}

TEST_P(MigrationTest, PodKilledAndRestartedWhileClientsPush) {
  StartMaster(/*lease_ms=*/1500);
  StartPod(0);
  StartPod(1);
  auto client = Client();
  ASSERT_NE(client, nullptr);
  CreateTable(*client);
  Pushers pushers(master_address_, 3);
  absl::SleepFor(absl::Milliseconds(500));
  // SIGKILL ps-1 and start it again on its data dir, at a new port: the master takes the
  // new address once the old lease expires, and the clients find it through the map.
  children_["ps-1"]->Kill();
  StartPod(1);
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  const uint64_t at_restart = pushers.pushes();
  while (pushers.pushes() < at_restart + 50 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  pushers.Stop();
  EXPECT_TRUE(pushers.errors().empty()) << pushers.errors().front();
  EXPECT_GE(pushers.pushes(), at_restart + 50);
  ExpectRows(*client, pushers.counts());
}

INSTANTIATE_TEST_SUITE_P(Replication, MigrationTest, testing::Values(1u, 2u),
                         [](const testing::TestParamInfo<uint32_t>& p) {
                           return absl::StrCat("R", p.param);
                         });

}  // namespace
}  // namespace ps
