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

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "proto/master.grpc.pb.h"
#include "tests/chaos_cluster.h"
#include "tests/exact_push_load.h"
#include "tests/process.h"
#include "tests/replicated_pair.h"
#include "tests/shard_map_watch.h"

namespace ps::integration {
namespace {

constexpr char kTable[] = "reads";
constexpr uint32_t kVShards = 16;
constexpr int64_t kRows = 256;

TEST(FollowerReadTest, ReadOnlyPullsAreServedByFollowersWhileThePrimaryIsDown) {
  TempDir dir("ps-follower-read");
  ASSERT_FALSE(dir.path().empty());
  // No failover while ps-0 is down: its followers serve the reads.
  chaos::ClusterOptions co = ReplicatedPairOptions(dir.path(), kVShards, /*lease_ms=*/60'000);
  // A follower slow to answer on a busy machine stays in the ack set (else pushes would be
  // acknowledged without it, and the reads below would rightly miss them).
  co.master_flags = {"--replication_max_lag_ms=60000"};
  chaos::Cluster cluster(co);
  // ps-0 is restarted in place once both are up, so that it knows ps-1's address.
  auto ready = StartReplicatedPair(cluster, /*restart_ps0=*/true);
  ASSERT_TRUE(ready.ok()) << ready.status() << cluster.Logs();
  const std::vector<uint32_t> led = OwnedVShards(*ready, "ps-0");
  ASSERT_FALSE(led.empty());

  ClientOptions options = PairClientOptions(cluster, kVShards);
  options.max_attempts = 3;
  options.max_backoff_ms = 100;
  auto client = PsClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->CreateTable(ExactLoadTable(kTable)).ok());
  const KnownRows known = MakeKnownRows(kRows);
  const std::vector<int64_t>& ids = known.ids;
  absl::Status pushed = (*client)->Push({{kTable, ids, known.grads.data()}});
  ASSERT_TRUE(pushed.ok()) << pushed << cluster.Logs();

  // Rows of both pods' vshards (so the pull needs ps-0's followers, and ps-1 as itself).
  const std::vector<int64_t> on_ps0 = RowsOfVShards(ids, kTable, kVShards, led);
  ASSERT_GT(on_ps0.size(), 0u);
  ASSERT_LT(on_ps0.size(), ids.size());

  cluster.KillPod(0);
  const uint64_t fallbacks_before = (*client)->client_stats().read_fallbacks;
  std::vector<float> rows(ids.size() * kLoadDim, -1.0f);
  absl::Status read = (*client)->Pull({{kTable, ids, rows.data()}}, /*read_only=*/true);
  ASSERT_TRUE(read.ok()) << read << cluster.Logs();
  ASSERT_EQ(KnownRowsMismatch(ids, rows), "");
  EXPECT_GT((*client)->client_stats().read_fallbacks, fallbacks_before);
  // Served by the followers, not by a failover: ps-0 still leads its vshards in the map.
  ShardMapWatch watch(cluster.master_address());
  auto map = watch.Fetch();
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(OwnedVShards(*map, "ps-0"), led);
  EXPECT_EQ(map->failovers(), 0u);

  // A training pull of a row ps-0 leads goes to the primary only: down, it fails.
  const int64_t probe = on_ps0[0];
  std::vector<float> one(kLoadDim);
  absl::Status train = (*client)->Pull({{kTable, absl::MakeConstSpan(&probe, 1), one.data()}},
                                       /*read_only=*/false);
  EXPECT_FALSE(train.ok()) << "a training pull was answered with ps-0 down";
  if (HasFailure()) KeepRunDir(cluster, dir.path());
}

// A new cluster's first primary learns its follower's address when the follower
// registers, so its first push is acknowledged with the follower in the ack set: nothing
// is removed for lag and every vshard keeps two copies. The lease is 30 s, so the
// primary's next heartbeat (10 s away) cannot be what tells it: before the master told the
// primaries of a registering follower at once, ps-0 streamed to an empty address, the
// push waited --replication_max_lag_ms (3 s) and the master removed ps-1 from the ack set
// ("ACK SET: ps-1 removed ... 3080 ms behind"); with the production lease (10 s) the same
// happened on every new cluster. Nothing is asserted on timing: a push that waits on a
// busy machine is fine, one that drops the follower for lag is not.
TEST(FollowerReadTest, AFirstPrimaryKnowsItsFollowerOnceTheFollowerRegisters) {
  TempDir dir("ps-follower-address");
  ASSERT_FALSE(dir.path().empty());
  chaos::Cluster cluster(ReplicatedPairOptions(dir.path(), kVShards, /*lease_ms=*/30'000));
  auto ready = StartReplicatedPair(cluster, /*restart_ps0=*/false);
  ASSERT_TRUE(ready.ok()) << ready.status() << cluster.Logs();

  auto client = PsClient::Connect(PairClientOptions(cluster, kVShards));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->CreateTable(ExactLoadTable(kTable)).ok());
  const KnownRows known = MakeKnownRows(kRows);
  absl::Status pushed = (*client)->Push({{kTable, known.ids, known.grads.data()}});
  ASSERT_TRUE(pushed.ok()) << pushed << cluster.Logs();

  auto master = Master::NewStub(
      grpc::CreateChannel(cluster.master_address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  StatusResponse status;
  ASSERT_TRUE(master->Status(&ctx, StatusRequest(), &status).ok());
  EXPECT_EQ(status.replication().removed_lag(), 0u) << cluster.Logs();
  auto map = ShardMapWatch(cluster.master_address()).Fetch();
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_TRUE(FullyReplicated(*map, 2)) << cluster.Logs();
}

}  // namespace
}  // namespace ps::integration
