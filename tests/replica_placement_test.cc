// Replica placement of a new cluster (R = 2, three pods, ps-master and pods as processes on
// loopback): the pods start one after the other, as a StatefulSet's do, and once all are
// live and no follower copy is running, every vshard has exactly R copies.
//
// DISABLED: it fails today. When ps-1 registers before ps-2 ever has, the vshards ps-1
// leads name ps-2 (not yet registered) as their follower; re-replication counts them short
// of a copy and fills ps-0 as their follower at once ("follower copy ... ps-1 -> ps-0");
// when ps-2 registers it stays in their ack set too, and nothing trims the third copy
// (`ps-admin shards`: "6-10  ps-1  ps-2,ps-0  3/2"). The extra copy costs ps-1 a second
// stream, and a vshard on every pod blocks drains ("cannot drain ps-0: no other live pod
// can take its copy of vshard 22 (every one already holds it)", ps-chaos --replication=2
// --seed=9). Run it with --gtest_also_run_disabled_tests. Nothing is asserted on timing.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/chaos_cluster.h"
#include "tests/process.h"
#include "tests/shard_map_watch.h"

#if !defined(PS_MASTER_BINARY) || !defined(PS_SERVER_BINARY)
#error "PS_MASTER_BINARY and PS_SERVER_BINARY must be defined"
#endif

namespace ps::integration {
namespace {

std::string Binary(const char* env, const char* built) {
  const char* v = std::getenv(env);
  return v != nullptr && *v != '\0' ? v : built;
}

TEST(ReplicaPlacementTest, DISABLED_PodsStartedInTurnGiveEveryVShardExactlyRCopies) {
  TempDir dir("ps-replica-placement");
  ASSERT_FALSE(dir.path().empty());
  chaos::ClusterOptions co;
  co.dir = dir.path();
  co.master_binary = Binary("PS_MASTER_BINARY", PS_MASTER_BINARY);
  co.server_binary = Binary("PS_SERVER_BINARY", PS_SERVER_BINARY);
  co.pods = 3;
  co.num_vshards = 16;
  co.lease_ms = 1000;
  co.replication = 2;
  chaos::Cluster cluster(co);
  ASSERT_TRUE(cluster.StartMaster().ok()) << cluster.Logs();
  ShardMapWatch watch(cluster.master_address());
  // In turn: each pod is live in the map before the next one starts.
  for (uint32_t i = 0; i < co.pods; ++i) {
    ASSERT_TRUE(cluster.StartPod(i).ok()) << cluster.Logs();
    const std::string id = cluster.PodId(i);
    auto live =
        watch.WaitFor([&](const ShardMapResponse& m) { return PodState(m, id) == PodInfo::LIVE; },
                      absl::Seconds(60), id + " live");
    ASSERT_TRUE(live.ok()) << live.status() << cluster.Logs();
  }
  // Every vshard with 2 live copies, and no follower copy running (the map lists moves in
  // progress).
  auto settled = watch.WaitFor(
      [](const ShardMapResponse& m) { return FullyReplicated(m, 2) && m.moves_size() == 0; },
      absl::Seconds(60), "every vshard with 2 live copies and no copy running");
  ASSERT_TRUE(settled.ok()) << settled.status() << cluster.Logs();
  std::string extra;
  for (int v = 0; v < settled->owner_size(); ++v) {
    const int copies = 1 + (v < settled->followers_size() ? settled->followers(v).pods_size() : 0);
    if (copies > 2) absl::StrAppend(&extra, " vshard ", v, ": ", copies, " copies;");
  }
  EXPECT_TRUE(extra.empty()) << "more than R = 2 copies:" << extra << "\n" << cluster.Logs();
}

}  // namespace
}  // namespace ps::integration
