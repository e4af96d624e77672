// PsCore: the feature lifecycle (issue 17): rows deleted through the one change path
// (DeleteRows: a delta import's deletions; eviction) and feature eviction (EvictOnce, run
// by the eviction thread). docs/architecture.md, "Feature lifecycle", says why it is exact.
#include <glog/logging.h>

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/base/status_macros.h"
#include "common/routing/hash.h"
#include "ps/ps_core.h"

namespace ps {

absl::Status PsCore::DeleteRows(const std::string& table, absl::Span<const int64_t> ids,
                                uint64_t* deleted) {
  return DeleteRowsIf(table, ids, UINT32_MAX, deleted);
}

absl::Status PsCore::DeleteRowsIf(const std::string& table, absl::Span<const int64_t> ids,
                                  uint32_t updated_before, uint64_t* deleted) {
  if (deleted != nullptr) *deleted = 0;
  if (ids.empty()) return absl::OkStatus();
  absl::Notification finished;
  absl::Status result;
  uint64_t removed = 0;
  {
    // Held from the ownership check until applied: see migrate_mu_.
    absl::ReaderMutexLock fence(&migrate_mu_);
    std::shared_ptr<EmbeddingTable> t = store_.FindTable(table);
    if (t == nullptr)
      return absl::NotFoundError(absl::StrCat("table '", table, "' does not exist"));
    RETURN_IF_ERROR(CheckOwned(*ownership(), *t, ids));
    // A move copies rows, not deletions: a deletion waits until no move runs (the next
    // eviction pass, or the importer's retry, deletes the rows then).
    if (outgoing_ != nullptr) {
      return absl::UnavailableError(
          "a vshard move is in progress on this pod: rows are deleted after it; retry");
    }
    Change change;
    change.rows.emplace_back(t, ids);
    change.exclusive = true;
    change.ship = true;
    change.record_bytes = 1 + 2 + table.size() + 4 + ids.size() * sizeof(int64_t);
    std::vector<int64_t> stale;
    auto apply = [&](LogRecordBuilder* record) -> absl::Status {
      if (updated_before == UINT32_MAX) {
        removed = t->Delete(ids);
        if (record != nullptr) record->AddDelete(table, ids);
      } else {
        t->DeleteStale(ids, updated_before, &stale);
        removed = stale.size();
        if (record != nullptr && !stale.empty()) record->AddDelete(table, stale);
      }
      return absl::OkStatus();
    };
    ApplyChange(change, apply, [&](absl::Status s) {
      result = s;
      finished.Notify();
    });
  }
  finished.WaitForNotification();
  if (result.ok() && deleted != nullptr) *deleted = removed;
  return result;
}

uint64_t PsCore::EvictOnce() {
  absl::MutexLock pass(&evict_pass_mu_);
  uint64_t total = 0;
  for (const auto& t : store_.Tables()) {
    const EvictionSpec& spec = t->spec().eviction();
    if (spec.ttl_seconds() == 0 && spec.max_rows() == 0) continue;
    auto own = ownership();
    const uint32_t n = own->num_vshards();
    const uint64_t h = t->name_hash();
    const uint32_t now = t->now_stamp();
    // Rows whose stamp is below this were not updated for ttl_seconds.
    const uint32_t expired_before = spec.ttl_seconds() > 0 && now > spec.ttl_seconds()
                                        ? static_cast<uint32_t>(now - spec.ttl_seconds())
                                        : 0;
    struct Candidate {
      uint64_t key;  // LFU: updates; LRU: last update
      uint32_t updated;
      int64_t id;
    };
    std::vector<int64_t> expired;
    std::vector<Candidate> kept;
    t->ForEachRow([&](const RowView& r) {
      if (!own->Owns(VShardOf(RouteHash(h, r.id), n))) return;  // its owner decides
      if (r.updated < expired_before) {
        expired.push_back(r.id);
      } else if (spec.max_rows() > 0) {
        kept.push_back({spec.policy() == EvictionSpec::LRU ? r.updated : r.step, r.updated, r.id});
      }
    });
    std::vector<int64_t> over;
    if (spec.max_rows() > 0) {
      const uint64_t share = (spec.max_rows() * own->owned_count() + n - 1) / n;
      if (kept.size() > share) {
        const size_t excess = kept.size() - share;
        auto before = [](const Candidate& a, const Candidate& b) {
          return std::tie(a.key, a.updated, a.id) < std::tie(b.key, b.updated, b.id);
        };
        std::nth_element(kept.begin(), kept.begin() + excess, kept.end(), before);
        for (size_t i = 0; i < excess; ++i) over.push_back(kept[i].id);
      }
    }
    // TTL victims must still be expired; cap victims must not have been updated after
    // this second (when they were chosen).
    uint64_t evicted = 0;
    absl::Status status;
    for (const auto& [ids, updated_before] :
         {std::make_pair(&expired, expired_before), std::make_pair(&over, now + 1)}) {
      for (size_t i = 0; i < ids->size() && status.ok(); i += options_.eviction_batch_rows) {
        const size_t k = std::min(options_.eviction_batch_rows, ids->size() - i);
        uint64_t deleted = 0;
        status = DeleteRowsIf(t->spec().name(), absl::MakeConstSpan(*ids).subspan(i, k),
                              updated_before, &deleted);
        evicted += deleted;
      }
    }
    t->CountEvicted(evicted);
    total += evicted;
    if (!status.ok()) {
      LOG_EVERY_N(WARNING, 100) << "eviction of '" << t->spec().name()
                                << "' stopped for this pass: " << status;
    }
    if (evicted > 0) {
      VLOG(1) << "evicted " << evicted << " rows of '" << t->spec().name() << "' ("
              << expired.size() << " past ttl " << spec.ttl_seconds() << " s, " << over.size()
              << " over the share of max_rows " << spec.max_rows() << ")";
    }
  }
  return total;
}

void PsCore::RunEviction() {
  for (;;) {
    {
      absl::MutexLock lock(&evict_mu_);
      if (evict_mu_.AwaitWithTimeout(absl::Condition(&stop_eviction_),
                                     absl::Milliseconds(options_.eviction_interval_ms))) {
        return;
      }
    }
    EvictOnce();
  }
}

}  // namespace ps
