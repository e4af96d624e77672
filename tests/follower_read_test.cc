// Reads from followers end to end (R = 2): ps-master and two durable pods as processes,
// each the follower of the other's vshards, and the C++ client. Rows are pushed (and
// acknowledged with --replication_ack=all, so each follower holds them), then the primary
// ps-0 is SIGKILLed. The master's lease is long (a minute), so it does not fail ps-0's
// vshards over during the test: ps-0 stays their primary in the map and is down.
//  - A read_only pull (evaluation) of every row is answered, exactly, by the followers:
//    the client falls back to them (client_stats().read_fallbacks) and the map still
//    names ps-0 as the primary, so no failover served it.
//  - A training pull (which may create rows) of a row ps-0 leads is not sent to a follower:
//    it fails once its retries are spent.
// Nothing is asserted on timing: the waits are for states of the master's map.
#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/routing/hash.h"
#include "gtest/gtest.h"
#include "proto/master.grpc.pb.h"
#include "tests/chaos_cluster.h"
#include "tests/exact_push_load.h"
#include "tests/process.h"
#include "tests/shard_map_watch.h"

#if !defined(PS_MASTER_BINARY) || !defined(PS_SERVER_BINARY)
#error "PS_MASTER_BINARY and PS_SERVER_BINARY must be defined"
#endif

namespace ps::integration {
namespace {

constexpr char kTable[] = "reads";
constexpr uint32_t kVShards = 16;
constexpr int64_t kRows = 256;

std::string Binary(const char* env, const char* built) {
  const char* v = std::getenv(env);
  return v != nullptr && *v != '\0' ? v : built;
}

// The value pushed to element d of row `id` (SGD, lr 1, zero rows: the row's value).
float Expected(int64_t id, int d) { return static_cast<float>(id * 10 + d); }

TEST(FollowerReadTest, ReadOnlyPullsAreServedByFollowersWhileThePrimaryIsDown) {
  TempDir dir("ps-follower-read");
  ASSERT_FALSE(dir.path().empty());
  chaos::ClusterOptions co;
  co.dir = dir.path();
  co.master_binary = Binary("PS_MASTER_BINARY", PS_MASTER_BINARY);
  co.server_binary = Binary("PS_SERVER_BINARY", PS_SERVER_BINARY);
  co.pods = 2;
  co.num_vshards = kVShards;
  co.lease_ms = 60'000;  // no failover while ps-0 is down: its followers serve the reads
  co.replication = 2;
  // A follower slow to answer on a busy machine stays in the ack set (else pushes would be
  // acknowledged without it, and the reads below would rightly miss them).
  co.master_flags = {"--replication_max_lag_ms=60000"};
  chaos::Cluster cluster(co);
  ASSERT_TRUE(cluster.StartMaster().ok()) << cluster.Logs();
  for (uint32_t i = 0; i < co.pods; ++i) ASSERT_TRUE(cluster.StartPod(i).ok()) << cluster.Logs();
  ShardMapWatch watch(cluster.master_address());
  auto ready = watch.WaitFor([](const ShardMapResponse& m) { return FullyReplicated(m, 2); },
                             absl::Seconds(60), "both pods live, each vshard on both");
  ASSERT_TRUE(ready.ok()) << ready.status() << cluster.Logs();
  // ps-0 registered before ps-1 had an address, and learns it only at its next heartbeat
  // (a third of the lease: 20 s here); the master does not tell a primary at once when its
  // follower registers. Restarted in place now, it gets ps-1's address at registration.
  cluster.KillPod(0);
  ASSERT_TRUE(cluster.StartPod(0, /*same_port=*/true).ok()) << cluster.Logs();
  ready = watch.WaitFor(
      [](const ShardMapResponse& m) {
        return FullyReplicated(m, 2) && !OwnedVShards(m, "ps-0").empty();
      },
      absl::Seconds(60), "ps-0 back, each vshard on both");
  ASSERT_TRUE(ready.ok()) << ready.status() << cluster.Logs();
  const std::vector<uint32_t> led = OwnedVShards(*ready, "ps-0");
  ASSERT_FALSE(led.empty());

  ClientOptions options;
  options.master = cluster.master_address();
  options.num_vshards = kVShards;
  options.deadline_ms = 2000;
  options.max_attempts = 3;
  options.initial_backoff_ms = 10;
  options.max_backoff_ms = 100;
  auto client = PsClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->CreateTable(ExactLoadTable(kTable)).ok());
  std::vector<int64_t> ids;
  std::vector<float> grads;
  for (int64_t id = 1; id <= kRows; ++id) {
    ids.push_back(id);
    for (int d = 0; d < kLoadDim; ++d) grads.push_back(-Expected(id, d));
  }
  absl::Status pushed = (*client)->Push({{kTable, ids, grads.data()}});
  ASSERT_TRUE(pushed.ok()) << pushed << cluster.Logs();

  // Rows of both pods' vshards (so the pull needs ps-0's followers, and ps-1 as itself).
  const uint64_t name = NameHash(kTable);
  const std::set<uint32_t> led_set(led.begin(), led.end());
  int64_t on_ps0 = 0;
  for (int64_t id : ids) on_ps0 += led_set.count(VShardOf(RouteHash(name, id), kVShards));
  ASSERT_GT(on_ps0, 0);
  ASSERT_LT(on_ps0, kRows);

  cluster.KillPod(0);
  const uint64_t fallbacks_before = (*client)->client_stats().read_fallbacks;
  std::vector<float> rows(ids.size() * kLoadDim, -1.0f);
  absl::Status read = (*client)->Pull({{kTable, ids, rows.data()}}, /*read_only=*/true);
  ASSERT_TRUE(read.ok()) << read << cluster.Logs();
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int d = 0; d < kLoadDim; ++d) {
      ASSERT_EQ(rows[i * kLoadDim + d], Expected(ids[i], d)) << "row " << ids[i] << "[" << d << "]";
    }
  }
  EXPECT_GT((*client)->client_stats().read_fallbacks, fallbacks_before);
  // Served by the followers, not by a failover: ps-0 still leads its vshards in the map.
  auto map = watch.Fetch();
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(OwnedVShards(*map, "ps-0"), led);
  EXPECT_EQ(map->failovers(), 0u);

  // A training pull of a row ps-0 leads goes to the primary only: down, it fails.
  int64_t probe = 0;
  for (int64_t id : ids) {
    if (led_set.count(VShardOf(RouteHash(name, id), kVShards)) > 0) {
      probe = id;
      break;
    }
  }
  std::vector<float> one(kLoadDim);
  absl::Status train = (*client)->Pull({{kTable, absl::MakeConstSpan(&probe, 1), one.data()}},
                                       /*read_only=*/false);
  EXPECT_FALSE(train.ok()) << "a training pull was answered with ps-0 down";
  if (HasFailure()) {
    ADD_FAILURE() << cluster.Logs() << "\nrun dir kept in " << dir.path() << ".kept";
    std::filesystem::rename(dir.path(), dir.path() + ".kept");
  }
}

// A new cluster's first primary learns its follower's address when the follower
// registers, so its first push is acknowledged with the follower in the ack set: nothing
// is removed for lag and every vshard keeps two copies. DISABLED: today the master tells a
// primary its follower's new address only at the primary's next heartbeat (a third of the
// lease: 10 s here); ps-0 streams to an empty address meanwhile, reports the follower
// behind once the push has waited --replication_max_lag_ms (3 s), and the master removes
// ps-1 from the ack set of ps-0's vshards ("ACK SET: ps-1 removed ... 3080 ms behind"),
// which then wait for re-replication. With the production lease (10 s: heartbeats every
// 3.3 s) the same happens on every new cluster. Run it with --gtest_also_run_disabled_tests.
TEST(FollowerReadTest, DISABLED_AFirstPrimaryKnowsItsFollowerOnceTheFollowerRegisters) {
  TempDir dir("ps-follower-address");
  ASSERT_FALSE(dir.path().empty());
  chaos::ClusterOptions co;
  co.dir = dir.path();
  co.master_binary = Binary("PS_MASTER_BINARY", PS_MASTER_BINARY);
  co.server_binary = Binary("PS_SERVER_BINARY", PS_SERVER_BINARY);
  co.pods = 2;
  co.num_vshards = kVShards;
  co.lease_ms = 30'000;
  co.replication = 2;
  chaos::Cluster cluster(co);
  ASSERT_TRUE(cluster.StartMaster().ok()) << cluster.Logs();
  for (uint32_t i = 0; i < co.pods; ++i) ASSERT_TRUE(cluster.StartPod(i).ok()) << cluster.Logs();
  ShardMapWatch watch(cluster.master_address());
  auto ready = watch.WaitFor([](const ShardMapResponse& m) { return FullyReplicated(m, 2); },
                             absl::Seconds(60), "both pods live, each vshard on both");
  ASSERT_TRUE(ready.ok()) << ready.status() << cluster.Logs();

  ClientOptions options;
  options.master = cluster.master_address();
  options.num_vshards = kVShards;
  options.deadline_ms = 2000;
  options.max_attempts = 100;
  options.initial_backoff_ms = 10;
  options.max_backoff_ms = 200;
  auto client = PsClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->CreateTable(ExactLoadTable(kTable)).ok());
  std::vector<int64_t> ids;
  std::vector<float> grads;
  for (int64_t id = 1; id <= kRows; ++id) {
    ids.push_back(id);
    for (int d = 0; d < kLoadDim; ++d) grads.push_back(-Expected(id, d));
  }
  absl::Status pushed = (*client)->Push({{kTable, ids, grads.data()}});
  ASSERT_TRUE(pushed.ok()) << pushed << cluster.Logs();

  auto master = Master::NewStub(
      grpc::CreateChannel(cluster.master_address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  StatusResponse status;
  ASSERT_TRUE(master->Status(&ctx, StatusRequest(), &status).ok());
  EXPECT_EQ(status.replication().removed_lag(), 0u) << cluster.Logs();
  auto map = watch.Fetch();
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_TRUE(FullyReplicated(*map, 2)) << cluster.Logs();
}

}  // namespace
}  // namespace ps::integration
