// The change journal (change_journal.h): entries survive a reopen, positions name one
// database's history exactly, retention refuses older cursors, and a restored older copy
// does not take the original's later positions. Its identity is the storage id's (an older
// database's "journal_id" stays valid); merged rounds keep every position valid, list each
// id once and give a superset of the changes since any position.
#include "ps/storage/change_journal.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
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

// Change sets of a run: what each round noted, and the positions after each.
struct History {
  std::vector<std::set<std::pair<int64_t, ChangeKind>>> rounds;  // rounds[i]: seq i + 1
  std::vector<JournalPosition> after;                            // after[i]: position at seq i
  std::vector<size_t> noted;  // noted[i]: records round i noted (an id may repeat)
};

// Commits `n` rounds of `per_round` ids drawn from [0, hot) (every 5th one a deletion) to
// `j`, appending to *run (after[0] is the position before the first round).
void Rounds(ChangeJournal& j, int n, int per_round, int64_t hot, uint32_t seed, History* run) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> pick(0, hot - 1);
  if (run->after.empty()) run->after.push_back(j.position());
  for (int r = 0; r < n; ++r) {
    std::set<std::pair<int64_t, ChangeKind>> round;
    for (int i = 0; i < per_round; ++i) {
      const int64_t id = pick(rng);
      const ChangeKind kind = i % 5 == 4 ? ChangeKind::kDelete : ChangeKind::kWrite;
      j.Note(1, id, kind);
      round.emplace(id, kind);
    }
    ASSERT_TRUE(j.Commit().ok());
    run->rounds.push_back(round);
    run->after.push_back(j.position());
    run->noted.push_back(per_round);
  }
}

// The ids changed (and deleted) after seq `since` of `run`.
std::pair<std::set<int64_t>, std::set<int64_t>> ChangedAfter(const History& run, uint64_t since) {
  std::set<int64_t> changed, deleted;
  for (size_t i = since; i < run.rounds.size(); ++i) {
    for (const auto& [id, kind] : run.rounds[i]) {
      changed.insert(id);
      if (kind == ChangeKind::kDelete) deleted.insert(id);
    }
  }
  return {changed, deleted};
}

TEST_F(ChangeJournalTest, IdentityIsTheStorageIdsAndAnOlderJournalIdStaysValid) {
  auto db = OpenDb(dir_);
  uint64_t expected = 0;
  ASSERT_TRUE(absl::SimpleHexAtoi(db->storage_id().substr(0, 16), &expected));
  EXPECT_EQ(db->identity(), expected);
  JournalPosition p;
  {
    auto j = ChangeJournal::Open(db.get(), {});
    ASSERT_TRUE(j.ok()) << j.status();
    EXPECT_EQ((*j)->position().identity, expected);  // one identity: the storage id's
    (*j)->Note(1, 9, ChangeKind::kWrite);
    ASSERT_TRUE((*j)->Commit().ok());
    p = (*j)->position();
  }
  EXPECT_TRUE(absl::IsNotFound(db->GetMeta("journal_id").status()));  // no second identity
  // A database an older version wrote: its journal had an identity of its own, which its
  // cursors carry. They stay valid beside the storage id's.
  const uint64_t legacy = 0x0123456789abcdefu;
  std::string v;
  for (int i = 7; i >= 0; --i) v.push_back(static_cast<char>(legacy >> (8 * i)));
  ASSERT_TRUE(db->WriteMeta({{"journal_id", v}}, {}, true).ok());
  auto j = ChangeJournal::Open(db.get(), {});
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ((*j)->position().identity, expected);  // new cursors carry the storage id's
  EXPECT_TRUE((*j)->Names(expected));
  EXPECT_TRUE((*j)->Names(legacy));
  EXPECT_FALSE((*j)->Names(legacy + 1));
  EXPECT_TRUE(*(*j)->Covers({legacy, p.seq, p.tag}));
  EXPECT_TRUE(*(*j)->Covers({expected, p.seq, p.tag}));
  EXPECT_TRUE(*(*j)->Covers({legacy, 0, 0}));
  EXPECT_FALSE(*(*j)->Covers({legacy, p.seq, p.tag + 1}));
  EXPECT_FALSE(*(*j)->Covers({legacy + 1, p.seq, p.tag}));  // another database's
  // A database that lost its directory and started afresh is another one.
  db.reset();
  j->reset();
  std::filesystem::remove_all(dir_);
  auto fresh = OpenDb(dir_);
  auto fj = ChangeJournal::Open(fresh.get(), {});
  ASSERT_TRUE(fj.ok());
  EXPECT_NE((*fj)->position().identity, expected);
  EXPECT_FALSE((*fj)->Names(legacy));
}

// Every position of `run` is valid in `j`, and a delta since it holds every change and
// every deletion after it: exactly those after the last merged seq, and from inside a
// merged range at most each of its ids once plus the rounds after it.
void ExpectSupersets(const ChangeJournal& j, const History& run) {
  const uint64_t merged = j.stats().merged_through;
  const uint64_t last = run.rounds.size();
  size_t after_merged = 0;  // records of the rounds after the merged range
  for (uint64_t i = merged; i < last; ++i) after_merged += run.noted[i];
  for (uint64_t s = 0; s <= last; ++s) {
    SCOPED_TRACE(s);
    EXPECT_TRUE(*j.Covers(run.after[s]));
    JournalPosition wrong = run.after[s];
    wrong.tag ^= 1;
    if (s > 0) {
      EXPECT_FALSE(*j.Covers(wrong));  // a merged seq keeps its tag
    }
    const auto [changed, deleted] = ChangedAfter(run, s);
    std::set<int64_t> got, got_deleted;
    size_t records = 0;
    EXPECT_TRUE(j.ForEachSince(s, [&](uint32_t t, ChangeKind k, int64_t id) {
                   EXPECT_EQ(t, 1u);
                   records++;
                   got.insert(id);
                   if (k == ChangeKind::kDelete) got_deleted.insert(id);
                   return absl::OkStatus();
                 }).ok());
    EXPECT_TRUE(std::includes(got.begin(), got.end(), changed.begin(), changed.end()));
    EXPECT_TRUE(
        std::includes(got_deleted.begin(), got_deleted.end(), deleted.begin(), deleted.end()));
    if (s >= merged) {
      EXPECT_EQ(got, changed);
      EXPECT_EQ(got_deleted, deleted);
    } else {
      // Rounds note an id per change (it may repeat); a merged range once.
      std::set<int64_t> in_merged;
      for (uint64_t i = 0; i < merged; ++i) {
        for (const auto& [id, kind] : run.rounds[i]) in_merged.insert(id);
      }
      EXPECT_LE(records, in_merged.size() + after_merged);
    }
  }
}

TEST_F(ChangeJournalTest, MergedRoundsKeepEveryPositionValidAndGiveASupersetOfTheChanges) {
  ChangeJournalOptions options;
  options.keep_rounds = 3;
  options.merge_min_bytes = 1;
  auto db = OpenDb(dir_);
  History run;
  ChangeJournal::Stats st;
  {
    auto j = ChangeJournal::Open(db.get(), options);
    ASSERT_TRUE(j.ok());
    Rounds(**j, 40, 30, 50, 7, &run);
    st = (*j)->stats();
    EXPECT_GT(st.merges, 0u);
    EXPECT_EQ(st.entries, 40u);  // every seq is kept: merged ones too
    EXPECT_EQ(st.floor, 0u);
    // All but the newest 3 rounds, or all but one more (the merge waits for a tail as
    // large as the merged entry).
    EXPECT_GE(st.merged_through, 36u);
    EXPECT_LE(st.merged_through, 37u);
    // 40 rounds of 30 records unmerged; merged: at most the 50 ids, then 4 rounds.
    EXPECT_LE(st.bytes, (8 + 50 * 13) + 4 * (8 + 30 * 13));
    ExpectSupersets(**j, run);
  }
  {
    auto j = ChangeJournal::Open(db.get(), options);
    ASSERT_TRUE(j.ok());
    EXPECT_EQ((*j)->stats().bytes, st.bytes);
    EXPECT_EQ((*j)->stats().merged_through, st.merged_through);
    ExpectSupersets(**j, run);
    Rounds(**j, 10, 30, 50, 8, &run);  // merged again, into the existing merged entry
    EXPECT_GE((*j)->stats().merged_through, 46u);
    ExpectSupersets(**j, run);
  }
  auto j = ChangeJournal::Open(db.get(), options);
  ASSERT_TRUE(j.ok());
  ExpectSupersets(**j, run);
}

TEST_F(ChangeJournalTest, MergingKeepsALongRunsHistoryInTheSpaceDroppingCouldNot) {
  // 400 rounds of 100 ids out of 2000 hot ones, in 40 KB: unmerged, the journal keeps
  // about 30 rounds; merged, all 400 (about 26 KB of ids once each).
  for (const bool merge : {false, true}) {
    SCOPED_TRACE(merge);
    std::filesystem::remove_all(dir_);
    auto db = OpenDb(dir_);
    ChangeJournalOptions options;
    options.max_bytes = 40000;
    options.keep_rounds = 4;
    options.merge_min_bytes = merge ? 2000 : UINT64_MAX;
    auto j = ChangeJournal::Open(db.get(), options);
    ASSERT_TRUE(j.ok());
    History run;
    Rounds(**j, 400, 100, 2000, 3, &run);
    const ChangeJournal::Stats st = (*j)->stats();
    EXPECT_LE(st.bytes, options.max_bytes);
    if (!merge) {
      EXPECT_GT(st.floor, 350u);
      EXPECT_EQ((*j)->Covers(run.after[1]).status().code(), absl::StatusCode::kFailedPrecondition);
      continue;
    }
    EXPECT_EQ(st.floor, 0u);
    EXPECT_EQ(st.dropped, 0u);
    for (uint64_t s : {uint64_t{0}, uint64_t{1}, uint64_t{200}, uint64_t{396}, uint64_t{399}}) {
      ASSERT_TRUE(*(*j)->Covers(run.after[s])) << s;
      const auto [changed, deleted] = ChangedAfter(run, s);
      std::set<int64_t> got, got_deleted;
      for (const auto& [t, k, id] : Since(**j, s)) {
        got.insert(id);
        if (k == ChangeKind::kDelete) got_deleted.insert(id);
      }
      EXPECT_TRUE(std::includes(got.begin(), got.end(), changed.begin(), changed.end())) << s;
      EXPECT_TRUE(
          std::includes(got_deleted.begin(), got_deleted.end(), deleted.begin(), deleted.end()))
          << s;
    }
  }
}

TEST_F(ChangeJournalTest, RetentionDropsAMergedRangeWholeWhenItNoLongerFits) {
  auto db = OpenDb(dir_);
  ChangeJournalOptions options;
  options.keep_rounds = 2;
  options.merge_min_bytes = 1;
  options.merge_max_bytes = 8 + 60 * 13;  // a merged entry reads at most 60 ids
  options.max_bytes = 3 * (8 + 60 * 13);
  auto j = ChangeJournal::Open(db.get(), options);
  ASSERT_TRUE(j.ok());
  History run;
  // Ids never repeat: merging saves nothing, and old ranges must go.
  for (int r = 0; r < 30; ++r) {
    for (int i = 0; i < 20; ++i) (*j)->Note(1, r * 20 + i, ChangeKind::kWrite);
    ASSERT_TRUE((*j)->Commit().ok());
    run.after.push_back((*j)->position());
  }
  const ChangeJournal::Stats st = (*j)->stats();
  EXPECT_LE(st.bytes, options.max_bytes);
  EXPECT_GT(st.floor, 0u);
  EXPECT_GT(st.merges, 0u);
  // Every position after the floor is valid and its delta holds every id after it.
  for (uint64_t s = 1; s <= 30; ++s) {
    auto covers = (*j)->Covers(run.after[s - 1]);
    if (s <= st.floor) {
      EXPECT_EQ(covers.status().code(), absl::StatusCode::kFailedPrecondition) << s;
      continue;
    }
    ASSERT_TRUE(covers.ok() && *covers) << s;
    std::set<int64_t> got;
    for (const auto& [t, k, id] : Since(**j, s)) got.insert(id);
    for (int64_t id = s * 20; id < 600; ++id) EXPECT_EQ(got.count(id), 1u) << s << " " << id;
  }
  // Read back the same at open (the floor never lies inside a merged range's seqs).
  j->reset();
  auto again = ChangeJournal::Open(db.get(), options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->stats().bytes, st.bytes);
  EXPECT_EQ((*again)->stats().floor, st.floor);
}

TEST_F(ChangeJournalTest, ARestoredCopyDoesNotTakeTheOriginalsPositionsInsideMergedRanges) {
  ChangeJournalOptions options;
  options.keep_rounds = 1;
  options.merge_min_bytes = 1;
  auto db = OpenDb(dir_);
  auto j = ChangeJournal::Open(db.get(), options);
  ASSERT_TRUE(j.ok());
  History run;
  Rounds(**j, 3, 10, 100, 1, &run);
  ASSERT_TRUE(db->Checkpoint(dir_ + "_copy").ok());
  Rounds(**j, 5, 10, 100, 2, &run);  // the original goes on: seqs 4..8
  auto copy_db = OpenDb(dir_ + "_copy");
  auto copy = ChangeJournal::Open(copy_db.get(), options);
  ASSERT_TRUE(copy.ok());
  History other;
  Rounds(**copy, 6, 10, 100, 3, &other);  // the copy reuses seqs 4..9, merging 1..8
  EXPECT_GE((*copy)->stats().merged_through, 8u);
  EXPECT_TRUE(*(*copy)->Covers(run.after[3]));  // shared history
  for (uint64_t s = 4; s <= 8; ++s) EXPECT_FALSE(*(*copy)->Covers(run.after[s])) << s;
}

}  // namespace
}  // namespace ps
