// The master's `counters` record: one stored proto whose fields belong to different parts.
//   next_worker_id, table_versions, retired_*   JobDispatcher
//   catalog_version                  Catalog
//   next_move_id                     Membership
//   next_checkpoint_id               Checkpoints
// Each part changes only its own fields, and only under its own lock, so it may read them
// with Get() and then Write the next value. Write serializes the read-modify-write of the
// whole record, so parts holding different locks never overwrite each other's fields.
//
// Lock order: a part's lock, then write_mu_, then mu_ (the innermost lock of the master).
// Readers take only mu_, briefly: they never wait for a disk write.
#pragma once

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "master/master_store.h"
#include "proto/master_state.pb.h"

namespace ps {

class CountersRecord {
 public:
  // `store` must outlive this.
  explicit CountersRecord(MasterStore* store) : store_(store) {}

  // Reads the stored record (absent: all zero). DATA_LOSS when it does not parse.
  absl::Status Load() ABSL_LOCKS_EXCLUDED(write_mu_, mu_);

  // A copy of the current counters. Thread-safe.
  Counters Get() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t catalog_version() const ABSL_LOCKS_EXCLUDED(mu_);

  // Adds to `batch` the counters as `edit` leaves a copy of the current ones, writes the
  // batch (synced), and only then makes that copy current. On error nothing changed.
  // `edit` runs under the lock and must only change fields of the caller's part.
  // Thread-safe; concurrent Writes run one after another.
  absl::Status Write(StoreBatch batch, absl::FunctionRef<void(Counters*)> edit)
      ABSL_LOCKS_EXCLUDED(write_mu_, mu_);

  // For the ABSL_ACQUIRED_BEFORE annotations of the parts' locks; never lock it from outside.
  absl::Mutex* write_mutex() const ABSL_LOCK_RETURNED(write_mu_) { return &write_mu_; }

 private:
  MasterStore* const store_;
  mutable absl::Mutex write_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // held across Write's disk write
  mutable absl::Mutex mu_;
  Counters counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps
