// Rereplicator: keeps every vshard at R copies (R >= 2) by re-replication. After a follower
// is dropped from an ack set (its lease ran out, its storage was lost) or a failover used
// one up, a thread of its own plans the missing copies (rereplicate_plan.h) and runs them
// one at a time as follower copies (MoveRunner::FillFollower): the vshard-move copy from
// the primary while it serves, whose commit adds the new follower to the ack sets. A
// dropped follower that comes back is filled the same way (its old rows are older than
// the copy's and are replaced; the install rule decides by step).
//
// Copies beyond R (a copy filled for a follower that registered later, pods started one
// after another) are trimmed the same way: the surplus follower leaves the ack sets
// (Membership::TrimAckSets) and drops the rows when told.
//
// Rounds run every `interval` and when Wake() is called (a pod registered, a failover).
// Each copy holds the operation lock (operation_lock.h), so a drain, rebalance or
// checkpoint never interleaves with one; a round that finds an operation running, or a
// move in flight, ends and the next round plans again. A failed copy is aborted like any
// move (the vshards keep their primary and ack set), logged and counted; the next round
// retries it.
//
// Thread-safety: every method is thread-safe. The destructor stops the thread, waiting for
// the copy it runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "master/master_options.h"
#include "master/membership.h"
#include "master/move_runner.h"

namespace ps {

class Rereplicator {
 public:
  // `options`, `membership`, `runner` and `operation_mu` must outlive this.
  Rereplicator(const MasterOptions& options, Membership* membership, MoveRunner* runner,
               absl::Mutex* operation_mu)
      : options_(options), membership_(membership), runner_(runner), operation_mu_(operation_mu) {}
  ~Rereplicator() ABSL_LOCKS_EXCLUDED(mu_);
  Rereplicator(const Rereplicator&) = delete;
  Rereplicator& operator=(const Rereplicator&) = delete;

  // Starts the thread (call once, after Load; nothing happens at R = 1 rounds: the plan is
  // empty).
  void Start(absl::Duration interval) ABSL_LOCKS_EXCLUDED(mu_);
  // Asks for a round now. Does not wait.
  void Wake() ABSL_LOCKS_EXCLUDED(mu_);
  // One round, on the caller's thread: trims ack sets beyond R - 1 (PlanTrims), plans the
  // missing copies and runs them in order, then trims again (a copy may have filled the
  // place of a follower that is not live). OK when every planned copy committed (or none
  // was needed); ABORTED when an operation or a move was running; else the first failed
  // step's error (the rest wait for the next round). For the thread and tests.
  absl::Status RunOnce();

  // Copies committed and failed since the start; rows and bytes the committed ones copied.
  struct Stats {
    uint64_t copies = 0, failures = 0, rows = 0, bytes = 0;
  };
  Stats stats() const;

 private:
  void Loop(absl::Duration interval) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes the surplus followers out of the ack sets (PlanTrims, Membership::TrimAckSets)
  // under the operation lock, and tells the pods concerned. ABORTED while an operation runs.
  absl::Status Trim();

  const MasterOptions& options_;
  Membership* const membership_;
  MoveRunner* const runner_;
  absl::Mutex* const operation_mu_;

  std::atomic<uint64_t> copies_{0}, failures_{0}, rows_{0}, bytes_{0};
  absl::Mutex mu_;
  bool wanted_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ps
