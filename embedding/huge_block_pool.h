// Memory for the row index's bucket arrays, on transparent huge pages.
//
// A pull or push probes the index of a large table at random, and an index of a few
// hundred MB on 4 KiB pages takes a TLB miss, in a VM a two-dimensional page walk, on
// almost every probe. The stripes' arrays are smaller than a huge page (1M rows over 256
// stripes: about 90 KiB each), so they are carved from shared 2 MiB chunks advised as
// huge pages. Blocks are whole 4 KiB pages, any number of them (the index sizes its
// arrays for load, not in powers of two: a buddy allocator would round them back up),
// placed best-fit: the smallest free run of pages that holds the block, lowest address
// first. A chunk wholly free again goes back to the C heap (free; glibc may keep it for
// later allocations). Huge pages measured on 1M Adagrad rows of dim 64, old and new
// alternated: pull 98-105 -> 83-99 us and push 163-188 -> 166-174 us per 1024 rows
// (docs/benchmarks.md).
#pragma once

#include <bitset>
#include <cstddef>
#include <cstdint>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ps {

class HugeBlockPool {
 public:
  static constexpr size_t kChunkBytes = size_t{2} << 20;
  static constexpr size_t kPageBytes = size_t{4} << 10;
  // Every block's alignment (RowIndex packs 7 bits of state below its array's address).
  static constexpr size_t kAlignment = 128;

  // The process-wide pool (every table's index shares it).
  static HugeBlockPool& Default();

  // `bytes` of uninitialized memory, kAlignment-aligned, to be given back to Free with the
  // same `bytes`. Sizes below kPageBytes come from the heap; above kChunkBytes, from a
  // 2 MiB-aligned allocation of their own (advised as huge pages too); in between,
  // rounded up to whole pages, from the chunks. Never fails but by throwing
  // std::bad_alloc, as operator new. Thread-safe.
  void* Allocate(size_t bytes);
  void Free(void* p, size_t bytes);

  // Bytes of chunks held (in use or free), and of their pages in use. Thread-safe.
  size_t chunk_bytes() const;
  size_t used_bytes() const;

 private:
  static constexpr size_t kPages = kChunkBytes / kPageBytes;  // 512
  struct Chunk {
    std::bitset<kPages> used;  // a bit per page
    size_t free_pages = kPages;
  };

  mutable absl::Mutex mu_;
  // Chunks by address (2 MiB-aligned): best fit scans them in order.
  std::map<uintptr_t, Chunk> chunks_ ABSL_GUARDED_BY(mu_);
  size_t used_pages_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ps
