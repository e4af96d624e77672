// A materialization round of a replicated primary stores the push keys of every record it
// truncates (pod_storage_materialize.cc; Replicator::WaitHeld). Its truncation gate waits
// for the followers to hold the records below its cut, and a primary marks a push's key
// applied only once they do; the round used to read the key state before the gate, so a
// push the gate waited for had its update stored in the rows, its record truncated and its
// key in neither. A crash then, and the push's retry (its fate was unknown to the client)
// was applied a second time: ps-crash-test --replication=2 --kills=8 --seconds=16 found
// markers at 2. And a replicated pod back with its disk leaves a re-routed piece of a
// vshard it no longer owns to that vshard's owner (PsCore::RefusedOrDuplicate).
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/routing/hash.h"
#include "gtest/gtest.h"
#include "ps/ps_core.h"
#include "ps/replica_test_pods.h"
#include "ps/storage/pod_storage.h"

namespace ps {
namespace {

using replica_test::kDim;
using replica_test::kVShards;
using replica_test::MakePush;
using replica_test::PendingPush;
using replica_test::Range;
using replica_test::Role;
using replica_test::Rows;
using replica_test::Weights;

uint32_t VShard(int64_t id) { return VShardOf(RouteHash(NameHash("emb"), id), kVShards); }

// The first id of "emb" whose vshard is in [begin, end).
int64_t IdsIn(uint32_t begin, uint32_t end) {
  int64_t id = 1;
  while (VShard(id) < begin || VShard(id) >= end) ++id;
  return id;
}

// Durable pods that materialize only when the test says so and close as a kill would;
// SGD at learning rate 1 over zero rows, so a push of -1 adds 1.
class TruncationKeysTest : public replica_test::ReplicaPairFixture {
 protected:
  replica_test::ReplicaPairOptions Options() override {
    replica_test::ReplicaPairOptions options;
    options.durable = true;
    options.pod.storage.materialize_ms = 3600 * 1000;
    options.pod.storage.materialize_on_close = false;
    options.pod.eviction_interval_ms = 0;
    options.emb.mutable_optimizer()->set_kind(OptimizerSpec::SGD);
    options.emb.mutable_optimizer()->set_learning_rate(1.0f);
    options.emb.mutable_initializer()->set_kind(InitializerSpec::ZEROS);
    return options;
  }

  void SetUp() override {
    ReplicaPairFixture::SetUp();
    if (HasFatalFailure()) return;
    Apply(*b_, Role(2, "b", {}, {}, {{"a", Range(0, kVShards)}}));
    Apply(*a_, Role(2, "a", Range(0, kVShards), {"b"}, {}));
  }

  void Apply(PsCore& core, const Assignment& a) {
    ApplyAssignmentResponse resp;
    ASSERT_TRUE(core.ApplyAssignment(a, &resp).ok());
  }
};

TEST_F(TruncationKeysTest, ARecordTheGateWaitedForKeepsItsKey) {
  const PushRequest push = MakePush({1, 2}, std::vector<float>(2 * kDim, -1.0f), 11, 1);
  // Applied and logged on a; b does not answer yet.
  sender_->Close();
  PendingPush pending(*a_, push);
  while (sender_->calls() < 1) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_FALSE(pending.done());
  // A round: its cut is past the push's record, and its gate waits for b (up to 1 s).
  absl::Status round;
  std::thread materializer([&] { round = a_->storage()->Materialize(); });
  absl::SleepFor(absl::Milliseconds(200));
  sender_->Open();  // b holds the record: the push is acknowledged, the round truncates
  ASSERT_TRUE(pending.Wait().ok());
  materializer.join();
  ASSERT_TRUE(round.ok()) << round;
  // a is killed and comes back on its disk, still the primary; the client, which may not
  // have seen the answer, retries.
  Stop("a");
  Restart("a");
  Apply(*a_, Role(3, "a", Range(0, kVShards), {"b"}, {}));
  PushResponse resp;
  absl::Status s;
  while ((s = a_->Push(push, &resp)).code() == absl::StatusCode::kAborted) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(resp.duplicate());
  const auto rows = Rows(*a_);
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& [id, row] : rows) {
    EXPECT_EQ(Weights(row), std::vector<float>(kDim, 1.0f)) << "row " << id;
  }
  EXPECT_EQ(Rows(*b_), rows);
}

// A primary killed while shipping a push comes back with its disk, still leading some of
// the push's vshards (sole copies) while another failed over to its follower, which never
// got the record. The recovered key is confirmed (the pod leads some of its vshards); a
// piece of the other vshard re-routed to it on a stale map must not be answered
// "duplicate" (it used to be, and the push was lost): the refusal stands and the owner,
// which lacks it, applies it.
TEST_F(TruncationKeysTest, ANonOwnerLeavesAReroutedPieceToTheOwner) {
  const int64_t low = IdsIn(0, kVShards / 2), high = IdsIn(kVShards / 2, kVShards);
  const PushRequest push = MakePush({low, high}, std::vector<float>(2 * kDim, -1.0f), 11, 1);
  sender_->Close();
  {
    PendingPush pending(*a_, push);
    while (sender_->calls() < 1) absl::SleepFor(absl::Milliseconds(1));
    Stop("a");
  }
  Restart("a");
  sender_->Open();
  // The failover: b leads the upper half; a keeps the lower half, with no follower.
  Apply(*b_, Role(3, "b", Range(kVShards / 2, kVShards), {}, {}));
  b_->RenewWriteLease(absl::Now() + absl::Hours(1));
  Apply(*a_, Role(3, "a", Range(0, kVShards / 2), {}, {}));
  PushRequest piece = MakePush({high}, std::vector<float>(kDim, -1.0f), 11, 1);
  piece.mutable_key()->set_piece(VShard(high) + 1);
  piece.set_epoch(2);
  PushResponse at_a;
  absl::Status s;
  while ((s = a_->Push(piece, &at_a)).code() == absl::StatusCode::kAborted) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_FALSE(at_a.duplicate());
  PushResponse at_b;
  ASSERT_TRUE(b_->Push(piece, &at_b).ok());
  EXPECT_FALSE(at_b.duplicate());
  EXPECT_EQ(Weights(Rows(*b_).at(high)), std::vector<float>(kDim, 1.0f));
}

}  // namespace
}  // namespace ps
