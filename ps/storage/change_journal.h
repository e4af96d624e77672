// Which rows changed when: a pod's journal of the ids each materialization round writes or
// deletes in the rows column family, so an incremental export (ps-transfer export
// --since=CURSOR) reads only the rows changed since a cursor (docs/architecture.md,
// "Incremental export").
//
// A position in the journal is (identity, seq, tag): `identity` names this database (a
// random u64 written once, copied by checkpoints), `seq` counts entries (one per written
// group of rows, never reused), `tag` is random per entry, so a database restored from an
// older copy, which reuses seqs, does not take a position it never had for its own.
//
// On disk (meta column family, StorageDb::WriteMeta; docs/architecture.md, "On-disk
// layout"):
//   "journal_id"                 -> u64be identity
//   "journal_floor"              -> u64be: entries at or below it were dropped (retention)
//   "journal/"      u64be seq    -> u64be tag, then per id: u32be table number, u8 kind
//                                   (1 write, 2 delete), u64be id
//   "journal_size/" u64be seq    -> u64be tag, u64be bytes of the entry (read at open, so
//                                   retention never reads the entries themselves)
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
  // Bytes of entries kept (13 per changed id per entry); the oldest entries beyond it are
  // dropped, and an export asking for a cursor older than what is kept is refused (take a
  // full export). 1 GiB holds about 80M row changes: hours of training at the rates
  // docs/benchmarks.md measures. 0: keep nothing (every delta export is refused).
  uint64_t max_bytes = uint64_t{1} << 30;
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
  // Writes the noted ids as one entry (synced), then drops the oldest entries beyond
  // max_bytes (the newest entry is always kept, so the position just printed stays valid). Call
  // before the rows it names are written. Nothing noted: nothing written. On error nothing is
  // committed and the noted ids stay for the next Commit.
  absl::Status Commit();

  // The last committed entry. Thread-safe.
  JournalPosition position() const;

  // Whether `since` is a position of this journal whose later entries are all kept:
  // true (ForEachSince(since.seq) is exact), false (another database, or a position this
  // one never had: e.g. a restored older copy; the caller must treat every row as
  // changed), FAILED_PRECONDITION (this journal's, but older than what is kept). Thread-safe.
  absl::StatusOr<bool> Covers(const JournalPosition& since) const;
  // Calls fn for every id of every entry after `since_seq`, in entry order (an id may come
  // several times). Thread-safe with Note/Commit (sees entries committed before the call).
  absl::Status ForEachSince(
      uint64_t since_seq,
      const std::function<absl::Status(uint32_t table_no, ChangeKind kind, int64_t id)>& fn) const;

  struct Stats {
    uint64_t entries = 0, bytes = 0, floor = 0, dropped = 0;
  };
  Stats stats() const;

 private:
  ChangeJournal(StorageDb* db, const ChangeJournalOptions& options) : db_(db), options_(options) {}
  absl::Status DropOldest() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  StorageDb* const db_;
  const ChangeJournalOptions options_;
  uint64_t identity_ = 0;  // constant after Open

  std::string noted_;  // the entry being gathered: only its writer touches it

  mutable absl::Mutex mu_;
  struct Entry {
    uint64_t seq, tag, bytes;
  };
  std::deque<Entry> entries_ ABSL_GUARDED_BY(mu_);  // kept, oldest first; seqs consecutive
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t floor_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_tag_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ps
