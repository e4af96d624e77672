// A primary deposed of SOME of its vshards (a failover of those with a follower; it keeps
// its sole copies, or those whose follower stays) while a push is queued for a follower
// that has not answered. Before, every queued record failed and its key was finished
// "not applied", although its rows stayed applied on the copy still authoritative for the
// kept vshards: the client's retry (same key, whole or as re-routed pieces) applied them
// there a second time. Now the key counts as applied for the kept vshards only, the
// followers the pod keeps still get the record, and the failed-over rows apply once at
// their new primary (ps_core_migrate.cc, ApplyAssignment; Replicator::Depose).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/routing/hash.h"
#include "gtest/gtest.h"
#include "ps/ps_core.h"
#include "ps/replica_test_pods.h"

namespace ps {
namespace {

using replica_test::kDim;
using replica_test::kVShards;
using replica_test::PendingPush;
using replica_test::Range;
using replica_test::Role;
using replica_test::Rows;
using replica_test::UnitPush;
using replica_test::Weights;

constexpr uint32_t kLow = 0;              // fails over to b
constexpr uint32_t kHigh = kVShards - 1;  // a keeps it

// The first `n` ids of "emb" in vshard `v`.
std::vector<int64_t> IdsOf(uint32_t v, size_t n) {
  std::vector<int64_t> ids;
  for (int64_t id = 1; ids.size() < n; ++id) {
    if (VShardOf(RouteHash(NameHash("emb"), id), kVShards) == v) ids.push_back(id);
  }
  return ids;
}

// How many times each of `ids` was pushed on `core` (CountingSpec: a unit push adds 1 to
// every weight); -1 for a row whose weights differ, 0 for an absent row.
std::map<int64_t, float> Counts(PsCore& core, const std::vector<int64_t>& ids) {
  const auto rows = Rows(core);
  std::map<int64_t, float> out;
  for (int64_t id : ids) {
    auto it = rows.find(id);
    if (it == rows.end()) {
      out[id] = 0;
      continue;
    }
    const std::vector<float> w = Weights(it->second);
    float c = w[0];
    for (uint32_t i = 1; i < kDim; ++i) {
      if (w[i] != c) c = -1;
    }
    out[id] = c;
  }
  return out;
}

std::map<int64_t, float> Each(const std::vector<int64_t>& ids, float c) {
  std::map<int64_t, float> out;
  for (int64_t id : ids) out[id] = c;
  return out;
}

PushRequest Piece(const std::vector<int64_t>& ids, uint32_t v) {
  PushRequest p = UnitPush(ids, 1);
  p.mutable_key()->set_piece(v + 1);
  return p;
}

// Pods a, b and c; a leads every vshard, b follows its lower half. With `c_follows`, c
// follows the upper half; otherwise a holds the only copy of it.
class DeposedKeysTest : public replica_test::ReplicaPairFixture,
                        public testing::WithParamInterface<bool> {
 protected:
  replica_test::ReplicaPairOptions Options() override {
    replica_test::ReplicaPairOptions options;
    options.durable = GetParam();
    options.emb = replica_test::CountingSpec();
    return options;
  }
  void Start(bool c_follows) {
    c_ = Open("c");
    ASSERT_NE(c_, nullptr);
    ASSERT_TRUE(replica_test::CreateTable(*c_, replica_test::CountingSpec()).ok());
    c_->RenewWriteLease(absl::Now() + absl::Hours(1));
    sender_->Add("c:1", c_.get());
    Apply(*b_, Role(2, "b", {}, {}, {{"a", Range(0, kVShards / 2)}}));
    std::vector<std::string> followers = {"b"};
    if (c_follows) {
      Apply(*c_, Role(2, "c", {}, {}, {{"a", Range(kVShards / 2, kVShards)}}));
      followers.push_back("c");
    }
    Apply(*a_, Role(2, "a", Range(0, kVShards), followers, {}));
  }
  void TearDown() override {
    sender_->Remove("c:1");
    c_.reset();
    ReplicaPairFixture::TearDown();
    pending_.reset();  // answered by now (the cores are gone)
  }

  // The part (ids of kLow and kHigh) is pushed to a and applied there; b does not answer.
  void PushWhileBIsSilent() {
    sender_->Remove("b:1");
    pending_ = std::make_unique<PendingPush>(*a_, UnitPush(part_, 1));
    for (int i = 0; i < 6000 && Counts(*a_, part_) != Each(part_, 1); ++i) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_EQ(Counts(*a_, part_), Each(part_, 1)) << "a never applied the part";
    EXPECT_FALSE(pending_->done()) << "acknowledged although b does not answer";
  }

  // a's lower half fails over to b (which never got the part); a keeps the upper half,
  // with c as its follower if `c_follows`. (b stays out of the sender: a reaches it no
  // more.)
  void FailOverTheLowerHalf(bool c_follows) {
    Apply(*b_, Role(5, "b", Range(0, kVShards / 2), {}, {}));
    if (c_follows) Apply(*c_, Role(5, "c", {}, {}, {{"a", Range(kVShards / 2, kVShards)}}));
    Apply(*a_, Role(5, "a", Range(kVShards / 2, kVShards),
                    c_follows ? std::vector<std::string>{"c"} : std::vector<std::string>{}, {}));
  }

  // The client retries the part, whole (a refuses it: it no longer leads the lower half)
  // and as the pieces of the new map: each row holds the update exactly once at its owner.
  void RetryAndCheck() {
    const absl::Status first = pending_->Wait();
    EXPECT_EQ(first.code(), absl::StatusCode::kUnavailable) << first;
    PushResponse whole;
    const absl::Status s = a_->Push(UnitPush(part_, 1), &whole);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_FALSE(whole.duplicate());
    PushResponse high;
    ASSERT_TRUE(a_->Push(Piece(high_, kHigh), &high).ok());
    EXPECT_TRUE(high.duplicate()) << "a applied its kept rows of the push again";
    // The kept rows alone under the whole key (a client that narrows its part).
    PushResponse high_whole;
    ASSERT_TRUE(a_->Push(UnitPush(high_, 1), &high_whole).ok());
    EXPECT_TRUE(high_whole.duplicate());
    PushResponse low;
    ASSERT_TRUE(b_->Push(Piece(low_, kLow), &low).ok());
    EXPECT_FALSE(low.duplicate());
    EXPECT_EQ(Counts(*a_, high_), Each(high_, 1));
    EXPECT_EQ(Counts(*b_, low_), Each(low_, 1));
  }

  const std::vector<int64_t> low_ = IdsOf(kLow, 2);
  const std::vector<int64_t> high_ = IdsOf(kHigh, 2);
  const std::vector<int64_t> part_ = [this] {
    std::vector<int64_t> p = low_;
    p.insert(p.end(), high_.begin(), high_.end());
    return p;
  }();
  std::unique_ptr<PsCore> c_;
  std::unique_ptr<PendingPush> pending_;
};

// a keeps its sole copy of the upper half (a restart in periodic mode; a paused pod).
TEST_P(DeposedKeysTest, KeptSoleCopyRowsApplyOnce) {
  Start(/*c_follows=*/false);
  if (HasFatalFailure()) return;
  PushWhileBIsSilent();
  if (HasFatalFailure()) return;
  FailOverTheLowerHalf(/*c_follows=*/false);
  RetryAndCheck();
}

// c, the follower of the kept half, holds the part; b does not.
TEST_P(DeposedKeysTest, KeptRowsWithAnAnsweringFollowerApplyOnce) {
  Start(/*c_follows=*/true);
  if (HasFatalFailure()) return;
  PushWhileBIsSilent();
  if (HasFatalFailure()) return;
  for (int i = 0; i < 6000 && Counts(*c_, high_) != Each(high_, 1); ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(Counts(*c_, high_), Each(high_, 1)) << "c never held the part";
  FailOverTheLowerHalf(/*c_follows=*/true);
  RetryAndCheck();
  EXPECT_EQ(Counts(*c_, high_), Each(high_, 1));
}

// Neither follower answers when a is deposed: the push's record still waits for c, which
// stays a's follower of the kept half (its replica must get those rows), and fails only
// then; c's replica equals a's.
TEST_P(DeposedKeysTest, AKeptFollowerStillGetsTheKeptRows) {
  Start(/*c_follows=*/true);
  if (HasFatalFailure()) return;
  sender_->Remove("c:1");
  PushWhileBIsSilent();
  if (HasFatalFailure()) return;
  FailOverTheLowerHalf(/*c_follows=*/true);
  EXPECT_FALSE(pending_->done()) << "answered before c, still a follower, held the kept rows";
  EXPECT_EQ(Counts(*c_, high_), Each(high_, 0));
  sender_->Add("c:1", c_.get());
  RetryAndCheck();
  EXPECT_EQ(Counts(*c_, high_), Each(high_, 1));
}

INSTANTIATE_TEST_SUITE_P(DurableAndInMemory, DeposedKeysTest, testing::Bool(),
                         replica_test::DurableOrInMemory);

}  // namespace
}  // namespace ps
