// Admission counters of one table (issue 17, TableSpec.admission): how often each id
// without a row has been pushed, in a count-min sketch per vshard, so a row is created
// only at its id's min_count-th push and rare ids never cost a row.
//
// Each vshard's sketch (allocated at its first count) has kDepth rows of kWidth 16-bit
// counters; an id's estimate is the minimum of its kDepth counters (never below its true
// count; above it when ids collide). Counters saturate at 65535. Decay: a vshard that
// has counted kDecayEvery ids since its last decay is due (DueForDecay); the caller then
// halves its counters (Decay) at a point it can order against the counts (a durable pod:
// its materializer, with the apply lock held exclusively, logging the decay), so the
// counts of ids pushed once and never again fade instead of piling up.
//
// Counting commutes (saturating adds), so counts replayed in any order between two
// decays rebuild the same counters: what makes recovery exact (ps/storage/log_record.h).
//
// Serialize/Restore give a stable byte format (for the pod's database and a move's copy):
//   u32 version 1, u64 admitted, u64 dropped, u64 first_seen, u32 vshards n, then n times
//   u32 vshard, u64 counted since the last decay, kDepth*kWidth u16 counters (LE).
//
// Thread-safe: each vshard's sketch has its own lock; counters are atomics.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/base/spin_lock.h"

namespace ps {

class AdmissionSketch {
 public:
  static constexpr uint32_t kDepth = 2;
  static constexpr uint32_t kWidth = 8192;  // 32 KiB per vshard that counted anything
  static constexpr uint64_t kDecayEvery = 8 * kWidth;

  // `num_vshards`: a power of two; the vshard of an id is its routing hash's low bits.
  explicit AdmissionSketch(uint32_t num_vshards);

  // Counts one push of `id` (routing hash `route_hash`) and returns its estimate after it.
  uint32_t Add(uint64_t route_hash);
  // The estimate without counting.
  uint32_t Estimate(uint64_t route_hash) const;

  // Lifecycle counters (TableInfo): rows created by admission, gradients dropped before
  // it, and ids seen for the first time (estimate 1 after their count).
  void CountAdmitted() { admitted_.fetch_add(1, std::memory_order_relaxed); }
  void CountDropped() { dropped_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t admitted() const { return admitted_.load(std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  // Ids counted but not admitted: an estimate (first sightings minus admissions).
  uint64_t pending() const;

  // Vshards that counted kDecayEvery ids since their last decay.
  std::vector<uint32_t> DueForDecay() const;
  // Halves every counter of each of `vshards`.
  void Decay(absl::Span<const uint32_t> vshards);
  // Forgets the counters of `vshards` (moved away).
  void Clear(absl::Span<const uint32_t> vshards);

  // The whole state, or the counters of some vshards only (a move: then the lifecycle
  // counters are written as 0). Restore replaces the counters of the vshards it holds
  // and, if `with_totals`, the lifecycle counters. INVALID_ARGUMENT for bytes that are
  // not this format or name a vshard out of range.
  std::string Serialize() const;
  std::string SerializeVShards(absl::Span<const uint32_t> vshards) const;
  absl::Status Restore(absl::string_view bytes, bool with_totals);

 private:
  struct Shard {
    mutable SpinLock mu;
    uint64_t counted = 0;            // since the last decay
    std::vector<uint16_t> counters;  // kDepth * kWidth, empty until the first count
  };
  static uint32_t Slot(uint64_t route_hash, uint32_t row);
  std::string SerializeImpl(absl::Span<const uint32_t> vshards, bool totals) const;

  const uint32_t mask_;
  std::unique_ptr<Shard[]> shards_;
  std::atomic<uint64_t> admitted_{0}, dropped_{0}, first_seen_{0};
};

}  // namespace ps
