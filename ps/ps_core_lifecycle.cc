// PsCore: the feature lifecycle (issue 17): rows deleted through the one change path
// (DeleteRows: a delta import's deletions; eviction) and feature eviction (EvictOnce, run
// by the eviction thread). docs/architecture.md, "Feature lifecycle", says why it is exact.
#include <glog/logging.h>

#include <algorithm>

#include "absl/container/flat_hash_map.h"
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
    ApplyDelete(t, ids, updated_before, /*ship=*/true, &removed, [&](absl::Status s) {
      result = s;
      finished.Notify();
    });
  }
  finished.WaitForNotification();
  if (result.ok() && deleted != nullptr) *deleted = removed;
  return result;
}

void PsCore::ApplyDelete(const std::shared_ptr<EmbeddingTable>& t, absl::Span<const int64_t> ids,
                         uint32_t updated_before, bool ship, uint64_t* removed, Done done) {
  // A vshard move running on this pod copies the deletion too: its ids are recorded for
  // the move before they are deleted (and as touched after), so the move's next phase
  // sends their deletion before any later state of those rows (ps_core_migrate.cc).
  // Fenced vshards refuse it as they refuse a push (UNAVAILABLE: the next eviction pass,
  // or the importer's retry, deletes the rows then).
  OutgoingMove* out = outgoing_.get();
  const std::string& table = t->spec().name();
  Change change;
  change.rows.emplace_back(t, ids);
  change.exclusive = true;
  change.ship = ship;
  change.record_bytes = 1 + 2 + table.size() + 4 + ids.size() * sizeof(int64_t);
  std::vector<int64_t> stale;
  auto apply = [&](LogRecordBuilder* record) -> absl::Status {
    if (out != nullptr) RecordDeleted(out, t, ids);
    uint64_t n = 0;
    if (updated_before == UINT32_MAX) {
      n = t->Delete(ids);
      if (record != nullptr) record->AddDelete(table, ids);
    } else {
      t->DeleteStale(ids, updated_before, &stale);
      n = stale.size();
      if (record != nullptr && !stale.empty()) record->AddDelete(table, stale);
    }
    if (removed != nullptr) *removed = n;
    return absl::OkStatus();
  };
  ApplyChange(change, apply, std::move(done));
}

namespace {

// A table's share of its max_rows on this pod: max_rows x owned vshards / vshards, rounded
// up (0: no cap).
uint64_t CapShare(const EvictionSpec& spec, const ShardOwnership& own) {
  const uint32_t n = own.num_vshards();
  return (spec.max_rows() * own.owned_count() + n - 1) / n;
}

// A pass over a table past its share evicts down to share - share / kCapHeadroom, so
// that under a stream of new ids passes (two scans of every row) are not back to back:
// with 1M rows, 31k new rows before the next one.
constexpr uint64_t kCapHeadroom = 32;

}  // namespace

uint64_t PsCore::EvictOnce() {
  absl::MutexLock pass(&evict_pass_mu_);
  uint64_t total = 0;
  for (const auto& t : store_.Tables()) total += EvictTable(*t);
  return total;
}

uint64_t PsCore::EvictTable(EmbeddingTable& table) {
  EmbeddingTable* t = &table;
  const absl::Time start = absl::Now();
  const EvictionSpec& spec = t->spec().eviction();
  if (spec.ttl_seconds() == 0 && spec.max_rows() == 0) return 0;
  auto own = ownership();
  const uint32_t n = own->num_vshards();
  const uint64_t h = t->name_hash();
  const uint32_t now = t->now_stamp();
  // Rows whose stamp is below this were not updated for ttl_seconds.
  const uint32_t expired_before = spec.ttl_seconds() > 0 && now > spec.ttl_seconds()
                                      ? static_cast<uint32_t>(now - spec.ttl_seconds())
                                      : 0;
  // Pass 1: the expired rows, and a histogram of the others' eviction keys, lower
  // buckets evicted first (LFU: the update count; LRU: the age in seconds, oldest
  // first; both capped at 4095), so choosing the cap's victims needs no array of every
  // row (that array, 24 bytes a row, was a third of the memory over the cap).
  constexpr uint32_t kBuckets = 4096;
  const bool lru = spec.policy() == EvictionSpec::LRU;
  auto bucket = [&](const RowView& r) -> uint32_t {
    if (lru) {
      const uint64_t age = now > r.updated ? now - r.updated : 0;  // seconds
      return (kBuckets - 1) - static_cast<uint32_t>(std::min<uint64_t>(age, kBuckets - 1));
    }
    return static_cast<uint32_t>(std::min<uint64_t>(r.step, kBuckets - 1));
  };
  std::vector<int64_t> expired;
  std::vector<uint64_t> histogram(kBuckets, 0);
  uint64_t kept = 0;
  t->ForEachRow([&](const RowView& r) {
    if (!own->Owns(VShardOf(RouteHash(h, r.id), n))) return;  // its owner decides
    if (r.updated < expired_before) {
      expired.push_back(r.id);
    } else if (spec.max_rows() > 0) {
      ++histogram[bucket(r)];
      ++kept;
    }
  });
  // Pass 2 (over the cap): every row of the buckets below the threshold bucket, and of
  // that bucket an even share spread over the whole scan, until the excess is reached.
  // Not its first rows met: the scan goes stripe by stripe, so those would empty the
  // first stripes while new rows keep filling all of them, and a stripe keeps the
  // memory of its peak rows (its free slots are reused by its own new rows only): the
  // row arena grew to 1.8x the rows at the cap in lifecycle-bench.
  std::vector<int64_t> over;
  if (spec.max_rows() > 0) {
    const uint64_t share = CapShare(spec, *own);
    if (kept > share) {
      const uint64_t excess = kept - (share - share / kCapHeadroom);
      uint32_t threshold = 0;
      uint64_t below = 0;
      while (threshold < kBuckets - 1 && below + histogram[threshold] < excess) {
        below += histogram[threshold++];
      }
      const uint64_t at_threshold = excess - below;  // of histogram[threshold] rows
      const uint64_t in_threshold = std::max<uint64_t>(histogram[threshold], 1);
      uint64_t met = 0, taken = 0;  // rows of the threshold bucket met, taken
      over.reserve(excess);
      t->ForEachRow([&](const RowView& r) {
        if (over.size() >= excess || r.updated < expired_before) return;
        if (!own->Owns(VShardOf(RouteHash(h, r.id), n))) return;
        const uint32_t b = bucket(r);
        if (b < threshold) {
          over.push_back(r.id);
        } else if (b == threshold && taken < at_threshold) {
          // The met-th row of the bucket is taken when the share due by it grows.
          if ((met + 1) * at_threshold / in_threshold > met * at_threshold / in_threshold) {
            over.push_back(r.id);
            ++taken;
          }
          ++met;
        }
      });
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
  if (!status.ok()) {
    LOG_EVERY_N(WARNING, 100) << "eviction of '" << t->spec().name()
                              << "' stopped for this pass: " << status;
  }
  if (evicted > 0) {
    VLOG(1) << "evicted " << evicted << " rows of '" << t->spec().name() << "' (" << expired.size()
            << " past ttl " << spec.ttl_seconds() << " s, " << over.size()
            << " over the share of max_rows " << spec.max_rows() << ") in "
            << absl::ToDoubleMilliseconds(absl::Now() - start) << " ms";
  }
  return evicted;
}

void PsCore::RunEviction() {
  // Every eviction_interval_ms a pass over every table (TTL and cap). In between, every
  // kCapCheck, each table's row count (one atomic load) against its share: a table past it
  // by share / kCapSlack gets a pass at once, so a fast stream of new ids cannot outrun
  // the interval (the rows, and the arena that keeps each stripe's peak, stay near the
  // cap: in lifecycle-bench peak rows went from 1.42M to 1.02M for max_rows 1M). A pass
  // leaves the rows it may not evict (vshards this pod follows or receives, rows updated
  // this second): the next check waits until the table grows past that by the slack.
  constexpr absl::Duration kCapCheck = absl::Milliseconds(10);
  constexpr uint64_t kCapSlack = 256;
  const absl::Duration interval = absl::Milliseconds(options_.eviction_interval_ms);
  absl::Time next_full = absl::Now() + interval;
  absl::flat_hash_map<const EmbeddingTable*, uint64_t> floor;  // rows after the last pass
  for (;;) {
    {
      absl::MutexLock lock(&evict_mu_);
      if (evict_mu_.AwaitWithTimeout(absl::Condition(&stop_eviction_),
                                     std::min(kCapCheck, next_full - absl::Now()))) {
        return;
      }
    }
    const bool full = absl::Now() >= next_full;
    if (full) next_full = absl::Now() + interval;
    auto own = ownership();
    absl::flat_hash_map<const EmbeddingTable*, uint64_t> next_floor;
    absl::MutexLock pass(&evict_pass_mu_);
    for (const auto& t : store_.Tables()) {
      const EvictionSpec& spec = t->spec().eviction();
      if (spec.ttl_seconds() == 0 && spec.max_rows() == 0) continue;
      const uint64_t share = CapShare(spec, *own);
      auto it = floor.find(t.get());
      const uint64_t base = std::max(share, it == floor.end() ? 0 : it->second);
      if (full || (spec.max_rows() > 0 && t->rows() > base + share / kCapSlack)) {
        EvictTable(*t);
        next_floor[t.get()] = t->rows();
      } else if (it != floor.end()) {
        next_floor[t.get()] = it->second;
      }
    }
    floor = std::move(next_floor);  // forgets dropped tables
  }
}

}  // namespace ps
