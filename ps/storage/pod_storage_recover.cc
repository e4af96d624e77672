// PodStorage: recovery at start. Recover runs named steps: load the catalog, read and index
// the log, choose an eager or a lazy start, load the stored rows, replay the log, start the
// background threads. docs/architecture.md ("Recovery", "Lazy start") describes each.
#include <glog/logging.h>

#include <algorithm>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "ps/storage/log_record.h"
#include "ps/storage/pod_storage.h"
#include "ps/storage/pod_storage_pending.h"

namespace ps {

namespace {

using TablesByNumber = absl::flat_hash_map<uint32_t, std::shared_ptr<EmbeddingTable>>;
using PendingTables = absl::flat_hash_map<uint32_t, std::unique_ptr<PendingTable>>;

// A logged update of a dense tensor: a gradient, or the whole tensor installed.
struct DenseUpdate {
  std::shared_ptr<DenseTensor> tensor;
  uint64_t step;
  const float* grad;
  float lr;
  const std::vector<float>* install = nullptr;  // weights then slots
};

// Sorts the row entries of the log's records (pushes' gradients and installs) into their
// tables' PendingTables, checking each against the catalog: a record naming a table the
// catalog lacks, or rows of another size, is DATA_LOSS.
class RowUpdateIndex {
 public:
  RowUpdateIndex(const TablesByNumber& tables, PendingTables* out)
      : tables_(tables),
        out_(out),
        shards_(std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8)) {
    for (const auto& [no, table] : tables) numbers_[table->spec().name()] = no;
  }

  // Room for every update first: millions after a burst of pushes.
  absl::Status Reserve(const std::vector<LogEntryView>& records) {
    absl::flat_hash_map<std::string, size_t> counts;
    for (const LogEntryView& entry : records) {
      ASSIGN_OR_RETURN(LogRecordView rec, ParseLogRecord(entry.record));
      for (const LogTableView& e : rec.tables) counts[e.table] += e.n;
      for (const LogInstallView& e : rec.installs) counts[e.table] += e.n;
      for (const LogDeleteView& e : rec.deletes) counts[e.table] += e.n;
    }
    for (const auto& [name, count] : counts) {
      if (PendingTable* pt = Find(name); pt != nullptr) pt->Reserve(count);
    }
    return absl::OkStatus();
  }

  // Checks the record's row entries and keeps them for Build. `rec` points into the log,
  // which must outlive the index's tables.
  absl::Status Add(const LogRecordView& rec) {
    for (const LogTableView& e : rec.tables) {
      PendingTable* pt = Find(e.table);
      if (pt == nullptr || pt->table->dim() != e.dim) {
        return absl::DataLossError(absl::StrCat("log record of worker ", rec.key.worker_id(),
                                                " names table '", e.table, "' (dim ", e.dim,
                                                ") which the catalog lacks"));
      }
      entries_.push_back({Entry::kGradients, gradients_.size()});
      gradients_.push_back({pt, e});
    }
    for (const LogInstallView& e : rec.installs) {
      PendingTable* pt = Find(e.table);
      if (pt == nullptr || pt->table->dim() + pt->table->slot_floats() != e.row_floats) {
        return absl::DataLossError(absl::StrCat("log record installs rows of table '", e.table,
                                                "' (", e.row_floats,
                                                " floats per row) which the catalog lacks"));
      }
      entries_.push_back({Entry::kInstalls, installs_.size()});
      installs_.push_back({pt, e});
    }
    for (const LogDeleteView& e : rec.deletes) {
      PendingTable* pt = Find(e.table);
      if (pt == nullptr) {
        return absl::DataLossError(absl::StrCat("log record deletes rows of table '", e.table,
                                                "' which the catalog lacks"));
      }
      entries_.push_back({Entry::kDelete, deletes_.size()});
      deletes_.push_back({pt, e});
    }
    return absl::OkStatus();
  }

  // Row deletions in the log.
  size_t deletions() const {
    size_t n = 0;
    for (const auto& [pt, e] : deletes_) n += e.n;
    return n;
  }

  // Chains each row's updates in log order (a deletion's place among a row's updates is
  // its log position), one thread per shard of the rows.
  void Build() {
    auto build = [this](size_t shard) {
      for (const Entry& entry : entries_) {
        if (entry.kind == Entry::kGradients) {
          const auto& [pt, e] = gradients_[entry.index];
          for (size_t i = 0; i < e.n; ++i) {
            const int64_t id = e.id(i);
            // Step 0: a push admission dropped (counted in ReadLog, no row update).
            if (pt->ShardOf(id) == shard && e.step(i) != 0) {
              pt->Add(shard, {id, e.step(i), e.grad(i), e.lr, false});
            }
          }
        } else if (entry.kind == Entry::kInstalls) {
          const auto& [pt, e] = installs_[entry.index];
          for (size_t i = 0; i < e.n; ++i) {
            const int64_t id = e.id(i);
            if (pt->ShardOf(id) == shard) pt->Add(shard, {id, e.step(i), e.row(i), 0, true});
          }
        } else {
          const auto& [pt, e] = deletes_[entry.index];
          for (size_t i = 0; i < e.n; ++i) {
            const int64_t id = e.id(i);
            if (pt->ShardOf(id) == shard) pt->Add(shard, {id, 0, nullptr, 0, false, true});
          }
        }
      }
    };
    std::vector<std::thread> threads;
    for (size_t k = 1; k < shards_; ++k) threads.emplace_back(build, k);
    build(0);
    for (std::thread& t : threads) t.join();
  }

 private:
  // The PendingTable of table `name` (created on first use), or null if the catalog lacks it.
  PendingTable* Find(absl::string_view name) {
    auto it = numbers_.find(name);
    if (it == numbers_.end()) return nullptr;
    auto [pt, inserted] = out_->try_emplace(it->second);
    if (inserted) pt->second = std::make_unique<PendingTable>(tables_.at(it->second), shards_);
    return pt->second.get();
  }

  const TablesByNumber& tables_;
  PendingTables* const out_;
  const size_t shards_;
  absl::flat_hash_map<std::string, uint32_t> numbers_;
  std::vector<std::pair<PendingTable*, LogTableView>> gradients_;
  std::vector<std::pair<PendingTable*, LogInstallView>> installs_;
  std::vector<std::pair<PendingTable*, LogDeleteView>> deletes_;
  // Every entry above in log order.
  struct Entry {
    enum Kind : uint8_t { kGradients, kInstalls, kDelete } kind;
    size_t index;
  };
  std::vector<Entry> entries_;
};

// Decodes the dense entries of one record into `records` (which must have room: it is never
// reallocated) and adds its updates to `updates`; DATA_LOSS for a tensor the catalog lacks.
absl::Status AddDenseUpdates(ModelStore& store, absl::string_view record,
                             std::vector<LogRecord>* records, std::vector<DenseUpdate>* updates) {
  ASSIGN_OR_RETURN(LogRecord full, DecodeLogRecord(record));
  const LogRecord& kept = records->emplace_back(std::move(full));
  for (const LogDenseEntry& e : kept.dense) {
    auto d = store.FindDense(e.name);
    if (d == nullptr || d->numel() != e.grads.size()) {
      return absl::DataLossError(
          absl::StrCat("log record names dense tensor '", e.name, "' which the catalog lacks"));
    }
    updates->push_back({std::move(d), e.step, e.grads.data(), e.lr});
  }
  for (const LogDenseInstall& e : kept.dense_installs) {
    auto d = store.FindDense(e.name);
    if (d == nullptr || d->numel() + d->slot_floats() != e.values.size()) {
      return absl::DataLossError(
          absl::StrCat("log record installs dense tensor '", e.name, "' which the catalog lacks"));
    }
    updates->push_back({std::move(d), e.step, nullptr, 0, &e.values});
  }
  return absl::OkStatus();
}

}  // namespace

// The log records recovery read, indexed: every row update in its table's PendingTable,
// every dense tensor update in a list.
struct PodStorage::RecoveredLog {
  std::shared_ptr<Pending> pending = std::make_shared<Pending>();
  std::vector<LogRecord> dense_records;  // decoded copies of the records with dense parts
  std::vector<DenseUpdate> dense;        // pointing into dense_records
  uint64_t next_lsn = 0;                 // the lsn after the last record
  size_t row_updates = 0;                // over every PendingTable
  size_t deletions = 0;                  // rows deleted (among row_updates)
};

absl::Status PodStorage::Recover() {
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(StorageDb::Catalog catalog, db_->LoadCatalog());
  TablesByNumber tables;
  RETURN_IF_ERROR(LoadCatalog(catalog, &tables));
  const absl::Time log_start = absl::Now();
  RecoveredLog log;
  RETURN_IF_ERROR(ReadLog(catalog.log_base, tables, &log));
  const absl::Time log_read = absl::Now();
  // A log that deletes rows is replayed before serving: a lazy replay would apply a
  // deleted row's older updates to it when it is read back, after the deletion is stored.
  const bool lazy_replay =
      ChooseLazy(/*log_updates_rows=*/log.row_updates > 0) && log.deletions == 0;
  if (recovery_.lazy) {
    if (lazy_replay) {
      absl::MutexLock lock(&mu_);
      pending_ = log.pending;
    }
    for (auto& [no, table] : tables) AttachSource(no, *table);
  }
  RETURN_IF_ERROR(LoadStoredRows(tables));
  const absl::Time rows_done = absl::Now();
  // A lazy start without lazy replay: the rows the log updates are read back first.
  if (recovery_.lazy && !lazy_replay) RETURN_IF_ERROR(ReadBackLoggedRows(log));
  const absl::Time read_back = absl::Now();
  if (!lazy_replay) ReplayRows(log);
  RETURN_IF_ERROR(ReplayDense(log));

  recovery_.log_records = log.pending->log.records.size();
  recovery_.replayed_updates = log.row_updates + log.dense.size();
  recovery_.lazy_replay = lazy_replay;
  const absl::Time end = absl::Now();
  recovery_.seconds = absl::ToDoubleSeconds(end - start);
  LOG(INFO) << "recovered " << options_.db.dir << " in " << recovery_.seconds
            << " s: " << recovery_.tables << " tables, " << recovery_.dense << " dense tensors, "
            << (recovery_.lazy ? "stored rows load lazily, " : "") << recovery_.rows
            << " stored rows, " << recovery_.log_records << " log records "
            << (lazy_replay ? "pending" : "replayed") << " (" << recovery_.replayed_updates
            << " row updates" << (lazy_replay ? ", applied as rows load" : "") << ")"
            << " [log read " << absl::ToDoubleSeconds(log_read - log_start) << " s, stored rows "
            << absl::ToDoubleSeconds(rows_done - log_read) << " s, rows read back "
            << absl::ToDoubleSeconds(read_back - rows_done) << " s, replay "
            << absl::ToDoubleSeconds(end - read_back) << " s]";
  StartBackground(log.next_lsn, lazy_replay);
  return absl::OkStatus();
}

absl::Status PodStorage::LoadCatalog(const StorageDb::Catalog& catalog, TablesByNumber* tables) {
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [no, spec] : catalog.tables) {
      RETURN_IF_ERROR(store_->CreateTable(spec).status());
      (*tables)[no] = store_->FindTable(spec.name());
      table_numbers_[spec.name()] = no;
      next_table_no_ = std::max(next_table_no_, no + 1);
    }
  }
  for (const DenseSpec& spec : catalog.dense) RETURN_IF_ERROR(store_->CreateDense(spec).status());
  recovery_.tables = catalog.tables.size();
  recovery_.dense = catalog.dense.size();
  if (!catalog.dedup.empty()) RETURN_IF_ERROR(dedup_->Restore(catalog.dedup));
  // Admission counters as of the log's base; ReadLog counts the records after it.
  for (const auto& [no, bytes] : catalog.admission) {
    auto it = tables->find(no);
    if (it == tables->end() || it->second->admission() == nullptr) continue;
    if (absl::Status s = it->second->admission()->Restore(bytes, /*with_totals=*/true); !s.ok()) {
      return absl::DataLossError(absl::StrCat("stored admission counters of '",
                                              it->second->spec().name(), "': ", s.message()));
    }
  }
  return absl::OkStatus();
}

// The log, parsed in place (see log_record.h): every row update, to be replayed per row
// in step order.
absl::Status PodStorage::ReadLog(uint64_t base, const TablesByNumber& tables, RecoveredLog* log) {
  log->next_lsn = base;
  RETURN_IF_ERROR(db_->ReadLog(base, &log->pending->log));
  const std::vector<LogEntryView>& records = log->pending->log.records;
  RowUpdateIndex index(tables, &log->pending->tables);
  RETURN_IF_ERROR(index.Reserve(records));
  log->dense_records.reserve(records.size());
  for (const LogEntryView& entry : records) {
    log->next_lsn = std::max(log->next_lsn, entry.lsn + 1);
    ASSIGN_OR_RETURN(LogRecordView rec, ParseLogRecord(entry.record));
    RETURN_IF_ERROR(index.Add(rec));
    CountAdmission(rec, tables);
    NoteLoggedDeletes(rec);  // for the change journal (pod_storage_journal.cc)
    if (rec.has_dense) {
      RETURN_IF_ERROR(AddDenseUpdates(*store_, entry.record, &log->dense_records, &log->dense));
    }
    // The change is durable here: a retry of its key must not apply it again. Held, not
    // yet applied, until the pod knows its role: a replicated primary's followers may lack
    // it (see ForEachRecoveredRecord).
    dedup_->Hold(rec.key);
  }
  recovered_base_ = base;
  recovered_end_ = log->next_lsn;
  recovered_held_.store(!records.empty());
  index.Build();
  for (const auto& [no, pt] : log->pending->tables) log->row_updates += pt->size();
  log->deletions = index.deletions();
  return absl::OkStatus();
}

void PodStorage::CountAdmission(const LogRecordView& rec, const TablesByNumber& tables) {
  // In log order: counts between two decays commute, and a decay was logged with the
  // apply lock held exclusively, so the counts logged before it were made before it.
  if (rec.tables.empty() && rec.decays.empty() && rec.admission_installs.empty()) return;
  auto find = [&](absl::string_view name) -> EmbeddingTable* {
    absl::MutexLock lock(&mu_);
    auto it = table_numbers_.find(name);
    if (it == table_numbers_.end()) return nullptr;
    auto t = tables.find(it->second);
    return t == tables.end() || t->second->admission() == nullptr ? nullptr : t->second.get();
  };
  for (const LogTableView& e : rec.tables) {
    EmbeddingTable* t = find(e.table);
    if (t == nullptr) continue;
    for (uint32_t i = 0; i < e.n; ++i) t->CountLogged(e.id(i), e.step(i));
  }
  for (const LogAdmissionInstallView& e : rec.admission_installs) {
    EmbeddingTable* t = find(e.table);
    if (t == nullptr) continue;
    // Checked when it was installed (PsCore::ImportChunk); the record's CRC held.
    if (absl::Status s = t->admission()->Restore(e.counters, /*with_totals=*/false); !s.ok()) {
      LOG(WARNING) << "logged admission counters of '" << e.table << "' not restored: " << s;
    }
  }
  for (const LogDecayView& e : rec.decays) {
    EmbeddingTable* t = find(e.table);
    if (t == nullptr) continue;
    std::vector<uint32_t> vshards(e.n);
    for (uint32_t i = 0; i < e.n; ++i) vshards[i] = e.vshard(i);
    t->admission()->Decay(vshards);
  }
}

bool PodStorage::ChooseLazy(bool log_updates_rows) {
  // Stored rows load lazily under a memory budget or a lazy start: each table then reads
  // its rows back from the database on first touch.
  bool lazy_start = options_.lazy_start, lazy_replay_wanted = options_.lazy_replay;
  if (!lazy_start && options_.memory_budget_bytes == 0 && options_.lazy_start_rows > 0) {
    const uint64_t stored = db_->EstimateRows();
    if (stored >= options_.lazy_start_rows) {
      LOG(INFO) << "lazy start: about " << stored << " stored rows, at least "
                << options_.lazy_start_rows << " (--lazy_start_rows)";
      lazy_start = lazy_replay_wanted = true;
    }
  }
  recovery_.lazy = options_.memory_budget_bytes > 0 || lazy_start;
  // Lazy replay (a lazy start without a budget): the log's updates are applied to each
  // row when it is first read back (request or background load), not before serving.
  return recovery_.lazy && options_.memory_budget_bytes == 0 && lazy_replay_wanted &&
         log_updates_rows;
}

absl::Status PodStorage::LoadStoredRows(const TablesByNumber& tables) {
  return db_->ForEachRow(
      [&](const StoredRow& row) -> absl::Status {
        auto it = tables.find(row.table_no);
        if (it == tables.end()) {
          return absl::DataLossError(absl::StrCat("stored row ", row.id, " of table number ",
                                                  row.table_no, " which the catalog lacks"));
        }
        EmbeddingTable& t = *it->second;
        if (row.values.size() != t.dim() + t.slot_floats()) {
          return absl::DataLossError(absl::StrCat("stored row ", row.id, " of '", t.spec().name(),
                                                  "' has ", row.values.size(), " floats, expected ",
                                                  t.dim() + t.slot_floats()));
        }
        t.Restore(row.id, row.values.data(), row.values.data() + t.dim(), row.step);
        ++recovery_.rows;
        return absl::OkStatus();
      },
      [&](absl::string_view name, uint64_t step, absl::Span<const float> values) {
        auto d = store_->FindDense(name);
        if (d == nullptr) {
          return absl::DataLossError(
              absl::StrCat("stored dense tensor '", name, "' which the catalog lacks"));
        }
        return d->Restore(values, step);
      },
      /*table_rows=*/!recovery_.lazy);
}

absl::Status PodStorage::ReadBackLoggedRows(const RecoveredLog& log) {
  for (const auto& [no, pt] : log.pending->tables) {
    const std::vector<int64_t> ids = pt->Ids();
    for (size_t i = 0; i < ids.size(); i += 65536) {
      const size_t n = std::min<size_t>(65536, ids.size() - i);
      RETURN_IF_ERROR(pt->table->Load(absl::MakeConstSpan(ids).subspan(i, n)));
    }
  }
  return absl::OkStatus();
}

void PodStorage::ReplayRows(const RecoveredLog& log) {
  // Per row in step order (PendingTable::Ordered); Replay and Install skip what a row holds.
  for (const auto& [no, pt] : log.pending->tables) {
    std::vector<std::thread> threads;
    for (size_t k = 1; k < pt->shards(); ++k) {
      threads.emplace_back([pt = pt.get(), k] { pt->ReplayInto(k); });
    }
    pt->ReplayInto(0);
    for (std::thread& t : threads) t.join();
  }
}

absl::Status PodStorage::ReplayDense(RecoveredLog& log) {
  // Per tensor in step order; at equal steps the gradient first (as PendingTable::Ordered).
  std::sort(log.dense.begin(), log.dense.end(), [](const DenseUpdate& a, const DenseUpdate& b) {
    const bool ia = a.install != nullptr, ib = b.install != nullptr;
    return std::tie(a.tensor, a.step, ia) < std::tie(b.tensor, b.step, ib);
  });
  for (const DenseUpdate& u : log.dense) {
    if (u.install != nullptr) {
      RETURN_IF_ERROR(u.tensor->Install(*u.install, u.step).status());
    } else {
      u.tensor->Replay(u.grad, u.lr, u.step);
    }
  }
  return absl::OkStatus();
}

absl::Status PodStorage::ForEachRecoveredRecord(
    const std::function<absl::Status(absl::string_view)>& fn) {
  if (!recovered_held_.load()) {
    return absl::FailedPreconditionError("the recovered log was released (or was empty)");
  }
  // Not truncated while held: every record from the recovered base is still there.
  LogRead read;
  RETURN_IF_ERROR(db_->ReadLog(recovered_base_, &read));
  for (const LogEntryView& entry : read.records) {
    if (entry.lsn >= recovered_end_) break;
    RETURN_IF_ERROR(fn(entry.record));
  }
  return absl::OkStatus();
}

void PodStorage::ReleaseRecoveredLog() { recovered_held_.store(false); }

void PodStorage::SetTruncateGate(std::function<absl::Status()> gate) {
  absl::MutexLock round(&materialize_mu_);
  truncate_gate_ = std::move(gate);
}

bool PodStorage::MayTruncate() {
  if (recovered_held_.load()) return false;
  if (!truncate_gate_) return true;
  if (absl::Status s = truncate_gate_(); !s.ok()) {
    VLOG(1) << "log not truncated this round: " << s;
    return false;
  }
  return true;
}

void PodStorage::StartBackground(uint64_t next_lsn, bool lazy_replay) {
  DurableLogOptions log_options = options_.log;
  if (lazy_replay) log_options.max_log_bytes = 0;  // no truncation until ApplyPending
  log_ = std::make_unique<DurableLog>(db_.get(), next_lsn, log_options);
  materializer_ = std::thread([this] { RunMaterializer(); });
  if (recovery_.lazy && options_.memory_budget_bytes == 0 && options_.background_load) {
    loader_ = std::thread([this] { LoadInBackground(); });
  } else {
    loaded_ = !recovery_.lazy;
  }
}

}  // namespace ps
