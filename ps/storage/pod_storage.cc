// PodStorage: opening and closing, the catalog, the one durable-apply path, and what a
// vshard move and a checkpoint need. Recovery, the materializer and lazy loading are in
// the pod_storage_*.cc files beside this one.
#include "ps/storage/pod_storage.h"

#include <glog/logging.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace ps {

absl::StatusOr<std::unique_ptr<PodStorage>> PodStorage::Open(const PodStorageOptions& options,
                                                             ModelStore* store, PushDedup* dedup) {
  StorageDbOptions db_options = options.db;
  // Rows reach the database as ingested table files, so the rows memtable only holds the
  // few rows written through it (dense tensors, deletes): the skiplist, which serves
  // point reads (a lazy start, a memory budget), costs nothing.
  db_options.rows_point_reads = true;
  db_options.sync_log_on_rotate = options.log.durability != Durability::kProcess;
  ASSIGN_OR_RETURN(std::unique_ptr<StorageDb> db, StorageDb::Open(db_options));
  std::unique_ptr<PodStorage> storage(new PodStorage(options, std::move(db), store, dedup));
  ASSIGN_OR_RETURN(storage->journal_, ChangeJournal::Open(storage->db_.get(), options.journal));
  RETURN_IF_ERROR(storage->Recover());
  // Before anything is acknowledged: this run's marker, and what the previous one left.
  ASSIGN_OR_RETURN(storage->previous_run_, BeginRun(storage->db_.get(), options.log.durability));
  if (storage->previous_run_.lost_acknowledged_tail) {
    LOG(WARNING) << "the previous run on " << options.db.dir
                 << " ended without a clean close while it acknowledged records before "
                    "writing them (periodic durability): its log may lack up to --flush_ms of "
                    "records it acknowledged; the pod reports this to the master, which at "
                    "R >= 2 replaces its copies from their other replicas";
  } else if (storage->previous_run_.crashed) {
    LOG(INFO) << "the previous run on " << options.db.dir
              << " ended without a clean close; its log holds everything it acknowledged";
  }
  return storage;
}

PodStorage::PodStorage(const PodStorageOptions& options, std::unique_ptr<StorageDb> db,
                       ModelStore* store, PushDedup* dedup)
    : options_(options), db_(std::move(db)), store_(store), dedup_(dedup) {}

PodStorage::~PodStorage() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (materializer_.joinable()) materializer_.join();
  if (loader_.joinable()) loader_.join();
  if (log_ != nullptr && options_.materialize_on_close) {
    absl::Status s = Materialize();
    if (!s.ok()) LOG(WARNING) << "final materialization failed (the log still has it): " << s;
    // A clean close only once every acknowledged record is written and fsynced.
    absl::Status durable = log_->WaitWritten(log_->next_lsn());
    log_.reset();
    if (durable.ok()) durable = db_->SyncLog();
    if (durable.ok()) durable = EndRun(db_.get());
    if (!durable.ok()) {
      LOG(WARNING) << "the log could not be made durable at close (the next start counts "
                      "this run as a crash): "
                   << durable;
    }
  }
  // The tables may outlive this storage: they must not read through its sources.
  for (auto& t : store_->Tables()) t->SetRowSource(nullptr);
}

absl::Status PodStorage::AddTable(const TableSpec& spec) {
  uint32_t no;
  {
    absl::MutexLock lock(&mu_);
    auto it = table_numbers_.find(spec.name());
    no = it != table_numbers_.end() ? it->second : next_table_no_++;
  }
  RETURN_IF_ERROR(db_->PutTable(no, spec));
  absl::MutexLock lock(&mu_);
  table_numbers_[spec.name()] = no;
  return absl::OkStatus();
}

absl::Status PodStorage::AddDense(const DenseSpec& spec) { return db_->PutDense(spec); }

void PodStorage::ApplyLogged(
    const PushKey& key, size_t record_bytes,
    absl::FunctionRef<absl::Status(LogRecordBuilder* record)> apply, DurableLog::Done done,
    const std::function<void(const std::shared_ptr<const std::string>&, absl::Status)>& ship,
    bool exclusive) {
  if (absl::Status s = log_->health(); !s.ok()) return done(s);
  if (exclusive && pending() != nullptr) {
    return done(absl::UnavailableError(
        "rows cannot be deleted while the recovered log is still being applied (lazy "
        "start); retry"));
  }
  // While materialization lags far behind, wait for it, outside the lock it needs.
  log_->WaitForRoom();
  // Applied and appended under the shared apply lock: see BarrierLsn. `done` may mark a
  // push's key applied (periodic mode: inside Append), which the materializer's snapshot
  // of the de-duplication state relies on happening under this lock too. A deletion holds
  // it exclusively (see log_record.h).
  if (exclusive)
    apply_mu_.WriterLock();
  else
    apply_mu_.ReaderLock();
  absl::Cleanup unlock = [&] {
    if (exclusive)
      apply_mu_.WriterUnlock();
    else
      apply_mu_.ReaderUnlock();
  };
  LogRecordBuilder record(key, record_bytes);
  if (absl::Status s = apply(&record); !s.ok()) return done(s);
  if (!record.has_entries()) return done(absl::OkStatus());
  std::shared_ptr<const std::string> bytes = record.FinishShared();
  if (exclusive) {
    // For the change journal (pod_storage_journal.cc); the record was just built whole.
    if (absl::StatusOr<LogRecordView> rec = ParseLogRecord(*bytes); rec.ok()) {
      NoteLoggedDeletes(*rec);
    }
  }
  if (!ship) return log_->Append(std::move(bytes), std::move(done));
  if (options_.log.durability == Durability::kPeriodic) {
    ship(bytes, absl::OkStatus());  // see the header: a crash loses the log's tail anyway
    return log_->Append(std::move(bytes), std::move(done));
  }
  // Shipped once written: a follower never holds a record this log can lose to a SIGKILL.
  std::shared_ptr<const std::string> shipped = bytes;
  log_->Append(std::move(bytes), std::move(done),
               [ship, shipped = std::move(shipped)](absl::Status written) {
                 ship(shipped, std::move(written));
               });
}

uint64_t PodStorage::BarrierLsn() {
  absl::WriterMutexLock lock(&apply_mu_);
  return log_->next_lsn();
}

absl::Status PodStorage::WaitApplied() { return log_->WaitWritten(BarrierLsn()); }

absl::Status PodStorage::SyncApplied() {
  RETURN_IF_ERROR(WaitApplied());
  // Process mode promises only what is written; machine mode fsynced each group before
  // marking it written; periodic mode fsyncs on a timer, so fsync now.
  if (options_.log.durability != Durability::kPeriodic) return absl::OkStatus();
  return db_->SyncLog();
}

absl::Status PodStorage::DropRows(
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& rows,
    const std::vector<std::string>& dense) {
  // Under the round lock: a round in progress could otherwise write back a row it
  // gathered before the caller erased it.
  absl::MutexLock round(&materialize_mu_);
  // First a round: it writes what is dirty (a dense tensor being dropped stays in memory,
  // so it must not be dirty afterwards) and truncates the log records of the dropped rows.
  RETURN_IF_ERROR(MaterializeLocked());
  RowBatch batch = db_->NewRowBatch();
  for (const auto& [table, ids] : rows) {
    uint32_t no;
    {
      absl::MutexLock lock(&mu_);
      auto it = table_numbers_.find(table);
      if (it == table_numbers_.end()) continue;
      no = it->second;
    }
    for (int64_t id : ids) batch.DeleteRow(no, id);
  }
  for (const std::string& name : dense) batch.DeleteDense(name);
  if (batch.count() > 0) {
    RETURN_IF_ERROR(db_->WriteRows(&batch));
    RETURN_IF_ERROR(db_->FlushRows());
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> PodStorage::TableNumber(const std::string& table) {
  absl::MutexLock lock(&mu_);
  auto it = table_numbers_.find(table);
  if (it == table_numbers_.end()) {
    return absl::NotFoundError(absl::StrCat("table '", table, "' is not stored"));
  }
  return it->second;
}

absl::Status PodStorage::ReadStoredRows(uint32_t table_no, absl::Span<const int64_t> ids,
                                        size_t row_floats, float* values, uint64_t* steps,
                                        bool* found) {
  return db_->ReadRows(table_no, ids, row_floats, values, steps, found);
}

absl::Status PodStorage::Checkpoint(const std::string& dir) {
  // Rows live in memtables without the WAL until flushed: materialize first, so the
  // checkpoint's log (which the copy keeps) and rows together hold every update.
  absl::MutexLock round(&materialize_mu_);
  RETURN_IF_ERROR(MaterializeLocked());
  return db_->Checkpoint(dir);
}

absl::Status PodStorage::ForEachStoredRow(const std::string& table,
                                          const std::function<absl::Status(const StoredRow&)>& fn) {
  uint32_t no;
  {
    absl::MutexLock lock(&mu_);
    auto it = table_numbers_.find(table);
    if (it == table_numbers_.end()) {
      return absl::NotFoundError(absl::StrCat("table '", table, "' is not stored"));
    }
    no = it->second;
  }
  return db_->ForEachTableRow(no, fn);
}

PodStorage::Stats PodStorage::stats() {
  const uint64_t disk = db_->disk_bytes();
  absl::MutexLock lock(&mu_);
  Stats s = stats_;
  s.disk_bytes = disk;
  return s;
}

}  // namespace ps
