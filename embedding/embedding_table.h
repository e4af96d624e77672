// An embedding table: int64 id -> a row of `dim` float weights plus its optimizer state.
//
// Rows are created lazily on first touch, at their deterministic initial value
// (embedding/initializer.h). The table is split into lock stripes by a hash of the id, so
// pulls and pushes from many threads touch disjoint locks; a row is read or updated whole
// under its stripe's lock, so a pull never sees a half-applied update.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "embedding/initializer.h"
#include "embedding/optimizer.h"
#include "proto/ps.pb.h"

namespace ps {

struct TableOptions {
  // Lock stripes (a power of two). 256 keeps two threads on different stripes >99% of the
  // time even on many-core pods, at about 16 KiB of fixed overhead per stripe in use.
  int num_stripes = 256;
};

// One row as the table stores it, for inspection and export.
struct RowView {
  int64_t id = 0;
  const float* weights = nullptr;  // dim floats
  const float* slots = nullptr;    // optimizer().slots() * dim floats
  uint64_t step = 0;               // updates applied to the row
};

class EmbeddingTable {
 public:
  // Returns INVALID_ARGUMENT for a spec that does not normalize (embedding/spec.h).
  static absl::StatusOr<std::unique_ptr<EmbeddingTable>> Create(const TableSpec& spec,
                                                                const TableOptions& options = {});
  virtual ~EmbeddingTable() = default;

  // The normalized spec. Constant for the table's life.
  virtual const TableSpec& spec() const = 0;
  virtual uint32_t dim() const = 0;
  virtual uint64_t name_hash() const = 0;

  // Copies row ids[i] into out[i*dim, (i+1)*dim) for every i. A missing row is created at
  // its initial value unless `read_only`, in which case its initial value is returned and
  // nothing is stored. Thread-safe.
  virtual void Pull(absl::Span<const int64_t> ids, float* out, bool read_only) = 0;

  // Applies grads[i*dim, (i+1)*dim) to row ids[i] for every i in order, creating missing
  // rows first. lr > 0 overrides the table's learning rate. The caller has checked that
  // the gradients are finite. Thread-safe.
  virtual void Push(absl::Span<const int64_t> ids, const float* grads, float lr) = 0;

  // Calls fn for the row `id` if it exists, under its stripe's lock (fn must not call back
  // into the table); returns whether it exists. Thread-safe.
  virtual bool Inspect(int64_t id, const std::function<void(const RowView&)>& fn) = 0;

  // Materialized rows, and bytes of row storage plus index. Thread-safe, approximate while
  // writers run.
  virtual uint64_t rows() const = 0;
  virtual uint64_t memory_bytes() const = 0;
};

}  // namespace ps
