// ReplicaOrder: a follower runs each primary's numbered batches in number order, whatever
// order they arrive in; it refuses what it cannot order, and bounds what waits.
#include "ps/replica_order.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

// Records what ran (the batches' first numbers) and what was refused.
struct Log {
  std::vector<uint64_t> ran;
  std::vector<uint64_t> refused;
  // A batch of `count` records at `first` that applies `applies` of them (all: -1).
  ReplicaOrder::Run Batch(uint64_t first, uint64_t count, int64_t applies = -1) {
    return [this, first, count, applies](absl::Status turn) -> uint64_t {
      if (!turn.ok()) {
        EXPECT_EQ(turn.code(), absl::StatusCode::kUnavailable) << turn;
        refused.push_back(first);
        return 0;
      }
      ran.push_back(first);
      return applies < 0 ? count : static_cast<uint64_t>(applies);
    };
  }
};

TEST(ReplicaOrderTest, BatchesArrivingOutOfOrderRunInNumberOrder) {
  Log log;
  ReplicaOrder order;
  order.Submit("ps-0", 7, 0, 2, /*restart=*/true, log.Batch(0, 2));
  // 8.., 5.., 2.. arrive in that order: each waits for the one before it.
  order.Submit("ps-0", 7, 8, 1, false, log.Batch(8, 1));
  order.Submit("ps-0", 7, 5, 3, false, log.Batch(5, 3));
  EXPECT_EQ(log.ran, (std::vector<uint64_t>{0}));
  order.Submit("ps-0", 7, 2, 3, false, log.Batch(2, 3));
  EXPECT_EQ(log.ran, (std::vector<uint64_t>{0, 2, 5, 8}));
  EXPECT_EQ(order.parked_total(), 2u);
  EXPECT_TRUE(log.refused.empty());
}

TEST(ReplicaOrderTest, ABatchThatComesAgainRunsAgain) {
  Log log;
  ReplicaOrder order;
  order.Submit("ps-0", 7, 0, 4, true, log.Batch(0, 4));
  order.Submit("ps-0", 7, 2, 4, false, log.Batch(2, 4));  // overlaps: replayed idempotently
  order.Submit("ps-0", 7, 6, 1, false, log.Batch(6, 1));
  EXPECT_EQ(log.ran, (std::vector<uint64_t>{0, 2, 6}));
}

TEST(ReplicaOrderTest, AnUnknownStreamWithoutRestartIsRefusedAtOnce) {
  // A follower that restarted knows no stream: the primary must resend from what it holds.
  Log log;
  ReplicaOrder order;
  order.Submit("ps-0", 7, 10, 2, false, log.Batch(10, 2));
  EXPECT_EQ(log.refused, (std::vector<uint64_t>{10}));
  order.Submit("ps-0", 7, 4, 6, true, log.Batch(4, 6));  // records below 4 are held here
  order.Submit("ps-0", 7, 10, 2, false, log.Batch(10, 2));
  EXPECT_EQ(log.ran, (std::vector<uint64_t>{4, 10}));
}

TEST(ReplicaOrderTest, ANewStreamFailsTheOldStreamsWaitingBatches) {
  Log log;
  ReplicaOrder order;
  order.Submit("ps-0", 7, 0, 1, true, log.Batch(0, 1));
  order.Submit("ps-0", 7, 5, 1, false, log.Batch(5, 1));  // waits for 1..4
  order.Submit("ps-0", 9, 0, 1, true, log.Batch(0, 1));   // the primary restarted
  EXPECT_EQ(log.refused, (std::vector<uint64_t>{5}));
  EXPECT_EQ(log.ran, (std::vector<uint64_t>{0, 0}));
  order.Submit("ps-0", 9, 1, 1, false, log.Batch(1, 1));
  EXPECT_EQ(log.ran, (std::vector<uint64_t>{0, 0, 1}));
}

TEST(ReplicaOrderTest, AFailedBatchFailsTheBatchesWaitingBehindIt) {
  Log log;
  ReplicaOrder order;
  order.Submit("ps-0", 7, 0, 1, true, log.Batch(0, 1));
  order.Submit("ps-0", 7, 3, 1, false, log.Batch(3, 1));
  order.Submit("ps-0", 7, 1, 2, false, log.Batch(1, 2, /*applies=*/1));  // record 2 fails
  EXPECT_EQ(log.ran, (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(log.refused, (std::vector<uint64_t>{3}));
  // The primary resends from record 2 (a new generation, with restart).
  order.Submit("ps-0", 7, 2, 2, true, log.Batch(2, 2));
  EXPECT_EQ(log.ran, (std::vector<uint64_t>{0, 1, 2}));
}

TEST(ReplicaOrderTest, WaitingBatchesAreBoundedPerPrimary) {
  ReplicaOrderOptions options;
  options.max_parked = 2;
  Log log;
  ReplicaOrder order(options);
  order.Submit("ps-0", 7, 0, 1, true, log.Batch(0, 1));
  order.Submit("ps-0", 7, 5, 1, false, log.Batch(5, 1));
  order.Submit("ps-0", 7, 6, 1, false, log.Batch(6, 1));
  order.Submit("ps-0", 7, 7, 1, false, log.Batch(7, 1));  // a third: refused
  EXPECT_EQ(log.refused, (std::vector<uint64_t>{7}));
  // Another primary's stream is independent.
  order.Submit("ps-1", 3, 0, 1, true, log.Batch(100, 1));
  EXPECT_EQ(log.ran, (std::vector<uint64_t>{0, 100}));
  EXPECT_EQ(order.refused_total(), 1u);
}

TEST(ReplicaOrderTest, UnnumberedBatchesRunOnArrival) {
  Log log;
  ReplicaOrder order;
  order.Submit("ps-0", 0, 0, 1, false, log.Batch(1, 1));
  order.Submit("ps-0", 0, 0, 1, false, log.Batch(2, 1));
  EXPECT_EQ(log.ran, (std::vector<uint64_t>{1, 2}));
}

TEST(ReplicaOrderTest, ShuttingDownFailsWaitingBatches) {
  Log log;
  {
    ReplicaOrder order;
    order.Submit("ps-0", 7, 0, 1, true, log.Batch(0, 1));
    order.Submit("ps-0", 7, 4, 1, false, log.Batch(4, 1));
  }
  EXPECT_EQ(log.refused, (std::vector<uint64_t>{4}));
}

TEST(ReplicaOrderTest, ABatchWaitingTooLongFailsAtTheNextArrival) {
  ReplicaOrderOptions options;
  options.max_wait = absl::ZeroDuration();
  Log log;
  ReplicaOrder order(options);
  order.Submit("ps-0", 7, 0, 1, true, log.Batch(0, 1));
  order.Submit("ps-0", 7, 4, 1, false, log.Batch(4, 1));
  absl::SleepFor(absl::Milliseconds(2));  // any positive wait exceeds a zero max_wait
  order.Submit("ps-1", 3, 0, 1, true, log.Batch(100, 1));
  EXPECT_EQ(log.refused, (std::vector<uint64_t>{4}));
}

}  // namespace
}  // namespace ps
