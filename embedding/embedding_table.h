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
#include "embedding/admission_sketch.h"
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
  // The vshard count (a power of two) of the pod's map: a table with admission keeps its
  // counters per vshard (AdmissionSketch), so a move can carry them.
  uint32_t num_vshards = 256;
  // Seconds now, for the last-update time of rows of tables with eviction (TTL, LRU).
  // Null: the system clock. Tests pass a fake clock.
  std::function<int64_t()> clock;
};

class RowSource;

// One row as the table stores it, for inspection and export.
struct RowView {
  int64_t id = 0;
  const float* weights = nullptr;  // dim floats
  const float* slots = nullptr;    // optimizer().slots() * dim floats
  uint64_t step = 0;               // updates applied to the row
  // Tables with eviction: when the row was created or last updated, in the table's stamp
  // seconds (now_stamp()); 0 otherwise. Kept in memory only: a restart stamps the rows it
  // recovers with its own start, so a TTL counts from there (never evicts early).
  uint32_t updated = 0;
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
  // its initial value unless `read_only` or the table admits rows by count (admission),
  // in which case its initial value is returned and nothing is stored. Thread-safe.
  // With a RowSource, a missing row is read from it first; if that read fails, *error
  // (when given) gets the error and the rows of the failed read are unspecified.
  virtual void Pull(absl::Span<const int64_t> ids, float* out, bool read_only,
                    absl::Status* error = nullptr) = 0;

  // Applies grads[i*dim, (i+1)*dim) to row ids[i] for every i in order, creating missing
  // rows first. lr > 0 overrides the table's learning rate. The caller has checked that
  // the gradients are finite. If `steps` is not null, steps[i] receives the row's update
  // count right after update i: (id, step) names each update exactly, which is how a
  // durable log replays updates in the order they were applied. Thread-safe.
  // With admission (spec.admission.min_count = N >= 2), a missing row is created only by
  // its id's N-th counted push (admission()): earlier pushes of it are counted, their
  // gradients dropped, and steps[i] = 0 says so (a logged step 0 is a count, nothing else).
  virtual void Push(absl::Span<const int64_t> ids, const float* grads, float lr,
                    uint64_t* steps = nullptr) = 0;

  // Replays one logged update: if row `id` has had fewer than `step` updates, its count is
  // set to step - 1 and grad[0..dim) is applied with lr (so its count becomes `step`);
  // otherwise the update is already in the row and nothing happens. Updates of one row
  // must be replayed in increasing step order. Step 0 (a push admission dropped) changes
  // no row: its count is CountLogged's. Thread-safe.
  virtual void Replay(int64_t id, const float* grad, float lr, uint64_t step) = 0;
  // Replay of updates (ids[i], grads[i*dim, (i+1)*dim), steps[i]) for every i in order,
  // as a push visits its rows (index and rows prefetched a group at a time), so a
  // follower or recovery replaying a logged entry does not wait on one cache miss per row.
  // steps.size() == ids.size(). Thread-safe.
  virtual void ReplayRows(absl::Span<const int64_t> ids, const float* grads, float lr,
                          absl::Span<const uint64_t> steps) = 0;

  // Sets row `id` to the given weights (dim floats), optimizer slots (slot_floats()) and
  // update count, creating it if missing; the row is not marked dirty. Thread-safe.
  virtual void Restore(int64_t id, const float* weights, const float* slots, uint64_t step) = 0;

  // Restores row `id` (values: weights then slots) unless it is resident or was deleted
  // (Delete) since the last CollectDirty but one; not marked dirty. Returns whether it did. For
  // loading stored rows in the background while the table serves: a resident row is as new as the
  // stored one or newer. Thread-safe.
  virtual bool RestoreIfAbsent(int64_t id, const float* values, uint64_t step) = 0;

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
  // the caller can write out what it gathered. With `deleted`, also calls it (under the
  // stripe's lock) for every id Delete removed since the previous call whose row is not
  // dirty now (a dirty row, re-created since, is reported to fn instead: its new state
  // replaces the stored one), and forgets them; an id is never reported to both in one
  // call. Returns the rows reported to fn. Thread-safe; one caller at a time.
  virtual size_t CollectDirty(const std::function<void(const RowView&)>& fn,
                              const std::function<void()>& between = nullptr,
                              const std::function<void(int64_t id)>& deleted = nullptr) = 0;

  // Deletes rows (feature eviction, an imported deletion, a logged deletion replayed):
  // removes those that are resident and, with track_dirty, remembers every id (resident or
  // not) until CollectDirty reports it, so a durable pod deletes it from disk too;
  // meanwhile a row source is not asked for it (a missing row is then new: its initial
  // value, step 0). Returns how many resident rows it removed. Thread-safe.
  virtual size_t Delete(absl::Span<const int64_t> ids) = 0;
  // Eviction's delete: only the resident rows of `ids` not updated since `updated_before`
  // (their `updated` stamp is older), each checked under its stripe's lock, so a row
  // updated after it was chosen stays. Appends the ids it deleted to *deleted. Thread-safe.
  virtual void DeleteStale(absl::Span<const int64_t> ids, uint32_t updated_before,
                           std::vector<int64_t>* deleted) = 0;
  // Whether `id` was deleted (Delete) and not re-created, and the deletion may not be on
  // the row source's disk yet (it is until the CollectDirty after next). A reader of the
  // row source's disk directly (an export of a snapshot) must skip it. Thread-safe.
  virtual bool DeletePending(int64_t id) = 0;
  // The current time in stamp seconds (RowView::updated): seconds since the table was
  // created in this process, by TableOptions.clock.
  virtual uint32_t now_stamp() const = 0;

  // Removes the rows of `ids` that exist (their memory is reused by later rows); returns
  // how many were removed. Used when a vshard moves to another pod (the caller deletes
  // them from disk itself; see Delete for a deletion a durable pod must write). Thread-safe.
  virtual size_t Erase(absl::Span<const int64_t> ids) = 0;

  // Calls fn for every row (as CollectDirty, without clearing marks). Thread-safe.
  virtual size_t ForEachRow(const std::function<void(const RowView&)>& fn) = 0;

  // The admission counters, or null for a table that admits every id. Owned by the table.
  virtual AdmissionSketch* admission() = 0;
  // Counts a logged push of `id` at `step` into the admission counters as Push counted
  // it: step 0 a dropped gradient, step 1 an admission (a row is only ever created by
  // its admitting push); other steps (and tables without admission) count nothing. For
  // recovery and followers, which replay rows and counts separately. Thread-safe.
  virtual void CountLogged(int64_t id, uint64_t step) = 0;

  // Rows deleted by feature eviction (TTL, max_rows) since the table was created in this
  // process: the evicting caller counts them. Thread-safe.
  virtual void CountEvicted(uint64_t rows) = 0;
  virtual uint64_t evicted() const = 0;

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
