// A follower applies every record its primary ships, by the rows' steps, even when it
// already knows the record's push key (ps_core.cc, ApplyChange): its key state may claim
// more than its rows hold. Here a follower that kept some rows of a part (and so records
// the part's key whole) later follows, from another primary, the vshard whose rows it left
// out; that primary never had the part and applies its re-routed piece. Before, the
// follower answered the piece's record "duplicate" and skipped its rows: its replica of the
// vshard silently lacked the update (the rows' step counts still matched), and a failover
// to it lost the update for good: the replicated crash tests' "shared_row_mismatches".
#include <vector>

#include "absl/time/clock.h"
#include "common/routing/hash.h"
#include "gtest/gtest.h"
#include "ps/ps_core.h"
#include "ps/replica_test_pods.h"

namespace ps {
namespace {

using replica_test::kVShards;
using replica_test::MakePush;
using replica_test::PendingPush;
using replica_test::Range;
using replica_test::Role;
using replica_test::Rows;

constexpr uint32_t kLow = 0;              // a vshard of the lower half
constexpr uint32_t kHigh = kVShards - 1;  // a vshard of the upper half

// The first `n` ids of "emb" in vshard `v` from `from` on.
std::vector<int64_t> IdsOf(uint32_t v, size_t n, int64_t from = 1) {
  std::vector<int64_t> ids;
  for (int64_t id = from; ids.size() < n; ++id) {
    if (VShardOf(RouteHash(NameHash("emb"), id), kVShards) == v) ids.push_back(id);
  }
  return ids;
}

// The rows of `ids` in `rows` (absent ones left out).
std::map<int64_t, std::string> Only(const std::map<int64_t, std::string>& rows,
                                    const std::vector<int64_t>& ids) {
  std::map<int64_t, std::string> out;
  for (int64_t id : ids) {
    auto it = rows.find(id);
    if (it != rows.end()) out.insert(*it);
  }
  return out;
}

std::vector<int64_t> Concat(std::vector<int64_t> a, const std::vector<int64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Pods a and b of the fixture and a third, c. a leads every vshard; b follows its lower
// half, c its upper half.
class FollowerReplayTest : public replica_test::ReplicaPairTest {
 protected:
  void SetUp() override {
    ReplicaPairTest::SetUp();
    if (HasFatalFailure()) return;
    c_ = Open("c");
    ASSERT_NE(c_, nullptr);
    ASSERT_TRUE(replica_test::CreateEmbTable(*c_).ok());
    c_->RenewWriteLease(absl::Now() + absl::Hours(1));
    ApplyAssignmentResponse resp;
    ASSERT_TRUE(
        b_->ApplyAssignment(Role(2, "b", {}, {}, {{"a", Range(0, kVShards / 2)}}), &resp).ok());
    ASSERT_TRUE(
        c_->ApplyAssignment(Role(2, "c", {}, {}, {{"a", Range(kVShards / 2, kVShards)}}), &resp)
            .ok());
    ASSERT_TRUE(a_->ApplyAssignment(Role(2, "a", Range(0, kVShards), {"b", "c"}, {}), &resp).ok());
  }
  void TearDown() override {
    if (c_ != nullptr) sender_->Remove("c:1");
    c_.reset();
    ReplicaPairTest::TearDown();
  }

  // The part's push (ids low then high, key 11/1) reaches b, which keeps its lower rows and
  // records its key, but not c; a is lost before c holds it, so the push was never
  // acknowledged: its fate is unknown.
  void LoseAOnceOnlyBHoldsThePart() {
    sender_->Remove("c:1");
    PendingPush pending(*a_, MakePush(part_, 0.5f, 11, 1));
    for (int i = 0; i < 6000 && Only(Rows(*b_), low_).size() < low_.size(); ++i) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_EQ(Only(Rows(*b_), low_).size(), low_.size()) << "b never held the part";
    EXPECT_FALSE(pending.done());
    Stop("a");
  }

  const std::vector<int64_t> low_ = IdsOf(kLow, 2);
  const std::vector<int64_t> high_ = IdsOf(kHigh, 2);
  const std::vector<int64_t> part_ = Concat(low_, high_);
  std::unique_ptr<PsCore> c_;
};

TEST_P(FollowerReplayTest, AKnownKeyDoesNotSkipAReplicatedRecordsRows) {
  LoseAOnceOnlyBHoldsThePart();
  if (HasFatalFailure()) return;
  sender_->Add("c:1", c_.get());
  // The failover: b leads the lower half, c the upper half with b as its follower (as
  // re-replication makes it; the upper rows of `part` exist nowhere yet, so the copy is
  // empty).
  ApplyAssignmentResponse resp;
  ASSERT_TRUE(
      b_->ApplyAssignment(
            Role(5, "b", Range(0, kVShards / 2), {}, {{"c", Range(kVShards / 2, kVShards)}}), &resp)
          .ok());
  ASSERT_TRUE(
      c_->ApplyAssignment(Role(5, "c", Range(kVShards / 2, kVShards), {"b"}, {}), &resp).ok());
  b_->RenewWriteLease(absl::Now() + absl::Hours(1));
  c_->RenewWriteLease(absl::Now() + absl::Hours(1));
  // The client re-routes the part as pieces under its key: b answers the lower piece
  // "duplicate" (it holds it); c never had the part and applies the upper one, shipping it
  // to b, and acknowledges it once b answered.
  PushRequest low_piece = MakePush(low_, 0.5f, 11, 1);
  low_piece.mutable_key()->set_piece(kLow + 1);
  PushResponse low_resp;
  ASSERT_TRUE(b_->Push(low_piece, &low_resp).ok());
  EXPECT_TRUE(low_resp.duplicate());
  std::vector<float> high_grads;
  {
    const PushRequest whole = MakePush(part_, 0.5f, 11, 1);
    const float* g = reinterpret_cast<const float*>(whole.tables(0).grads().data());
    high_grads.assign(g + low_.size() * replica_test::kDim, g + part_.size() * replica_test::kDim);
  }
  PushRequest high_piece = MakePush(high_, high_grads, 11, 1);
  high_piece.mutable_key()->set_piece(kHigh + 1);
  PushResponse high_resp;
  ASSERT_TRUE(c_->Push(high_piece, &high_resp).ok());
  EXPECT_FALSE(high_resp.duplicate());
  // b's replica of the upper rows is c's, bit for bit.
  const auto on_c = Only(Rows(*c_), high_);
  ASSERT_EQ(on_c.size(), high_.size());
  EXPECT_EQ(Only(Rows(*b_), high_), on_c);
  // c is lost too; b leads everything and answers the piece's retry "duplicate", holding
  // its rows.
  sender_->Remove("c:1");
  c_.reset();
  ASSERT_TRUE(b_->ApplyAssignment(Role(7, "b", Range(0, kVShards), {}, {}), &resp).ok());
  b_->RenewWriteLease(absl::Now() + absl::Hours(1));
  PushResponse retry;
  ASSERT_TRUE(b_->Push(high_piece, &retry).ok());
  EXPECT_TRUE(retry.duplicate());
  EXPECT_EQ(Only(Rows(*b_), high_), on_c);
}

// b kept only the lower rows of the part: its key counts there for the vshards it follows
// from a (push keys per vshard), so when c is lost before the upper piece reaches it, b
// (promoted) applies the re-routed piece rather than answering it "duplicate" without its
// rows (the update was lost while a follower recorded the key whole).
TEST_P(FollowerReplayTest, AFollowerThatKeptSomeRowsDoesNotClaimTheOthers) {
  LoseAOnceOnlyBHoldsThePart();
  if (HasFatalFailure()) return;
  // a and then c are lost before the upper piece reached c: b leads everything.
  c_.reset();
  ApplyAssignmentResponse resp;
  ASSERT_TRUE(b_->ApplyAssignment(Role(7, "b", Range(0, kVShards), {}, {}), &resp).ok());
  b_->RenewWriteLease(absl::Now() + absl::Hours(1));
  PushRequest high_piece = MakePush(high_, 0.5f, 11, 1);
  high_piece.mutable_key()->set_piece(kHigh + 1);
  PushResponse applied;
  ASSERT_TRUE(b_->Push(high_piece, &applied).ok());
  EXPECT_FALSE(applied.duplicate());
  EXPECT_EQ(Only(Rows(*b_), high_).size(), high_.size());
}

// b kept only the lower rows of the part and leads nothing. A client on a stale map sends
// it the whole part again: b refuses it as wrong shard (the owners decide), rather than
// answering "being applied now" (ABORTED) for a key it will never complete, which kept the
// client retrying the stale route until it gave up (crash_test_periodic_r2 in CI).
TEST_P(FollowerReplayTest, ANonOwnerThatKeptSomeRowsRefusesTheWholePart) {
  LoseAOnceOnlyBHoldsThePart();
  if (HasFatalFailure()) return;
  PushResponse resp;
  const absl::Status s = b_->Push(MakePush(part_, 0.5f, 11, 1), &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_FALSE(resp.duplicate());
  // A piece of the rows it holds is the owner's to answer as well.
  PushRequest low_piece = MakePush(low_, 0.5f, 11, 1);
  low_piece.mutable_key()->set_piece(kLow + 1);
  PushResponse low_resp;
  EXPECT_EQ(b_->Push(low_piece, &low_resp).code(), absl::StatusCode::kFailedPrecondition);
}

INSTANTIATE_TEST_SUITE_P(DurableAndInMemory, FollowerReplayTest, testing::Bool(),
                         replica_test::DurableOrInMemory);

}  // namespace
}  // namespace ps
