// No split brain (R = 2): ps-master with a 1 s lease and two durable pods, each the
// follower of the other's vshards, under a continuous push load through the C++ client.
// The primary ps-0 is paused (SIGSTOP) until the master has promoted its follower, and
// the load carries on at the new primary; then ps-0 resumes (SIGCONT). A write sent to it
// for a vshard it led is refused, and at the end every row equals the exact sum of the
// pushes applied: nothing lost, nothing applied twice. Nothing is asserted on timing: the
// waits are for states of the master's map and for pushes acknowledged.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/routing/hash.h"
#include "common/rpc/grpc_status.h"
#include "gtest/gtest.h"
#include "proto/ps.grpc.pb.h"
#include "tests/chaos_cluster.h"
#include "tests/exact_push_load.h"
#include "tests/process.h"
#include "tests/replicated_pair.h"
#include "tests/shard_map_watch.h"

namespace ps::integration {
namespace {

constexpr char kTable[] = "split";
constexpr uint32_t kVShards = 16;

// A push straight to `address` (no client logic: no retry, no re-route) of -1 to row `id`,
// under map epoch `epoch`, with a key no load thread uses.
absl::Status RawPush(const std::string& address, uint64_t epoch, int64_t id) {
  auto stub =
      ParameterServer::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  PushRequest req;
  req.set_epoch(epoch);
  req.mutable_key()->set_worker_id(999'999);
  req.mutable_key()->set_incarnation(1);
  req.mutable_key()->set_sequence(static_cast<uint64_t>(id));
  TableGrads* t = req.add_tables();
  t->set_table(kTable);
  t->set_ids(std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
  const std::vector<float> minus_one(kLoadDim, -1.0f);
  t->set_grads(std::string(reinterpret_cast<const char*>(minus_one.data()),
                           minus_one.size() * sizeof(float)));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  PushResponse resp;
  return FromGrpcStatus(stub->Push(&ctx, req, &resp));
}

std::string AddressOf(const ShardMapResponse& map, const std::string& pod_id) {
  for (const PodInfo& p : map.pods()) {
    if (p.pod_id() == pod_id) return p.address();
  }
  return "";
}

TEST(SplitBrainTest, PausedPrimaryIsDeposedAndItsWritesAreRefused) {
  TempDir dir("ps-split-brain");
  ASSERT_FALSE(dir.path().empty());
  chaos::Cluster cluster(ReplicatedPairOptions(dir.path(), kVShards, /*lease_ms=*/1000));
  ASSERT_TRUE(StartReplicatedPair(cluster, /*restart_ps0=*/false).ok()) << cluster.Logs();
  ShardMapWatch watch(cluster.master_address());

  ClientOptions client = PairClientOptions(cluster, kVShards);
  client.max_attempts = 1000;
  client.max_reroutes = 5000;
  client.map_refresh_ms = 20;
  {
    auto admin = PsClient::Connect(client);
    ASSERT_TRUE(admin.ok()) << admin.status();
    ASSERT_TRUE((*admin)->CreateTable(ExactLoadTable(kTable)).ok());
  }
  auto load = ExactPushLoad::Start(client, kTable, /*threads=*/3, /*seed=*/5);
  ASSERT_TRUE(load.ok()) << load.status();
  ASSERT_TRUE(WaitForAcks(**load, 50)) << "pushes were not acknowledged" << cluster.Logs();

  // Pause the primary ps-0 until the master has promoted ps-1 in its place.
  auto before = watch.Fetch();
  ASSERT_TRUE(before.ok()) << before.status();
  const std::vector<uint32_t> led = OwnedVShards(*before, "ps-0");
  ASSERT_FALSE(led.empty());
  const std::string old_address = AddressOf(*before, "ps-0");
  cluster.SignalPod(0, SIGSTOP);
  const absl::Time paused_at = absl::Now();
  auto promoted =
      watch.WaitFor([&](const ShardMapResponse& m) { return OwnedVShards(m, "ps-0").empty(); },
                    absl::Seconds(60), "ps-0's vshards promoted to ps-1");
  ASSERT_TRUE(promoted.ok()) << promoted.status() << cluster.Logs();
  const absl::Time promoted_at = absl::Now();
  EXPECT_EQ(OwnedVShards(*promoted, "ps-1").size(), kVShards);
  EXPECT_GE(promoted->failovers(), 1u);
  // The load goes on at the new primary.
  ASSERT_TRUE(WaitForAcks(**load, 50)) << "pushes were not acknowledged" << cluster.Logs();

  // ps-0 resumes. A write to it for a vshard it led is refused, before and after it has
  // heard from the master (no lease, then no ownership), under the epoch it led at.
  cluster.SignalPod(0, SIGCONT);
  const absl::Time resumed_at = absl::Now();
  const uint64_t name = NameHash(kTable);
  std::set<uint32_t> led_set(led.begin(), led.end());
  std::vector<int64_t> probes;
  for (int64_t id = int64_t{1} << 40; probes.size() < 2; ++id) {
    if (led_set.count(VShardOf(RouteHash(name, id), kVShards)) > 0) probes.push_back(id);
  }
  // Refused: UNAVAILABLE (no write lease) or FAILED_PRECONDITION (not the owner).
  auto refused = [](const absl::Status& s) {
    return s.code() == absl::StatusCode::kUnavailable ||
           s.code() == absl::StatusCode::kFailedPrecondition;
  };
  absl::Status first = RawPush(old_address, before->epoch(), probes[0]);
  EXPECT_TRUE(refused(first)) << "the deposed primary's answer: " << first;
  auto back =
      watch.WaitFor([](const ShardMapResponse& m) { return PodState(m, "ps-0") == PodInfo::LIVE; },
                    absl::Seconds(60), "ps-0 live again");
  ASSERT_TRUE(back.ok()) << back.status() << cluster.Logs();
  absl::Status second = RawPush(old_address, before->epoch(), probes[1]);
  EXPECT_TRUE(refused(second)) << "the deposed primary's answer: " << second;
  ASSERT_TRUE(WaitForAcks(**load, 50)) << "pushes were not acknowledged" << cluster.Logs();
  (*load)->Stop();

  // Every row is the exact sum of the pushes applied; the refused writes are nowhere.
  auto checker = PsClient::Connect(client);
  ASSERT_TRUE(checker.ok()) << checker.status();
  const std::vector<LoadPush> pushes = (*load)->pushes();
  absl::StatusOr<LoadCheck> check = CheckPushLoad(**checker, kTable, pushes);
  ASSERT_TRUE(check.ok()) << check.status();
  EXPECT_GT(check->acked, 150u);
  EXPECT_EQ(check->failed, 0u);
  EXPECT_EQ(check->lost, 0u);
  EXPECT_EQ(check->duplicated, 0u);
  EXPECT_EQ(check->torn, 0u);
  EXPECT_EQ(check->shared_mismatches, 0u);
  if (!check->pass()) {
    KeepRunDir(cluster, dir.path(),
               absl::StrCat(check->problems, "\nsigstop at ", absl::FormatTime(paused_at),
                            ", promoted seen at ", absl::FormatTime(promoted_at), ", sigcont at ",
                            absl::FormatTime(resumed_at)));
  }
  std::vector<float> probe_rows(probes.size() * kLoadDim, -1.0f);
  ASSERT_TRUE((*checker)->Pull({{kTable, probes, probe_rows.data()}}).ok());
  for (float v : probe_rows) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace ps::integration
