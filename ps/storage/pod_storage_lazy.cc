// PodStorage: rows that are not in memory (evicted under a memory budget, or not loaded
// yet after a lazy start) are read back from the rows column family, with the recovered
// log's updates applied during a lazy replay; the background load of a lazy start.
#include <glog/logging.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "embedding/row_source.h"
#include "ps/storage/pod_storage.h"
#include "ps/storage/pod_storage_pending.h"

namespace ps {

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
          journal_->Note(no, r.id, ChangeKind::kWrite);
        });
      }
      // As in a round: the rows may hold newer pushes, whose records must be written first.
      status = log_->WaitWritten(BarrierLsn());
      if (status.ok()) status = journal_->Commit();  // before the rows (change_journal.h)
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
  for (auto& [no, t] : NumberedTables()) by_number[no] = std::move(t);
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

}  // namespace ps
