// Durability of one PS pod: its RocksDB database (storage_db.h), the push log
// (durable_log.h), recovery at start and the background materializer.
//
// How an update becomes durable: a push is applied in memory, then its record (key, ids,
// row steps, gradients) is appended to the log and the push is acknowledged when the log
// says so (durable_log.h). The materializer, every `materialize_ms`, writes the rows that
// changed to the rows column family (sorted table files, ingested), and deletes the log
// records they make redundant, storing the push de-duplication state with that deletion. Recovery
// loads the catalog, the rows and the de-duplication state, then replays the remaining log records,
// each row's updates in step order, skipping those its stored row already holds.
//
// Invariants (docs/architecture.md, "Durability"): a stored row holds only updates whose
// records are written (the materializer waits for the log before writing a group of
// rows), so a retried push is never applied twice; a log record is deleted only after
// the rows it changed are flushed, so an acknowledged push is never lost.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "embedding/model_store.h"
#include "ps/storage/durable_log.h"
#include "ps/storage/push_dedup.h"
#include "ps/storage/storage_db.h"

namespace ps {

struct PodStorageOptions {
  StorageDbOptions db;
  DurableLogOptions log;
  // How often changed rows are written out and the log truncated. Recovery replays at
  // most about this much of the log; 1 s keeps restarts fast at a small write cost.
  int materialize_ms = 1000;
  // Row bytes gathered before the materializer writes a group: one sorted table file,
  // ingested into the rows column family (no memtable, no flush).
  size_t materialize_group_bytes = size_t{64} << 20;
  // Materialize once more when closing, so the next start replays little. Tests turn it
  // off to leave the log as a crash would.
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
  bool lazy = false;  // stored rows were left on disk at start (lazy_start, memory budget)
  bool lazy_replay = false;
  // Without lazy_start (and a budget): start lazily, with lazy replay, anyway when the
  // database holds at least this many rows (RocksDB's estimate), where an eager start
  // would take seconds. 0: never.
  uint64_t lazy_start_rows = 0;  // the log's updates were left to apply as rows load
  double seconds = 0;
};

class PodStorage {
 public:
  // Opens (or creates) the database, recovers its contents into `store` (which must be
  // empty and built with TableOptions.track_dirty) and `dedup`, and starts the log writer
  // and the materializer. `store` and `dedup` must outlive the storage.
  static absl::StatusOr<std::unique_ptr<PodStorage>> Open(const PodStorageOptions& options,
                                                          ModelStore* store, PushDedup* dedup);
  // Writes what is queued, materializes once more (so the next start replays little) and
  // closes the database.
  ~PodStorage();

  // Persists a new table / tensor (normalized spec) before it is created in memory; the
  // caller serializes creations. Thread-compatible.
  absl::Status AddTable(const TableSpec& spec);
  absl::Status AddDense(const DenseSpec& spec);

  // Pushes hold this shared from before they apply until their record is appended, so
  // the materializer (which takes it exclusively, briefly) knows every update it reads
  // from memory has a log sequence number below the one it then sees.
  absl::Mutex& apply_mu() { return apply_mu_; }
  DurableLog& log() { return *log_; }

  // Live migration (ps/ps_core_migrate.cc). Rows a move brought here (per id: `dim`
  // weights then the slots), written through the WAL: durable (in the pod's durability
  // mode) after FlushImported, with no memtable flush. Thread-safe.
  absl::Status WriteImported(const std::string& table, absl::Span<const int64_t> ids,
                             absl::Span<const uint64_t> steps, absl::Span<const float> values,
                             uint32_t dim);
  absl::Status WriteImportedDense(const std::string& name, uint64_t step,
                                  absl::Span<const float> values);
  absl::Status FlushImported();
  // Deletes rows (and dense tensors) of vshards that moved away, durably, then truncates
  // the log so a restart does not replay their updates. The caller erased them from
  // memory first. Thread-safe.
  absl::Status DropRows(const std::vector<std::pair<std::string, std::vector<int64_t>>>& rows,
                        const std::vector<std::string>& dense);
  // Waits until every update applied in memory so far has its log record written.
  absl::Status WaitApplied();

  // One materialization round now (the background thread calls it too). Thread-safe.
  absl::Status Materialize();
  // A consistent copy of the pod's database into `dir` (see StorageDb::Checkpoint).
  absl::Status Checkpoint(const std::string& dir);

  // Calls fn for every stored row of table `table` (as the rows column family has it:
  // rows changed since the last materialization are newer in memory). NOT_FOUND for an
  // unknown table. Thread-safe.
  absl::Status ForEachStoredRow(const std::string& table,
                                const std::function<absl::Status(const StoredRow&)>& fn);

  const RecoveryStats& recovery() const { return recovery_; }
  // Whether every stored row is in memory (false during a lazy start's background load,
  // and always with a memory budget).
  bool rows_loaded() const { return loaded_; }
  Durability durability() const { return options_.log.durability; }
  struct Stats {
    uint64_t materialize_rounds = 0, materialized_rows = 0, evicted_rows = 0;
    double last_materialize_ms = 0;
    uint64_t disk_bytes = 0;
  };
  Stats stats();

 private:
  PodStorage(const PodStorageOptions& options, std::unique_ptr<StorageDb> db, ModelStore* store,
             PushDedup* dedup);
  absl::Status Recover();
  uint64_t BarrierLsn();  // next_lsn read with apply_mu_ held exclusively
  void RunMaterializer();
  absl::Status MaterializeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(materialize_mu_);
  // Gives `table` (number `no`) its RowSource over the rows column family, once.
  void AttachSource(uint32_t no, EmbeddingTable& table);
  // Evicts rows down to the budget; after a successful round (every dirty row written).
  void EvictToBudget();
  // Lazy start without a budget: loads every stored row that is not resident, then
  // detaches the tables' sources (every row is then in memory).
  void LoadInBackground();

  const PodStorageOptions options_;
  std::unique_ptr<StorageDb> db_;
  ModelStore* const store_;
  PushDedup* const dedup_;
  RecoveryStats recovery_;
  std::unique_ptr<DurableLog> log_;
  absl::Mutex apply_mu_;

  absl::Mutex materialize_mu_;  // one round at a time
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, uint32_t> table_numbers_ ABSL_GUARDED_BY(mu_);
  class StoredRowSource;
  struct Pending;
  // The recovered log's updates not yet applied (lazy replay); null once the background
  // load has applied and stored them. The log is not truncated meanwhile.
  std::shared_ptr<const Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const Pending> pending();
  // Lazy replay: loads every row the recovered log updates (applying its updates) and
  // stores it, then drops the pending updates. false if stopped or failed.
  bool ApplyPending(const Pending& pending);
  absl::flat_hash_map<uint32_t, std::unique_ptr<StoredRowSource>> sources_ ABSL_GUARDED_BY(mu_);
  uint32_t next_table_no_ ABSL_GUARDED_BY(mu_) = 1;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread materializer_;
  std::thread loader_;
  std::atomic<bool> loaded_{false};
};

}  // namespace ps
