// PodStorage: the materializer (changed rows written to the rows column family, then the
// log truncated below them) and, under a memory budget, eviction after each round.
#include <glog/logging.h>

#include <algorithm>

#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "ps/storage/pod_storage.h"

namespace ps {

std::vector<std::pair<uint32_t, std::shared_ptr<EmbeddingTable>>> PodStorage::NumberedTables() {
  std::vector<std::pair<uint32_t, std::shared_ptr<EmbeddingTable>>> tables;
  absl::MutexLock lock(&mu_);
  for (auto& t : store_->Tables()) {
    auto it = table_numbers_.find(t->spec().name());
    if (it != table_numbers_.end()) tables.emplace_back(it->second, std::move(t));
  }
  return tables;
}

void PodStorage::SetReplicated(bool replicated) { replicated_.store(replicated); }

bool PodStorage::WaitForRound(uint64_t live_after) {
  const absl::Time start = absl::Now();
  for (;;) {
    // Read each slice: SetReplicated may change it meanwhile. A memory budget keeps the
    // plain interval: its rounds are what evicts.
    const int ms = replicated_.load() && options_.replicated_materialize_ms > 0 &&
                           options_.memory_budget_bytes == 0
                       ? options_.replicated_materialize_ms
                       : options_.materialize_ms;
    const absl::Time due = start + absl::Milliseconds(ms);
    const absl::Time now = absl::Now();
    // Pushes wait once the log passes its bound: start a round at half of it. Measured
    // from what the last round left, so a round that could not truncate (a follower not
    // holding the records yet, a lazy replay) is not repeated back to back.
    const uint64_t bound = log_->max_log_bytes();
    const bool due_now = now >= due || (bound > 0 && log_->live_bytes() >= live_after + bound / 2);
    absl::MutexLock lock(&mu_);
    if (due_now) return stop_;
    if (mu_.AwaitWithTimeout(absl::Condition(&stop_),
                             std::min(due - now, absl::Milliseconds(100)))) {
      return true;
    }
  }
}

void PodStorage::RunMaterializer() {
  uint64_t live_after = 0;
  while (!WaitForRound(live_after)) {
    absl::Status s = Materialize();
    if (!s.ok()) {
      LOG_EVERY_N(ERROR, 10) << "materialization failed (will retry): " << s;
    }
    live_after = log_->live_bytes();
  }
}

absl::Status PodStorage::Materialize() {
  absl::MutexLock round(&materialize_mu_);
  return MaterializeLocked();
}

absl::Status PodStorage::MaterializeLocked() {
  const absl::Time start = absl::Now();
  // Every update of a record below `cut` is in memory and its key is marked applied;
  // `admission` holds exactly the counts of the records below it.
  std::vector<std::pair<uint32_t, std::string>> admission;
  const uint64_t cut = CutWithAdmission(&admission);
  RETURN_IF_ERROR(log_->WaitWritten(cut));

  RowFile file;
  file.Reserve(options_.materialize_group_bytes + (size_t{1} << 20));
  absl::Status status;
  // Before a group of rows is written, the log records of every update in it must be
  // written (else a crash could keep the update in a row while its key is forgotten).
  auto write_group = [&] {
    if (!status.ok() || file.count() == 0) return;
    status = log_->WaitWritten(BarrierLsn());
    // The journal names the group's ids before they are written (change_journal.h).
    if (status.ok()) status = journal_->Commit();
    if (status.ok()) status = db_->IngestRows(&file);
    file.Clear();
  };
  size_t rows = 0;
  // Deleted rows (EmbeddingTable::Delete) and dense tensors (few, small) go through the
  // memtable, flushed below. A round never both writes and deletes one row, and rounds
  // are sequential, so the order of the two writes does not matter.
  RowBatch batch = db_->NewRowBatch();
  uint64_t deleted = 0;
  for (auto& [no, table] : NumberedTables()) {
    const uint32_t dim = table->dim();
    const uint32_t slots = table->slot_floats();
    rows += table->CollectDirty(
        [&, no = no](const RowView& r) {
          file.AddRow(no, r.id, r.step, absl::MakeConstSpan(r.weights, dim),
                      absl::MakeConstSpan(r.slots, slots));
          journal_->Note(no, r.id, ChangeKind::kWrite);
        },
        [&] {
          if (file.bytes() >= options_.materialize_group_bytes) write_group();
        },
        [&, no = no](int64_t id) {
          batch.DeleteRow(no, id);
          ++deleted;
        });
  }
  write_group();
  std::vector<float> values;
  for (auto& d : store_->DenseTensors()) {
    uint64_t step;
    if (d->Snapshot(/*always=*/false, &values, &step)) {
      batch.AddDense(d->spec().name(), step, values);
    }
  }
  // The journal names every deletion so far before any is written (change_journal.h).
  JournalLoggedDeletes();
  if (status.ok()) status = journal_->Commit();
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
  // It is read after the truncation gate: every key of a record below `cut` must be in it
  // (the rows written above hold their updates, the truncation drops their records), and
  // a replicated primary marks a key applied only once its followers hold the record,
  // which the gate waits for (Replicator::WaitHeld). Read before the gate, it lacked the
  // keys the gate waited for; a crash then left their updates in the rows with their keys
  // forgotten, and a retry applied the push twice (ps_core_truncation_keys_test).
  // During a lazy replay the recovered records are the only copy of the updates of rows
  // not loaded yet: the log stays whole until ApplyPending has stored those rows.
  if (pending() == nullptr && MayTruncate()) {
    std::string dedup;
    uint64_t dedup_lsn;
    {
      absl::WriterMutexLock lock(&apply_mu_);
      dedup_lsn = log_->next_lsn();
      dedup = dedup_->Serialize();
    }
    RETURN_IF_ERROR(log_->WaitWritten(dedup_lsn));
    RETURN_IF_ERROR(
        db_->TruncateLog(cut, dedup, options_.log.durability != Durability::kProcess, admission));
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
  stats_.deleted_rows += deleted;
  stats_.last_materialize_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  return absl::OkStatus();
}

uint64_t PodStorage::CutWithAdmission(std::vector<std::pair<uint32_t, std::string>>* admission) {
  std::vector<std::pair<uint32_t, std::shared_ptr<EmbeddingTable>>> tables;
  for (auto& [no, t] : NumberedTables()) {
    if (t->admission() != nullptr) tables.emplace_back(no, std::move(t));
  }
  absl::WriterMutexLock lock(&apply_mu_);
  if (!tables.empty()) {
    LogRecordBuilder decays(PushKey(), 0);
    for (const auto& [no, t] : tables) {
      const std::vector<uint32_t> due = t->admission()->DueForDecay();
      if (due.empty()) continue;
      t->admission()->Decay(due);
      decays.AddDecay(t->spec().name(), due);
    }
    // Appended under the exclusive hold: ordered against every count (log_record.h).
    if (decays.has_entries()) {
      log_->Append(decays.Finish(), [](absl::Status s) {
        if (!s.ok()) LOG(WARNING) << "admission decay record not written: " << s;
      });
    }
    for (const auto& [no, t] : tables) admission->emplace_back(no, t->admission()->Serialize());
  }
  return log_->next_lsn();
}

void PodStorage::EvictToBudget() {
  const auto tables = NumberedTables();
  uint64_t total = 0;
  for (auto& [no, t] : tables) total += t->rows() * t->row_bytes();
  if (total <= options_.memory_budget_bytes) return;
  // Down to 90% of the budget, each table in proportion to its share, so rows touched
  // before the next round fit. Changes (which load rows, then update them) wait meanwhile.
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

}  // namespace ps
