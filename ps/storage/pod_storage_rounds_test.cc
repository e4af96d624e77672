// When the background materialization rounds run (PodStorage::WaitForRound): at the
// replicated interval once the pod is replicated, and early, whatever the interval, once
// the push log holds half of its bound, so pushes never wait for the timer. Each test
// waits for the round it expects (up to a minute); none asserts how soon it came.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <numeric>
#include <vector>

#include "absl/time/clock.h"
#include "embedding/spec.h"
#include "proto/packed.h"
#include "ps/ps_core.h"
#include "ps/storage/pod_storage.h"

namespace ps {
namespace {

constexpr uint32_t kDim = 16;
constexpr int kIds = 256;  // a record of about kIds * (kDim + 4) * 4 = 20 KiB

class PodStorageRoundsTest : public ::testing::Test {
 public:
  void SetUp() override {
    char tmpl[] = "/tmp/pod_storage_rounds_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // A pod whose timer never fires by itself within a test (an hour), unless replicated.
  std::unique_ptr<PsCore> Open(uint64_t max_log_bytes, int replicated_materialize_ms) {
    PsCoreOptions options;
    options.storage.db.dir = root_ + "/db";
    options.storage.materialize_ms = 3600 * 1000;
    options.storage.replicated_materialize_ms = replicated_materialize_ms;
    options.storage.log.max_log_bytes = max_log_bytes;
    options.storage.materialize_on_close = false;  // a close leaves the log as it is
    auto core = PsCore::Open(options, ShardOwnership::All(16));
    EXPECT_TRUE(core.ok()) << core.status();
    if (!core.ok()) return nullptr;
    CreateTableRequest req;
    TableSpec* spec = req.mutable_spec();
    spec->set_name("emb");
    spec->set_dim(kDim);
    spec->mutable_optimizer()->set_kind(OptimizerSpec::SGD);
    CreateTableResponse resp;
    EXPECT_TRUE((*core)->CreateTable(req, &resp).ok());
    return *std::move(core);
  }

  static void Push(PsCore& core, uint64_t seq) {
    PushRequest req;
    req.mutable_key()->set_worker_id(3);
    req.mutable_key()->set_incarnation(1);
    req.mutable_key()->set_sequence(seq);
    TableGrads* t = req.add_tables();
    t->set_table("emb");
    std::vector<int64_t> ids(kIds);
    std::iota(ids.begin(), ids.end(), int64_t(seq) * kIds);
    *t->mutable_ids() = Pack<int64_t>(ids);
    *t->mutable_grads() = Pack<float>(std::vector<float>(ids.size() * kDim, 0.5f));
    PushResponse resp;
    ASSERT_TRUE(core.Push(req, &resp).ok());
  }

  // Waits up to a minute for the first background round.
  static bool RoundRan(PsCore& core) {
    const absl::Time deadline = absl::Now() + absl::Minutes(1);
    while (core.storage()->stats().materialize_rounds == 0) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return true;
  }

  std::string root_;
};

TEST_F(PodStorageRoundsTest, LogAtHalfItsBoundStartsARoundBeforeTheTimer) {
  {
    // Three records (~60 KiB): past half of the 100 KiB bound, not past the bound, where
    // pushes would wait for the round.
    auto core = Open(/*max_log_bytes=*/100 << 10, /*replicated_materialize_ms=*/0);
    ASSERT_NE(core, nullptr);
    for (uint64_t seq = 1; seq <= 3; ++seq) Push(*core, seq);
    ASSERT_TRUE(RoundRan(*core)) << "no round within a minute of the log passing half its bound";
  }
  // The round truncated the log: a restart replays nothing, and has every row stored.
  auto core = Open(100 << 10, 0);
  ASSERT_NE(core, nullptr);
  EXPECT_EQ(core->storage()->recovery().log_records, 0u);
  EXPECT_EQ(core->storage()->recovery().rows, 3u * kIds);
}

TEST_F(PodStorageRoundsTest, BelowHalfTheBoundTheLogWaitsForTheTimer) {
  auto core = Open(/*max_log_bytes=*/uint64_t{1} << 30, /*replicated_materialize_ms=*/0);
  ASSERT_NE(core, nullptr);
  Push(*core, 1);
  // A round may only come from the timer, an hour away: none after a few of the
  // materializer's 100 ms checks.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(core->storage()->stats().materialize_rounds, 0u);
}

TEST_F(PodStorageRoundsTest, ReplicatedPodRoundsAtTheReplicatedInterval) {
  auto core = Open(/*max_log_bytes=*/uint64_t{1} << 30, /*replicated_materialize_ms=*/20);
  ASSERT_NE(core, nullptr);
  Push(*core, 1);
  // Not replicated: the hour's timer. Replicated (R >= 2): every 20 ms, taken up by the
  // materializer already waiting on the hour.
  core->storage()->SetReplicated(true);
  ASSERT_TRUE(RoundRan(*core)) << "no round within a minute at a 20 ms replicated interval";
}

}  // namespace
}  // namespace ps
