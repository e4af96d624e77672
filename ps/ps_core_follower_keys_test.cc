// A follower records a replicated push's key only if it keeps some of the record's rows
// (ps_core_replicate.cc, ApplyReplicated): one that left them all out (vshards it does not
// follow) does not hold the push, and must not answer its retry "duplicate" once it leads
// those vshards. Re-routed pieces (PushKey.piece) keep their key on the follower too.
#include <vector>

#include "common/routing/hash.h"
#include "gtest/gtest.h"
#include "ps/ps_core.h"
#include "ps/replica_test_pods.h"

namespace ps {
namespace {

using replica_test::kVShards;
using replica_test::MakePush;
using replica_test::Range;
using replica_test::Role;
using replica_test::Rows;

// The first `n` ids of "emb" whose vshard is in [begin, end).
std::vector<int64_t> IdsIn(uint32_t begin, uint32_t end, size_t n) {
  std::vector<int64_t> ids;
  for (int64_t id = 1; ids.size() < n; ++id) {
    const uint32_t v = VShardOf(RouteHash(NameHash("emb"), id), kVShards);
    if (v >= begin && v < end) ids.push_back(id);
  }
  return ids;
}

// `a` leads every vshard and streams them all to `b`, which follows only the lower half.
class FollowerKeysTest : public replica_test::ReplicaPairTest {
 protected:
  void SetUp() override {
    ReplicaPairTest::SetUp();
    if (HasFatalFailure()) return;
    ApplyAssignmentResponse resp;
    ASSERT_TRUE(
        b_->ApplyAssignment(Role(2, "b", {}, {}, {{"a", Range(0, kVShards / 2)}}), &resp).ok());
    ASSERT_TRUE(a_->ApplyAssignment(Role(2, "a", Range(0, kVShards), {"b"}, {}), &resp).ok());
  }
  // b leads every vshard (a failover).
  void Promote() {
    ApplyAssignmentResponse resp;
    ASSERT_TRUE(b_->ApplyAssignment(Role(5, "b", Range(0, kVShards), {}, {}), &resp).ok());
    b_->RenewWriteLease(absl::Now() + absl::Hours(1));
  }
};

TEST_P(FollowerKeysTest, AFollowerThatLeftEveryRowOutDoesNotKnowTheKey) {
  const PushRequest push = MakePush(IdsIn(kVShards / 2, kVShards, 3), 0.5f, 11, 1);
  PushResponse resp;
  ASSERT_TRUE(a_->Push(push, &resp).ok());  // acknowledged: b answered the record
  EXPECT_GT(b_->replication_stats().rows_left_out, 0u);
  EXPECT_TRUE(Rows(*b_).empty());
  Promote();
  PushResponse retry;
  ASSERT_TRUE(b_->Push(push, &retry).ok());
  EXPECT_FALSE(retry.duplicate());  // applied here now: b never held it
  EXPECT_EQ(Rows(*b_).size(), 3u);
}

TEST_P(FollowerKeysTest, AFollowerThatKeptRowsKnowsTheKeyAndItsPieces) {
  const PushRequest whole = MakePush(IdsIn(0, kVShards / 2, 3), 0.5f, 11, 1);
  PushRequest piece = MakePush(IdsIn(0, 1, 2), 0.5f, 11, 2);
  piece.mutable_key()->set_piece(1);  // vshard 0's piece
  PushResponse resp;
  ASSERT_TRUE(a_->Push(whole, &resp).ok());
  ASSERT_TRUE(a_->Push(piece, &resp).ok());
  Promote();
  const auto before = Rows(*b_);
  for (const PushRequest* p : std::vector<const PushRequest*>{&whole, &piece}) {
    PushResponse retry;
    ASSERT_TRUE(b_->Push(*p, &retry).ok());
    EXPECT_TRUE(retry.duplicate());
  }
  EXPECT_EQ(Rows(*b_), before);
  // Another vshard's piece of the same key was never applied: it applies.
  PushRequest other = MakePush(IdsIn(1, 2, 1), 0.5f, 11, 2);
  other.mutable_key()->set_piece(2);
  PushResponse applied;
  ASSERT_TRUE(b_->Push(other, &applied).ok());
  EXPECT_FALSE(applied.duplicate());
}

INSTANTIATE_TEST_SUITE_P(DurableAndInMemory, FollowerKeysTest, testing::Bool(),
                         replica_test::DurableOrInMemory);

}  // namespace
}  // namespace ps
