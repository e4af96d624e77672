// Which rows changed when: a pod's journal of the ids each materialization round writes or
// deletes in the rows column family, so an incremental export (ps-transfer export
// --since=CURSOR) reads only the rows changed since a cursor (docs/architecture.md,
// "Incremental export").
//
// A position in the journal is (identity, seq, tag): `identity` names this database (the
// storage id's first 64 bits, StorageDb::identity: one identity for the master's
// lost-volume check and for cursors; copied by checkpoints), `seq` counts rounds (one per
// written group of rows, never reused), `tag` is random per round, so a database restored
// from an older copy, which reuses seqs, does not take a position it never had for its
// own. A database written before the identities were one also carries meta "journal_id":
// positions of that identity stay valid (Names), new ones carry the storage id's.
//
// Compaction: the newest `keep_rounds` entries are kept as written; older rounds are
// merged into one entry that lists each id once (kind delete if it was deleted in any of
// them), keyed by the last seq it covers. The seqs it covers keep their size records (0
// bytes: "folded into the next entry that has bytes") and their tags, so every position
// after the floor stays valid: a delta since a position inside a merged range gets every
// id of that range plus every later one (a superset of the changes since the position,
// deletions included: exact once the import deletes, then installs), one since a position
// among the newest rounds gets exactly the later rounds. Merges run on the writer's
// thread, bounded by merge_max_bytes of input; one merge is one atomic meta write.
//
// On disk (meta column family, StorageDb::WriteMeta; docs/architecture.md, "On-disk
// layout"):
//   "journal_id"                 -> u64be: an older database's identity (read only)
//   "journal_floor"              -> u64be: entries at or below it were dropped (retention)
//   "journal/"      u64be seq    -> u64be tag, then per id: u32be table number, u8 kind
//                                   (1 write, 2 delete), u64be id; a merged entry under its
//                                   last seq, ids sorted and each once
//   "journal_size/" u64be seq    -> u64be tag, u64be bytes of the entry (read at open, so
//                                   retention never reads the entries themselves); 0 bytes:
//                                   the seq's ids are in the next entry with bytes
// An entry is written (synced) *before* the rows it names: a crash between the two leaves
// an entry naming a change that never happened (an export then writes the row as it is,
// a superset), never a change that no entry names.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ps/storage/storage_db.h"

namespace ps {

struct ChangeJournalOptions {
  // Bytes of entries kept (13 per id per entry); once merging cannot keep the journal
  // within it, the oldest entries are dropped, and an export asking for a cursor older
  // than what is kept is refused (take a full export). Merged, the journal keeps all
  // history while the distinct ids changed in it fit (13 bytes each, plus the newest
  // rounds); unmerged rounds hold max_bytes / 13 row changes (minutes at ~1M changed rows
  // per round). 0: keep only the newest entry.
  uint64_t max_bytes = uint64_t{1} << 30;
  // The newest rounds never merged: a cursor among them gets an exact delta (no id of a
  // round before it). 8 rounds of the materializer's default interval: the last minutes.
  uint32_t keep_rounds = 8;
  // Older rounds are merged once they hold at least this many bytes and at least as many
  // as the last merged entry (so a byte is rewritten a bounded number of times), or the
  // journal is over max_bytes (merging before dropping). 4 MiB: about 300k ids, a second
  // or two of a busy pod's changes.
  uint64_t merge_min_bytes = uint64_t{4} << 20;
  // Bytes one merge reads at most (the last merged entry joins the merge only within it;
  // otherwise it stays as it is and a new merged entry starts): a merge holds about 2.3x
  // this in memory, and a merged entry is one RocksDB value.
  uint64_t merge_max_bytes = uint64_t{64} << 20;
};

enum class ChangeKind : uint8_t { kWrite = 1, kDelete = 2 };

struct JournalPosition {
  uint64_t identity = 0;
  uint64_t seq = 0;  // 0: before the first entry
  uint64_t tag = 0;  // of entry seq (0 for seq 0)
};

class ChangeJournal {
 public:
  // Reads (or, on a database without one, writes) the identity, the floor and the entry
  // sizes. `db` must outlive the journal. Errors: the database's.
  static absl::StatusOr<std::unique_ptr<ChangeJournal>> Open(StorageDb* db,
                                                             const ChangeJournalOptions& options);

  // Notes one id of the entry being gathered. Called by the one writer of rows at a time
  // (the materializer, the background load: both under the storage's round lock).
  void Note(uint32_t table_no, int64_t id, ChangeKind kind);
  // Writes the noted ids as one entry (synced), merges older rounds (see the top of this
  // file), then drops the oldest entries beyond max_bytes (the newest entry is always kept,
  // so the position just printed stays valid). Call before the rows it names are written.
  // Nothing noted: nothing written. On error nothing is committed and the noted ids stay
  // for the next Commit (a failed merge or drop only logs: the entry is committed).
  absl::Status Commit();

  // The last committed entry. Thread-safe.
  JournalPosition position() const;

  // Whether `identity` names this database: its storage id's, or the "journal_id" of a
  // database older versions wrote (their cursors stay valid). Thread-safe.
  bool Names(uint64_t identity) const {
    return identity == identity_ || (legacy_identity_ != 0 && identity == legacy_identity_);
  }

  // Whether `since` is a position of this journal whose later entries are all kept:
  // true (ForEachSince(since.seq) is exact), false (another database, or a position this
  // one never had: e.g. a restored older copy; the caller must treat every row as
  // changed), FAILED_PRECONDITION (this journal's, but older than what is kept). Thread-safe.
  absl::StatusOr<bool> Covers(const JournalPosition& since) const;
  // Calls fn for every id of every entry after `since_seq`, in entry order (an id may come
  // several times), including the whole merged entry whose range holds since_seq + 1 (a
  // superset: see the top of this file). Thread-safe with Note/Commit (one consistent view
  // of the entries committed before the call).
  absl::Status ForEachSince(
      uint64_t since_seq,
      const std::function<absl::Status(uint32_t table_no, ChangeKind kind, int64_t id)>& fn) const;

  struct Stats {
    uint64_t entries = 0;  // seqs kept (merged ones included)
    uint64_t bytes = 0, floor = 0, dropped = 0;
    uint64_t merges = 0;          // since Open
    uint64_t merged_through = 0;  // the last seq merged (0: none); exact after it
  };
  Stats stats() const;

 private:
  ChangeJournal(StorageDb* db, const ChangeJournalOptions& options) : db_(db), options_(options) {}
  absl::Status DropOldest() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Merges older rounds when the policy says so (the writer only; takes mu_ itself, not
  // during its reads and sorting).
  absl::Status MaybeMerge() ABSL_LOCKS_EXCLUDED(mu_);

  StorageDb* const db_;
  const ChangeJournalOptions options_;
  uint64_t identity_ = 0;         // constant after Open: db_->identity()
  uint64_t legacy_identity_ = 0;  // constant after Open: meta "journal_id", 0 if none

  std::string noted_;  // the entry being gathered: only its writer touches it

  mutable absl::Mutex mu_;
  struct Entry {
    uint64_t seq, tag, bytes;
    uint64_t first;  // the first seq whose ids the entry holds (seq for a round; a merged
                     // range's first for it and for its 0-byte seqs)
  };
  // Kept, oldest first; seqs consecutive. Changed by the writer only (under mu_).
  std::deque<Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t floor_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_tag_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t merges_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ps
