// A replicated primary ships a record to its followers only once its own log holds it
// (ps_core_replicate.cc, ApplyShipped; docs/architecture.md, "Replication"). In process, a
// primary `a` dies (a kill point in its log writer) between applying a push and writing
// its record, then restarts on its disk, its lease live, still the primary of follower `b`.
// Shipped before the write, `b` held the lost record while `a` did not: `a` gave its next
// update of those rows the lost record's step, `b`'s replay skipped it (step <= row step),
// and the replicas differed for good (a failover to `b` lost that update). Shipped after
// the write, `b` never sees the lost record: the client's retry applies it once, on both.
// Both per-push durability modes (process: written to the OS; machine: fsynced too).
#include <atomic>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "ps/ps_core.h"
#include "ps/replica_test_pods.h"

namespace ps {
namespace {

using replica_test::FollowingAll;
using replica_test::kDim;
using replica_test::kVShards;
using replica_test::MakePush;
using replica_test::PendingPush;
using replica_test::Range;
using replica_test::Rows;
using replica_test::Weights;

// A push to rows 1 and 2 that adds `add` to each of their weights (SGD, lr 1).
PushRequest AddPush(float add, uint64_t worker, uint64_t seq) {
  return MakePush({1, 2}, std::vector<float>(2 * kDim, -add), worker, seq);
}

class ShipOrderTest : public replica_test::ReplicaPairFixture,
                      public testing::WithParamInterface<Durability> {
 protected:
  replica_test::ReplicaPairOptions Options() override {
    replica_test::ReplicaPairOptions options;
    options.durable = true;
    options.pod.storage.log.durability = GetParam();
    // No round within the test: the kill point leaves the log failed, which a round
    // would wait on.
    options.pod.storage.materialize_ms = 3600 * 1000;
    options.pod.eviction_interval_ms = 0;
    options.emb = replica_test::CountingSpec();
    options.per_pod = [this](const std::string& name, PsCoreOptions* pod) {
      if (name == "a") pod->storage.log.test_before_write = [this] { return KillPoint(); };
    };
    return options;
  }

  // On a's log writer, before each write: once armed, waits until every record `a` has
  // shipped is held by `b` (so a record shipped before its write is surely on `b`), then
  // stops the write, as a SIGKILL there would.
  bool KillPoint() {
    if (!armed_.exchange(false)) return true;
    for (;;) {
      uint64_t queued = 0;
      for (const auto& f : a_->replication_stats().followers) queued += f.queued_records;
      if (queued == 0) return false;
      absl::SleepFor(absl::Milliseconds(1));
    }
  }

  std::atomic<bool> armed_{false};
};

TEST_P(ShipOrderTest, PrimaryKilledBeforeItsLogWriteLeavesNoRecordOnItsFollower) {
  Apply(*b_, replica_test::Role(2, "b", {}, {}, FollowingAll("a")));
  Apply(*a_, replica_test::Role(2, "a", Range(0, kVShards), {"b"}, {}));
  const PushRequest lost = AddPush(1, /*worker=*/7, /*seq=*/1);
  armed_ = true;
  {
    PendingPush pending(*a_, lost);
    EXPECT_EQ(pending.Wait().code(), absl::StatusCode::kUnavailable);  // never acknowledged
  }
  Stop("a");
  Restart("a");  // same disk, lease live
  Apply(*a_, replica_test::Role(3, "a", Range(0, kVShards), {"b"}, {}));

  // Another client's push of the same rows, then the first client's retry.
  PushResponse resp;
  const PushRequest next = AddPush(10, /*worker=*/8, /*seq=*/1);
  ASSERT_TRUE(a_->Push(next, &resp).ok());
  ASSERT_TRUE(a_->Push(lost, &resp).ok());
  EXPECT_FALSE(resp.duplicate());
  // Each applied once, on both replicas (acknowledged with --replication_ack=all: b holds
  // them).
  const auto rows = Rows(*a_);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(Weights(rows.at(1)), std::vector<float>(kDim, 11.0f));
  EXPECT_EQ(Weights(rows.at(2)), std::vector<float>(kDim, 11.0f));
  EXPECT_EQ(Rows(*b_), rows);

  // a is lost for good: b, promoted, holds both pushes and answers their retries as such.
  Stop("a");
  Apply(*b_, replica_test::Role(4, "b", Range(0, kVShards), {}, {}));
  b_->RenewWriteLease(absl::Now() + absl::Hours(1));
  for (const PushRequest& retry : {lost, next}) {
    ASSERT_TRUE(b_->Push(retry, &resp).ok());
    EXPECT_TRUE(resp.duplicate());
  }
  EXPECT_EQ(Rows(*b_), rows);
}

INSTANTIATE_TEST_SUITE_P(PerPushDurability, ShipOrderTest,
                         testing::Values(Durability::kProcess, Durability::kMachine),
                         [](const testing::TestParamInfo<Durability>& p) {
                           return std::string(DurabilityName(p.param));
                         });

}  // namespace
}  // namespace ps
