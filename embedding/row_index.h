// The per-stripe index of an embedding table: an open-addressing hash map from a row id
// (int64) to its slot number (uint32), built so that a batch lookup can prefetch each id's
// bucket before taking the stripe's lock.
//
// Why not absl::flat_hash_map: a batch pull over a large table misses the cache on nearly
// every probe, and the per-id lock (a locked xchg, a full fence on x86) keeps those misses
// from overlapping. Software prefetches are not ordered by locked instructions, so the
// caller prefetches the buckets of a group of ids without any lock (Prefetch), then locks
// and probes each one, by then a cache hit. absl does not expose the bucket address.
//
// Layout: linear probing over an array of 16-byte entries {key, value, hash bits}, so a
// probe usually touches one cache line (the next entry is in the next line for 1 bucket
// in 4). The bucket of a hash comes from its top bits after Fibonacci hashing: mixed =
// (hash * 0x9E3779B97F4A7C15) >> 32, bucket = (mixed * capacity) >> 32 (a multiply, not
// a modulo, so any capacity works): every bit of the caller's hash counts, which matters
// because the low bits (vshard) and bits 40..47 (stripe) of RouteHash are nearly constant
// within one stripe. Each entry keeps `mixed`, so growing and backward-shift deletion
// never need the hash function.
//
// Sized for load, not in powers of two: the capacity is (4 + m) << e lines of 4 buckets
// (m in 0..3), steps of 1.14x to 1.25x; the array holds at most 3/4 of its buckets and
// grows by one step when full, so a grown array is 0.6 to 0.75 full (a power-of-two array
// was 0.375 to 0.75: 32 bytes a row at 1M rows over 256 stripes, against about 25 now;
// HugeBlockPool hands out whole pages, not powers of two, so the bytes are saved). Each
// growth rehashes the whole array, 6 times the ids in total instead of doubling's 2. Its
// smallest size is 16 buckets (256 bytes), so thousands of small stripes stay cheap. Erase is
// backward-shift deletion: no tombstones, so eviction never degrades probes.
//
// The key INT64_MIN marks an empty bucket; a row with that id lives in a side field.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>

namespace ps {

class RowIndex {
 public:
  // An empty index of kMinCapacity buckets.
  RowIndex();
  ~RowIndex();

  // Not copyable or movable: Prefetch may be running on another thread against `this`.
  RowIndex(const RowIndex&) = delete;
  RowIndex& operator=(const RowIndex&) = delete;

  // Thread-safety: every method except Prefetch needs the caller's exclusive lock (the
  // stripe's SpinLock): const ones included, since they read the bucket array.
  //
  // `hash` is the caller's 64-bit hash of `id` (ps::RouteHash). It must be the same for
  // every call with the same id for the life of the index; its quality only affects
  // speed (a constant hash is correct, and linear in size()).

  // The slot of `id`, or nullptr if absent. The pointer stays valid until the next
  // Insert, Erase, Reserve or Clear; writing through it changes the stored slot.
  uint32_t* Find(int64_t id, uint64_t hash) {
    if (id == kEmptyKey) return has_empty_key_ ? &empty_key_value_ : nullptr;
    const size_t capacity = capacity_;
    for (size_t b = Bucket(Mix(hash), capacity);; b = Next(b, capacity)) {
      Entry& e = At(b);
      if (e.key == id) return &e.value;
      if (e.key == kEmptyKey) return nullptr;
    }
  }
  const uint32_t* Find(int64_t id, uint64_t hash) const {
    return const_cast<RowIndex*>(this)->Find(id, hash);
  }

  // Maps `id` to `value` if `id` is absent. Returns a pointer to the slot now stored for
  // `id` (valid as for Find) and whether it was inserted; if `id` was present its slot is
  // left unchanged (like emplace). May grow the array, which invalidates every pointer
  // from Find or Insert.
  std::pair<uint32_t*, bool> Insert(int64_t id, uint64_t hash, uint32_t value);

  // Removes `id`; returns whether it was present. Moves later entries of its probe run
  // back (backward-shift deletion), so it invalidates pointers from Find or Insert.
  // Never shrinks the array (see Clear).
  bool Erase(int64_t id, uint64_t hash);

  // Grows the array, if needed, so that `n` ids in total fit without another rehash.
  void Reserve(size_t n);

  // Removes every id and returns to kMinCapacity buckets, freeing the old array (so a
  // table that shrinks can give its index memory back).
  void Clear();

  // Calls fn(int64_t id, uint32_t slot) once for every id, in no particular order. fn
  // must not modify the index.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    if (has_empty_key_) fn(kEmptyKey, empty_key_value_);
    for (size_t b = 0, n = capacity(); b < n; ++b) {
      const Entry& e = At(b);
      if (e.key != kEmptyKey) fn(e.key, e.value);
    }
  }

  // The number of ids stored.
  size_t size() const { return size_ + (has_empty_key_ ? 1 : 0); }
  bool empty() const { return size() == 0; }

  // The number of buckets: 4 * (4 + m) << e for some m in 0..3, >= kMinCapacity.
  size_t capacity() const { return capacity_; }

  // The most ids the current array holds before Insert grows it (3/4 of capacity()).
  size_t max_load() const { return MaxLoad(capacity_); }

  // Heap bytes owned by the index (the bucket array), not counting sizeof(RowIndex).
  size_t memory_bytes() const { return capacity() * sizeof(Entry); }

  // Prefetches the cache lines of the home bucket of `hash` and of the 3 buckets after it
  // (the first buckets Find, Insert or Erase will probe: one line, or two when the home
  // bucket is not first in its line). The only method that may be called WITHOUT the lock,
  // concurrently with writers. It reads a single std::atomic word, the address and size
  // of the bucket array (published by the writer with a release store after each
  // rehash), never the array itself, so it is race-free in the C++ memory model. The
  // addresses it computes always lie inside an array this index allocated, but a writer
  // may have replaced and freed that array since: a prefetch never faults (GCC documents
  // that __builtin_prefetch of an invalid address does not fault; PREFETCHh on x86 and
  // PRFM on Arm do not), so that costs at most a useless prefetch. The old array is
  // deliberately not kept alive: that would cost up to +88% of the index's memory per
  // stripe, and still would not cover a reader stalled across two rehashes. The load is
  // relaxed: the value is only an address hint, nothing is read through it. At up to 3/4
  // load a run often crosses into the next line (a miss under the lock if not fetched
  // here); a run longer than 4 buckets still misses past that. `this` must outlive the
  // call.
  void Prefetch(uint64_t hash) const {
    const uintptr_t state = published_.load(std::memory_order_relaxed);
    const uintptr_t base = state & ~kCodeMask;
    const size_t capacity = CapacityOf(static_cast<int>(state & kCodeMask));
    const size_t b = Bucket(Mix(hash), capacity);
    __builtin_prefetch(reinterpret_cast<const void*>(base + b * sizeof(Entry)), /*rw=*/0,
                       /*locality=*/3);
    if ((b & 3) != 0 && b + 4 <= capacity) {
      __builtin_prefetch(reinterpret_cast<const void*>(base + (b + 3) * sizeof(Entry)),
                         /*rw=*/0, /*locality=*/3);
    }
  }

  static constexpr size_t kMinCapacity = 16;

 private:
  static constexpr int64_t kEmptyKey = std::numeric_limits<int64_t>::min();
  static constexpr uint64_t kFibonacci = 0x9E3779B97F4A7C15ULL;

  struct alignas(16) Entry {
    int64_t key = kEmptyKey;
    uint32_t value = 0;
    uint32_t mixed = 0;  // Mix(hash): the top 32 bits of hash * kFibonacci
  };
  static_assert(sizeof(Entry) == 16, "4 entries per cache line");

  // The array is 128-byte aligned (HugeBlockPool::kAlignment), so published_ packs the
  // capacity's code (< 128) into the low 7 bits of its address: Prefetch reads address
  // and size in one atomic load.
  struct alignas(64) Line {
    Entry entries[4];
  };
  static constexpr uintptr_t kCodeMask = 127;

  // Capacity codes: code = 4 * e + m names (4 + m) << e lines, 4 buckets each. Code 0 is
  // kMinCapacity; kMaxCode is 2^32 buckets (Bucket multiplies a 32-bit hash by it).
  static constexpr int kMaxCode = 4 * 28;
  static constexpr size_t CapacityOf(int code) {
    return (size_t{4} + (code & 3)) << ((code >> 2) + 2);
  }
  // At most 3/4 of the buckets hold an entry.
  static constexpr size_t MaxLoad(size_t capacity) { return capacity * 3 / 4; }

  static uint32_t Mix(uint64_t hash) { return static_cast<uint32_t>((hash * kFibonacci) >> 32); }
  // The home bucket of `mixed` in an array of `capacity` buckets (monotone in `mixed`).
  static size_t Bucket(uint32_t mixed, size_t capacity) {
    return static_cast<size_t>((static_cast<uint64_t>(mixed) * capacity) >> 32);
  }
  static size_t Next(size_t b, size_t capacity) { return b + 1 == capacity ? 0 : b + 1; }
  // Buckets from `from` forward to `to`, wrapping around the end.
  static size_t Distance(size_t from, size_t to, size_t capacity) {
    return to >= from ? to - from : to + capacity - from;
  }
  Entry& At(size_t b) { return lines_[b >> 2].entries[b & 3]; }
  const Entry& At(size_t b) const { return lines_[b >> 2].entries[b & 3]; }

  // Replaces the array by one of CapacityOf(code) empty buckets and reinserts every entry.
  void Rehash(int code);
  // The first empty bucket of the probe run of `mixed`; `mixed`'s id must be absent.
  Entry* FindEmpty(uint32_t mixed);

  // The bucket array's memory, from HugeBlockPool (on huge pages once it is large).
  struct PoolFree {
    PoolFree() noexcept : bytes(0) {}
    explicit PoolFree(size_t b) noexcept : bytes(b) {}
    void operator()(Line* lines) const;
    size_t bytes;
  };
  using Lines = std::unique_ptr<Line[], PoolFree>;
  static Lines NewLines(size_t count);

  Lines lines_;  // capacity() / 4 lines: bucket b is At(b)
  int code_ = 0;
  size_t capacity_ = 0;     // CapacityOf(code_)
  size_t size_ = 0;         // ids in the array (not counting the side field)
  size_t growth_left_ = 0;  // inserts into the array before the next rehash
  bool has_empty_key_ = false;
  uint32_t empty_key_value_ = 0;  // the slot of id kEmptyKey if has_empty_key_

  // Address of lines_[0] | code_, for Prefetch. Written only under the caller's
  // lock, read by Prefetch without it.
  std::atomic<uintptr_t> published_{0};
};

}  // namespace ps
