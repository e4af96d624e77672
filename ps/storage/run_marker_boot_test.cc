// The run marker's boot id: a process-mode run acknowledges records written to the page
// cache only, so its crash loses nothing on the same boot, and counts as a lost tail once
// the machine went down (another boot id). Boot ids are injected; the database is real.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>

#include "ps/storage/run_marker.h"
#include "ps/storage/storage_db.h"

namespace ps {
namespace {

constexpr char kBootA[] = "6f1e0c3a-0000-4000-8000-00000000000a";
constexpr char kBootB[] = "6f1e0c3a-0000-4000-8000-00000000000b";

class RunMarkerBootTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/run_marker_boot_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  StorageDbOptions Options() const {
    StorageDbOptions options;
    options.dir = root_ + "/db";
    return options;
  }
  // One run on `boot` in `mode` that crashes (its marker stays); returns what it saw of the
  // previous run.
  PreviousRun CrashedRun(Durability mode, absl::string_view boot) {
    auto db = StorageDb::Open(Options());
    EXPECT_TRUE(db.ok()) << db.status();
    if (!db.ok()) return {};
    auto previous = BeginRun(db->get(), mode, boot);
    EXPECT_TRUE(previous.ok()) << previous.status();
    return previous.ok() ? *previous : PreviousRun{};
  }

  std::string root_;
};

TEST_F(RunMarkerBootTest, AProcessCrashOnTheSameBootLosesNothing) {
  CrashedRun(Durability::kProcess, kBootA);
  const PreviousRun seen = CrashedRun(Durability::kProcess, kBootA);
  EXPECT_TRUE(seen.crashed);
  EXPECT_FALSE(seen.lost_acknowledged_tail);
}

TEST_F(RunMarkerBootTest, AProcessCrashFromAnotherBootLostTheTailUntilACleanClose) {
  CrashedRun(Durability::kProcess, kBootA);
  // The machine lost power: the next start is on another boot.
  const PreviousRun after_reboot = CrashedRun(Durability::kProcess, kBootB);
  EXPECT_TRUE(after_reboot.crashed);
  EXPECT_TRUE(after_reboot.lost_acknowledged_tail);
  // That run crashed too before it could report: the loss is reported again, even on its
  // own boot, until a clean close.
  EXPECT_TRUE(CrashedRun(Durability::kProcess, kBootB).lost_acknowledged_tail);
  {
    auto db = StorageDb::Open(Options());
    ASSERT_TRUE(db.ok()) << db.status();
    ASSERT_TRUE(EndRun(db->get()).ok());
  }
  EXPECT_FALSE(CrashedRun(Durability::kProcess, kBootB).crashed);
}

TEST_F(RunMarkerBootTest, AMachineModeCrashFromAnotherBootLosesNothing) {
  CrashedRun(Durability::kMachine, kBootA);  // fsyncs before acknowledging
  const PreviousRun seen = CrashedRun(Durability::kProcess, kBootB);
  EXPECT_TRUE(seen.crashed);
  EXPECT_FALSE(seen.lost_acknowledged_tail);
}

TEST_F(RunMarkerBootTest, WithoutABootIdAProcessCrashCountsAsExact) {
  // Recorded without one, read with one; then recorded with one, read without one.
  CrashedRun(Durability::kProcess, "");
  EXPECT_FALSE(CrashedRun(Durability::kProcess, kBootB).lost_acknowledged_tail);
  EXPECT_FALSE(CrashedRun(Durability::kProcess, "").lost_acknowledged_tail);
}

TEST_F(RunMarkerBootTest, ThisMachineHasABootId) {
  // Linux: the pods' machines. The marker of a process-mode run then carries it.
  EXPECT_EQ(CurrentBootId().size(), 36u) << CurrentBootId();
}

}  // namespace
}  // namespace ps
