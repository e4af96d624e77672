#include "embedding/row_index.h"

#include <cstdio>
#include <cstdlib>
#include <new>
#include <type_traits>

#include "embedding/huge_block_pool.h"

namespace ps {
namespace {

constexpr int kMinLog2Capacity = 4;
// The array keeps 32 bits of mixed hash per entry, so it cannot address more buckets.
constexpr int kMaxLog2Capacity = 32;

// At most 3/4 of the buckets hold an entry.
size_t MaxLoad(size_t capacity) { return capacity - capacity / 4; }

}  // namespace

static_assert(RowIndex::kMinCapacity == size_t{1} << kMinLog2Capacity, "");

RowIndex::RowIndex() { Rehash(kMinLog2Capacity); }

RowIndex::~RowIndex() = default;

std::pair<uint32_t*, bool> RowIndex::Insert(int64_t id, uint64_t hash, uint32_t value) {
  if (id == kEmptyKey) {
    if (has_empty_key_) return {&empty_key_value_, false};
    has_empty_key_ = true;
    empty_key_value_ = value;
    return {&empty_key_value_, true};
  }
  const uint32_t mixed = Mix(hash);
  const size_t mask = Mask();
  size_t b = Bucket(mixed, shift_);
  for (;; b = (b + 1) & mask) {
    Entry& e = At(b);
    if (e.key == id) return {&e.value, false};
    if (e.key == kEmptyKey) break;
  }
  Entry* e = &At(b);
  if (growth_left_ == 0) {
    Rehash(log2_capacity_ + 1);
    e = FindEmpty(mixed);
  }
  e->key = id;
  e->value = value;
  e->mixed = mixed;
  ++size_;
  --growth_left_;
  return {&e->value, true};
}

bool RowIndex::Erase(int64_t id, uint64_t hash) {
  if (id == kEmptyKey) {
    const bool had = has_empty_key_;
    has_empty_key_ = false;
    return had;
  }
  const size_t mask = Mask();
  size_t hole = Bucket(Mix(hash), shift_);
  for (;; hole = (hole + 1) & mask) {
    const Entry& e = At(hole);
    if (e.key == id) break;
    if (e.key == kEmptyKey) return false;
  }
  // Backward shift: walk the rest of the run; an entry whose probe run [home, j] passes
  // through the hole (cyclically: the hole is no further back from j than its home) moves
  // into it, and its old bucket becomes the hole. The run ends at the first empty bucket.
  for (size_t j = (hole + 1) & mask;; j = (j + 1) & mask) {
    const Entry& e = At(j);
    if (e.key == kEmptyKey) break;
    const size_t home = Bucket(e.mixed, shift_);
    if (((j - home) & mask) >= ((j - hole) & mask)) {
      At(hole) = e;
      hole = j;
    }
  }
  At(hole) = Entry();
  --size_;
  ++growth_left_;
  return true;
}

void RowIndex::Reserve(size_t n) {
  int log2_capacity = log2_capacity_;
  while (MaxLoad(size_t{1} << log2_capacity) < n) ++log2_capacity;
  if (log2_capacity > log2_capacity_) Rehash(log2_capacity);
}

void RowIndex::Clear() {
  // Freed on return, after Rehash has published the new array.
  Lines old = std::move(lines_);
  size_ = 0;
  has_empty_key_ = false;
  Rehash(kMinLog2Capacity);
}

void RowIndex::PoolFree::operator()(Line* lines) const {
  HugeBlockPool::Default().Free(lines, bytes);  // Line is trivially destructible
}

RowIndex::Lines RowIndex::NewLines(size_t count) {
  static_assert(std::is_trivially_destructible_v<Line>, "freed without destructors");
  const size_t bytes = count * sizeof(Line);
  Line* lines = static_cast<Line*>(HugeBlockPool::Default().Allocate(bytes));
  for (size_t i = 0; i < count; ++i) new (&lines[i]) Line();  // every bucket empty
  return Lines(lines, PoolFree(bytes));
}

void RowIndex::Rehash(int log2_capacity) {
  if (log2_capacity > kMaxLog2Capacity) {
    std::fprintf(stderr, "RowIndex: cannot grow past 2^%d buckets\n", kMaxLog2Capacity);
    std::abort();
  }
  const size_t old_lines = lines_ ? capacity() / 4 : 0;
  Lines old = std::move(lines_);
  lines_ = NewLines((size_t{1} << log2_capacity) / 4);
  if ((reinterpret_cast<uintptr_t>(lines_.get()) & kLog2Mask) != 0) {
    std::fprintf(stderr, "RowIndex: bucket array is not 64-byte aligned\n");
    std::abort();
  }
  log2_capacity_ = log2_capacity;
  shift_ = 32 - log2_capacity;
  for (size_t i = 0; i < old_lines; ++i) {
    for (const Entry& e : old[i].entries) {
      if (e.key != kEmptyKey) *FindEmpty(e.mixed) = e;
    }
  }
  growth_left_ = MaxLoad(capacity()) - size_;
  // Publish before `old` is freed, so that a Prefetch that loads the new state never
  // computes an address in freed memory (one that loaded the old state still may).
  published_.store(
      reinterpret_cast<uintptr_t>(lines_.get()) | static_cast<uintptr_t>(log2_capacity),
      std::memory_order_release);
}

RowIndex::Entry* RowIndex::FindEmpty(uint32_t mixed) {
  const size_t mask = Mask();
  for (size_t b = Bucket(mixed, shift_);; b = (b + 1) & mask) {
    Entry& e = At(b);
    if (e.key == kEmptyKey) return &e;
  }
}

}  // namespace ps
