// A follower records a replicated push's key only for the vshards whose rows it keeps
// (ps_core_replicate.cc, ApplyReplicated; PushDedup, "Per vshard"): one that left them all
// out (vshards it does not follow) does not hold the push, one that left some out holds it
// for the others only, and neither may answer a retry of the rows it left out "duplicate"
// once it leads their vshards. Its keys go with the rows it drops. Re-routed pieces
// (PushKey.piece) keep their key on the follower too.
#include <vector>

#include "absl/time/clock.h"
#include "common/routing/hash.h"
#include "gtest/gtest.h"
#include "ps/ps_core.h"
#include "ps/replica_test_pods.h"
#include "ps/storage/log_record.h"

namespace ps {
namespace {

using replica_test::kDim;
using replica_test::kVShards;
using replica_test::MakePush;
using replica_test::Range;
using replica_test::Replicate;
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

// A follower that kept only some of a record's rows (the vshards it follows) knows its key
// for those vshards only: led by it after a failover, a retry of the whole part applies
// the rows it left out, once, and not those it kept. (Before, it knew the key whole and
// answered the retry "duplicate": the rows it left out were lost, as in migration_test at
// R = 2, where ps-0 followed some of ps-2's vshards and later imported the others.)
TEST_P(FollowerKeysTest, AFollowerThatKeptSomeRowsKnowsTheKeyForThoseVShardsOnly) {
  std::vector<int64_t> ids = IdsIn(0, kVShards / 2, 3);
  const std::vector<int64_t> upper = IdsIn(kVShards / 2, kVShards, 3);
  ids.insert(ids.end(), upper.begin(), upper.end());
  const PushRequest push = MakePush(ids, 0.5f, 11, 1);
  PushResponse resp;
  ASSERT_TRUE(a_->Push(push, &resp).ok());  // acknowledged: b answered the record
  const auto kept = Rows(*b_);
  ASSERT_EQ(kept.size(), 3u);
  Promote();
  PushResponse retry;
  ASSERT_TRUE(b_->Push(push, &retry).ok());
  EXPECT_FALSE(retry.duplicate());
  auto rows = Rows(*b_);
  EXPECT_EQ(rows.size(), 6u);
  for (const auto& [id, row] : kept) EXPECT_EQ(rows[id], row) << id;  // not applied twice
  const auto at_a = Rows(*a_);
  for (int64_t id : upper) EXPECT_EQ(rows[id], at_a.at(id)) << id;  // applied once, the same
  PushResponse again;
  ASSERT_TRUE(b_->Push(push, &again).ok());
  EXPECT_TRUE(again.duplicate());
  EXPECT_EQ(Rows(*b_), rows);
}

// A follower's keys go with the rows it drops. Here a record its primary lost (shipped to
// b, then the primary was SIGKILLed before its own log write, so it restarted without it):
// b stops following those vshards (its rows are dropped), then leads them (promoted here;
// in migration_test by a copy from that primary, which lacks the push too). The client's
// retry must apply; b answered it "duplicate" before, from the key it kept.
TEST_P(FollowerKeysTest, AKeyIsForgottenWithTheRowsAFollowerDrops) {
  const std::vector<int64_t> ids = IdsIn(0, kVShards / 2, 4);
  const PushRequest push = MakePush(ids, 0.25f, 11, 7);
  LogRecordBuilder record(push.key(), 0);
  const std::vector<uint64_t> steps(ids.size(), 1);
  const std::vector<float> grads(ids.size() * kDim, 0.25f);
  record.AddTable("emb", 0.1f, kDim, ids, steps, grads.data());
  ASSERT_TRUE(Replicate(*b_, 2, "a", {record.Finish()}).ok());
  ASSERT_EQ(Rows(*b_).size(), ids.size());
  ApplyAssignmentResponse resp;
  ASSERT_TRUE(b_->ApplyAssignment(Role(3, "b", {}, {}, {}), &resp).ok());  // follows nothing
  EXPECT_TRUE(Rows(*b_).empty());
  Promote();
  PushResponse retry;
  ASSERT_TRUE(b_->Push(push, &retry).ok());
  EXPECT_FALSE(retry.duplicate());
  EXPECT_EQ(Rows(*b_).size(), ids.size());
}

// A push routed under an older map than its primary's is recorded there exactly (for the
// vshards of its rows: the stale map may have sent the rest of its part elsewhere), and
// its record says so, so its follower records it the same way. Before, the record carried
// no mark: the follower recorded the key whole and, promoted, answered the retry of the
// part's other rows "duplicate" although they never applied anywhere (a lost push).
class ExactKeysTest : public replica_test::ReplicaPairTest {
 protected:
  void SetUp() override {
    ReplicaPairTest::SetUp();
    if (HasFatalFailure()) return;
    ApplyAssignmentResponse resp;
    ASSERT_TRUE(
        b_->ApplyAssignment(Role(2, "b", {}, {}, replica_test::FollowingAll("a")), &resp).ok());
    ASSERT_TRUE(a_->ApplyAssignment(Role(2, "a", Range(0, kVShards), {"b"}, {}), &resp).ok());
  }
};

TEST_P(ExactKeysTest, AFollowerRecordsAStaleRoutedPushExactlyAsItsPrimary) {
  PushRequest lower = MakePush(IdsIn(0, kVShards / 2, 3), 0.5f, 11, 1);
  lower.set_epoch(1);  // routed under the map before a's
  PushResponse resp;
  ASSERT_TRUE(a_->Push(lower, &resp).ok());  // acknowledged: b answered the record
  ASSERT_FALSE(resp.duplicate());
  ASSERT_EQ(Rows(*b_), Rows(*a_));
  // The rest of the part: the stale map sent it elsewhere; re-routed, it comes here under
  // the same key.
  PushRequest upper = MakePush(IdsIn(kVShards / 2, kVShards, 2), 0.5f, 11, 1);
  ApplyAssignmentResponse assigned;
  ASSERT_TRUE(b_->ApplyAssignment(Role(5, "b", Range(0, kVShards), {}, {}), &assigned).ok());
  b_->RenewWriteLease(absl::Now() + absl::Hours(1));
  upper.set_epoch(5);
  PushResponse rest;
  ASSERT_TRUE(b_->Push(upper, &rest).ok());
  EXPECT_FALSE(rest.duplicate());  // the rows of vshards the push never held apply
  EXPECT_EQ(Rows(*b_).size(), 5u);
  PushResponse again;
  ASSERT_TRUE(b_->Push(lower, &again).ok());
  EXPECT_TRUE(again.duplicate());  // and those it held do not apply twice
  PushResponse twice;
  ASSERT_TRUE(b_->Push(upper, &twice).ok());
  EXPECT_TRUE(twice.duplicate());
}

INSTANTIATE_TEST_SUITE_P(DurableAndInMemory, ExactKeysTest, testing::Bool(),
                         replica_test::DurableOrInMemory);

// Durable pods whose state after a kill is in their logs alone: no materialization round
// runs, none on close.
replica_test::ReplicaPairOptions LogOnlyDurablePods() {
  replica_test::ReplicaPairOptions options;
  options.durable = true;
  options.pod.storage.materialize_ms = 600000;
  options.pod.storage.materialize_on_close = false;
  return options;
}

// The same after the primary restarts from its log alone (as after a SIGKILL): recovery
// reads the mark and keeps the key exact (ResolveRecoveredLog). Before, it released every
// recovered key whole, and answered the retry of the rest of the part "duplicate".
class RestartedExactKeysTest : public ExactKeysTest {
 protected:
  replica_test::ReplicaPairOptions Options() override { return LogOnlyDurablePods(); }
};

TEST_F(RestartedExactKeysTest, APrimaryKeepsAStaleRoutedPushExactAcrossARestart) {
  PushRequest lower = MakePush(IdsIn(0, kVShards / 2, 3), 0.5f, 11, 1);
  lower.set_epoch(1);
  PushResponse resp;
  ASSERT_TRUE(a_->Push(lower, &resp).ok());
  Stop("a");
  Restart("a");
  ApplyAssignmentResponse assigned;
  ASSERT_TRUE(a_->ApplyAssignment(Role(3, "a", Range(0, kVShards), {"b"}, {}), &assigned).ok());
  PushRequest upper = MakePush(IdsIn(kVShards / 2, kVShards, 2), 0.5f, 11, 1);
  upper.set_epoch(3);
  // The re-shipped record's key waits for b: a retry is told to wait until then.
  PushResponse rest;
  absl::Status s;
  for (int i = 0; i < 2000; ++i) {
    rest.Clear();
    s = a_->Push(upper, &rest);
    if (s.code() != absl::StatusCode::kAborted) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_FALSE(rest.duplicate());  // the rows of vshards the push never held apply
  EXPECT_EQ(Rows(*a_).size(), 5u);
  PushResponse again;
  ASSERT_TRUE(a_->Push(lower, &again).ok());
  EXPECT_TRUE(again.duplicate());
}

INSTANTIATE_TEST_SUITE_P(DurableAndInMemory, FollowerKeysTest, testing::Bool(),
                         replica_test::DurableOrInMemory);

// The same after b restarts from its log alone (as after a SIGKILL: no round stored its
// state), where its record holds the rows it kept but not which it left out: recovery
// keeps the key for the record's vshards only (ResolveRecoveredLog).
class RestartedFollowerKeysTest : public FollowerKeysTest {
 protected:
  replica_test::ReplicaPairOptions Options() override { return LogOnlyDurablePods(); }
};

TEST_F(RestartedFollowerKeysTest, KnowsItsLoggedRecordsKeysForTheirRowsOnly) {
  std::vector<int64_t> ids = IdsIn(0, kVShards / 2, 3);
  const std::vector<int64_t> upper = IdsIn(kVShards / 2, kVShards, 3);
  ids.insert(ids.end(), upper.begin(), upper.end());
  const PushRequest push = MakePush(ids, 0.5f, 11, 1);
  PushResponse resp;
  ASSERT_TRUE(a_->Push(push, &resp).ok());
  const auto kept = Rows(*b_);
  ASSERT_EQ(kept.size(), 3u);
  Stop("b");
  Restart("b");
  ASSERT_EQ(Rows(*b_), kept);
  ApplyAssignmentResponse assigned;
  ASSERT_TRUE(
      b_->ApplyAssignment(Role(3, "b", {}, {}, {{"a", Range(0, kVShards / 2)}}), &assigned).ok());
  Promote();
  PushResponse retry;
  ASSERT_TRUE(b_->Push(push, &retry).ok());
  EXPECT_FALSE(retry.duplicate());
  auto rows = Rows(*b_);
  EXPECT_EQ(rows.size(), 6u);
  for (const auto& [id, row] : kept) EXPECT_EQ(rows[id], row) << id;
}

}  // namespace
}  // namespace ps
