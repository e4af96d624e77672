#include "embedding/embedding_table.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "absl/base/attributes.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/spin_lock.h"
#include "common/base/status_macros.h"
#include "common/routing/hash.h"
#include "embedding/block_arena.h"
#include "embedding/row_index.h"
#include "embedding/row_rules.h"
#include "embedding/row_source.h"
#include "embedding/spec.h"

namespace ps {
namespace {

// Row storage is a list of fixed-size blocks per stripe: growing never moves a row, and a
// block is at most kBlockBytes so small tables stay small. A block holds rows_per_block
// rows, then their ids (int64 each) unless each row keeps its id in its own padding,
// then, for a table with eviction, their last-update stamps (uint32 each): the per-slot
// data grows with the rows, a block at a time, where vectors of their own would double
// (up to 2x their 12 bytes a row).
constexpr size_t kBlockBytes = 16 * 1024;

// Layout of one row, in floats: [weights dim][slots k*dim][step: 2 floats][pad to 4],
// the row's id in the padding when it has 2 floats (it does for half the layouts, e.g.
// Adagrad of any even dim).
struct RowLayout {
  uint32_t dim;
  uint32_t slot_floats;
  uint32_t stride;  // floats per row, a multiple of 4 (16-byte aligned rows)
  bool id_in_row;

  RowLayout(uint32_t d, int slots)
      : dim(d),
        slot_floats(d * slots),
        stride(((d + d * slots + 2) + 3) / 4 * 4),
        id_in_row(stride - (d + d * slots + 2) >= 2) {}
  size_t step_offset() const { return dim + slot_floats; }
  size_t id_offset() const { return dim + slot_floats + 2; }  // if id_in_row
};

// Whether a table's rows keep a last-update stamp (eviction by TTL or row cap).
bool Stamped(const TableSpec& spec) {
  return spec.eviction().ttl_seconds() > 0 || spec.eviction().max_rows() > 0;
}

// Block bytes per row: the row, its id (unless in the row) and (stamped) its stamp.
size_t SlotBytes(const RowLayout& layout, bool stamped) {
  return layout.stride * sizeof(float) + (layout.id_in_row ? 0 : sizeof(int64_t)) +
         (stamped ? sizeof(uint32_t) : 0);
}

// Rows per block: of the counts whose block fits kBlockBytes (at least half as many as
// fit), the one that puts the most rows in a BlockArena chunk (blocks are 64-byte rounded
// and never straddle chunks). 110 rows of 148 bytes (the most that fit) leave 8 KiB of a
// 2 MiB chunk unused, 80 leave 1.4 KiB; 20 rows of 788 bytes leave 10 KiB, 19 leave 0.5.
size_t RowsPerBlock(size_t slot_bytes) {
  const size_t most = std::max<size_t>(1, kBlockBytes / slot_bytes);
  size_t best = most, best_rows = 0;
  for (size_t r = most; r >= 1 && r * 2 >= most; --r) {
    const size_t block = (r * slot_bytes + 63) / 64 * 64;
    const size_t rows = BlockArena::kChunkBytes / block * r;
    if (rows > best_rows) {
      best = r;
      best_rows = rows;
    }
  }
  return best;
}

class alignas(64) Stripe {
 public:
  SpinLock mu;
  RowIndex index ABSL_GUARDED_BY(mu);               // id -> slot; Prefetch needs no lock
  std::vector<float*> blocks ABSL_GUARDED_BY(mu);   // owned by the table's arena
  std::vector<uint64_t> dirty ABSL_GUARDED_BY(mu);  // bit per slot (with track_dirty)
  uint32_t used_slots ABSL_GUARDED_BY(mu) = 0;
  // A bit per slot holding a row, and the slots of evicted or erased rows for reuse.
  std::vector<uint64_t> live ABSL_GUARDED_BY(mu);
  std::vector<uint32_t> free_slots ABSL_GUARDED_BY(mu);
  // With evictable: a reference bit per slot (CLOCK) and the clock hand.
  std::vector<uint64_t> ref ABSL_GUARDED_BY(mu);
  uint32_t hand ABSL_GUARDED_BY(mu) = 0;
  // Ids Delete removed that CollectDirty has not reported yet (with track_dirty), and
  // those the previous CollectDirty reported: until the next one, the caller may not have
  // deleted them from its row source yet, so neither set is read back.
  absl::flat_hash_set<int64_t> deleted ABSL_GUARDED_BY(mu);
  absl::flat_hash_set<int64_t> reported ABSL_GUARDED_BY(mu);
};

inline bool TestBit(const std::vector<uint64_t>& v, uint32_t i) {
  return (v[i >> 6] >> (i & 63)) & 1;
}
inline void SetBit(std::vector<uint64_t>& v, uint32_t i) { v[i >> 6] |= uint64_t{1} << (i & 63); }
inline void ClearBit(std::vector<uint64_t>& v, uint32_t i) {
  v[i >> 6] &= ~(uint64_t{1} << (i & 63));
}

class EmbeddingTableImpl final : public EmbeddingTable {
 public:
  EmbeddingTableImpl(TableSpec spec, const TableOptions& options)
      : spec_(std::move(spec)),
        name_hash_(NameHash(spec_.name())),
        initializer_(spec_.initializer()),
        optimizer_(Optimizer::For(spec_)),
        layout_(spec_.dim(), optimizer_.slots()),
        rows_per_block_(RowsPerBlock(SlotBytes(layout_, Stamped(spec_)))),
        ids_offset_(rows_per_block_ * layout_.stride * sizeof(float)),
        stamps_offset_(ids_offset_ + (layout_.id_in_row ? 0 : rows_per_block_ * sizeof(int64_t))),
        block_bytes_(rows_per_block_ * SlotBytes(layout_, Stamped(spec_))),
        stripe_mask_(options.num_stripes - 1),
        track_dirty_(options.track_dirty),
        evictable_(options.evictable),
        stamped_(Stamped(spec_)),
        clock_(options.clock),
        base_seconds_(NowSeconds()),
        min_count_(spec_.admission().min_count()),
        admission_(min_count_ >= 2 ? std::make_unique<AdmissionSketch>(options.num_vshards)
                                   : nullptr),
        stripes_(options.num_stripes),
        index_bytes_(options.num_stripes * RowIndex::kMinCapacity * 16) {}

  const TableSpec& spec() const override { return spec_; }
  uint32_t dim() const override { return layout_.dim; }
  uint64_t name_hash() const override { return name_hash_; }
  uint32_t slot_floats() const override { return layout_.slot_floats; }

  // Both batch operations walk the ids in groups: a first pass looks each row up and
  // prefetches it, a second copies or updates it. The rows of a large table are almost
  // all cache misses; issuing a group's misses together overlaps them instead of paying
  // them one after another. The second pass looks the id up again under the lock (an L1
  // hit by then), so nothing is trusted across the two locks.
  void Pull(absl::Span<const int64_t> ids, float* out, bool read_only,
            absl::Status* error) override {
    read_only = read_only || admission_ != nullptr;  // only pushes create rows (admission)
    RowSource* source = source_.load(std::memory_order_acquire);
    if (source == nullptr) {
      // Every row is resident: a table that is not evictable pulls without locks for
      // the copies (PullOptimistic); an evictable one locks and marks each row read.
      if (evictable_) {
        PullResident(ids, out, read_only);
      } else {
        PullOptimistic(ids, out, read_only);
      }
      return;
    }
    const size_t row_bytes = layout_.dim * sizeof(float);
    // Rows may have been evicted: copy the resident ones, then read the others back.
    std::vector<uint32_t> missing;
    ForEachGroup(ids, /*for_write=*/false, [&](size_t i, Stripe& s, uint64_t h) {
      const uint32_t* slot = s.index.Find(ids[i], h);
      if (slot == nullptr) {
        missing.push_back(static_cast<uint32_t>(i));
        return;
      }
      std::memcpy(out + i * layout_.dim, RowAt(s, *slot), row_bytes);
      Touch(s, *slot);
    });
    if (missing.empty()) return;
    absl::Status st = LoadMissing(source, ids, missing, out, read_only);
    if (!st.ok() && error != nullptr) *error = st;
  }

  // The pull of a table whose rows are neither evicted nor touched (not evictable): one
  // lock per row instead of ForEachGroup's two. Per group of kGroup ids: pass 0
  // prefetches the index buckets without a lock; pass 1 locks, finds the row, notes its
  // address and the stripe lock's version, and prefetches it; pass 2 copies each row
  // WITHOUT the lock, as a seqlock reader (SpinLock): the copy counts only if no hold of
  // the stripe began since pass 1, neither before nor during the copy (any hold: a push,
  // a new row, an erase that could reuse the slot, or just another lookup, this pull's
  // own included when two of a group's ids share a stripe, ~3% of rows: those cost a
  // second locked read, nothing else). Otherwise, and for ids not found, pass 2 locks and
  // runs the locked path. A row's memory is never freed while the table lives, so the
  // address noted in pass 1 stays readable. Measured over 1M Adagrad rows of dim 64:
  // 104-114 -> 93-103 us per 1024-row pull, alternated batch by batch (docs/benchmarks.md).
  void PullOptimistic(absl::Span<const int64_t> ids, float* out, bool read_only) {
    const size_t row_bytes = layout_.dim * sizeof(float);
    Stripe* stripes[kGroup];
    uint64_t hashes[kGroup];
    const float* rows[kGroup];
    uint32_t versions[kGroup];
    for (size_t begin = 0; begin < ids.size(); begin += kGroup) {
      const size_t n = std::min(ids.size() - begin, kGroup);
      PrefetchBuckets(ids.subspan(begin, n), stripes, hashes);
      for (size_t k = 0; k < n; ++k) {
        Stripe& s = *stripes[k];
        SpinLockHolder lock(&s.mu);
        const uint32_t* slot = s.index.Find(ids[begin + k], hashes[k]);
        if (slot == nullptr) {
          rows[k] = nullptr;
          continue;
        }
        rows[k] = RowAt(s, *slot);
        versions[k] = s.mu.version_after_unlock();
        PrefetchRow(rows[k], row_bytes, /*for_write=*/false);
      }
      for (size_t k = 0; k < n; ++k) {
        const size_t i = begin + k;
        float* dst = out + i * layout_.dim;
        Stripe& s = *stripes[k];
        if (rows[k] != nullptr) {
          std::memcpy(dst, rows[k], row_bytes);
          if (s.mu.Unchanged(versions[k])) continue;
        }
        SpinLockHolder lock(&s.mu);
        PullLocked(s, ids[i], hashes[k], dst, read_only);
      }
    }
  }

  // The pull of an evictable table whose rows are all resident: every row read under its
  // lock (and marked referenced, for CLOCK).
  void PullResident(absl::Span<const int64_t> ids, float* out, bool read_only) {
    ForEachGroup(ids, /*for_write=*/false, [&](size_t i, Stripe& s, uint64_t h) {
      PullLocked(s, ids[i], h, out + i * layout_.dim, read_only);
    });
  }

  // One row of a pull, under its stripe's lock: copied if resident (and touched), else
  // its initial value (read_only) or a new row.
  void PullLocked(Stripe& s, int64_t id, uint64_t h, float* dst, bool read_only)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    const size_t row_bytes = layout_.dim * sizeof(float);
    const uint32_t* slot = s.index.Find(id, h);
    if (slot != nullptr) {
      std::memcpy(dst, RowAt(s, *slot), row_bytes);
      Touch(s, *slot);
    } else if (read_only) {
      initializer_.Fill(name_hash_, id, dst, layout_.dim);
    } else {
      std::memcpy(dst, CreateRow(s, id, h), row_bytes);
    }
  }

  void SetRowSource(RowSource* source) override {
    source_.store(source, std::memory_order_release);
  }

  absl::Status Load(absl::Span<const int64_t> ids) override {
    RowSource* source = source_.load(std::memory_order_acquire);
    if (source == nullptr) return absl::OkStatus();
    std::vector<uint32_t> missing;
    ForEachGroup(ids, /*for_write=*/false, [&](size_t i, Stripe& s, uint64_t h) {
      if (s.index.Find(ids[i], h) == nullptr) missing.push_back(static_cast<uint32_t>(i));
    });
    if (missing.empty()) return absl::OkStatus();
    return LoadMissing(source, ids, missing, /*out=*/nullptr, /*read_only=*/true);
  }

  size_t Erase(absl::Span<const int64_t> ids) override {
    size_t erased = 0;
    for (int64_t id : ids) {
      const uint64_t h = RouteHash(name_hash_, id);
      Stripe& s = StripeOf(h);
      SpinLockHolder lock(&s.mu);
      erased += EraseLocked(s, id, h);
    }
    return erased;
  }

  size_t Delete(absl::Span<const int64_t> ids) override {
    // A read-back in flight (LoadMissing) must not keep what it read before the deletion.
    evict_epoch_.fetch_add(1, std::memory_order_acq_rel);
    size_t erased = 0;
    for (int64_t id : ids) {
      const uint64_t h = RouteHash(name_hash_, id);
      Stripe& s = StripeOf(h);
      SpinLockHolder lock(&s.mu);
      if (track_dirty_) s.deleted.insert(id);
      erased += EraseLocked(s, id, h);
    }
    evict_epoch_.fetch_add(1, std::memory_order_acq_rel);
    return erased;
  }

  bool DeletePending(int64_t id) override {
    const uint64_t h = RouteHash(name_hash_, id);
    Stripe& s = StripeOf(h);
    SpinLockHolder lock(&s.mu);
    if (s.index.Find(id, h) != nullptr) return false;
    return s.deleted.contains(id) || s.reported.contains(id);
  }

  uint32_t now_stamp() const override {
    const int64_t d = NowSeconds() - base_seconds_;
    return static_cast<uint32_t>(std::clamp<int64_t>(d, 0, UINT32_MAX));
  }

  void DeleteStale(absl::Span<const int64_t> ids, uint32_t updated_before,
                   std::vector<int64_t>* deleted) override {
    evict_epoch_.fetch_add(1, std::memory_order_acq_rel);
    for (int64_t id : ids) {
      const uint64_t h = RouteHash(name_hash_, id);
      Stripe& s = StripeOf(h);
      SpinLockHolder lock(&s.mu);
      const uint32_t* slot = s.index.Find(id, h);
      if (slot == nullptr || (stamped_ && StampAt(s, *slot) >= updated_before)) continue;
      if (track_dirty_) s.deleted.insert(id);
      EraseLocked(s, id, h);
      deleted->push_back(id);
    }
    evict_epoch_.fetch_add(1, std::memory_order_acq_rel);
  }

  size_t Evict(uint64_t target_rows) override {
    if (!evictable_) return 0;
    const uint64_t resident = rows_.load(std::memory_order_relaxed);
    if (resident <= target_rows) return 0;
    evict_epoch_.fetch_add(1, std::memory_order_acq_rel);
    const uint64_t want = resident - target_rows;
    const uint64_t per_stripe = want / stripes_.size() + 1;
    size_t evicted = 0;
    // A few passes: the first may only clear reference bits.
    for (int pass = 0; pass < 3 && evicted < want; ++pass) {
      for (Stripe& s : stripes_) {
        if (evicted >= want) break;
        SpinLockHolder lock(&s.mu);
        evicted += EvictFromStripe(s, std::min<uint64_t>(per_stripe, want - evicted));
      }
    }
    evict_epoch_.fetch_add(1, std::memory_order_acq_rel);
    return evicted;
  }

  uint64_t row_bytes() const override { return layout_.stride * sizeof(float) + 24; }

  void Push(absl::Span<const int64_t> ids, const float* grads, float lr, uint64_t* steps) override {
    if (evictable_) {
      PushRows</*kTouch=*/true>(ids, grads, lr, steps);
    } else {
      PushRows</*kTouch=*/false>(ids, grads, lr, steps);
    }
  }

  template <bool kTouch>
  void PushRows(absl::Span<const int64_t> ids, const float* grads, float lr, uint64_t* steps) {
    const uint32_t now = stamped_ ? now_stamp() : 0;
    ForEachGroup(ids, /*for_write=*/true, [&](size_t i, Stripe& s, uint64_t h) {
      uint32_t slot;
      if (admission_ == nullptr) {
        slot = FindOrCreate(s, ids[i], h);
      } else if (const uint32_t* found = s.index.Find(ids[i], h); found != nullptr) {
        slot = *found;
      } else if (admission_->Add(h) >= min_count_) {
        admission_->CountAdmitted();
        slot = NewSlot(s, ids[i], h);
        InitRow(RowAt(s, slot), ids[i]);
      } else {
        admission_->CountDropped();
        if (steps != nullptr) steps[i] = 0;
        return;
      }
      if (kTouch) SetBit(s.ref, slot);
      float* row = RowAt(s, slot);
      uint64_t step = GetStep(row);
      optimizer_.Apply(lr, row, row + layout_.dim, &step, grads + i * layout_.dim, layout_.dim);
      SetStep(row, step);
      MarkDirty(s, slot);
      Stamp(s, slot, now);
      if (steps != nullptr) steps[i] = step;
    });
  }

  void Replay(int64_t id, const float* grad, float lr, uint64_t step) override {
    if (step == 0) return;  // a push admission counted and dropped: no row
    const uint64_t h = RouteHash(name_hash_, id);
    Stripe& s = StripeOf(h);
    SpinLockHolder lock(&s.mu);
    ReplayLocked(s, id, h, grad, lr, step, stamped_ ? now_stamp() : 0);
  }

  void ReplayRows(absl::Span<const int64_t> ids, const float* grads, float lr,
                  absl::Span<const uint64_t> steps) override {
    const uint32_t now = stamped_ ? now_stamp() : 0;
    ForEachGroup(ids, /*for_write=*/true, [&](size_t i, Stripe& s, uint64_t h) {
      if (steps[i] == 0) return;  // as Replay
      ReplayLocked(s, ids[i], h, grads + i * layout_.dim, lr, steps[i], now);
    });
  }

  // One logged update of row `id` (Replay), under its stripe's lock.
  void ReplayLocked(Stripe& s, int64_t id, uint64_t h, const float* grad, float lr, uint64_t step,
                    uint32_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    const uint32_t slot = FindOrCreate(s, id, h);
    float* row = RowAt(s, slot);
    uint64_t row_step = GetStep(row);
    if (!ReplayGradient(optimizer_, lr, grad, step, layout_.dim, row, row + layout_.dim,
                        &row_step)) {
      return;
    }
    SetStep(row, row_step);
    MarkDirty(s, slot);
    Stamp(s, slot, now);
  }

  void Restore(int64_t id, const float* weights, const float* slots, uint64_t step) override {
    const uint64_t h = RouteHash(name_hash_, id);
    Stripe& s = StripeOf(h);
    SpinLockHolder lock(&s.mu);
    float* row = RowAt(s, FindOrCreate(s, id, h));
    std::memcpy(row, weights, layout_.dim * sizeof(float));
    std::memcpy(row + layout_.dim, slots, layout_.slot_floats * sizeof(float));
    SetStep(row, step);
  }

  bool RestoreIfAbsent(int64_t id, const float* values, uint64_t step) override {
    const uint64_t h = RouteHash(name_hash_, id);
    Stripe& s = StripeOf(h);
    SpinLockHolder lock(&s.mu);
    if (s.index.Find(id, h) != nullptr) return false;
    if (s.deleted.contains(id) || s.reported.contains(id)) return false;  // deleted since
    float* row = RowAt(s, NewSlot(s, id, h));
    std::memcpy(row, values, (layout_.dim + layout_.slot_floats) * sizeof(float));
    SetStep(row, step);
    return true;
  }

  bool Install(int64_t id, const float* weights, const float* slots, uint64_t step) override {
    const uint64_t h = RouteHash(name_hash_, id);
    Stripe& s = StripeOf(h);
    SpinLockHolder lock(&s.mu);
    const uint32_t* found = s.index.Find(id, h);
    const bool exists = found != nullptr;
    const uint32_t slot = exists ? *found : NewSlot(s, id, h);
    float* row = RowAt(s, slot);
    uint64_t row_step = exists ? GetStep(row) : 0;
    if (!InstallValues(weights, slots, step, layout_.dim, layout_.slot_floats, exists, row,
                       row + layout_.dim, &row_step)) {
      return false;  // the row is as new already (a new row always installs)
    }
    Touch(s, slot);
    SetStep(row, row_step);
    MarkDirty(s, slot);
    if (stamped_) Stamp(s, slot, now_stamp());
    return true;
  }

  size_t CollectDirty(const std::function<void(const RowView&)>& fn,
                      const std::function<void()>& between,
                      const std::function<void(int64_t id)>& deleted) override {
    return Scan(/*dirty_only=*/true, fn, between, deleted);
  }

  size_t ForEachRow(const std::function<void(const RowView&)>& fn) override {
    return Scan(/*dirty_only=*/false, fn, nullptr, nullptr);
  }

  bool Inspect(int64_t id, const std::function<void(const RowView&)>& fn) override {
    const uint64_t h = RouteHash(name_hash_, id);
    Stripe& s = StripeOf(h);
    SpinLockHolder lock(&s.mu);
    const uint32_t* slot = s.index.Find(id, h);
    if (slot == nullptr) return false;
    const float* row = RowAt(s, *slot);
    RowView view;
    view.id = id;
    view.weights = row;
    view.slots = row + layout_.dim;
    view.step = GetStep(row);
    fn(view);
    return true;
  }

  AdmissionSketch* admission() override { return admission_.get(); }
  void CountEvicted(uint64_t rows) override { evicted_.fetch_add(rows, std::memory_order_relaxed); }
  uint64_t evicted() const override { return evicted_.load(std::memory_order_relaxed); }

  void CountLogged(int64_t id, uint64_t step) override {
    if (admission_ == nullptr || step > 1) return;
    admission_->Add(RouteHash(name_hash_, id));
    if (step == 0) {
      admission_->CountDropped();
    } else {
      admission_->CountAdmitted();
    }
  }

  uint64_t rows() const override { return rows_.load(std::memory_order_relaxed); }

  uint64_t memory_bytes() const override {
    return arena_.reserved_bytes() + index_bytes_.load(std::memory_order_relaxed);
  }

 private:
  static constexpr size_t kGroup = 16;
  // Rows visited per lock hold by Scan, so a long scan never stalls a stripe's writers.
  static constexpr uint32_t kScanChunk = 256;

  uint64_t GetStep(const float* row) const {
    uint64_t step;
    std::memcpy(&step, row + layout_.step_offset(), sizeof(step));
    return step;
  }
  void SetStep(float* row, uint64_t step) const {
    std::memcpy(row + layout_.step_offset(), &step, sizeof(step));
  }

  uint32_t FindOrCreate(Stripe& s, int64_t id, uint64_t h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    const uint32_t* slot = s.index.Find(id, h);
    if (slot != nullptr) return *slot;
    const uint32_t created = NewSlot(s, id, h);
    InitRow(RowAt(s, created), id);
    return created;
  }

  int64_t NowSeconds() const { return clock_ ? clock_() : absl::ToUnixSeconds(absl::Now()); }
  void Stamp(Stripe& s, uint32_t slot, uint32_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    if (stamped_) StampAt(s, slot) = now;
  }

  // Removes row `id` if resident (its slot is reused); returns 1 if it was.
  size_t EraseLocked(Stripe& s, int64_t id, uint64_t h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    const uint32_t* found = s.index.Find(id, h);
    if (found == nullptr) return 0;
    const uint32_t slot = *found;
    s.index.Erase(id, h);
    ClearBit(s.live, slot);
    if (track_dirty_) ClearBit(s.dirty, slot);
    s.free_slots.push_back(slot);
    rows_.fetch_sub(1, std::memory_order_relaxed);
    return 1;
  }

  void Touch(Stripe& s, uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    if (evictable_) SetBit(s.ref, slot);
  }

  // Reads rows ids[missing[k]] from the source (outside any lock) and, per row: copies it
  // to out (if given) and keeps it, unless an eviction ran meanwhile (it might then be
  // older than what was written since); a row the source lacks is created (unless
  // read_only) or, for a pull, filled with its initial value.
  absl::Status LoadMissing(RowSource* source, absl::Span<const int64_t> ids,
                           const std::vector<uint32_t>& missing, float* out, bool read_only) {
    const uint64_t epoch = evict_epoch_.load(std::memory_order_acquire);
    const size_t n = missing.size();
    const size_t floats = layout_.dim + layout_.slot_floats;
    std::vector<int64_t> wanted(n);
    for (size_t k = 0; k < n; ++k) wanted[k] = ids[missing[k]];
    std::vector<float> values(n * floats);
    std::vector<uint64_t> steps(n);
    std::unique_ptr<bool[]> found(new bool[n]);
    absl::Status st = source->Read(wanted, floats, values.data(), steps.data(), found.get());
    if (!st.ok()) return st;
    const size_t row_bytes = layout_.dim * sizeof(float);
    for (size_t k = 0; k < n; ++k) {
      const int64_t id = wanted[k];
      const uint64_t h = RouteHash(name_hash_, id);
      Stripe& s = StripeOf(h);
      SpinLockHolder lock(&s.mu);
      float* dst = out == nullptr ? nullptr : out + size_t{missing[k]} * layout_.dim;
      if (const uint32_t* slot = s.index.Find(id, h); slot != nullptr) {
        if (dst != nullptr) std::memcpy(dst, RowAt(s, *slot), row_bytes);  // loaded meanwhile
        continue;
      }
      // Deleted since (or before) the read, and not yet deleted on disk: a new row.
      if (found[k] && (s.deleted.contains(id) || s.reported.contains(id))) found[k] = false;
      if (found[k]) {
        const float* v = values.data() + k * floats;
        if (dst != nullptr) std::memcpy(dst, v, row_bytes);
        if (evict_epoch_.load(std::memory_order_acquire) != epoch) continue;
        const uint32_t slot = NewSlot(s, id, h);
        float* row = RowAt(s, slot);
        std::memcpy(row, v, floats * sizeof(float));
        SetStep(row, steps[k]);
      } else if (dst != nullptr) {
        if (read_only) {
          initializer_.Fill(name_hash_, id, dst, layout_.dim);
        } else {
          std::memcpy(dst, CreateRow(s, id, h), row_bytes);
        }
      }
    }
    return absl::OkStatus();
  }

  // Evicts up to `quota` clean, unreferenced rows of a stripe, advancing its clock hand
  // at most twice around.
  size_t EvictFromStripe(Stripe& s, uint64_t quota) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    size_t evicted = 0;
    const uint32_t n = s.used_slots;
    for (uint64_t step = 0; step < 2 * uint64_t{n} && evicted < quota; ++step) {
      const uint32_t slot = s.hand;
      s.hand = s.hand + 1 >= n ? 0 : s.hand + 1;
      if (!TestBit(s.live, slot)) continue;
      if (track_dirty_ && TestBit(s.dirty, slot)) continue;
      if (TestBit(s.ref, slot)) {
        ClearBit(s.ref, slot);
        continue;
      }
      const int64_t id = IdOf(s, slot);
      s.index.Erase(id, RouteHash(name_hash_, id));
      ClearBit(s.live, slot);
      s.free_slots.push_back(slot);
      rows_.fetch_sub(1, std::memory_order_relaxed);
      ++evicted;
    }
    return evicted;
  }

  void MarkDirty(Stripe& s, uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    if (track_dirty_) s.dirty[slot >> 6] |= uint64_t{1} << (slot & 63);
  }

  // Visits the rows of every stripe (only the dirty ones, clearing their marks, if
  // dirty_only), kScanChunk slots per lock hold. Slots never move, so resuming a stripe
  // at a slot index after re-locking is safe.
  size_t Scan(bool dirty_only, const std::function<void(const RowView&)>& fn,
              const std::function<void()>& between,
              const std::function<void(int64_t id)>& deleted) {
    size_t visited = 0;
    for (Stripe& s : stripes_) {
      for (uint32_t begin = 0;; begin += kScanChunk) {
        if (between && begin > 0) between();
        SpinLockHolder lock(&s.mu);
        if (begin == 0 && deleted) ReportDeleted(s, deleted);
        if (begin >= s.used_slots) break;
        const uint32_t end = std::min(s.used_slots, begin + kScanChunk);
        for (uint32_t slot = begin; slot < end; ++slot) {
          if (dirty_only) {
            uint64_t& word = s.dirty[slot >> 6];
            const uint64_t bit = uint64_t{1} << (slot & 63);
            if ((word & bit) == 0) {
              // Skip clean words whole.
              if (word == 0) slot |= 63;
              continue;
            }
            word &= ~bit;
          }
          if (!TestBit(s.live, slot)) continue;
          const float* row = RowAt(s, slot);
          RowView view;
          view.id = IdOf(s, slot);
          view.weights = row;
          view.slots = row + layout_.dim;
          view.step = GetStep(row);
          view.updated = stamped_ ? StampAt(s, slot) : 0;
          fn(view);
          ++visited;
        }
      }
    }
    return visited;
  }

  // CollectDirty's deletions of one stripe, before its rows are scanned: a deleted id whose
  // row is dirty now was re-created since, and the scan that follows reports that row
  // (dirty rows are only cleared by scans, one at a time); every other one is reported.
  // The ids reported by the previous call are forgotten now (their caller has written
  // them out since).
  void ReportDeleted(Stripe& s, const std::function<void(int64_t id)>& deleted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    if (!s.reported.empty()) s.reported.clear();
    if (s.deleted.empty()) return;
    for (int64_t id : s.deleted) {
      const uint32_t* slot = s.index.Find(id, RouteHash(name_hash_, id));
      if (slot != nullptr && TestBit(s.dirty, *slot)) continue;
      deleted(id);
      s.reported.insert(id);
    }
    s.deleted.clear();
  }

  // Calls fn(i, stripe, hash) for every i with the stripe of ids[i] locked. Per group of
  // kGroup ids: pass 0 prefetches each id's index bucket without any lock; pass 1 locks,
  // finds the row (now a cache hit) and prefetches it (a push: the whole row and its
  // stamp; for an id not found, the slot a new row would take: creating a row misses
  // there otherwise, and measured in lifecycle-bench that was most of NewSlot's time);
  // pass 2 locks again and runs fn.
  // A lock is a full fence on x86, which would serialize demand misses taken under it;
  // prefetches are not ordered by it, so the misses of a whole group overlap.
  template <typename Fn>
  void ForEachGroup(absl::Span<const int64_t> ids, bool for_write, Fn fn) {
    // A pull reads the weights only; a push reads and writes the whole row.
    const size_t row_bytes = (for_write ? layout_.stride : layout_.dim) * sizeof(float);
    Stripe* stripes[kGroup];
    uint64_t hashes[kGroup];
    for (size_t begin = 0; begin < ids.size(); begin += kGroup) {
      const size_t n = std::min(ids.size() - begin, kGroup);
      PrefetchBuckets(ids.subspan(begin, n), stripes, hashes);
      for (size_t k = 0; k < n; ++k) {
        Stripe& s = *stripes[k];
        SpinLockHolder lock(&s.mu);
        const uint32_t* slot = s.index.Find(ids[begin + k], hashes[k]);
        // A push of a new id (unless admission drops it) fills the slot NewSlot will
        // take next, the same one for all but the second new id of a stripe in a group.
        const uint32_t target = slot != nullptr ? *slot : for_write ? NextSlot(s) : kNoSlot;
        if (target == kNoSlot) continue;
        PrefetchRow(RowAt(s, target), row_bytes, for_write);
        // A push also writes the row's stamp, in another line of its block.
        if (for_write && stamped_) __builtin_prefetch(&StampAt(s, target), 1, 3);
      }
      for (size_t k = 0; k < n; ++k) {
        Stripe& s = *stripes[k];
        SpinLockHolder lock(&s.mu);
        fn(begin + k, s, hashes[k]);
      }
    }
  }

  // Pass 0 of a group: the routing hash and stripe of each id, and a prefetch of its
  // index bucket, without any lock.
  void PrefetchBuckets(absl::Span<const int64_t> ids, Stripe** stripes, uint64_t* hashes) {
    for (size_t k = 0; k < ids.size(); ++k) {
      hashes[k] = RouteHash(name_hash_, ids[k]);
      stripes[k] = &StripeOf(hashes[k]);
      stripes[k]->index.Prefetch(hashes[k]);
    }
  }

  // Prefetches `bytes` of a row (for writing: the whole row).
  ABSL_ATTRIBUTE_ALWAYS_INLINE static void PrefetchRow(const float* row, size_t bytes,
                                                       bool for_write) {
    const char* p = reinterpret_cast<const char*>(row);
    for (size_t off = 0; off < bytes; off += 64) {
      if (for_write) {
        __builtin_prefetch(p + off, 1, 3);
      } else {
        __builtin_prefetch(p + off, 0, 3);
      }
    }
  }

  Stripe& StripeOf(uint64_t route_hash) {
    // High bits of the routing hash: within one vshard (which fixes the low bits) ids still
    // spread over every stripe.
    return stripes_[(route_hash >> 40) & stripe_mask_];
  }

  float* RowAt(Stripe& s, uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    return s.blocks[slot / rows_per_block_] + (slot % rows_per_block_) * layout_.stride;
  }
  // The id of the row in `slot` (in the row's padding or the block's id array).
  char* IdAddress(Stripe& s, uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    if (layout_.id_in_row) return reinterpret_cast<char*>(RowAt(s, slot) + layout_.id_offset());
    char* block = reinterpret_cast<char*>(s.blocks[slot / rows_per_block_]);
    return block + ids_offset_ + (slot % rows_per_block_) * sizeof(int64_t);
  }
  int64_t IdOf(Stripe& s, uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    int64_t id;
    std::memcpy(&id, IdAddress(s, slot), sizeof(id));  // 4-byte aligned in a row
    return id;
  }
  void SetId(Stripe& s, uint32_t slot, int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    std::memcpy(IdAddress(s, slot), &id, sizeof(id));
  }
  // The last-update stamp of the row in `slot` (stamped_ only).
  uint32_t& StampAt(Stripe& s, uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    char* block = reinterpret_cast<char*>(s.blocks[slot / rows_per_block_]);
    return reinterpret_cast<uint32_t*>(block + stamps_offset_)[slot % rows_per_block_];
  }

  static constexpr uint32_t kNoSlot = UINT32_MAX;
  // The slot NewSlot(s, ...) would take now if its block exists already, else kNoSlot.
  uint32_t NextSlot(Stripe& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    if (!s.free_slots.empty()) return s.free_slots.back();
    return s.used_slots / rows_per_block_ < s.blocks.size() ? s.used_slots : kNoSlot;
  }

  float* CreateRow(Stripe& s, int64_t id, uint64_t h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    float* row = RowAt(s, NewSlot(s, id, h));
    InitRow(row, id);
    return row;
  }

  void InitRow(float* row, int64_t id) const {
    uint64_t step;
    InitRowValues(initializer_, optimizer_, name_hash_, id, layout_.dim, row, row + layout_.dim,
                  &step);
    SetStep(row, step);
  }

  // A slot for a new row of `id` (an evicted row's, or a new one), indexed, not dirty;
  // its contents are for the caller to write.
  uint32_t NewSlot(Stripe& s, int64_t id, uint64_t h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    uint32_t slot;
    if (!s.free_slots.empty()) {
      slot = s.free_slots.back();
      s.free_slots.pop_back();
      if (track_dirty_) ClearBit(s.dirty, slot);
    } else {
      slot = s.used_slots++;
      if (slot / rows_per_block_ >= s.blocks.size()) {
        s.blocks.push_back(static_cast<float*>(arena_.Allocate(block_bytes_)));
      }
      if ((slot & 63) == 0) {
        if (track_dirty_) s.dirty.push_back(0);
        s.live.push_back(0);
        if (evictable_) s.ref.push_back(0);
      }
    }
    SetId(s, slot, id);
    SetBit(s.live, slot);
    if (evictable_) SetBit(s.ref, slot);
    if (stamped_) StampAt(s, slot) = now_stamp();
    const size_t index_bytes = s.index.memory_bytes();
    s.index.Insert(id, h, slot);
    // Only when the index grew: an atomic add (a locked instruction) per new row is waste.
    if (s.index.memory_bytes() != index_bytes) {
      index_bytes_.fetch_add(s.index.memory_bytes() - index_bytes, std::memory_order_relaxed);
    }
    rows_.fetch_add(1, std::memory_order_relaxed);
    return slot;
  }

  // Constant after construction.
  const TableSpec spec_;
  const uint64_t name_hash_;
  const Initializer initializer_;
  const Optimizer optimizer_;
  const RowLayout layout_;
  const size_t rows_per_block_;
  const size_t ids_offset_;     // block bytes before the ids (unless layout_.id_in_row)
  const size_t stamps_offset_;  // block bytes before the stamps (StampAt)
  const size_t block_bytes_;
  const uint64_t stripe_mask_;
  const bool track_dirty_;
  const bool evictable_;
  const bool stamped_;  // eviction: rows keep their last-update stamp
  const std::function<int64_t()> clock_;
  const int64_t base_seconds_;                        // stamp 0
  const uint32_t min_count_;                          // admission: pushes that create a row
  const std::unique_ptr<AdmissionSketch> admission_;  // null: every id admitted
  std::atomic<RowSource*> source_{nullptr};
  // Bumped before and after every Evict: a row read back from the source is kept only if
  // no eviction ran since the read (else it might be older than a later write-out).
  std::atomic<uint64_t> evict_epoch_{0};

  BlockArena arena_;             // declared before the stripes that point into it
  std::vector<Stripe> stripes_;  // each guarded by its own mu
  std::atomic<uint64_t> rows_{0};
  std::atomic<uint64_t> index_bytes_{0};
  std::atomic<uint64_t> evicted_{0};
};

}  // namespace

absl::StatusOr<std::unique_ptr<EmbeddingTable>> EmbeddingTable::Create(
    const TableSpec& spec, const TableOptions& options) {
  ASSIGN_OR_RETURN(TableSpec normalized, NormalizeTableSpec(spec, SpecRules::kStored));
  if (options.num_stripes < 1 || (options.num_stripes & (options.num_stripes - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TableOptions.num_stripes = ", options.num_stripes, " must be a power of two"));
  }
  return std::unique_ptr<EmbeddingTable>(
      std::make_unique<EmbeddingTableImpl>(std::move(normalized), options));
}

}  // namespace ps
