// Counts the client's work in flight (RPCs with their retries, map refreshes), so that
// destroying the client can wait until none is left.
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ps::internal {

// Thread-safe.
class InFlight {
 public:
  void Begin() {
    absl::MutexLock lock(&mu_);
    ++count_;
  }
  void End() {
    absl::MutexLock lock(&mu_);
    --count_;
  }
  // Blocks until every Begin has had its End.
  void WaitIdle() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* n) { return *n == 0; }, &count_));
  }

 private:
  absl::Mutex mu_;
  int count_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ps::internal
