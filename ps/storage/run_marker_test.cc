// The run marker through a whole PodStorage: a crash (the destructor without its clean
// close: materialize_on_close off) is seen by the next open, and a periodic crash says the
// log may lack acknowledged records until a clean close clears it.
#include "ps/storage/run_marker.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include "embedding/model_store.h"
#include "ps/storage/pod_storage.h"

namespace ps {
namespace {

class RunMarkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/run_marker_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/db";
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  struct Run {
    ModelStore store;
    PushDedup dedup;
    std::unique_ptr<PodStorage> storage;
  };
  // Opens the database in `mode`; `crash`: its close will be a crash's (no clean close).
  std::unique_ptr<Run> Open(Durability mode, bool crash) {
    auto run = std::make_unique<Run>();
    PodStorageOptions options;
    options.db.dir = dir_;
    options.log.durability = mode;
    options.materialize_ms = 600000;
    options.materialize_on_close = !crash;
    auto storage = PodStorage::Open(options, &run->store, &run->dedup);
    EXPECT_TRUE(storage.ok()) << storage.status();
    if (!storage.ok()) return nullptr;
    run->storage = *std::move(storage);
    return run;
  }
  // Whether the database's previous run lost an acknowledged tail, as an open in `mode`
  // sees it (that open's own close is clean).
  bool TailLostAtOpen(Durability mode) {
    auto run = Open(mode, /*crash=*/false);
    return run != nullptr && run->storage->acknowledged_tail_lost();
  }
  std::string MarkerPath() const { return dir_ + "/RUN-ps-server"; }

  std::string root_, dir_;
};

TEST_F(RunMarkerTest, APeriodicCrashLosesTheTailUntilACleanClose) {
  {
    auto run = Open(Durability::kPeriodic, /*crash=*/true);
    ASSERT_NE(run, nullptr);
    EXPECT_FALSE(run->storage->acknowledged_tail_lost());  // a new database
    EXPECT_TRUE(std::filesystem::exists(MarkerPath()));
  }
  // Seen after the crash, whatever the next mode: it is about the previous run.
  {
    auto run = Open(Durability::kProcess, /*crash=*/true);
    ASSERT_NE(run, nullptr);
    EXPECT_TRUE(run->storage->acknowledged_tail_lost());
  }
  // That run crashed too, before its clean close: the earlier loss is still reported. Its
  // clean close then clears it.
  EXPECT_TRUE(TailLostAtOpen(Durability::kProcess));
  EXPECT_FALSE(std::filesystem::exists(MarkerPath()));
  EXPECT_FALSE(TailLostAtOpen(Durability::kPeriodic));
}

TEST_F(RunMarkerTest, ACrashThatWroteBeforeAcknowledgingLosesNothing) {
  for (Durability mode : {Durability::kProcess, Durability::kMachine}) {
    { ASSERT_NE(Open(mode, /*crash=*/true), nullptr); }
    auto run = Open(mode, /*crash=*/false);
    ASSERT_NE(run, nullptr);
    EXPECT_FALSE(run->storage->acknowledged_tail_lost()) << DurabilityName(mode);
  }
}

TEST_F(RunMarkerTest, ACleanCloseInPeriodicModeLosesNothing) {
  { ASSERT_NE(Open(Durability::kPeriodic, /*crash=*/false), nullptr); }
  EXPECT_FALSE(std::filesystem::exists(MarkerPath()));
  EXPECT_FALSE(TailLostAtOpen(Durability::kPeriodic));
}

TEST_F(RunMarkerTest, ATornMarkerCountsAsALostTail) {
  { ASSERT_NE(Open(Durability::kProcess, /*crash=*/true), nullptr); }
  std::ofstream(MarkerPath(), std::ios::trunc).close();  // cut short while written
  EXPECT_TRUE(TailLostAtOpen(Durability::kProcess));
}

TEST_F(RunMarkerTest, ACheckpointCarriesNoMarker) {
  auto run = Open(Durability::kPeriodic, /*crash=*/true);
  ASSERT_NE(run, nullptr);
  const std::string copy = root_ + "/ckpt";
  ASSERT_TRUE(run->storage->Checkpoint(copy).ok());
  EXPECT_FALSE(std::filesystem::exists(copy + "/RUN-ps-server"));
}

}  // namespace
}  // namespace ps
