#include "master/move_plan.h"

#include <map>

#include "gtest/gtest.h"

namespace ps {
namespace {

// `owners` pods ps-0.. owning contiguous ranges of 16 vshards, plus `extra` empty pods; all
// registered and live.
ClusterView View(int owners, int extra) {
  ClusterView view;
  view.epoch = 7;
  for (int v = 0; v < 16; ++v) view.owner.push_back("ps-" + std::to_string(v * owners / 16));
  for (int i = 0; i < owners + extra; ++i) {
    const std::string id = "ps-" + std::to_string(i);
    view.known.push_back(id);
    view.registered[id] = ClusterView::Pod{id + ":1", /*live=*/true, /*drained=*/false};
  }
  return view;
}

// Vshards per pod after the plan ran.
std::map<std::string, int> After(ClusterView view, const MovePlan& plan) {
  for (const PlannedMove& m : plan.moves) {
    for (uint32_t v : m.vshards) {
      EXPECT_EQ(view.owner[v], m.source);
      view.owner[v] = m.destination;
    }
  }
  std::map<std::string, int> counts;
  for (const std::string& o : view.owner) ++counts[o];
  return counts;
}

TEST(MovePlanTest, RebalanceMovesTheFewestVShardsInBoundedMoves) {
  const ClusterView view = View(2, 1);
  auto plan = PlanRebalance(view, /*per_move=*/2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->vshards, 5u);  // 16 over 3: 6, 5, 5
  EXPECT_EQ(plan->moves.size(), 3u);
  for (const PlannedMove& m : plan->moves) {
    EXPECT_LE(m.vshards.size(), 2u);
    EXPECT_EQ(m.destination, "ps-2");
  }
  auto counts = After(view, *plan);
  EXPECT_EQ(counts["ps-2"], 5);
  EXPECT_LE(std::abs(counts["ps-0"] - counts["ps-1"]), 1);
  // Balanced: nothing to do.
  auto again = PlanRebalance(View(2, 0), 2);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->empty());
}

TEST(MovePlanTest, RebalanceLeavesALostPodsVShardsAndSkipsDrainedPods) {
  ClusterView view = View(2, 2);
  view.registered["ps-1"].live = false;    // its rows are only on its volume
  view.registered["ps-3"].drained = true;  // gets nothing
  auto plan = PlanRebalance(view, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto counts = After(view, *plan);
  EXPECT_EQ(counts["ps-1"], 8);
  EXPECT_EQ(counts["ps-0"], 4);
  EXPECT_EQ(counts["ps-2"], 4);
  EXPECT_EQ(counts.count("ps-3"), 0u);
  for (auto& [id, pod] : view.registered) pod.live = false;
  EXPECT_EQ(PlanRebalance(view, 4).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(MovePlanTest, DrainSpreadsOverTheLeastLoadedLivePods) {
  const ClusterView view = View(2, 1);
  auto plan = PlanDrain(view, "ps-0", 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->vshards, 8u);
  auto counts = After(view, *plan);
  EXPECT_EQ(counts.count("ps-0"), 0u);
  EXPECT_EQ(counts["ps-1"], 8);  // ps-2, the least loaded, took all 8
  EXPECT_EQ(counts["ps-2"], 8);
  // A pod that owns nothing is drained already.
  auto empty = PlanDrain(view, "ps-2", 4);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(MovePlanTest, DrainNeedsATargetAndALiveSource) {
  ClusterView view = View(2, 0);
  view.registered["ps-1"].drained = true;
  auto none = PlanDrain(view, "ps-0", 4);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(none.status().message().find("8 vshards"), std::string::npos) << none.status();
  view.registered["ps-1"].drained = false;
  view.registered["ps-0"].live = false;
  EXPECT_EQ(PlanDrain(view, "ps-0", 4).status().code(), absl::StatusCode::kUnavailable);
}

// R = 2 over 3 pods, the ring: ps-i's vshards followed by ps-(i+1); ps-3 empty.
ClusterView Replicated() {
  ClusterView view = View(3, 1);
  view.replication = 2;
  for (int v = 0; v < 16; ++v) {
    const int owner = v * 3 / 16;
    view.followers.push_back({"ps-" + std::to_string((owner + 1) % 3)});
  }
  return view;
}

TEST(MovePlanTest, AtTwoCopiesADrainMovesBothRolesAndKeepsCopiesApart) {
  ClusterView view = Replicated();
  auto plan = PlanDrain(view, "ps-1", /*per_move=*/4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  uint32_t owned = 0, followed = 0;
  for (const PlannedMove& m : plan->moves) {
    EXPECT_LE(m.vshards.size(), 4u);
    for (uint32_t v : m.vshards) {
      if (m.follower) {
        // ps-1's copy of ps-0's vshards goes to a pod with none of them, from their primary.
        EXPECT_EQ(m.replaces, "ps-1");
        EXPECT_EQ(m.source, view.owner[v]);
        EXPECT_NE(m.destination, view.owner[v]);
        view.followers[v] = {m.destination};
        ++followed;
      } else {
        EXPECT_EQ(m.source, "ps-1");
        view.owner[v] = m.destination;
        ++owned;
      }
    }
  }
  EXPECT_EQ(owned, 5u);
  EXPECT_EQ(followed, 6u);
  EXPECT_EQ(plan->vshards, 11u);
  // Afterwards every vshard has two copies on two pods, none on ps-1.
  for (int v = 0; v < 16; ++v) {
    ASSERT_EQ(view.followers[v].size(), 1u);
    EXPECT_NE(view.owner[v], view.followers[v][0]) << v;
    EXPECT_NE(view.owner[v], "ps-1") << v;
    EXPECT_NE(view.followers[v][0], "ps-1") << v;
  }
}

TEST(MovePlanTest, AtTwoCopiesARebalanceNeverMovesAVShardOntoItsFollower) {
  ClusterView view = Replicated();
  view.known.pop_back();  // no empty pod
  view.registered.erase("ps-3");
  // ps-0 holds 7 (vshard 6 too, followed by ps-1), ps-1 4, ps-2 5: the one vshard a
  // rebalance would give ps-1 is vshard 6, which ps-1 follows. It stays.
  view.owner[6] = "ps-0";
  view.followers[6] = {"ps-1"};
  auto plan = PlanRebalance(view, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->empty());
  for (const PlannedMove& m : plan->moves) {
    EXPECT_FALSE(m.follower);
    for (uint32_t v : m.vshards) {
      EXPECT_NE(view.followers[v][0], m.destination) << "vshard " << v;
    }
  }
}

}  // namespace
}  // namespace ps
