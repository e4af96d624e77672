// Acknowledgements that wait for an fsync of the push log, in groups: the changes a pod
// acknowledges only once its log is durable on disk (--durability=periodic, a vshard whose
// ack set is empty: docs/architecture.md, "Replication"). Each Add'ed callback runs after
// one call of `sync` that started after the Add (one call covers every callback added
// before it started: group commit), with that call's status.
//
// Usage:
//   SyncedAcks acks([storage] { return storage->SyncApplied(); });
//   storage->ApplyLogged(..., [&acks, done](absl::Status s) {
//     if (!s.ok()) return done(s);
//     acks.Add(done);  // done(OK) once the record is fsynced
//   });
//
// Thread-safety: every method is thread-safe. Callbacks run on this class's thread (or on
// the caller's after Stop), never under its lock; `sync` runs on its thread, one call at
// a time. Memory: the callbacks waiting, as many as the changes in flight.
#pragma once

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ps {

class SyncedAcks {
 public:
  using Done = std::function<void(absl::Status)>;
  // `sync` makes every change applied so far durable, or returns why not
  // (PodStorage::SyncApplied); it must stay callable until Stop returns. `clock` times the
  // waits (Stats); tests inject a fake one.
  explicit SyncedAcks(std::function<absl::Status()> sync,
                      std::function<absl::Time()> clock = absl::Now);
  // Stop.
  ~SyncedAcks();
  SyncedAcks(const SyncedAcks&) = delete;
  SyncedAcks& operator=(const SyncedAcks&) = delete;

  // done(status of the next sync) once a sync that started after this call returned; after
  // Stop, done(UNAVAILABLE) at once (the pod is closing: the client retries its key).
  void Add(Done done) ABSL_LOCKS_EXCLUDED(mu_);
  // Syncs once more for the callbacks waiting, runs them, and stops the thread; `sync` is
  // not called afterwards. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Syncs done so far, and callbacks run after one.
  uint64_t syncs() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t acks() const ABSL_LOCKS_EXCLUDED(mu_);
  struct Stats {
    uint64_t syncs = 0, acks = 0;  // as above
    absl::Duration sync_time;      // spent in `sync`, over every call
    // From each callback's Add to the end of the sync that covered it, summed over the
    // callbacks run (ack_wait / acks: the mean wait an acknowledgement took).
    absl::Duration ack_wait;
  };
  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run();
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // something to do

  struct Waiting {
    Done done;
    absl::Time added;
  };

  const std::function<absl::Status()> sync_;
  const std::function<absl::Time()> clock_;

  mutable absl::Mutex mu_;
  std::vector<Waiting> waiting_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // started last: it reads the members above
};

}  // namespace ps
