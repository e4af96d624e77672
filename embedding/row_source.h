// Where an embedding table's evicted rows live (a durable pod's RocksDB), so the table
// can read them back when they are touched again (TableOptions.evictable).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace ps {

class RowSource {
 public:
  virtual ~RowSource() = default;
  // For every i: if row ids[i] is stored, copies its dim weights then slot floats to
  // values[i * row_floats ...], its update count to steps[i], and sets found[i]; else
  // found[i] = false. One batched read. Thread-safe.
  virtual absl::Status Read(absl::Span<const int64_t> ids, size_t row_floats, float* values,
                            uint64_t* steps, bool* found) = 0;
};

}  // namespace ps
