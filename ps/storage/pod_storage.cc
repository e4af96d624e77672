#include "ps/storage/pod_storage.h"

#include <glog/logging.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "embedding/initializer.h"
#include "embedding/optimizer.h"
#include "embedding/row_rules.h"
#include "embedding/row_source.h"
#include "ps/storage/log_record.h"

namespace ps {

namespace {

// One logged row update (or whole row installed by an import), pointing into the log.
struct PendingUpdate {
  int64_t id;
  uint64_t step;
  const float* data;  // the gradient, or the installed row (weights then slots)
  float lr;
  bool install;
};

// The recovered log's updates of one table, in log order, with each row's updates
// chained (no sort of the whole log: a row's chain is put in step order when applied).
// Rows are split into shards by a hash of the id, so that shards are built in parallel.
class PendingTable {
 public:
  PendingTable(std::shared_ptr<EmbeddingTable> t, size_t shards)
      : table(std::move(t)),
        shards_(shards),
        optimizer_(table->spec().optimizer()),
        initializer_(table->spec().initializer()) {}

  size_t shards() const { return shards_.size(); }
  size_t ShardOf(int64_t id) const {
    return ((static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull) >> 32) % shards_.size();
  }
  void Reserve(size_t n) {
    const size_t per_shard = n / shards_.size() + n / 64 + 16;
    for (Shard& s : shards_) {
      s.updates.reserve(per_shard);
      s.next.reserve(per_shard);
      s.rows.reserve(per_shard / 2);  // rows are usually updated more than once
    }
  }
  // Adds an update of a row of shard `shard` (ShardOf(u.id)). One thread per shard.
  void Add(size_t shard, const PendingUpdate& u) {
    Shard& s = shards_[shard];
    const uint32_t i = static_cast<uint32_t>(s.updates.size());
    s.updates.push_back(u);
    s.next.push_back(kEnd);
    auto [it, inserted] = s.rows.try_emplace(u.id, Chain{i, i});
    if (!inserted) {
      s.next[it->second.last] = i;
      it->second.last = i;
    }
  }
  size_t size() const {
    size_t n = 0;
    for (const Shard& s : shards_) n += s.updates.size();
    return n;
  }
  std::vector<int64_t> Ids() const {
    std::vector<int64_t> ids;
    for (const Shard& s : shards_) {
      for (const auto& [id, chain] : s.rows) ids.push_back(id);
    }
    std::sort(ids.begin(), ids.end());
    return ids;
  }
  // Applies every update of the rows of `shard` to the table (EmbeddingTable::Replay /
  // Install skip what a row already holds). Shards may be replayed in parallel.
  void ReplayInto(size_t shard) const {
    std::vector<const PendingUpdate*> row;
    {
      const Shard& s = shards_[shard];
      for (const auto& [id, chain] : s.rows) {
        Ordered(s, chain, &row);
        for (const PendingUpdate* u : row) {
          if (u->install) {
            table->Install(u->id, u->data, u->data + table->dim(), u->step);
          } else {
            table->Replay(u->id, u->data, u->lr, u->step);
          }
        }
      }
    }
  }
  // The same arithmetic on a row read back from the database (`*found`) or, if it is not
  // stored, on its initial value: values holds dim weights then the slots. Returns whether
  // `id` has logged updates. Thread-safe.
  bool Apply(int64_t id, float* values, uint64_t* step, bool* found) const {
    const Shard& s = shards_[ShardOf(id)];
    auto it = s.rows.find(id);
    if (it == s.rows.end()) return false;
    std::vector<const PendingUpdate*> row;
    Ordered(s, it->second, &row);
    // The rules of EmbeddingTable::Replay and Install (embedding/row_rules.h), on a row
    // that is not in the table: each update is skipped if the stored row has it already.
    const uint32_t dim = table->dim();
    float* weights = values;
    float* slots = values + dim;
    for (const PendingUpdate* u : row) {
      if (u->install) {
        InstallValues(u->data, u->data + dim, u->step, dim, table->slot_floats(), *found, weights,
                      slots, step);
      } else {
        if (!*found) {
          InitRowValues(initializer_, optimizer_, table->name_hash(), id, dim, weights, slots,
                        step);
        }
        ReplayGradient(optimizer_, u->lr, u->data, u->step, dim, weights, slots, step);
      }
      *found = true;
    }
    return true;
  }

  const std::shared_ptr<EmbeddingTable> table;

 private:
  static constexpr uint32_t kEnd = ~uint32_t{0};
  struct Chain {
    uint32_t first, last;
  };
  struct Shard {
    std::vector<PendingUpdate> updates;  // log order
    std::vector<uint32_t> next;          // the next update of the same row, or kEnd
    absl::flat_hash_map<int64_t, Chain> rows;
  };
  // A row's updates in step order; at equal steps the gradient update first: an install
  // at the step a row already had was skipped (and so never logged), so an install is
  // never followed by an update with its own step. The log order is nearly that already
  // (concurrent pushes of one row may log out of step order).
  void Ordered(const Shard& s, const Chain& chain, std::vector<const PendingUpdate*>* row) const {
    row->clear();
    for (uint32_t i = chain.first; i != kEnd; i = s.next[i]) row->push_back(&s.updates[i]);
    auto less = [](const PendingUpdate* a, const PendingUpdate* b) {
      return std::tie(a->step, a->install) < std::tie(b->step, b->install);
    };
    if (!std::is_sorted(row->begin(), row->end(), less)) {
      std::sort(row->begin(), row->end(), less);
    }
  }

  std::vector<Shard> shards_;
  const Optimizer optimizer_;
  const Initializer initializer_;
};

}  // namespace

struct PodStorage::Pending {
  LogRead log;  // the records the updates point into
  absl::flat_hash_map<uint32_t, std::unique_ptr<PendingTable>> tables;  // by table number
};

// Rows not in memory (evicted, or not loaded yet at a lazy start): read back from the rows
// column family, with the recovered log's updates applied during a lazy replay.
class PodStorage::StoredRowSource final : public RowSource {
 public:
  StoredRowSource(PodStorage* storage, uint32_t table_no)
      : storage_(storage), table_no_(table_no) {}
  absl::Status Read(absl::Span<const int64_t> ids, size_t row_floats, float* values,
                    uint64_t* steps, bool* found) override {
    RETURN_IF_ERROR(storage_->db_->ReadRows(table_no_, ids, row_floats, values, steps, found));
    std::shared_ptr<const Pending> pending = storage_->pending();
    if (pending == nullptr) return absl::OkStatus();
    auto it = pending->tables.find(table_no_);
    if (it == pending->tables.end()) return absl::OkStatus();
    for (size_t i = 0; i < ids.size(); ++i) {
      it->second->Apply(ids[i], values + i * row_floats, &steps[i], &found[i]);
    }
    return absl::OkStatus();
  }

 private:
  PodStorage* const storage_;
  const uint32_t table_no_;
};

std::shared_ptr<const PodStorage::Pending> PodStorage::pending() {
  absl::MutexLock lock(&mu_);
  return pending_;
}

void PodStorage::AttachSource(uint32_t no, EmbeddingTable& table) {
  absl::MutexLock lock(&mu_);
  auto& source = sources_[no];
  if (source != nullptr) return;
  source = std::make_unique<StoredRowSource>(this, no);
  table.SetRowSource(source.get());
}

absl::StatusOr<std::unique_ptr<PodStorage>> PodStorage::Open(const PodStorageOptions& options,
                                                             ModelStore* store, PushDedup* dedup) {
  StorageDbOptions db_options = options.db;
  // Rows reach the database as ingested table files, so the rows memtable only holds the
  // few rows written through it (dense tensors, live-migration imports, deletes): the
  // skiplist, which serves point reads (a lazy start, a memory budget), costs nothing.
  db_options.rows_point_reads = true;
  db_options.sync_log_on_rotate = options.log.durability != Durability::kProcess;
  ASSIGN_OR_RETURN(std::unique_ptr<StorageDb> db, StorageDb::Open(db_options));
  std::unique_ptr<PodStorage> storage(new PodStorage(options, std::move(db), store, dedup));
  RETURN_IF_ERROR(storage->Recover());
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
    log_.reset();
  }
  // The tables may outlive this storage: they must not read through its sources.
  for (auto& t : store_->Tables()) t->SetRowSource(nullptr);
}

absl::Status PodStorage::Recover() {
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(StorageDb::Catalog catalog, db_->LoadCatalog());
  absl::flat_hash_map<uint32_t, std::shared_ptr<EmbeddingTable>> by_number;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [no, spec] : catalog.tables) {
      RETURN_IF_ERROR(store_->CreateTable(spec).status());
      by_number[no] = store_->FindTable(spec.name());
      table_numbers_[spec.name()] = no;
      next_table_no_ = std::max(next_table_no_, no + 1);
    }
  }
  for (const DenseSpec& spec : catalog.dense) RETURN_IF_ERROR(store_->CreateDense(spec).status());
  recovery_.tables = catalog.tables.size();
  recovery_.dense = catalog.dense.size();
  if (!catalog.dedup.empty()) RETURN_IF_ERROR(dedup_->Restore(catalog.dedup));

  // The log, parsed in place (see log_record.h): every row update, to be replayed per row
  // in step order.
  auto pending = std::make_shared<Pending>();
  uint64_t next_lsn = catalog.log_base;
  const absl::Time log_start = absl::Now();
  RETURN_IF_ERROR(db_->ReadLog(catalog.log_base, &pending->log));
  absl::flat_hash_map<std::string, uint32_t> numbers;
  for (const auto& [no, spec] : catalog.tables) numbers[spec.name()] = no;
  const size_t shards = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8);
  auto pending_table = [&](absl::string_view name) -> PendingTable* {
    auto it = numbers.find(name);
    if (it == numbers.end()) return nullptr;
    auto [pt, inserted] = pending->tables.try_emplace(it->second);
    if (inserted) {
      pt->second = std::make_unique<PendingTable>(by_number[it->second], shards);
    }
    return pt->second.get();
  };
  struct DenseUpdate {
    DenseTensor* tensor;
    uint64_t step;
    const float* grad;
    float lr;
    const std::vector<float>* install = nullptr;
  };
  std::vector<DenseUpdate> dense_updates;
  std::vector<std::shared_ptr<DenseTensor>> keep_dense;
  // Never reallocated (reserved for every record): dense_updates point into it.
  std::vector<LogRecord> dense_records;  // decoded copies of the (rare) records with dense parts
  dense_records.reserve(pending->log.records.size());
  {  // Room for every update first: millions after a burst of pushes.
    absl::flat_hash_map<std::string, size_t> counts;
    for (const LogEntryView& entry : pending->log.records) {
      ASSIGN_OR_RETURN(LogRecordView rec, ParseLogRecord(entry.record));
      for (const LogTableView& e : rec.tables) counts[e.table] += e.n;
      for (const LogInstallView& e : rec.installs) counts[e.table] += e.n;
    }
    for (const auto& [name, count] : counts) {
      if (PendingTable* pt = pending_table(name); pt != nullptr) pt->Reserve(count);
    }
  }
  std::vector<std::pair<PendingTable*, LogTableView>> table_entries;
  std::vector<std::pair<PendingTable*, LogInstallView>> install_entries;
  for (const LogEntryView& entry : pending->log.records) {
    next_lsn = std::max(next_lsn, entry.lsn + 1);
    ASSIGN_OR_RETURN(LogRecordView rec, ParseLogRecord(entry.record));
    for (const LogTableView& e : rec.tables) {
      PendingTable* pt = pending_table(e.table);
      if (pt == nullptr || pt->table->dim() != e.dim) {
        return absl::DataLossError(absl::StrCat("log record of worker ", rec.key.worker_id(),
                                                " names table '", e.table, "' (dim ", e.dim,
                                                ") which the catalog lacks"));
      }
      table_entries.push_back({pt, e});
    }
    for (const LogInstallView& e : rec.installs) {
      PendingTable* pt = pending_table(e.table);
      if (pt == nullptr || pt->table->dim() + pt->table->slot_floats() != e.row_floats) {
        return absl::DataLossError(absl::StrCat("log record installs rows of table '", e.table,
                                                "' (", e.row_floats,
                                                " floats per row) which the catalog lacks"));
      }
      install_entries.push_back({pt, e});
    }
    if (rec.has_dense) {
      ASSIGN_OR_RETURN(LogRecord full, DecodeLogRecord(entry.record));
      const LogRecord& kept = dense_records.emplace_back(std::move(full));
      for (const LogDenseEntry& e : kept.dense) {
        auto d = store_->FindDense(e.name);
        if (d == nullptr || d->numel() != e.grads.size()) {
          return absl::DataLossError(
              absl::StrCat("log record names dense tensor '", e.name, "' which the catalog lacks"));
        }
        dense_updates.push_back({d.get(), e.step, e.grads.data(), e.lr});
        keep_dense.push_back(std::move(d));
      }
      for (const LogDenseInstall& e : kept.dense_installs) {
        auto d = store_->FindDense(e.name);
        if (d == nullptr || d->numel() + d->slot_floats() != e.values.size()) {
          return absl::DataLossError(absl::StrCat("log record installs dense tensor '", e.name,
                                                  "' which the catalog lacks"));
        }
        dense_updates.push_back({d.get(), e.step, nullptr, 0, &e.values});
        keep_dense.push_back(std::move(d));
      }
    }
    // The push is durable: a retry of its key must not apply it again.
    auto claim = dedup_->Begin(rec.key);
    if (claim.ok() && *claim == PushDedup::Claim::kNew) dedup_->Finish(rec.key, true);
  }
  {  // Each row's updates in log order, one thread per shard of the rows.
    auto build = [&](size_t shard) {
      for (const auto& [pt, e] : table_entries) {
        for (size_t i = 0; i < e.n; ++i) {
          const int64_t id = e.id(i);
          if (pt->ShardOf(id) == shard) pt->Add(shard, {id, e.step(i), e.grad(i), e.lr, false});
        }
      }
      for (const auto& [pt, e] : install_entries) {
        for (size_t i = 0; i < e.n; ++i) {
          const int64_t id = e.id(i);
          if (pt->ShardOf(id) == shard) pt->Add(shard, {id, e.step(i), e.row(i), 0, true});
        }
      }
    };
    std::vector<std::thread> threads;
    for (size_t k = 1; k < shards; ++k) threads.emplace_back(build, k);
    build(0);
    for (std::thread& t : threads) t.join();
  }
  size_t row_updates = 0;
  for (auto& [no, pt] : pending->tables) {
    row_updates += pt->size();
  }
  const absl::Time log_read = absl::Now();

  // Stored rows, unless they load lazily (memory budget, lazy start): then each table
  // reads its rows back from the database on first touch.
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
  const bool lazy_replay =
      recovery_.lazy && options_.memory_budget_bytes == 0 && lazy_replay_wanted && row_updates > 0;
  if (recovery_.lazy) {
    if (lazy_replay) {
      absl::MutexLock lock(&mu_);
      pending_ = pending;
    }
    for (auto& [no, table] : by_number) AttachSource(no, *table);
  }
  RETURN_IF_ERROR(db_->ForEachRow(
      [&](const StoredRow& row) -> absl::Status {
        auto it = by_number.find(row.table_no);
        if (it == by_number.end()) {
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
      /*table_rows=*/!recovery_.lazy));
  const absl::Time rows_done = absl::Now();
  if (recovery_.lazy && !lazy_replay) {  // the rows the log updates must be loaded first
    for (auto& [no, pt] : pending->tables) {
      const std::vector<int64_t> ids = pt->Ids();
      for (size_t i = 0; i < ids.size(); i += 65536) {
        const size_t n = std::min<size_t>(65536, ids.size() - i);
        RETURN_IF_ERROR(pt->table->Load(absl::MakeConstSpan(ids).subspan(i, n)));
      }
    }
  }
  const absl::Time loaded = absl::Now();
  if (!lazy_replay) {
    // Per row in step order (PendingTable::Ordered); Replay and Install skip what a row holds.
    for (auto& [no, pt] : pending->tables) {
      std::vector<std::thread> threads;
      for (size_t k = 1; k < pt->shards(); ++k) {
        threads.emplace_back([pt = pt.get(), k] { pt->ReplayInto(k); });
      }
      pt->ReplayInto(0);
      for (std::thread& t : threads) t.join();
    }
  }
  std::sort(dense_updates.begin(), dense_updates.end(),
            [](const DenseUpdate& a, const DenseUpdate& b) {
              const bool ia = a.install != nullptr, ib = b.install != nullptr;
              return std::tie(a.tensor, a.step, ia) < std::tie(b.tensor, b.step, ib);
            });
  for (const DenseUpdate& u : dense_updates) {
    if (u.install != nullptr) {
      RETURN_IF_ERROR(u.tensor->Install(*u.install, u.step).status());
    } else {
      u.tensor->Replay(u.grad, u.lr, u.step);
    }
  }
  recovery_.log_records = pending->log.records.size();
  recovery_.replayed_updates = row_updates + dense_updates.size();
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
            << absl::ToDoubleSeconds(loaded - rows_done) << " s, replay "
            << absl::ToDoubleSeconds(end - loaded) << " s]";

  DurableLogOptions log_options = options_.log;
  if (lazy_replay) log_options.max_log_bytes = 0;  // no truncation until ApplyPending
  log_ = std::make_unique<DurableLog>(db_.get(), next_lsn, log_options);
  materializer_ = std::thread([this] { RunMaterializer(); });
  if (recovery_.lazy && options_.memory_budget_bytes == 0 && options_.background_load) {
    loader_ = std::thread([this] { LoadInBackground(); });
  } else {
    loaded_ = !recovery_.lazy;
  }
  return absl::OkStatus();
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

uint64_t PodStorage::BarrierLsn() {
  absl::WriterMutexLock lock(&apply_mu_);
  return log_->next_lsn();
}

absl::Status PodStorage::Materialize() {
  absl::MutexLock round(&materialize_mu_);
  return MaterializeLocked();
}

absl::Status PodStorage::MaterializeLocked() {
  const absl::Time start = absl::Now();
  // Every update of a record below `cut` is in memory and its key is marked applied.
  const uint64_t cut = BarrierLsn();
  RETURN_IF_ERROR(log_->WaitWritten(cut));

  RowFile file;
  file.Reserve(options_.materialize_group_bytes + (size_t{1} << 20));
  absl::Status status;
  // Before a group of rows is written, the log records of every update in it must be
  // written (else a crash could keep the update in a row while its key is forgotten).
  auto write_group = [&] {
    if (!status.ok() || file.count() == 0) return;
    status = log_->WaitWritten(BarrierLsn());
    if (status.ok()) status = db_->IngestRows(&file);
    file.Clear();
  };
  std::vector<std::pair<uint32_t, std::shared_ptr<EmbeddingTable>>> tables;
  {
    absl::MutexLock lock(&mu_);
    for (auto& t : store_->Tables()) {
      auto it = table_numbers_.find(t->spec().name());
      if (it != table_numbers_.end()) tables.emplace_back(it->second, std::move(t));
    }
  }
  size_t rows = 0;
  for (auto& [no, table] : tables) {
    const uint32_t dim = table->dim();
    const uint32_t slots = table->slot_floats();
    rows += table->CollectDirty(
        [&, no = no](const RowView& r) {
          file.AddRow(no, r.id, r.step, absl::MakeConstSpan(r.weights, dim),
                      absl::MakeConstSpan(r.slots, slots));
        },
        [&] {
          if (file.bytes() >= options_.materialize_group_bytes) write_group();
        });
  }
  write_group();
  // Dense tensors (few, small) through the memtable, flushed below.
  RowBatch batch = db_->NewRowBatch();
  std::vector<float> values;
  for (auto& d : store_->DenseTensors()) {
    uint64_t step;
    if (d->Snapshot(/*always=*/false, &values, &step)) {
      batch.AddDense(d->spec().name(), step, values);
    }
  }
  if (status.ok() && batch.count() > 0) {
    status = log_->WaitWritten(BarrierLsn());
    if (status.ok()) status = db_->WriteRows(&batch);
  }
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(db_->FlushRows());
  // The stored de-duplication state may only name pushes whose records are written: in
  // periodic mode a key is marked applied when acknowledged, before its write, and a
  // stored key whose record was then lost would turn the client's retry into a false
  // "duplicate". Pushes are acknowledged under apply_mu (shared), so every key in a
  // snapshot taken under it exclusively has a record below `dedup_lsn`.
  std::string dedup;
  uint64_t dedup_lsn;
  {
    absl::WriterMutexLock lock(&apply_mu_);
    dedup_lsn = log_->next_lsn();
    dedup = dedup_->Serialize();
  }
  RETURN_IF_ERROR(log_->WaitWritten(dedup_lsn));
  // During a lazy replay the recovered records are the only copy of the updates of rows
  // not loaded yet: the log stays whole until ApplyPending has stored those rows.
  if (pending() == nullptr) {
    RETURN_IF_ERROR(db_->TruncateLog(cut, dedup, options_.log.durability != Durability::kProcess));
    log_->Truncated(cut);
  }
  if (options_.memory_budget_bytes > 0) EvictToBudget();
  const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  if (ms > 1000) {
    LOG(INFO) << "materialized " << rows << " rows in " << ms << " ms; log truncated below " << cut;
  } else {
    VLOG(1) << "materialized " << rows << " rows in " << ms << " ms; log truncated below " << cut;
  }
  absl::MutexLock lock(&mu_);
  stats_.materialize_rounds++;
  stats_.materialized_rows += rows;
  stats_.last_materialize_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  return absl::OkStatus();
}

void PodStorage::EvictToBudget() {
  std::vector<std::pair<uint32_t, std::shared_ptr<EmbeddingTable>>> tables;
  {
    absl::MutexLock lock(&mu_);
    for (auto& t : store_->Tables()) {
      auto it = table_numbers_.find(t->spec().name());
      if (it != table_numbers_.end()) tables.emplace_back(it->second, std::move(t));
    }
  }
  uint64_t total = 0;
  for (auto& [no, t] : tables) total += t->rows() * t->row_bytes();
  if (total <= options_.memory_budget_bytes) return;
  // Down to 90% of the budget, each table in proportion to its share, so rows touched
  // before the next round fit. Pushes (which load rows, then update them) wait meanwhile.
  const double keep = 0.9 * static_cast<double>(options_.memory_budget_bytes) / total;
  uint64_t evicted = 0;
  {
    absl::WriterMutexLock lock(&apply_mu_);
    for (auto& [no, t] : tables) {
      AttachSource(no, *t);
      evicted += t->Evict(static_cast<uint64_t>(keep * t->rows()));
    }
  }
  VLOG(1) << "evicted " << evicted << " rows: resident row bytes were " << total << ", budget "
          << options_.memory_budget_bytes;
  absl::MutexLock lock(&mu_);
  stats_.evicted_rows += evicted;
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

bool PodStorage::ApplyPending(const Pending& pending) {
  const absl::Time start = absl::Now();
  uint64_t rows = 0;
  absl::Status status;
  for (const auto& [no, pt] : pending.tables) {
    const std::vector<int64_t> ids = pt->Ids();
    EmbeddingTable& table = *pt->table;
    const uint32_t dim = table.dim(), slots = table.slot_floats();
    for (size_t i = 0; i < ids.size() && status.ok(); i += 65536) {
      {
        absl::MutexLock lock(&mu_);
        if (stop_) return false;
      }
      const auto chunk =
          absl::MakeConstSpan(ids).subspan(i, std::min<size_t>(65536, ids.size() - i));
      // Resident afterwards, with the log's updates applied (StoredRowSource), but not
      // dirty: store them here, as a materialization round would.
      status = table.Load(chunk);
      if (!status.ok()) break;
      absl::MutexLock round(&materialize_mu_);
      RowFile file;
      for (int64_t id : chunk) {
        table.Inspect(id, [&, no = no](const RowView& r) {
          file.AddRow(no, r.id, r.step, absl::MakeConstSpan(r.weights, dim),
                      absl::MakeConstSpan(r.slots, slots));
        });
      }
      // As in a round: the rows may hold newer pushes, whose records must be written first.
      status = log_->WaitWritten(BarrierLsn());
      if (status.ok()) status = db_->IngestRows(&file);
      rows += chunk.size();
    }
  }
  if (!status.ok()) {
    // The log stays whole (pending_ stays): a restart replays it again.
    LOG(ERROR) << "applying the recovered log to its rows failed: " << status;
    return false;
  }
  {
    absl::MutexLock lock(&mu_);
    pending_ = nullptr;  // the next round truncates the log
  }
  log_->SetMaxLogBytes(options_.log.max_log_bytes);
  LOG(INFO) << "applied the recovered log to its " << rows
            << " rows and stored them in the background in "
            << absl::ToDoubleSeconds(absl::Now() - start) << " s";
  return true;
}

void PodStorage::LoadInBackground() {
  if (std::shared_ptr<const Pending> pending = this->pending(); pending != nullptr) {
    if (!ApplyPending(*pending)) return;
  }
  const absl::Time start = absl::Now();
  absl::flat_hash_map<uint32_t, std::shared_ptr<EmbeddingTable>> by_number;
  {
    absl::MutexLock lock(&mu_);
    for (auto& t : store_->Tables()) {
      auto it = table_numbers_.find(t->spec().name());
      if (it != table_numbers_.end()) by_number[it->second] = std::move(t);
    }
  }
  uint64_t loaded = 0, rows = 0;
  absl::Status s = db_->ForEachRow(
      [&](const StoredRow& row) -> absl::Status {
        if ((++rows & 4095) == 0) {
          absl::MutexLock lock(&mu_);
          if (stop_) return absl::CancelledError("closing");
        }
        auto it = by_number.find(row.table_no);
        if (it == by_number.end()) return absl::OkStatus();  // recovery checked the catalog
        EmbeddingTable& t = *it->second;
        if (row.values.size() != t.dim() + t.slot_floats()) {
          return absl::DataLossError(absl::StrCat("stored row ", row.id, " of '", t.spec().name(),
                                                  "' has ", row.values.size(), " floats"));
        }
        loaded += t.RestoreIfAbsent(row.id, row.values.data(), row.step);
        return absl::OkStatus();
      },
      [](absl::string_view, uint64_t, absl::Span<const float>) { return absl::OkStatus(); });
  if (!s.ok()) {
    // The sources stay attached: missing rows keep being read from the database.
    if (!absl::IsCancelled(s)) LOG(ERROR) << "background loading of stored rows failed: " << s;
    return;
  }
  // Every stored row is resident now: the tables go back to their in-memory path.
  for (auto& [no, t] : by_number) t->SetRowSource(nullptr);
  loaded_ = true;
  LOG(INFO) << "loaded " << loaded << " of " << rows << " stored rows in the background in "
            << absl::ToDoubleSeconds(absl::Now() - start) << " s";
}

void PodStorage::RunMaterializer() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_),
                               absl::Milliseconds(options_.materialize_ms))) {
        return;
      }
    }
    absl::Status s = Materialize();
    if (!s.ok()) {
      LOG_EVERY_N(ERROR, 10) << "materialization failed (will retry): " << s;
    }
  }
}

absl::Status PodStorage::Checkpoint(const std::string& dir) {
  // Rows live in memtables without the WAL until flushed: materialize first, so the
  // checkpoint's log (which the copy keeps) and rows together hold every update.
  absl::MutexLock round(&materialize_mu_);
  RETURN_IF_ERROR(MaterializeLocked());
  return db_->Checkpoint(dir);
}

absl::Status PodStorage::WriteImported(const std::string& table, absl::Span<const int64_t> ids,
                                       absl::Span<const uint64_t> steps,
                                       absl::Span<const float> values, uint32_t dim) {
  uint32_t no;
  {
    absl::MutexLock lock(&mu_);
    auto it = table_numbers_.find(table);
    if (it == table_numbers_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("imported rows of table '", table, "', which is not stored here"));
    }
    no = it->second;
  }
  const size_t row_floats = ids.empty() ? 0 : values.size() / ids.size();
  RowBatch batch = db_->NewRowBatch();
  for (size_t i = 0; i < ids.size(); ++i) {
    const float* row = values.data() + i * row_floats;
    batch.AddRow(no, ids[i], steps[i], absl::MakeConstSpan(row, dim),
                 absl::MakeConstSpan(row + dim, row_floats - dim));
  }
  return db_->WriteRowsLogged(&batch);
}

absl::Status PodStorage::WriteImportedDense(const std::string& name, uint64_t step,
                                            absl::Span<const float> values) {
  RowBatch batch = db_->NewRowBatch();
  batch.AddDense(name, step, values);
  return db_->WriteRowsLogged(&batch);
}

absl::Status PodStorage::FlushImported() {
  // Imported rows went through the WAL: written survives a process crash; fsync for
  // the modes that promise more.
  if (options_.log.durability == Durability::kProcess) return absl::OkStatus();
  return db_->SyncWal();
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

absl::Status PodStorage::WaitApplied() { return log_->WaitWritten(BarrierLsn()); }

PodStorage::Stats PodStorage::stats() {
  const uint64_t disk = db_->disk_bytes();
  absl::MutexLock lock(&mu_);
  Stats s = stats_;
  s.disk_bytes = disk;
  return s;
}

}  // namespace ps
