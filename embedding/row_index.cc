#include "embedding/row_index.h"

#include <cstdio>
#include <cstdlib>
#include <new>
#include <type_traits>

#include "embedding/huge_block_pool.h"

namespace ps {

RowIndex::RowIndex() {
  static_assert(kMinCapacity == CapacityOf(0), "code 0 is the smallest array");
  static_assert(CapacityOf(kMaxCode) == size_t{1} << 32, "a 32-bit mixed hash addresses it");
  static_assert(kMaxCode <= static_cast<int>(kCodeMask), "a code fits the mask");
  static_assert(HugeBlockPool::kAlignment > kCodeMask, "a code fits below the alignment");
  Rehash(0);
}

RowIndex::~RowIndex() = default;

std::pair<uint32_t*, bool> RowIndex::Insert(int64_t id, uint64_t hash, uint32_t value) {
  if (id == kEmptyKey) {
    if (has_empty_key_) return {&empty_key_value_, false};
    has_empty_key_ = true;
    empty_key_value_ = value;
    return {&empty_key_value_, true};
  }
  const uint32_t mixed = Mix(hash);
  const size_t capacity = capacity_;
  size_t b = Bucket(mixed, capacity);
  for (;; b = Next(b, capacity)) {
    Entry& e = At(b);
    if (e.key == id) return {&e.value, false};
    if (e.key == kEmptyKey) break;
  }
  Entry* e = &At(b);
  if (growth_left_ == 0) {
    Rehash(code_ + 1);
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
  const size_t capacity = capacity_;
  size_t hole = Bucket(Mix(hash), capacity);
  for (;; hole = Next(hole, capacity)) {
    const Entry& e = At(hole);
    if (e.key == id) break;
    if (e.key == kEmptyKey) return false;
  }
  // Backward shift: walk the rest of the run; an entry whose probe run [home, j] passes
  // through the hole (cyclically: the hole is no further back from j than its home) moves
  // into it, and its old bucket becomes the hole. The run ends at the first empty bucket.
  for (size_t j = Next(hole, capacity);; j = Next(j, capacity)) {
    const Entry& e = At(j);
    if (e.key == kEmptyKey) break;
    const size_t home = Bucket(e.mixed, capacity);
    if (Distance(home, j, capacity) >= Distance(hole, j, capacity)) {
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
  int code = code_;
  while (code < kMaxCode && MaxLoad(CapacityOf(code)) < n) ++code;
  if (code > code_) Rehash(code);
}

void RowIndex::Clear() {
  // Freed on return, after Rehash has published the new array.
  Lines old = std::move(lines_);
  size_ = 0;
  has_empty_key_ = false;
  Rehash(0);
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

void RowIndex::Rehash(int code) {
  if (code > kMaxCode) {
    std::fprintf(stderr, "RowIndex: cannot grow past %zu buckets\n", CapacityOf(kMaxCode));
    std::abort();
  }
  const size_t old_lines = lines_ ? capacity_ / 4 : 0;
  Lines old = std::move(lines_);
  const size_t capacity = CapacityOf(code);
  lines_ = NewLines(capacity / 4);
  if ((reinterpret_cast<uintptr_t>(lines_.get()) & kCodeMask) != 0) {
    std::fprintf(stderr, "RowIndex: bucket array is not %zu-byte aligned\n",
                 static_cast<size_t>(kCodeMask + 1));
    std::abort();
  }
  code_ = code;
  capacity_ = capacity;
  for (size_t i = 0; i < old_lines; ++i) {
    for (const Entry& e : old[i].entries) {
      if (e.key != kEmptyKey) *FindEmpty(e.mixed) = e;
    }
  }
  growth_left_ = MaxLoad(capacity) - size_;
  // Publish before `old` is freed, so that a Prefetch that loads the new state never
  // computes an address in freed memory (one that loaded the old state still may).
  published_.store(reinterpret_cast<uintptr_t>(lines_.get()) | static_cast<uintptr_t>(code),
                   std::memory_order_release);
}

RowIndex::Entry* RowIndex::FindEmpty(uint32_t mixed) {
  const size_t capacity = capacity_;
  for (size_t b = Bucket(mixed, capacity);; b = Next(b, capacity)) {
    Entry& e = At(b);
    if (e.key == kEmptyKey) return &e;
  }
}

}  // namespace ps
