// R = 3 on the pod side, in process: why a failover takes the other followers out of the
// ack set (master/membership_replicas.cc, FailOver) and has re-replication copy them again.
// `a` leads every vshard with followers `b` and `c`; a push reaches `b` only (`c` is cut
// off) and `a` dies before acknowledging it. `b` is promoted; the client's retry of the
// push is answered "duplicate" by `b` (it holds it), so `c` never gets it from a stream.
// Kept in the ack set, `c` stays without it (a second failover to `c` would lose an
// acknowledged push); copied again from `b` (the move machinery), `c` holds it,
// bit-identical, and after `b` dies too, `c` has every acknowledged push exactly once.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "ps/ps_core.h"
#include "ps/replica_test_pods.h"

namespace ps::replica_test {
namespace {

// `pod`'s assignment at R = 3: it leads `owned` with `followers`, follows every vshard of
// `primary` (if any), receives `in` and sends `out` (a follower copy).
Assignment R3(uint64_t epoch, const std::string& pod, const std::vector<uint32_t>& owned,
              const std::vector<std::string>& followers, const std::string& primary = "",
              const std::vector<uint32_t>& in = {}, const std::vector<uint32_t>& out = {}) {
  Assignment a = Role(epoch, pod, owned, followers, FollowingAll(primary), in, out);
  a.mutable_replication()->set_factor(3);
  return a;
}

class ThreeCopiesTest : public ReplicaPairFixture {
 protected:
  ReplicaPairOptions Options() override {
    ReplicaPairOptions options;
    options.emb = CountingSpec();
    return options;
  }

  void SetUp() override {
    ReplicaPairFixture::SetUp();
    if (HasFatalFailure()) return;
    c_ = Open("c");
    ASSERT_NE(c_, nullptr);
    ASSERT_TRUE(CreateTable(*c_, Options().emb).ok());
    c_->RenewWriteLease(absl::Now() + absl::Hours(1));
    sender_->Add("c:1", c_.get());
    Apply(*b_, R3(1, "b", {}, {}, "a"));
    Apply(*c_, R3(1, "c", {}, {}, "a"));
    Apply(*a_, R3(1, "a", Range(0, kVShards), {"b", "c"}));
    PushResponse resp;
    ASSERT_TRUE(a_->Push(UnitPush({1, 2}, 1), &resp).ok());  // all three hold it
    // `c` is cut off; the push reaches `b`, and `a` dies waiting for `c`: never acknowledged.
    sender_->Remove("c:1");
    const uint64_t applied = b_->replication_stats().records_applied;
    PendingPush pending(*a_, retried_);
    while (b_->replication_stats().records_applied == applied) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    ASSERT_FALSE(pending.done());
    Stop("a");
    ASSERT_FALSE(pending.Wait().ok());
    sender_->Add("c:1", c_.get());
  }
  void TearDown() override {
    sender_->Remove("c:1");
    c_.reset();
    ReplicaPairFixture::TearDown();
  }

  // The client's retry of the push `a` never acknowledged, at `primary`: acknowledged as a
  // duplicate (it was applied there).
  void RetryAt(PsCore& primary) {
    PushResponse resp;
    ASSERT_TRUE(primary.Push(retried_, &resp).ok());
    EXPECT_TRUE(resp.duplicate());
  }
  // Row `id`'s first weight: how many acknowledged pushes touched it.
  static float Applied(const std::map<int64_t, std::string>& rows, int64_t id) {
    auto it = rows.find(id);
    return it == rows.end() ? 0.0f : Weights(it->second)[0];
  }

  const PushRequest retried_ = UnitPush({2, 3}, 2);
  std::unique_ptr<PsCore> c_;
};

TEST_F(ThreeCopiesTest, KeptInTheAckSetTheOtherFollowerNeverGetsARetriedPush) {
  // The failover as it was: `b` leads with `c` still in its ack set.
  Apply(*c_, R3(2, "c", {}, {}, "b"));
  Apply(*b_, R3(2, "b", Range(0, kVShards), {"c"}));
  RetryAt(*b_);
  PushResponse resp;
  ASSERT_TRUE(b_->Push(UnitPush({4}, 3), &resp).ok());  // `c` holds every later push
  EXPECT_EQ(Applied(Rows(*c_), 4), 1.0f);
  // Acknowledged, on `b` only: the copies differ, and a failover to `c` would lose it.
  EXPECT_EQ(Applied(Rows(*b_), 3), 1.0f);
  EXPECT_EQ(Applied(Rows(*c_), 3), 0.0f);
}

TEST_F(ThreeCopiesTest, RecopiedTheOtherFollowerHoldsItAndSurvivesTheNextFailover) {
  // The failover (epoch 2): `b` leads, `c` leaves the ack set (and drops its rows).
  Apply(*b_, R3(2, "b", Range(0, kVShards), {}));
  Apply(*c_, R3(2, "c", {}, {}));
  EXPECT_TRUE(Rows(*c_).empty());
  RetryAt(*b_);
  // Re-replication: a follower copy of every vshard from `b` into `c` (epoch 3), whose
  // commit (epoch 4) puts `c` in the ack set.
  const std::vector<uint32_t> all = Range(0, kVShards);
  Apply(*c_, R3(3, "c", {}, {}, "", all));
  Apply(*b_, R3(3, "b", all, {}, "", {}, all));
  ASSERT_TRUE(BeginMove(*b_, *c_, 1, all).ok());
  for (auto phase :
       {MigrateExportRequest::SNAPSHOT, MigrateExportRequest::DELTA, MigrateExportRequest::FINAL}) {
    ASSERT_TRUE(CopyPhase(*b_, *c_, 1, phase).ok());
  }
  ASSERT_TRUE(c_->FinishImport().ok());
  Apply(*c_, R3(4, "c", {}, {}, "b"));
  Apply(*b_, R3(4, "b", all, {"c"}));
  PushResponse resp;
  ASSERT_TRUE(b_->Push(UnitPush({3, 4}, 3), &resp).ok());
  // Both copies hold every acknowledged push, bit-identical.
  const auto rows = Rows(*b_);
  EXPECT_EQ(Rows(*c_), rows);
  EXPECT_EQ(Applied(rows, 1), 1.0f);
  EXPECT_EQ(Applied(rows, 2), 2.0f);
  EXPECT_EQ(Applied(rows, 3), 2.0f);
  EXPECT_EQ(Applied(rows, 4), 1.0f);
  // `b` dies too; `c` is promoted: nothing acknowledged is lost, and the retried push,
  // sent once more, is still a duplicate (the copy carried its key).
  Stop("b");
  Apply(*c_, R3(5, "c", all, {}));
  EXPECT_EQ(Rows(*c_), rows);
  RetryAt(*c_);
  EXPECT_EQ(Rows(*c_), rows);
}

}  // namespace
}  // namespace ps::replica_test
