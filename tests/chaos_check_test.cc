// The chaos test's own checks can fail: its workload routes as it says, its journals
// parse as the workers write them, and its verdict catches a lost, a duplicated and a
// half-applied push.
#include "tests/chaos_check.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "common/routing/hash.h"
#include "gtest/gtest.h"
#include "tests/chaos_journal.h"
#include "tests/chaos_workload.h"

namespace ps::chaos {
namespace {

constexpr uint32_t kVShards = 16;
constexpr uint64_t kRecords = 20;
constexpr uint32_t kEpochs = 2;

using Rows = absl::flat_hash_map<int64_t, std::vector<float>>;

// Applies every part of (record, epoch) `times` times, as the pods would (SGD, lr 1).
void Apply(const Workload& w, uint64_t record, uint32_t epoch, int times, Rows* rows) {
  for (const Part& p : w.Record(record, epoch)) {
    for (size_t i = 0; i < p.ids.size(); ++i) {
      std::vector<float>& row = (*rows)[p.ids[i]];
      row.resize(kDim, 0.0f);
      for (uint32_t d = 0; d < kDim; ++d) row[d] -= times * p.grads[i * kDim + d];
    }
  }
}

// One worker that pushed and acknowledged every record once, in tasks of 10.
std::string CleanJournal() {
  std::string j;
  uint64_t task = 0;
  for (uint32_t e = 0; e < kEpochs; ++e) {
    for (uint64_t first = 0; first < kRecords; first += 10, ++task) {
      absl::StrAppend(&j, "T ", task, " 1 ", e, " ", first, " ", first + 10, "\n");
      for (uint64_t r = first; r < first + 10; ++r) {
        absl::StrAppend(&j, "P ", task, " 1 ", e, " ", r, "\nA ", task, " 1 ", e, " ", r, "\n");
      }
      absl::StrAppend(&j, "R ", task, " 1 ok\n");
    }
  }
  return j;
}

Rows CleanRows(const Workload& w) {
  Rows rows;
  for (uint32_t e = 0; e < kEpochs; ++e) {
    for (uint64_t r = 0; r < kRecords; ++r) Apply(w, r, e, 1, &rows);
  }
  return rows;
}

TEST(ChaosWorkloadTest, PartsRouteToTheirVShardAndWitnessesAreTheirOwn) {
  const Workload w(kVShards);
  const uint64_t table = NameHash(kTable);
  std::set<int64_t> witnesses;
  for (uint32_t e = 0; e < kEpochs; ++e) {
    for (uint64_t r = 0; r < kRecords; ++r) {
      const std::vector<Part> parts = w.Record(r, e);
      ASSERT_EQ(parts.size(), kParts);
      for (uint32_t j = 0; j < kParts; ++j) {
        const Part& p = parts[j];
        ASSERT_EQ(p.ids.size(), 1 + kHotPerPart);
        ASSERT_EQ(p.grads.size(), p.ids.size() * kDim);
        EXPECT_EQ(p.ids[0], w.Witness(r, e, j));
        for (int64_t id : p.ids) EXPECT_EQ(VShardOf(RouteHash(table, id), kVShards), p.vshard);
        EXPECT_TRUE(witnesses.insert(p.ids[0]).second) << "witness reused: " << p.ids[0];
      }
    }
  }
  for (int64_t id : w.hot_ids()) EXPECT_EQ(witnesses.count(id), 0u);
  EXPECT_EQ(Workload(kVShards).Record(7, 1)[2].ids, w.Record(7, 1)[2].ids);  // deterministic
}

TEST(ChaosJournalTest, ParsesWhatWorkersWriteAndCountsUnfinishedPushesAsUnknown) {
  JournalSummary s;
  AddJournal(CleanJournal(), &s);
  EXPECT_EQ(s.acked_pushes, kRecords * kEpochs);
  EXPECT_EQ(s.unknown_pushes, 0u);
  EXPECT_EQ(s.bad_lines, 0u);
  EXPECT_EQ(s.tasks.at(0).ok, 1u);
  // A worker killed mid-push, and one whose push failed and was pushed again.
  AddJournal("T 9 2 0 0 10\nP 9 2 0 0\nA 9 2 0 0\nP 9 2 0 1\n", &s);
  AddJournal("T 9 3 0 0 10\nP 9 3 0 1\nF 9 3 0 1\nP 9 3 0 1\nA 9 3 0 1\nR 9 3 lost\n", &s);
  EXPECT_EQ(s.records.at({0, 0}).acked, 2u);
  EXPECT_EQ(s.records.at({0, 1}).acked, 2u);
  EXPECT_EQ(s.records.at({0, 1}).unknown, 2u);
  EXPECT_EQ(s.tasks.at(9).lost, 1u);
  EXPECT_EQ(s.attempts, 2 * 2 + 2u);
  EXPECT_EQ(s.bad_lines, 0u);
  AddJournal("A 1 1 0 5\nX\n", &s);  // an A without its P, and garbage
  EXPECT_EQ(s.bad_lines, 2u);
}

TEST(ChaosCheckTest, ExactRowsPass) {
  const Workload w(kVShards);
  JournalSummary s;
  AddJournal(CleanJournal(), &s);
  const Verdict v = Check(w, s, kRecords, kEpochs, CleanRows(w));
  EXPECT_EQ(v.parts_checked, kRecords * kEpochs * kParts);
  EXPECT_EQ(v.lost + v.duplicated + v.reapplied + v.wrong_rows, 0u) << v.examples.front();
}

TEST(ChaosCheckTest, AMissingAcknowledgedPushIsLost) {
  const Workload w(kVShards);
  JournalSummary s;
  AddJournal(CleanJournal(), &s);
  Rows rows = CleanRows(w);
  Apply(w, 3, 1, -1, &rows);  // undo record 3 of epoch 1
  const Verdict v = Check(w, s, kRecords, kEpochs, rows);
  EXPECT_EQ(v.lost, kParts);
  EXPECT_EQ(v.duplicated, 0u);
  EXPECT_EQ(v.wrong_rows, 0u);
}

TEST(ChaosCheckTest, AnExtraApplicationIsDuplicatedUnlessItsFateWasUnknown) {
  const Workload w(kVShards);
  Rows rows = CleanRows(w);
  Apply(w, 5, 0, 1, &rows);  // record 5 of epoch 0 applied twice
  JournalSummary s;
  AddJournal(CleanJournal(), &s);
  EXPECT_EQ(Check(w, s, kRecords, kEpochs, rows).duplicated, kParts);
  // The same rows, with a killed worker's push of that record in flight: allowed, and
  // counted as applied again.
  AddJournal("T 0 2 0 0 10\nP 0 2 0 5\n", &s);
  Verdict v = Check(w, s, kRecords, kEpochs, rows);
  EXPECT_EQ(v.duplicated, 0u);
  EXPECT_EQ(v.reapplied, kParts);
  EXPECT_EQ(v.lost + v.wrong_rows, 0u);
}

TEST(ChaosCheckTest, AHalfAppliedPushShowsInTheHotRows) {
  const Workload w(kVShards);
  JournalSummary s;
  AddJournal(CleanJournal(), &s);
  Rows rows = CleanRows(w);
  // A hot row of record 2's first part lost that part's update, its witness did not.
  const Part part = w.Record(2, 0)[0];
  for (uint32_t d = 0; d < kDim; ++d) rows[part.ids[1]][d] += part.grads[kDim + d];
  const Verdict v = Check(w, s, kRecords, kEpochs, rows);
  EXPECT_EQ(v.wrong_rows, 1u);
  EXPECT_EQ(v.lost + v.duplicated, 0u);
  // A witness that is no count at all (its part's hot rows then miss its updates too).
  rows = CleanRows(w);
  rows[w.Witness(4, 1, 2)][1] = 0.5f;
  EXPECT_GE(Check(w, s, kRecords, kEpochs, rows).wrong_rows, 1u);
}

}  // namespace
}  // namespace ps::chaos
