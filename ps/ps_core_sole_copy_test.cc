// --durability=periodic at R >= 2 with a vshard whose ack set is empty (a copy lost,
// re-replication not done): the primary holds the only copy, so it acknowledges a change of
// it only once its log is fsynced (PsCore::AckWhenDurable, ps/synced_acks.h); with a follower
// in the ack set the follower holds it and nothing waits for an fsync. In process: pods `a`
// and `b` (replica_test_pods.h), periodic, whose timed fsync never comes within a test (an
// hour); a full disk is injected to see whether an acknowledgement waited for the log.
#include <atomic>
#include <map>
#include <memory>

#include "gtest/gtest.h"
#include "ps/ps_core.h"
#include "ps/replica_test_pods.h"

namespace ps {
namespace {

using replica_test::kVShards;
using replica_test::MakePush;
using replica_test::Range;

// `a` owns every vshard, with `followers`; sole copy of all of them when it has none.
Assignment PrimaryRole(uint64_t epoch, const std::vector<std::string>& followers) {
  Assignment a = replica_test::Role(epoch, "a", Range(0, kVShards), followers, {});
  if (followers.empty()) {
    for (uint32_t v = 0; v < kVShards; ++v) a.mutable_replication()->add_sole_copy(v);
  }
  return a;
}

Assignment FollowerRole(uint64_t epoch) {
  return replica_test::Role(epoch, "b", {}, {}, {{"a", Range(0, kVShards)}});
}

class SoleCopyTest : public replica_test::ReplicaPairFixture {
 protected:
  replica_test::ReplicaPairOptions Options() override {
    replica_test::ReplicaPairOptions options;
    options.durable = true;
    replica_test::SetPeriodicUntimed(&options.pod);  // no timed fsync within the test
    options.pod.storage.db.inject_write_error = [full = full_] { return full->load(); };
    return options;
  }
  void Apply(PsCore& core, const Assignment& a) {
    ApplyAssignmentResponse resp;
    ASSERT_TRUE(core.ApplyAssignment(a, &resp).ok());
  }
  absl::Status Push(uint64_t seq, const std::vector<int64_t>& ids = {1, 2, 3}) {
    PushResponse resp;
    return a_->Push(MakePush(ids, 0.5f, 7, seq), &resp);
  }

  std::shared_ptr<std::atomic<bool>> full_ = std::make_shared<std::atomic<bool>>(false);
};

TEST_F(SoleCopyTest, ASoleCopysPushIsAcknowledgedOnlyOnceTheLogIsDurable) {
  Apply(*a_, PrimaryRole(1, {}));
  ASSERT_TRUE(Push(1).ok());
  PsCore::ReplicationStats stats = a_->replication_stats();
  EXPECT_EQ(stats.sole_copy, kVShards);
  EXPECT_EQ(stats.sole_copy_synced_acks, 1u);
  EXPECT_GE(stats.sole_copy_syncs, 1u);
  // The disk fills: the record is never written, so the push must not be acknowledged
  // (periodic mode alone acknowledges it at once, and a crash then loses it).
  full_->store(true);
  const absl::Status s = Push(2);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

TEST_F(SoleCopyTest, TheFsyncIsWaitedForOnlyWhileNoFollowerIsInTheAckSet) {
  Apply(*b_, FollowerRole(1));
  Apply(*a_, PrimaryRole(1, {"b"}));
  ASSERT_TRUE(Push(1).ok());
  EXPECT_EQ(a_->replication_stats().sole_copy, 0u);
  EXPECT_EQ(a_->replication_stats().sole_copy_synced_acks, 0u);
  // `b` leaves the ack set: `a` holds the only copy.
  Apply(*a_, PrimaryRole(2, {}));
  ASSERT_TRUE(Push(2).ok());
  ASSERT_TRUE(Push(3).ok());
  EXPECT_EQ(a_->replication_stats().sole_copy_synced_acks, 2u);
  // A follower again (re-replication would have copied rows 1-3 to it first; new rows
  // here): no more waiting, and the follower holds the push.
  Apply(*b_, FollowerRole(3));
  Apply(*a_, PrimaryRole(3, {"b"}));
  ASSERT_TRUE(Push(4, {10, 11}).ok());
  EXPECT_EQ(a_->replication_stats().sole_copy_synced_acks, 2u);
  EXPECT_EQ(a_->replication_stats().sole_copy, 0u);
  EXPECT_EQ(replica_test::Rows(*b_).count(10), 1u);
}

}  // namespace
}  // namespace ps
