#include "embedding/huge_block_pool.h"

#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <new>

namespace ps {
namespace {

void* AllocateChunks(size_t bytes) {
  void* p = std::aligned_alloc(HugeBlockPool::kChunkBytes, bytes);
  if (p == nullptr) throw std::bad_alloc();
  madvise(p, bytes, MADV_HUGEPAGE);  // a hint: failure only costs speed
  return p;
}

size_t PagesOf(size_t bytes) {
  return (bytes + HugeBlockPool::kPageBytes - 1) / HugeBlockPool::kPageBytes;
}

}  // namespace

HugeBlockPool& HugeBlockPool::Default() {
  static HugeBlockPool* pool = new HugeBlockPool();  // never destroyed: used until exit
  return *pool;
}

void* HugeBlockPool::Allocate(size_t bytes) {
  if (bytes < kPageBytes) {
    void* p = std::aligned_alloc(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  if (bytes > kChunkBytes)
    return AllocateChunks((bytes + kChunkBytes - 1) / kChunkBytes * kChunkBytes);
  const size_t want = PagesOf(bytes);
  absl::MutexLock lock(&mu_);
  // Best fit: the shortest free run of at least `want` pages over every chunk.
  Chunk* best = nullptr;
  uintptr_t best_base = 0;
  size_t best_start = 0, best_run = kPages + 1;
  for (auto& [base, chunk] : chunks_) {
    if (chunk.free_pages < want) continue;
    for (size_t i = 0; i < kPages;) {
      if (chunk.used[i]) {
        ++i;
        continue;
      }
      size_t end = i;
      while (end < kPages && !chunk.used[end]) ++end;
      const size_t run = end - i;
      if (run >= want && run < best_run) {
        best = &chunk;
        best_base = base;
        best_start = i;
        best_run = run;
      }
      i = end;
    }
    if (best_run == want) break;  // exact: nothing fits better
  }
  if (best == nullptr) {
    best_base = reinterpret_cast<uintptr_t>(AllocateChunks(kChunkBytes));
    best = &chunks_[best_base];
    best_start = 0;
  }
  for (size_t i = best_start; i < best_start + want; ++i) best->used.set(i);
  best->free_pages -= want;
  used_pages_ += want;
  return reinterpret_cast<void*>(best_base + best_start * kPageBytes);
}

void HugeBlockPool::Free(void* p, size_t bytes) {
  if (p == nullptr) return;
  if (bytes < kPageBytes || bytes > kChunkBytes) return std::free(p);
  const size_t pages = PagesOf(bytes);
  const uintptr_t block = reinterpret_cast<uintptr_t>(p);
  const uintptr_t base = block & ~(uintptr_t{kChunkBytes} - 1);
  absl::MutexLock lock(&mu_);
  auto it = chunks_.find(base);
  if (it == chunks_.end()) {
    std::fprintf(stderr, "HugeBlockPool: Free of %p, not from the pool\n", p);
    std::abort();
  }
  Chunk& chunk = it->second;
  const size_t first = (block - base) / kPageBytes;
  for (size_t i = first; i < first + pages; ++i) chunk.used.reset(i);
  chunk.free_pages += pages;
  used_pages_ -= pages;
  if (chunk.free_pages == kPages) {
    std::free(reinterpret_cast<void*>(base));  // the whole chunk is free
    chunks_.erase(it);
  }
}

size_t HugeBlockPool::chunk_bytes() const {
  absl::MutexLock lock(&mu_);
  return chunks_.size() * kChunkBytes;
}

size_t HugeBlockPool::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_pages_ * kPageBytes;
}

}  // namespace ps
