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
  // Remember which rows pushes changed since the last CollectDirty (one bit per row),
  // for a durable pod that writes changed rows to storage in the background.
  bool track_dirty = false;
  // Rows may be evicted (Evict) and read back from a RowSource when touched again: keeps a
  // reference bit per row (CLOCK) and reuses evicted slots. For a pod with a memory
  // budget; costs a bit write per row touched.
  bool evictable = false;
};

class RowSource;

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
  // With a RowSource, a missing row is read from it first; if that read fails, *error
  // (when given) gets the error and the rows of the failed read are unspecified.
  virtual void Pull(absl::Span<const int64_t> ids, float* out, bool read_only,
                    absl::Status* error = nullptr) = 0;

  // Applies grads[i*dim, (i+1)*dim) to row ids[i] for every i in order, creating missing
  // rows first. lr > 0 overrides the table's learning rate. The caller has checked that
  // the gradients are finite. If `steps` is not null, steps[i] receives the row's update
  // count right after update i: (id, step) names each update exactly, which is how a
  // durable log replays updates in the order they were applied. Thread-safe.
  virtual void Push(absl::Span<const int64_t> ids, const float* grads, float lr,
                    uint64_t* steps = nullptr) = 0;

  // Replays one logged update: if row `id` has had fewer than `step` updates, its count is
  // set to step - 1 and grad[0..dim) is applied with lr (so its count becomes `step`);
  // otherwise the update is already in the row and nothing happens. Updates of one row
  // must be replayed in increasing step order. Thread-safe.
  virtual void Replay(int64_t id, const float* grad, float lr, uint64_t step) = 0;

  // Sets row `id` to the given weights (dim floats), optimizer slots (slot_floats()) and
  // update count, creating it if missing; the row is not marked dirty. Thread-safe.
  virtual void Restore(int64_t id, const float* weights, const float* slots, uint64_t step) = 0;

  // Installs a whole row (an import): sets row `id` to the given weights (dim floats),
  // optimizer slots (slot_floats()) and update count if the row is missing or has fewer
  // than `step` updates, and marks it dirty; otherwise (the table already holds that state
  // or a later one) leaves it alone. Returns whether it installed. Replaying a logged
  // install is the same call, so imports are idempotent. Thread-safe.
  virtual bool Install(int64_t id, const float* weights, const float* slots, uint64_t step) = 0;

  // Evictable tables (TableOptions.evictable). Rows missing from memory are looked up
  // in `source` (which must outlive the table) before they are created: a pull reads them
  // back (and keeps them), a push, replay or install needs them loaded first (Load).
  // Thread-safe; set once.
  virtual void SetRowSource(RowSource* source) = 0;
  // Makes rows ids[...] resident, reading the missing ones from the source in one batch.
  // The caller keeps Evict from running until it has used them (a pod holds its apply
  // lock shared; Evict runs under it exclusively). Errors are the source's. Thread-safe.
  virtual absl::Status Load(absl::Span<const int64_t> ids) = 0;
  // Drops clean (not dirty), unreferenced rows until at most `target_rows` remain (CLOCK:
  // a row touched since the hand last passed gets a second chance). Only rows the source
  // holds may be dropped: the caller runs it right after writing every dirty row out.
  // Returns the rows dropped. Thread-safe (one caller at a time).
  virtual size_t Evict(uint64_t target_rows) = 0;
  // Bytes one resident row costs (row storage and its index entry).
  virtual uint64_t row_bytes() const = 0;

  // Calls fn for every row changed since the previous call (with track_dirty), under its
  // stripe's lock (fn must not call back into the table), and clears the marks. Rows
  // changed while it runs are reported now or by the next call. Rows are visited a few
  // hundred per lock hold; `between` (if set) runs with no lock held after each group, so
  // the caller can write out what it gathered. Returns the rows reported. Thread-safe;
  // one caller at a time.
  virtual size_t CollectDirty(const std::function<void(const RowView&)>& fn,
                              const std::function<void()>& between = nullptr) = 0;

  // Removes the rows of `ids` that exist (their memory is reused by later rows); returns
  // how many were removed. Used when a vshard moves to another pod. Thread-safe.
  virtual size_t Erase(absl::Span<const int64_t> ids) = 0;

  // Calls fn for every row (as CollectDirty, without clearing marks). Thread-safe.
  virtual size_t ForEachRow(const std::function<void(const RowView&)>& fn) = 0;

  // Optimizer slot floats per row (slots() * dim).
  virtual uint32_t slot_floats() const = 0;

  // Calls fn for the row `id` if it exists, under its stripe's lock (fn must not call back
  // into the table); returns whether it exists. Thread-safe.
  virtual bool Inspect(int64_t id, const std::function<void(const RowView&)>& fn) = 0;

  // Materialized rows, and bytes of row storage plus index. Thread-safe, approximate while
  // writers run.
  virtual uint64_t rows() const = 0;
  virtual uint64_t memory_bytes() const = 0;
};

}  // namespace ps
