// PlanFills: which vshards get another copy, and where. PlanTrims: which copies beyond R go.
#include "master/rereplicate_plan.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

// owners[v] leads vshard v, followed by followers[v]; every pod named is registered, and
// live when in `live` (else lost).
ClusterView View(uint32_t r, std::vector<std::string> owners,
                 std::vector<std::vector<std::string>> followers, std::set<std::string> live,
                 std::set<std::string> drained = {}) {
  ClusterView view;
  view.replication = r;
  view.owner = std::move(owners);
  view.followers = std::move(followers);
  std::set<std::string> ids(view.owner.begin(), view.owner.end());
  for (const auto& set : view.followers) ids.insert(set.begin(), set.end());
  ids.insert(live.begin(), live.end());
  view.known.assign(ids.begin(), ids.end());
  for (const std::string& id : ids) {
    view.registered[id].live = live.count(id) > 0;
    view.registered[id].drained = drained.count(id) > 0;
  }
  return view;
}

// follower -> primary -> vshards, over the whole plan.
std::map<std::string, std::map<std::string, std::set<uint32_t>>> Copies(const MovePlan& plan) {
  std::map<std::string, std::map<std::string, std::set<uint32_t>>> out;
  for (const PlannedMove& m : plan.moves) {
    for (uint32_t v : m.vshards) {
      EXPECT_TRUE(out[m.destination][m.source].insert(v).second) << "vshard " << v << " twice";
    }
  }
  return out;
}

TEST(PlanFillsTest, NothingAtOneCopyOrWhenEveryVShardHasItsFollowers) {
  EXPECT_TRUE(PlanFills(View(1, {"a", "b"}, {{}, {}}, {"a", "b"}), 4).empty());
  EXPECT_TRUE(PlanFills(View(2, {"a", "b"}, {{"b"}, {"a"}}, {"a", "b"}), 4).empty());
}

TEST(PlanFillsTest, ALostFollowerIsReplacedOnTheLeastLoadedOtherPod) {
  // a's follower c is lost; b holds 2 copies, d holds none: d gets a's two vshards.
  const ClusterView view = View(2, {"a", "a", "b"}, {{"c"}, {"c"}, {"a"}}, {"a", "b", "d"});
  const MovePlan plan = PlanFills(view, 4);
  EXPECT_EQ(plan.vshards, 2u);
  auto copies = Copies(plan);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies["d"]["a"], (std::set<uint32_t>{0, 1}));
}

TEST(PlanFillsTest, APrimaryKeepsOneFollowerForAllItsVShards) {
  // After a failover b leads its own vshard (followed by c) and a's two (no follower): c,
  // which already streams from b, gets a's two too, rather than a new stream to d.
  const ClusterView view = View(2, {"b", "b", "b"}, {{}, {}, {"c"}}, {"b", "c", "d"});
  auto copies = Copies(PlanFills(view, 4));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies["c"]["b"], (std::set<uint32_t>{0, 1}));
}

TEST(PlanFillsTest, NeverThePrimaryNorALostOrDrainedPod) {
  // a leads everything with no follower; c is drained, d live: only d qualifies.
  const ClusterView view =
      View(2, {"a", "a", "a"}, {{}, {}, {}}, {"a", "c", "d"}, /*drained=*/{"c"});
  auto copies = Copies(PlanFills(view, 2));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies["d"]["a"], (std::set<uint32_t>{0, 1, 2}));
  EXPECT_EQ(PlanFills(view, 2).moves.size(), 2u);  // at most 2 vshards per copy
  // With no other live pod the copies wait: the plan is empty, not an error.
  EXPECT_TRUE(PlanFills(View(2, {"a", "a"}, {{}, {}}, {"a"}), 4).empty());
}

TEST(PlanFillsTest, VShardsOfALostPrimaryWait) {
  // a is lost and leads vshard 0 (followed by b, which a failover would promote).
  const ClusterView view = View(2, {"a", "b"}, {{"b"}, {}}, {"b", "c"});
  auto copies = Copies(PlanFills(view, 4));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies["c"]["b"], (std::set<uint32_t>{1}));
}

TEST(PlanFillsTest, ThreeCopiesGetTwoDistinctFollowers) {
  // R = 3: a leads 4 vshards, followed by b only; c and d are empty: one of them follows.
  const ClusterView view =
      View(3, {"a", "a", "a", "a"}, {{"b"}, {"b"}, {"b"}, {"b"}}, {"a", "b", "c", "d"});
  auto copies = Copies(PlanFills(view, 4));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies.count("b"), 0u);
  EXPECT_EQ(copies.begin()->second["a"], (std::set<uint32_t>{0, 1, 2, 3}));
  // A vshard with no follower at all gets two, on two pods.
  const ClusterView bare = View(3, {"a"}, {{}}, {"a", "b", "c"});
  auto two = Copies(PlanFills(bare, 4));
  EXPECT_EQ(two.size(), 2u);
  EXPECT_EQ(two.count("a"), 0u);
}

TEST(PlanTrimsTest, NothingWhenNoAckSetIsBeyondR) {
  EXPECT_TRUE(PlanTrims(View(1, {"a", "b"}, {{}, {}}, {"a", "b"})).empty());
  EXPECT_TRUE(PlanTrims(View(2, {"a", "b"}, {{"b"}, {"a"}}, {"a", "b"})).empty());
  EXPECT_TRUE(PlanTrims(View(3, {"a", "b"}, {{"b", "c"}, {"a"}}, {"a", "b", "c"})).empty());
}

TEST(PlanTrimsTest, TheLatestLiveFollowerGoesAndTheLongestStandingStays) {
  // Pods started in turn: b's vshards 1-2 were filled onto a before c, their ring follower,
  // registered; now all are live and vshards 1-2 have 3 copies at R = 2.
  const ClusterView view =
      View(2, {"a", "b", "b", "c"}, {{"b"}, {"c", "a"}, {"c", "a"}, {"a"}}, {"a", "b", "c"});
  const auto drops = PlanTrims(view);
  const std::map<uint32_t, std::vector<std::string>> want = {{1, {"a"}}, {2, {"a"}}};
  EXPECT_EQ(drops, want);
}

TEST(PlanTrimsTest, AFollowerNotLiveGoesFirst) {
  // c (in the ack set first) never registered; a, the copy made in its place, is live.
  ClusterView view = View(2, {"a", "b"}, {{"b"}, {"c", "a"}}, {"a", "b"});
  view.registered.erase("c");
  const std::map<uint32_t, std::vector<std::string>> want = {{1, {"c"}}};
  EXPECT_EQ(PlanTrims(view), want);
  // R = 3: four followers, one lost: the lost one and then the latest live one.
  const ClusterView three = View(3, {"a"}, {{"b", "c", "d", "e"}}, {"a", "b", "d", "e"});
  const std::map<uint32_t, std::vector<std::string>> want3 = {{0, {"c", "e"}}};
  EXPECT_EQ(PlanTrims(three), want3);
}

TEST(PlanTrimsTest, VShardsOfAPrimaryNotLiveAreLeftToTheFailover) {
  // a is lost: vshard 0 (its own) keeps both followers; vshard 1 (b's) drops a.
  const ClusterView view = View(2, {"a", "b"}, {{"b", "c"}, {"a", "c"}}, {"b", "c"});
  const std::map<uint32_t, std::vector<std::string>> want = {{1, {"a"}}};
  EXPECT_EQ(PlanTrims(view), want);
}

}  // namespace
}  // namespace ps
