// Memory for row blocks, carved from 2 MiB-aligned chunks that the kernel is asked to back
// with transparent huge pages. Random row access over gigabytes of rows otherwise costs a
// TLB miss and a page walk per row on top of the cache miss.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ps {

class BlockArena {
 public:
  static constexpr size_t kChunkBytes = size_t{2} << 20;

  // Returns zeroed memory for `bytes` (<= kChunkBytes), 64-byte aligned, valid until the
  // arena is destroyed. Thread-safe.
  void* Allocate(size_t bytes);

  // Bytes reserved from the system.
  size_t reserved_bytes() const;

 private:
  struct FreeDeleter {
    void operator()(void* p) const;
  };

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<char, FreeDeleter>> chunks_ ABSL_GUARDED_BY(mu_);
  size_t used_in_last_ ABSL_GUARDED_BY(mu_) = kChunkBytes;
};

}  // namespace ps
