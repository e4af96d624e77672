// Durability of one PS pod: its RocksDB database (storage_db.h), the push log
// (durable_log.h), recovery at start and the background materializer.
//
// How an update becomes durable: every change of rows (a push, an import, a vshard move's
// installs) goes through ApplyLogged: it is applied in memory, then its record (key, ids,
// row steps, gradients or whole rows) is appended to the log, and the change is
// acknowledged when the log says so (durable_log.h). The materializer, every
// `materialize_ms`, writes the rows that changed to the rows column family (sorted table
// files, ingested), and deletes the log records they make redundant, storing the push
// de-duplication state with that deletion. Recovery loads the catalog, the rows and the
// de-duplication state, then replays the remaining log records, each row's updates in step
// order, skipping those its stored row already holds.
//
// Invariants (docs/architecture.md, "Durability"): a stored row holds only updates whose
// records are written (the materializer waits for the log before writing a group of
// rows), so a retried push is never applied twice; a log record is deleted only after
// the rows it changed are flushed, so an acknowledged push is never lost.
//
// The implementation is split by concern: pod_storage.cc (opening, the apply path, moves,
// checkpoints), pod_storage_recover.cc (recovery), pod_storage_materialize.cc (the
// materializer and eviction), pod_storage_lazy.cc (rows read back from the database: lazy
// start, lazy replay, memory budget) and pod_storage_pending.h (the recovered log's updates
// per row).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "embedding/model_store.h"
#include "embedding/row_source.h"
#include "ps/storage/change_journal.h"
#include "ps/storage/durable_log.h"
#include "ps/storage/log_record.h"
#include "ps/storage/push_dedup.h"
#include "ps/storage/run_marker.h"
#include "ps/storage/storage_db.h"

namespace ps {

struct PodStorageOptions {
  StorageDbOptions db;
  DurableLogOptions log;
  // Retention of the change journal (incremental exports; change_journal.h).
  ChangeJournalOptions journal;
  // How often changed rows are written out and the log truncated. Recovery replays at
  // most about this much of the log; 1 s keeps restarts fast at a small write cost.
  int materialize_ms = 1000;
  // The same interval while the pod is replicated (SetReplicated; R >= 2); 0: materialize_ms.
  // Each pod then holds and writes R times the rows (its followed vshards too), while a
  // restart replays a longer log only on a pod whose vshards have copies elsewhere:
  // ps-server sets 4 x materialize_ms (--replicated_materialize_factor). Either way a
  // round also starts once the log holds half of log.max_log_bytes (which bounds
  // recovery), so pushes never wait for the timer. Not used with a memory budget, whose
  // rounds are what evicts.
  int replicated_materialize_ms = 0;
  // Row bytes gathered before the materializer writes a group: one sorted table file,
  // ingested into the rows column family (no memtable, no flush).
  size_t materialize_group_bytes = size_t{64} << 20;
  // Materialize once more when closing, so the next start replays little, and record the
  // clean close. Tests turn it off to leave the log and the run marker as a crash would.
  bool materialize_on_close = true;
  // Bytes of table rows kept in memory; 0: all of them. Above it, each materialization
  // round evicts clean rows (CLOCK) down to 90% of it; evicted rows are read back from
  // the rows column family when touched. Stored rows are then not loaded at start
  // either: they load on first touch (a lazy start). Needs tables built with
  // TableOptions.evictable.
  uint64_t memory_budget_bytes = 0;
  // Serve before the stored rows are loaded: recovery replays the log (reading back only
  // the rows it updates) and the pod serves; a background thread then loads every stored
  // row that is not resident yet, while requests read missing rows from the database
  // (never a fresh initializer for a stored row). Implied by a memory budget, which
  // loads nothing in the background.
  bool lazy_start = false;
  // Lazy start: load the stored rows in the background (tests turn it off to keep the
  // not-yet-loaded window open).
  bool background_load = true;
  // Lazy start without a budget: do not replay the log before serving either. Each row's
  // logged updates are applied when the row is first read back (by a request or the
  // background load), so time to serving is reading the log, not replaying it. Until the
  // background load has applied and stored every such row, the log is not truncated.
  // Off: the rows the log updates are read back and replayed before serving (an export
  // reads the replayed rows from memory).
  bool lazy_replay = false;
  // Without lazy_start (and a budget): start lazily, with lazy replay, anyway when the
  // database holds at least this many rows (RocksDB's estimate), where an eager start
  // would take seconds. 0: never.
  uint64_t lazy_start_rows = 0;
};

struct RecoveryStats {
  uint64_t tables = 0, dense = 0, rows = 0, log_records = 0, replayed_updates = 0;
  bool lazy = false;         // stored rows were left on disk at start (lazy_start, budget)
  bool lazy_replay = false;  // the log's updates were left to apply as rows load
  double seconds = 0;
};

class PodStorage {
 public:
  // Opens (or creates) the database, recovers its contents into `store` (which must be
  // empty and built with TableOptions.track_dirty) and `dedup`, and starts the log writer
  // and the materializer. `store` and `dedup` must outlive the storage.
  static absl::StatusOr<std::unique_ptr<PodStorage>> Open(const PodStorageOptions& options,
                                                          ModelStore* store, PushDedup* dedup);
  // Writes what is queued, materializes once more (so the next start replays little),
  // fsyncs the log, records the clean close (run_marker.h) and closes the database. With
  // options.materialize_on_close off it closes as a crash would: no round, no clean close.
  ~PodStorage();

  // Persists a new table / tensor (normalized spec) before it is created in memory; the
  // caller serializes creations. Thread-compatible.
  absl::Status AddTable(const TableSpec& spec);
  absl::Status AddDense(const DenseSpec& spec);

  // Applies one change of rows or dense tensors durably; the one path of every change
  // (pushes, imports, a vshard move's installs). In order: fails at once with UNAVAILABLE
  // if a log write has failed; waits while the log is over its bound (max_log_bytes,
  // without holding any lock the materializer needs); then, under the apply lock (shared),
  // runs `apply`, which applies the change in memory and adds its entries to the record
  // (tagged with `key`; PushKey() for a change without one), or fails having applied
  // nothing; and appends the record. `done` gets apply's error, or OK once the record is
  // durable in the pod's durability mode (or the write's error). A change that added no
  // entry (nothing changed) is not logged: done(OK) at once. `done` runs exactly once, on
  // this thread (possibly before ApplyLogged returns, possibly under the apply lock: it
  // must not call back into the storage) or on the log writer's; record_bytes sizes the
  // record's buffer. Thread-safe.
  //
  // The apply lock is what makes materialization exact: a round takes it exclusively for
  // an instant to read the log's next sequence number, so every update it then reads from
  // memory has its record below that number.
  //
  // `ship`, when set, gets the encoded record of a change that is logged (never one that
  // failed or changed nothing; the log and it share the bytes, never copied) once the
  // record may leave this pod, with OK, or with the error that kept it out of the log
  // (then it must not leave). A replicated primary ships it to its followers, holding its
  // order lock over the whole call, so its records reach them in log order, which is
  // their apply order. When: once the log writer has written the record (process: to the
  // OS, machine: fsynced), on the writer's thread, in log order, before `done` and before
  // WaitApplied covers it (DurableLog::Append's `written`): no follower holds a record a
  // SIGKILL here can lose (shipped before its write, a primary killed in between came
  // back, its lease live, without a record its follower held, and its next update of
  // those rows reused the lost record's step, which the follower's replay skipped). In
  // periodic mode, at once, on this thread under the apply lock, before the append: the
  // log's tail is lost in a crash anyway, and a restart after one reports it
  // (run_marker.h), so the master moves the pod's vshards to a follower first; waiting
  // for the writer's gathering window would delay every acknowledgement.
  //
  // `exclusive`: a change that deletes rows (LogRecordBuilder::AddDelete) runs with the
  // apply lock held exclusively, so its record's place in the log orders it against
  // every update of the rows it deletes (log_record.h). Such a change is refused with
  // UNAVAILABLE while a lazy replay's recovered updates are pending (they would be
  // applied to the deleted rows when read back); retry.
  void ApplyLogged(const PushKey& key, size_t record_bytes,
                   absl::FunctionRef<absl::Status(LogRecordBuilder* record)> apply,
                   DurableLog::Done done,
                   const std::function<void(const std::shared_ptr<const std::string>& record,
                                            absl::Status written)>& ship = nullptr,
                   bool exclusive = false);
  // Blocks until every change applied so far has its log record written, and its `ship`
  // called (the source of a move before its last copy, a deposed primary before it fails
  // what its followers have not answered); returns the log's write error, if any.
  // Thread-safe.
  absl::Status WaitApplied();
  // WaitApplied, and in periodic mode an fsync of the log too: every change applied so far
  // then survives a crash of the process, and power loss unless the mode is process. For
  // the destination of a move before it reports its copy durable (the source then drops
  // the rows). Thread-safe.
  absl::Status SyncApplied();

  // Live migration. Deletes rows (and dense tensors) of vshards this pod no longer holds
  // (moved away, or an aborted move's copy), durably, after a round that truncates the log
  // so a restart does not replay their updates. The caller erased them from memory first.
  // Thread-safe.
  absl::Status DropRows(const std::vector<std::pair<std::string, std::vector<int64_t>>>& rows,
                        const std::vector<std::string>& dense);

  // One materialization round now (the background thread calls it too). Thread-safe.
  absl::Status Materialize();
  // Whether the pod's vshards have copies on other pods (R >= 2): the background rounds
  // then run every options.replicated_materialize_ms. Takes effect within 100 ms.
  // Thread-safe.
  void SetReplicated(bool replicated);
  // A consistent copy of the pod's database into `dir` (see StorageDb::Checkpoint).
  absl::Status Checkpoint(const std::string& dir);

  // Calls fn for every stored row of table `table` (as the rows column family has it:
  // rows changed since the last materialization are newer in memory). NOT_FOUND for an
  // unknown table. Thread-safe.
  absl::Status ForEachStoredRow(const std::string& table,
                                const std::function<absl::Status(const StoredRow&)>& fn);

  // The change journal: which ids each round wrote or deleted (incremental exports).
  // Lives as long as the storage; thread-safe (change_journal.h).
  const ChangeJournal& journal() const { return *journal_; }
  // The number the database gives table `table` (journal entries name tables by it), or
  // NOT_FOUND. Thread-safe.
  absl::StatusOr<uint32_t> TableNumber(const std::string& table);
  // Reads stored rows of table number `table_no` by id, as StorageDb::ReadRows (the rows
  // column family's state, not memory's). Thread-safe.
  absl::Status ReadStoredRows(uint32_t table_no, absl::Span<const int64_t> ids, size_t row_floats,
                              float* values, uint64_t* steps, bool* found);
  // Row deletions logged and not yet in the change journal, by table number: on a copy
  // opened for an export, exactly the deletions its log holds (the journal has the rest).
  // Thread-safe.
  std::vector<std::pair<uint32_t, int64_t>> LoggedDeletes();

  const RecoveryStats& recovery() const { return recovery_; }

  // Replication (pod_storage_recover.cc; docs/architecture.md, "Replication"). The records
  // recovered from the log at start, which the followers of a replicated primary may not
  // hold (its ship queue died with the process): their keys are held in the PushDedup
  // (PushDedup::Hold) and the log is not truncated until ReleaseRecoveredLog, so a restart
  // before then recovers them again. ForEachRecoveredRecord reads them back from the
  // database in log order (`fn`'s first error stops the walk and is returned); the views
  // live for the call. Thread-safe.
  absl::Status ForEachRecoveredRecord(const std::function<absl::Status(absl::string_view)>& fn);
  void ReleaseRecoveredLog();
  bool holds_recovered_log() const { return recovered_held_.load(); }
  // Asked by each materialization round before it truncates the log: a non-OK answer keeps
  // the log whole this round (a replicated primary's records below the cut that its
  // followers do not hold yet). Null: always truncate. Thread-safe.
  void SetTruncateGate(std::function<absl::Status()> gate);
  // The database's identity and whether this start created it (StorageDb::storage_id,
  // StorageDb::created): what the pod reports to the master at registration.
  const std::string& storage_id() const { return db_->storage_id(); }
  bool storage_created() const { return db_->created(); }
  // Whether the previous run of this database ended in a crash while it acknowledged
  // records before writing them (periodic durability; run_marker.h): its log may lack up
  // to flush_ms of records it acknowledged, which a replicated pod's followers or primary
  // hold. The pod reports it at registration (at R >= 2 the master replaces its copies).
  // A clean close (the destructor, once the log is written and fsynced) clears it for the
  // next start. Constant after Open; thread-safe.
  bool acknowledged_tail_lost() const { return previous_run_.lost_acknowledged_tail; }
  // Whether every stored row is in memory (false during a lazy start's background load,
  // and always with a memory budget).
  bool rows_loaded() const { return loaded_; }
  Durability durability() const { return options_.log.durability; }
  struct Stats {
    uint64_t materialize_rounds = 0, materialized_rows = 0, evicted_rows = 0;
    uint64_t deleted_rows = 0;  // rows deleted on disk (EmbeddingTable::Delete)
    double last_materialize_ms = 0;
    uint64_t disk_bytes = 0;
  };
  Stats stats();
  // The push log's counters (records, groups, bytes, lag). Thread-safe.
  DurableLog::Stats log_stats() const { return log_->stats(); }

 private:
  PodStorage(const PodStorageOptions& options, std::unique_ptr<StorageDb> db, ModelStore* store,
             PushDedup* dedup);
  uint64_t BarrierLsn();  // next_lsn read with apply_mu_ held exclusively
  // A materialization round's cut: BarrierLsn, and in the same exclusive hold, the
  // admission counters due for decay halved (and the decay logged), then every table's
  // counters serialized into *admission (by table number) as of the cut.
  uint64_t CutWithAdmission(std::vector<std::pair<uint32_t, std::string>>* admission);

  // Recovery (pod_storage_recover.cc): Recover runs these steps in this order.
  struct RecoveredLog;
  using TablesByNumber = absl::flat_hash_map<uint32_t, std::shared_ptr<EmbeddingTable>>;
  absl::Status Recover();
  // Creates the catalog's tables and tensors and restores the de-duplication state.
  absl::Status LoadCatalog(const StorageDb::Catalog& catalog, TablesByNumber* tables);
  // Reads the log records from `base` on (parsed in place) and indexes every row and dense
  // update; marks the keys of the records applied.
  absl::Status ReadLog(uint64_t base, const TablesByNumber& tables, RecoveredLog* log);
  // Counts a recovered record's pushes into its tables' admission counters and applies
  // its decays (records in log order).
  void CountAdmission(const LogRecordView& rec, const TablesByNumber& tables);
  // The change journal's deletions (pod_storage_journal.cc): NoteLoggedDeletes keeps the
  // deletions of a log record (ApplyLogged's deleting changes, recovery's records);
  // JournalLoggedDeletes notes every one kept so far in the journal (a round, before it
  // deletes rows from disk), waiting for a deleting change in progress to keep its own.
  void NoteLoggedDeletes(const LogRecordView& rec);
  void JournalLoggedDeletes() ABSL_EXCLUSIVE_LOCKS_REQUIRED(materialize_mu_);
  // Sets recovery_.lazy (stored rows stay on disk until touched) and returns whether the
  // log's row updates wait for their rows too (lazy replay).
  bool ChooseLazy(bool log_updates_rows);
  // Every stored dense tensor, and every stored row unless the start is lazy.
  absl::Status LoadStoredRows(const TablesByNumber& tables);
  // A lazy start without lazy replay: reads back the rows the log updates.
  absl::Status ReadBackLoggedRows(const RecoveredLog& log);
  // Replays the log's row updates and deletions, each row in step order between its
  // deletions, tables' shards in parallel.
  void ReplayRows(const RecoveredLog& log);
  absl::Status ReplayDense(RecoveredLog& log);
  // Starts the log writer at `next_lsn`, the materializer and the background load.
  void StartBackground(uint64_t next_lsn, bool lazy_replay);

  // The materializer and eviction (pod_storage_materialize.cc).
  void RunMaterializer();
  // Waits until the next background round is due (its interval passed, or the log grew by
  // half its bound since the last round, which left `live_after` bytes); true when
  // stopping.
  bool WaitForRound(uint64_t live_after);
  absl::Status MaterializeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(materialize_mu_);
  // Evicts rows down to the budget; after a successful round (every dirty row written).
  void EvictToBudget();
  // The tables the catalog numbers, with their numbers.
  std::vector<std::pair<uint32_t, std::shared_ptr<EmbeddingTable>>> NumberedTables();

  // Rows read back from the database (pod_storage_lazy.cc).
  class StoredRowSource;
  struct Pending;
  // Gives `table` (number `no`) its RowSource over the rows column family, once.
  void AttachSource(uint32_t no, EmbeddingTable& table);
  std::shared_ptr<const Pending> pending();
  // Lazy replay: loads every row the recovered log updates (applying its updates) and
  // stores it, then drops the pending updates. false if stopped or failed.
  bool ApplyPending(const Pending& pending);
  // Lazy start without a budget: loads every stored row that is not resident, then
  // detaches the tables' sources (every row is then in memory).
  void LoadInBackground();

  // Constant after Open.
  const PodStorageOptions options_;
  std::unique_ptr<StorageDb> db_;
  ModelStore* const store_;
  PushDedup* const dedup_;
  RecoveryStats recovery_;
  PreviousRun previous_run_;  // how the previous run ended (run_marker.h)
  std::unique_ptr<DurableLog> log_;
  std::unique_ptr<ChangeJournal> journal_;  // noted and committed under materialize_mu_
  // Row deletions logged since a round last noted them in the journal (see
  // pod_storage_journal.cc): a deleted row created again before the round is written as a
  // row, so the deletion is noted from its log record, not from the round.
  absl::Mutex deletes_mu_;
  std::vector<std::pair<uint32_t, int64_t>> logged_deletes_ ABSL_GUARDED_BY(deletes_mu_);

  // Held shared by ApplyLogged from apply to append, exclusively by the materializer for
  // an instant (BarrierLsn) and by eviction.
  absl::Mutex apply_mu_;
  absl::Mutex materialize_mu_;  // one round at a time

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, uint32_t> table_numbers_ ABSL_GUARDED_BY(mu_);
  uint32_t next_table_no_ ABSL_GUARDED_BY(mu_) = 1;
  // The recovered log's updates not yet applied (lazy replay); null once the background
  // load has applied and stored them. The log is not truncated meanwhile.
  std::shared_ptr<const Pending> pending_ ABSL_GUARDED_BY(mu_);
  // Each table's StoredRowSource, by table number.
  absl::flat_hash_map<uint32_t, std::unique_ptr<RowSource>> sources_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  // The log recovered at start, [recovered_base_, recovered_end_): kept whole while
  // recovered_held_. MayTruncate: neither that nor the gate keeps it.
  uint64_t recovered_base_ = 0, recovered_end_ = 0;
  std::atomic<bool> recovered_held_{false};
  std::function<absl::Status()> truncate_gate_ ABSL_GUARDED_BY(materialize_mu_);
  bool MayTruncate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(materialize_mu_);

  std::atomic<bool> replicated_{false};  // SetReplicated
  std::thread materializer_;
  std::thread loader_;
  std::atomic<bool> loaded_{false};
};

}  // namespace ps
