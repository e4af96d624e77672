// ShardMap's followers (replication) and the view a read-only pull falls back to.
#include "common/routing/shard_map.h"

#include <gtest/gtest.h>

namespace ps {
namespace {

// 8 vshards over 3 pods: pod p owns vshards with v % 3 == p; vshard v is followed by the
// next two pods of the ring.
ShardMap Replicated() {
  std::vector<uint32_t> owner(8);
  std::vector<std::vector<uint32_t>> followers(8);
  for (uint32_t v = 0; v < 8; ++v) {
    owner[v] = v % 3;
    followers[v] = {(v + 1) % 3, (v + 2) % 3};
  }
  auto map = ShardMap::FromOwners(owner, 3, 5);
  EXPECT_TRUE(map.ok()) << map.status();
  EXPECT_TRUE(map->SetFollowers(followers).ok());
  return *map;
}

TEST(ShardMapTest, ReadReplicaViewMovesOnlyTheUnreachablePodsVShards) {
  const ShardMap map = Replicated();
  ASSERT_TRUE(map.has_followers());
  auto view = map.ReadReplicaView(1, {true, true, true});
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->epoch(), 5u);
  for (uint32_t v = 0; v < 8; ++v) {
    EXPECT_EQ(view->PodOfVShard(v), v % 3 == 1 ? 2u : v % 3) << v;  // first follower of 1: 2
  }
  // The first follower is down: the next one.
  view = map.ReadReplicaView(1, {true, true, false});
  ASSERT_TRUE(view.has_value());
  for (uint32_t v = 1; v < 8; v += 3) EXPECT_EQ(view->PodOfVShard(v), 0u) << v;
  // No follower up: nothing to fall back to.
  EXPECT_FALSE(map.ReadReplicaView(1, {false, true, false}).has_value());
}

TEST(ShardMapTest, WithoutFollowersThereIsNoView) {
  auto map = ShardMap::Static(8, 2);
  ASSERT_TRUE(map.ok());
  EXPECT_FALSE(map->has_followers());
  EXPECT_FALSE(map->ReadReplicaView(0, {true, true}).has_value());
}

TEST(ShardMapTest, FollowersAreChecked) {
  auto map = ShardMap::FromOwners({0, 1}, 2, 1);
  ASSERT_TRUE(map.ok());
  EXPECT_FALSE(map->SetFollowers({{1}}).ok());       // one entry for two vshards
  EXPECT_FALSE(map->SetFollowers({{0}, {0}}).ok());  // vshard 0's owner as its follower
  EXPECT_FALSE(map->SetFollowers({{1}, {2}}).ok());  // no pod 2
  EXPECT_TRUE(map->SetFollowers({{1}, {0}}).ok());
  EXPECT_TRUE(map->SetFollowers({}).ok());
  EXPECT_FALSE(map->has_followers());
}

}  // namespace
}  // namespace ps
