// Memory for the row index's bucket arrays, on transparent huge pages.
//
// A pull or push probes the index of a large table at random, and an index of a few
// hundred MB on 4 KiB pages takes a TLB miss, in a VM a two-dimensional page walk, on
// almost every probe. The stripes' arrays are smaller than a huge page (1M rows over 256
// stripes: 128 KiB each), so they are carved from shared 2 MiB chunks advised as huge
// pages, by a buddy allocator: blocks are powers of two from kMinBlockBytes to
// kChunkBytes, a freed block merges with its free buddy, and a chunk wholly free again
// goes back to the C heap (free; glibc may keep it for later allocations). Measured on
// 1M Adagrad rows of dim 64, old and new alternated: pull 98-105 -> 83-99 us and push
// 163-188 -> 166-174 us per 1024 rows (docs/benchmarks.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace ps {

class HugeBlockPool {
 public:
  static constexpr size_t kChunkBytes = size_t{2} << 20;
  static constexpr size_t kMinBlockBytes = size_t{4} << 10;

  // The process-wide pool (every table's index shares it).
  static HugeBlockPool& Default();

  // `bytes` of uninitialized memory, 64-byte aligned, to be given back to Free with the
  // same `bytes`. Sizes below kMinBlockBytes come from the
  // heap; above kChunkBytes, from a 2 MiB-aligned allocation of their own (advised as
  // huge pages too); in between, rounded up to a power of two, from the chunks. Never
  // fails but by throwing std::bad_alloc, as operator new.
  void* Allocate(size_t bytes);
  void Free(void* p, size_t bytes);

  // Bytes of chunks held (in use or free), for tests and memory accounting.
  size_t chunk_bytes() const;

 private:
  static constexpr int kOrders = 10;  // 4 KiB << 9 == 2 MiB
  static int OrderOf(size_t bytes);

  mutable absl::Mutex mu_;
  // Free blocks of each order, by address.
  absl::flat_hash_set<uintptr_t> free_[kOrders] ABSL_GUARDED_BY(mu_);
  size_t chunks_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ps
