// A materialization round of a replicated primary stores the push keys of every record it
// truncates (pod_storage_materialize.cc; Replicator::WaitHeld). Its truncation gate waits
// for the followers to hold the records below its cut, and a primary marks a push's key
// applied only once they do; the round used to read the key state before the gate, so a
// push the gate waited for had its update stored in the rows, its record truncated and its
// key in neither. A crash then, and the push's retry (its fate was unknown to the client)
// was applied a second time: ps-crash-test --replication=2 --kills=8 --seconds=16 found
// markers at 2.
#include <thread>
#include <vector>

#include "absl/time/clock.h"
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

}  // namespace
}  // namespace ps
