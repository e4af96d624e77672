#include "embedding/block_arena.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

namespace ps {

void BlockArena::FreeDeleter::operator()(void* p) const { std::free(p); }

void* BlockArena::Allocate(size_t bytes) {
  bytes = (bytes + 63) / 64 * 64;
  absl::MutexLock lock(&mu_);
  if (used_in_last_ + bytes > kChunkBytes) {
    void* chunk = std::aligned_alloc(kChunkBytes, kChunkBytes);
    if (chunk == nullptr) throw std::bad_alloc();
    madvise(chunk, kChunkBytes, MADV_HUGEPAGE);  // a hint: failure only costs speed
    std::memset(chunk, 0, kChunkBytes);
    chunks_.emplace_back(static_cast<char*>(chunk));
    used_in_last_ = 0;
  }
  void* p = chunks_.back().get() + used_in_last_;
  used_in_last_ += bytes;
  return p;
}

size_t BlockArena::reserved_bytes() const {
  absl::MutexLock lock(&mu_);
  return chunks_.size() * kChunkBytes;
}

}  // namespace ps
