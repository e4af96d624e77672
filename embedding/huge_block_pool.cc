#include "embedding/huge_block_pool.h"

#include <sys/mman.h>

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

}  // namespace

HugeBlockPool& HugeBlockPool::Default() {
  static HugeBlockPool* pool = new HugeBlockPool();  // never destroyed: used until exit
  return *pool;
}

int HugeBlockPool::OrderOf(size_t bytes) {
  int order = 0;
  while ((kMinBlockBytes << order) < bytes) ++order;
  return order;
}

void* HugeBlockPool::Allocate(size_t bytes) {
  if (bytes < kMinBlockBytes) {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  if (bytes > kChunkBytes)
    return AllocateChunks((bytes + kChunkBytes - 1) / kChunkBytes * kChunkBytes);
  const int want = OrderOf(bytes);
  absl::MutexLock lock(&mu_);
  int order = want;
  while (order < kOrders && free_[order].empty()) ++order;
  uintptr_t block;
  if (order == kOrders) {
    block = reinterpret_cast<uintptr_t>(AllocateChunks(kChunkBytes));
    ++chunks_;
    order = kOrders - 1;
  } else {
    block = *free_[order].begin();
    free_[order].erase(free_[order].begin());
  }
  // Split down to the size wanted; the upper halves become free blocks.
  while (order > want) {
    --order;
    free_[order].insert(block + (kMinBlockBytes << order));
  }
  return reinterpret_cast<void*>(block);
}

void HugeBlockPool::Free(void* p, size_t bytes) {
  if (p == nullptr) return;
  if (bytes < kMinBlockBytes || bytes > kChunkBytes) return std::free(p);
  int order = OrderOf(bytes);
  uintptr_t block = reinterpret_cast<uintptr_t>(p);
  absl::MutexLock lock(&mu_);
  // Merge with the buddy while it is free (a chunk is 2 MiB aligned, so the buddy of a
  // block of size b is its address xor b).
  while (order < kOrders - 1) {
    const uintptr_t buddy = block ^ (kMinBlockBytes << order);
    auto it = free_[order].find(buddy);
    if (it == free_[order].end()) break;
    free_[order].erase(it);
    block = std::min(block, buddy);
    ++order;
  }
  if (order == kOrders - 1) {
    std::free(reinterpret_cast<void*>(block));  // the whole chunk is free
    --chunks_;
    return;
  }
  free_[order].insert(block);
}

size_t HugeBlockPool::chunk_bytes() const {
  absl::MutexLock lock(&mu_);
  return chunks_ * kChunkBytes;
}

}  // namespace ps
