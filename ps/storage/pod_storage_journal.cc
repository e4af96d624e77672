// PodStorage and the change journal (change_journal.h): the deletions a round must name.
// A round names the rows it writes as it gathers them (pod_storage_materialize.cc); a
// deletion is named from its log record instead, since a row deleted and created again
// before the round is gathered as a row only, and an incremental export must still list
// the deletion (an import deletes, then installs the new row at its lower step).
#include "absl/strings/str_cat.h"
#include "ps/storage/pod_storage.h"

namespace ps {

void PodStorage::NoteLoggedDeletes(const LogRecordView& rec) {
  if (rec.deletes.empty()) return;
  std::vector<std::pair<uint32_t, int64_t>> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const LogDeleteView& e : rec.deletes) {
      auto it = table_numbers_.find(std::string(e.table));
      if (it == table_numbers_.end()) continue;  // recovery refuses such a record anyway
      for (size_t i = 0; i < e.n; ++i) ids.emplace_back(it->second, e.id(i));
    }
  }
  absl::MutexLock lock(&deletes_mu_);
  logged_deletes_.insert(logged_deletes_.end(), ids.begin(), ids.end());
}

void PodStorage::JournalLoggedDeletes() {
  std::vector<std::pair<uint32_t, int64_t>> ids;
  {
    // A deleting change keeps its deletions under the apply lock (held exclusively).
    absl::ReaderMutexLock apply(&apply_mu_);
    absl::MutexLock lock(&deletes_mu_);
    ids.swap(logged_deletes_);
  }
  for (const auto& [no, id] : ids) journal_->Note(no, id, ChangeKind::kDelete);
}

std::vector<std::pair<uint32_t, int64_t>> PodStorage::LoggedDeletes() {
  absl::MutexLock lock(&deletes_mu_);
  return logged_deletes_;
}

}  // namespace ps
