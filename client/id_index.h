// A per-batch map from int64 id to a small value (a row's first position), for the
// client's de-duplication of the ids of one call. Open addressing over power-of-two
// arrays kept across calls, so a batch costs no allocation; the caller supplies the hash
// (the routing hash it computes anyway). Not thread-safe: use one per thread. Holds at
// most max(32 n, 64 Ki) slots (12 bytes each) for the n of the last Reset.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace ps {

class IdIndex {
 public:
  // Empties the index and sizes it for up to n ids (load factor <= 1/2).
  void Reset(size_t n) {
    size_t cap = 16;
    int bits = 4;
    while (cap < 2 * n) {
      cap <<= 1;
      ++bits;
    }
    // Grow as needed; give memory back after a batch far larger than this one, so a
    // thread does not keep a huge index for its lifetime.
    if (keys_.size() < cap || keys_.size() > std::max<size_t>(8 * cap, size_t{1} << 16)) {
      keys_ = std::vector<int64_t>(cap);
      values_ = std::vector<uint32_t>(cap);
    }
    shift_ = 64 - bits;
    mask_ = cap - 1;
    std::memset(values_.data(), 0xff, cap * sizeof(uint32_t));  // every slot kEmpty
  }

  // The value of `id` (whose well-mixed 64-bit hash is `hash`); if absent, inserts
  // `value` (which must not be kEmpty) and returns it with *inserted = true. At most the
  // n ids of the last Reset may be inserted.
  uint32_t FindOrInsert(int64_t id, uint64_t hash, uint32_t value, bool* inserted) {
    for (size_t slot = hash >> shift_;; slot = (slot + 1) & mask_) {
      if (values_[slot] == kEmpty) {
        keys_[slot] = id;
        values_[slot] = value;
        *inserted = true;
        return value;
      }
      if (keys_[slot] == id) {
        *inserted = false;
        return values_[slot];
      }
    }
  }

  static constexpr uint32_t kEmpty = ~uint32_t{0};

 private:
  std::vector<int64_t> keys_;
  std::vector<uint32_t> values_;
  int shift_ = 60;
  size_t mask_ = 15;
};

}  // namespace ps
