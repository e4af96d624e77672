// A replicated pod back with its disk (ps_core_replicate.cc, ResolveRecoveredLog): the
// records its log recovered may be missing on its followers (its ship queue died with it).
// In process, a primary `a` logs a push its follower `b` never receives (the sender's gate
// is closed), stops and reopens on its data dir. Until it knows its role a retry of that
// push is told to wait; back as the primary it re-ships the record, answers the retry only
// once `b` holds it, and both end bit-identical with the push applied once; deposed, it
// forgets the key (the new primary decides) instead of answering "duplicate".
#include <memory>

#include "gtest/gtest.h"
#include "ps/ps_core.h"
#include "ps/replica_test_pods.h"

namespace ps {
namespace {

using replica_test::kDim;
using replica_test::kVShards;
using replica_test::PendingPush;
using replica_test::Range;
using replica_test::Rows;
using replica_test::UnitPush;
using replica_test::Weights;

// `pod` owns every vshard (if `owns`) with `followers`, or follows every vshard of `primary`.
Assignment Role(uint64_t epoch, const std::string& pod, bool owns,
                const std::vector<std::string>& followers, const std::string& primary = "") {
  return replica_test::Role(epoch, pod, owns ? Range(0, kVShards) : std::vector<uint32_t>{},
                            followers, replica_test::FollowingAll(primary));
}

class RecoveredLogTest : public replica_test::ReplicaPairFixture {
 protected:
  replica_test::ReplicaPairOptions Options() override {
    replica_test::ReplicaPairOptions options;
    options.durable = true;
    options.pod.storage.materialize_ms = 1;  // rounds all the time: the log must survive them
    options.pod.eviction_interval_ms = 0;
    options.emb = replica_test::CountingSpec();
    return options;
  }

  void SetUp() override {
    ReplicaPairFixture::SetUp();
    if (HasFatalFailure()) return;
    Apply(*b_, Role(2, "b", false, {}, "a"));
    Apply(*a_, Role(2, "a", true, {"b"}));
    // Acknowledged: both hold it.
    PushResponse resp;
    ASSERT_TRUE(a_->Push(UnitPush({1, 2}, 1), &resp).ok());
    // Logged on `a` only: its follower never answers, and `a` stops (as if killed: the
    // push was never acknowledged).
    sender_->Close();
    pending_ = std::make_unique<PendingPush>(*a_, push_);
    while (sender_->calls() < 3) absl::SleepFor(absl::Milliseconds(1));
    ASSERT_FALSE(pending_->done());
    Stop("a");
    ASSERT_TRUE(pending_->done());
    EXPECT_FALSE(pending_->Wait().ok());
    Restart("a");
  }

  const PushRequest push_ = UnitPush({2, 3}, 2);
  std::unique_ptr<PendingPush> pending_;
};

TEST_F(RecoveredLogTest, PrimaryBackWithItsDiskReshipsBeforeAnsweringDuplicate) {
  PushResponse resp;
  // Before its role is known, the retry waits (not "duplicate": b lacks the record).
  EXPECT_EQ(a_->Push(push_, &resp).code(), absl::StatusCode::kAborted);
  // Still the primary (back within its lease); b is still unreachable: still waiting.
  Apply(*a_, Role(3, "a", true, {"b"}));
  EXPECT_EQ(a_->Push(push_, &resp).code(), absl::StatusCode::kAborted);
  sender_->Open();
  absl::Status s;
  while ((s = a_->Push(push_, &resp)).code() == absl::StatusCode::kAborted) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(resp.duplicate());
  // Applied once, on both: row 2 took two pushes (SGD, lr 1, gradient -1), row 3 one.
  const auto rows = Rows(*a_);
  EXPECT_EQ(Weights(rows.at(1)), std::vector<float>(kDim, 1.0f));
  EXPECT_EQ(Weights(rows.at(2)), std::vector<float>(kDim, 2.0f));
  EXPECT_EQ(Weights(rows.at(3)), std::vector<float>(kDim, 1.0f));
  EXPECT_EQ(Rows(*b_), rows);
  // The log of the re-shipped record may now be truncated, and a later push goes through.
  PushResponse later;
  ASSERT_TRUE(a_->Push(UnitPush({3}, 3), &later).ok());
  EXPECT_FALSE(later.duplicate());
  EXPECT_EQ(Rows(*b_), Rows(*a_));
}

TEST_F(RecoveredLogTest, DeposedPodForgetsTheKeyInsteadOfAnsweringDuplicate) {
  // b was promoted while a was down; a comes back leading nothing.
  Apply(*b_, Role(3, "b", true, {}));
  b_->RenewWriteLease(absl::Now() + absl::Hours(1));
  Apply(*a_, Role(3, "a", false, {}));
  // A client with an old map asks a: refused (retry at the owner), never "duplicate".
  PushResponse resp;
  EXPECT_EQ(a_->Push(push_, &resp).code(), absl::StatusCode::kFailedPrecondition);
  // The owner never had it: it applies it, once.
  ASSERT_TRUE(b_->Push(push_, &resp).ok());
  EXPECT_FALSE(resp.duplicate());
  const auto rows = Rows(*b_);
  EXPECT_EQ(Weights(rows.at(2)), std::vector<float>(kDim, 2.0f));
  EXPECT_EQ(Weights(rows.at(3)), std::vector<float>(kDim, 1.0f));
  EXPECT_TRUE(Rows(*a_).empty());  // its rows went with the vshards
}

}  // namespace
}  // namespace ps
