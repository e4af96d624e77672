// The change journal (change_journal.h): entries survive a reopen, positions name one
// database's history exactly, retention refuses older cursors, and a restored older copy
// does not take the original's later positions.
#include "ps/storage/change_journal.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

using Change = std::tuple<uint32_t, ChangeKind, int64_t>;

class ChangeJournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/change_journal_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::remove_all(dir_ + "_copy");
  }
  void TearDown() override {
    std::filesystem::remove_all(dir_);
    std::filesystem::remove_all(dir_ + "_copy");
  }
  std::unique_ptr<StorageDb> OpenDb(const std::string& dir) {
    StorageDbOptions o;
    o.dir = dir;
    auto db = StorageDb::Open(o);
    EXPECT_TRUE(db.ok()) << db.status();
    return db.ok() ? *std::move(db) : nullptr;
  }
  static std::vector<Change> Since(const ChangeJournal& j, uint64_t seq) {
    std::vector<Change> out;
    EXPECT_TRUE(j.ForEachSince(seq, [&](uint32_t t, ChangeKind k, int64_t id) {
                   out.emplace_back(t, k, id);
                   return absl::OkStatus();
                 }).ok());
    return out;
  }
  std::string dir_;
};

TEST_F(ChangeJournalTest, EntriesSurviveReopenAndNameEveryChangeAfterAPosition) {
  JournalPosition first, second;
  {
    auto db = OpenDb(dir_);
    auto j = ChangeJournal::Open(db.get(), {});
    ASSERT_TRUE(j.ok()) << j.status();
    EXPECT_EQ((*j)->position().seq, 0u);
    EXPECT_NE((*j)->position().identity, 0u);
    ASSERT_TRUE((*j)->Commit().ok());  // nothing noted: no entry
    EXPECT_EQ((*j)->position().seq, 0u);
    (*j)->Note(1, -5, ChangeKind::kWrite);
    (*j)->Note(2, 7, ChangeKind::kDelete);
    ASSERT_TRUE((*j)->Commit().ok());
    first = (*j)->position();
    (*j)->Note(1, int64_t{1} << 62, ChangeKind::kWrite);
    ASSERT_TRUE((*j)->Commit().ok());
    second = (*j)->position();
    EXPECT_EQ(first.seq, 1u);
    EXPECT_EQ(second.seq, 2u);
    EXPECT_NE(first.tag, second.tag);
  }
  auto db = OpenDb(dir_);
  auto j = ChangeJournal::Open(db.get(), {});
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ((*j)->position().identity, first.identity);
  EXPECT_EQ((*j)->position().seq, second.seq);
  EXPECT_EQ((*j)->position().tag, second.tag);
  EXPECT_EQ(Since(**j, 0), (std::vector<Change>{{1, ChangeKind::kWrite, -5},
                                                {2, ChangeKind::kDelete, 7},
                                                {1, ChangeKind::kWrite, int64_t{1} << 62}}));
  EXPECT_EQ(Since(**j, 1), (std::vector<Change>{{1, ChangeKind::kWrite, int64_t{1} << 62}}));
  EXPECT_TRUE(Since(**j, 2).empty());
  EXPECT_TRUE(*(*j)->Covers(first));
  EXPECT_TRUE(*(*j)->Covers({first.identity, 0, 0}));
  // Another database's position, a tag this one never wrote, a position from its future.
  EXPECT_FALSE(*(*j)->Covers({first.identity + 1, first.seq, first.tag}));
  EXPECT_FALSE(*(*j)->Covers({first.identity, first.seq, first.tag + 1}));
  EXPECT_FALSE(*(*j)->Covers({first.identity, 3, 1}));
}

TEST_F(ChangeJournalTest, RetentionRefusesOlderCursorsAndKeepsTheNewestEntry) {
  auto db = OpenDb(dir_);
  ChangeJournalOptions options;
  options.max_bytes = 8 + 2 * 13;  // one entry of two ids
  auto j = ChangeJournal::Open(db.get(), options);
  ASSERT_TRUE(j.ok());
  std::vector<JournalPosition> pos;
  for (int i = 0; i < 3; ++i) {
    (*j)->Note(1, i, ChangeKind::kWrite);
    (*j)->Note(1, 100 + i, ChangeKind::kWrite);
    ASSERT_TRUE((*j)->Commit().ok());
    pos.push_back((*j)->position());
  }
  EXPECT_EQ((*j)->stats().entries, 1u);
  EXPECT_EQ((*j)->stats().floor, 2u);
  auto old = (*j)->Covers(pos[1]);
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(old.status().message().find("full export"), std::string::npos);
  EXPECT_EQ((*j)->Covers({pos[0].identity, 0, 0}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(*(*j)->Covers(pos[2]));
  // One entry over the bound on its own is kept: the position just taken stays valid.
  for (int i = 0; i < 5; ++i) (*j)->Note(2, i, ChangeKind::kDelete);
  ASSERT_TRUE((*j)->Commit().ok());
  EXPECT_TRUE(*(*j)->Covers((*j)->position()));
  EXPECT_EQ(Since(**j, pos[2].seq).size(), 5u);
  // The floor and the sizes are read back at open.
  const JournalPosition last = (*j)->position();
  j->reset();
  auto again = ChangeJournal::Open(db.get(), options);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->stats().floor, 3u);
  EXPECT_EQ((*again)->stats().entries, 1u);
  EXPECT_TRUE(*(*again)->Covers(last));
  EXPECT_EQ((*again)->Covers(pos[2]).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ChangeJournalTest, ARestoredOlderCopyDoesNotTakeTheOriginalsLaterPositions) {
  auto db = OpenDb(dir_);
  auto j = ChangeJournal::Open(db.get(), {});
  ASSERT_TRUE(j.ok());
  (*j)->Note(1, 1, ChangeKind::kWrite);
  ASSERT_TRUE((*j)->Commit().ok());
  const JournalPosition shared = (*j)->position();
  ASSERT_TRUE(db->Checkpoint(dir_ + "_copy").ok());
  (*j)->Note(1, 2, ChangeKind::kWrite);
  ASSERT_TRUE((*j)->Commit().ok());
  const JournalPosition original = (*j)->position();

  auto copy_db = OpenDb(dir_ + "_copy");
  auto copy = ChangeJournal::Open(copy_db.get(), {});
  ASSERT_TRUE(copy.ok());
  EXPECT_EQ((*copy)->position().identity, original.identity);
  EXPECT_TRUE(*(*copy)->Covers(shared));
  EXPECT_FALSE(*(*copy)->Covers(original));  // from the copy's future
  (*copy)->Note(1, 3, ChangeKind::kWrite);
  ASSERT_TRUE((*copy)->Commit().ok());
  EXPECT_EQ((*copy)->position().seq, original.seq);
  EXPECT_FALSE(*(*copy)->Covers(original));  // same seq, another history
}

}  // namespace
}  // namespace ps
