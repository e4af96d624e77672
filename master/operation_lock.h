// OperationLock: one cluster-wide operation at a time. Drain and Rebalance change the map
// through a series of moves and Checkpoint copies the pods while the map must hold still,
// so none of them may overlap. The mutex is owned by MasterCore and shared by Balancer and
// Checkpoints; it is only ever taken with TryLock (a second operation is refused, never
// queued), so it cannot deadlock, and it is held across the whole operation, before any
// part's lock.
//
// Usage:
//   OperationLock op(operation_mu_);
//   if (!op.held()) return absl::AbortedError("another drain or rebalance is running");
#pragma once

#include "absl/synchronization/mutex.h"

namespace ps {

class OperationLock {
 public:
  // Takes `mu` if it is free; `mu` must outlive this.
  explicit OperationLock(absl::Mutex* mu) : mu_(mu), held_(mu->TryLock()) {}
  ~OperationLock() {
    if (held_) mu_->Unlock();
  }
  OperationLock(const OperationLock&) = delete;
  OperationLock& operator=(const OperationLock&) = delete;

  // Whether this holds the mutex (the operation may run).
  bool held() const { return held_; }

 private:
  absl::Mutex* const mu_;
  const bool held_;
};

}  // namespace ps
