// journal-bench: the change journal (ps/storage/change_journal.h) over a long run, with and
// without merging: ROUNDS materialization rounds of CHANGES ids each (a Zipf stream, a
// share of them deletions) committed to a real database, as a busy pod's materializer
// would. Reports, every --report_every rounds and at the end, the journal's bytes, how
// many rounds of history it still serves (rounds after its floor) and the merges; at the
// end checks the delta of cursors taken along the run against what really changed after
// each (every changed id and every deletion named: the superset an export needs), and
// prints how many more ids than changed a delta names.
//
//   journal-bench --rows=10000000 --changes=100000 --rounds=1000 --journal_mb=64
//   journal-bench --rows=10000000 --changes=100000 --rounds=1000 --journal_mb=64 --merge=false
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "absl/time/clock.h"
#include "benchmarks/workload.h"
#include "common/base/binary_init.h"
#include "gflags/gflags.h"
#include "ps/storage/change_journal.h"
#include "ps/storage/storage_db.h"

DEFINE_uint64(rows, 10000000, "Distinct ids the stream draws from");
DEFINE_string(dist, "zipf:1.1", "Id distribution: uniform | zipf:S");
DEFINE_uint64(changes, 100000, "Ids noted per round (a materialization round's changed rows)");
DEFINE_uint64(rounds, 1000, "Rounds committed");
DEFINE_uint32(delete_pct, 1, "Percent of the noted ids that are deletions");
DEFINE_uint64(journal_mb, 64, "ChangeJournalOptions.max_bytes, MB (--change_journal_mb)");
DEFINE_bool(merge, true, "Merge older rounds (false: retention only, as before compaction)");
DEFINE_uint32(keep_rounds, 8, "ChangeJournalOptions.keep_rounds");
DEFINE_uint64(merge_min_kb, 4096, "ChangeJournalOptions.merge_min_bytes, KB");
DEFINE_uint64(merge_max_mb, 64, "ChangeJournalOptions.merge_max_bytes, MB");
DEFINE_uint64(report_every, 100, "Rounds between progress lines");
DEFINE_uint32(cursors, 5, "Cursors taken along the run and checked at the end");
DEFINE_string(dir, "", "Database directory (must not exist; default: a new one under /tmp)");
DEFINE_uint64(seed, 1, "Seed of the id stream");

namespace {

// What changed after one cursor, as bitmaps over [0, rows).
struct Truth {
  uint64_t round = 0;  // taken after this many rounds
  ps::JournalPosition at;
  std::vector<bool> changed, deleted;
};

}  // namespace

int main(int argc, char** argv) {
  ps::InitBinary(&argc, &argv, "journal-bench: the change journal's bytes and history over a run",
                 __FILE__);
  std::string dir = FLAGS_dir;
  if (dir.empty()) dir = "/tmp/journal-bench." + std::to_string(getpid());
  if (std::filesystem::exists(dir)) {
    std::fprintf(stderr, "%s exists; name a new directory\n", dir.c_str());
    return 2;
  }
  ps::StorageDbOptions db_options;
  db_options.dir = dir;
  auto db = ps::StorageDb::Open(db_options);
  if (!db.ok()) {
    std::fprintf(stderr, "%s\n", db.status().ToString().c_str());
    return 1;
  }
  ps::ChangeJournalOptions options;
  options.max_bytes = FLAGS_journal_mb << 20;
  options.keep_rounds = FLAGS_keep_rounds;
  options.merge_min_bytes = FLAGS_merge ? FLAGS_merge_min_kb << 10 : UINT64_MAX;
  options.merge_max_bytes = FLAGS_merge_max_mb << 20;
  auto journal = ps::ChangeJournal::Open(db->get(), options);
  if (!journal.ok()) {
    std::fprintf(stderr, "%s\n", journal.status().ToString().c_str());
    return 1;
  }
  ps::ChangeJournal& j = **journal;

  std::vector<Truth> truths;
  const uint64_t cursor_every = std::max<uint64_t>(1, FLAGS_rounds / (FLAGS_cursors + 1));
  const uint64_t delete_every = FLAGS_delete_pct == 0 ? 0 : 100 / FLAGS_delete_pct;
  constexpr uint64_t kChunk = 50;  // rounds drawn at a time
  double commit_s = 0, max_commit_s = 0;
  uint64_t noted = 0;
  const absl::Time start = absl::Now();
  for (uint64_t r = 0; r < FLAGS_rounds; r += kChunk) {
    auto w = ps::MakeWorkload(FLAGS_dist, FLAGS_rows, FLAGS_changes,
                              std::min(kChunk, FLAGS_rounds - r), FLAGS_seed + r);
    if (!w.ok()) {
      std::fprintf(stderr, "%s\n", w.status().ToString().c_str());
      return 2;
    }
    for (size_t b = 0; b < w->batches.size(); ++b) {
      const uint64_t round = r + b;
      if (round > 0 && round % cursor_every == 0 && truths.size() < FLAGS_cursors) {
        truths.push_back(
            {round, j.position(), std::vector<bool>(FLAGS_rows), std::vector<bool>(FLAGS_rows)});
      }
      for (size_t i = 0; i < w->batches[b].size(); ++i) {
        const int64_t id = w->batches[b][i];
        const bool del = delete_every != 0 && (noted + i) % delete_every == delete_every - 1;
        j.Note(1, id, del ? ps::ChangeKind::kDelete : ps::ChangeKind::kWrite);
        for (Truth& t : truths) {
          t.changed[id] = true;
          if (del) t.deleted[id] = true;
        }
      }
      noted += w->batches[b].size();
      const absl::Time t0 = absl::Now();
      if (absl::Status s = j.Commit(); !s.ok()) {
        std::fprintf(stderr, "commit: %s\n", s.ToString().c_str());
        return 1;
      }
      const double s = absl::ToDoubleSeconds(absl::Now() - t0);
      commit_s += s;
      max_commit_s = std::max(max_commit_s, s);
      if ((round + 1) % FLAGS_report_every == 0 || round + 1 == FLAGS_rounds) {
        const ps::ChangeJournal::Stats st = j.stats();
        std::printf(
            "round %llu: journal %.1f MiB, history %llu rounds (floor %llu), merges %llu, "
            "commit mean %.1f ms max %.0f ms\n",
            static_cast<unsigned long long>(round + 1), st.bytes / 1048576.0,
            static_cast<unsigned long long>(round + 1 - st.floor),
            static_cast<unsigned long long>(st.floor), static_cast<unsigned long long>(st.merges),
            1e3 * commit_s / (round + 1), 1e3 * max_commit_s);
        std::fflush(stdout);
      }
    }
  }
  const double run_s = absl::ToDoubleSeconds(absl::Now() - start);
  const ps::ChangeJournal::Stats st = j.stats();
  int failures = 0;
  for (const Truth& t : truths) {
    auto covers = j.Covers(t.at);
    if (!covers.ok()) {
      std::printf("cursor after round %llu: refused (%s)\n",
                  static_cast<unsigned long long>(t.round),
                  std::string(covers.status().message().substr(0, 60)).c_str());
      continue;
    }
    std::vector<bool> got(FLAGS_rows), got_deleted(FLAGS_rows);
    uint64_t named = 0, changed = 0, missing = 0;
    absl::Status s = j.ForEachSince(t.at.seq, [&](uint32_t, ps::ChangeKind k, int64_t id) {
      if (!got[id]) named++;
      got[id] = true;
      if (k == ps::ChangeKind::kDelete) got_deleted[id] = true;
      return absl::OkStatus();
    });
    for (uint64_t id = 0; id < FLAGS_rows; ++id) {
      changed += t.changed[id];
      missing += (t.changed[id] && !got[id]) || (t.deleted[id] && !got_deleted[id]);
    }
    const bool ok = s.ok() && *covers && missing == 0;
    failures += !ok;
    std::printf("cursor after round %llu: %s, delta names %llu ids for %llu changed (+%.1f%%)\n",
                static_cast<unsigned long long>(t.round), ok ? "correct" : "WRONG",
                static_cast<unsigned long long>(named), static_cast<unsigned long long>(changed),
                changed == 0 ? 0.0 : 100.0 * (named - changed) / changed);
  }
  std::printf(
      "RESULT merge=%d rounds=%llu changes=%llu journal_mib=%.1f (max %llu) history_rounds=%llu "
      "merges=%llu commit_mean_ms=%.1f commit_max_ms=%.0f run_s=%.1f wrong_deltas=%d\n",
      FLAGS_merge ? 1 : 0, static_cast<unsigned long long>(FLAGS_rounds),
      static_cast<unsigned long long>(FLAGS_changes), st.bytes / 1048576.0,
      static_cast<unsigned long long>(FLAGS_journal_mb),
      static_cast<unsigned long long>(FLAGS_rounds - st.floor),
      static_cast<unsigned long long>(st.merges), 1e3 * commit_s / FLAGS_rounds, 1e3 * max_commit_s,
      run_s, failures);
  journal->reset();
  db->reset();
  std::filesystem::remove_all(dir);
  return failures == 0 ? 0 : 1;
}
