// A test-and-test-and-set lock for very short critical sections (a row copy or update,
// ~100 ns). Uncontended it is one atomic exchange and one store, against ~30 ns for
// absl::Mutex with Debian's build (which checks for deadlocks on every lock). After a
// short spin it yields, so a holder descheduled on an oversubscribed host is not starved.
//
// It is also a sequence lock: every hold moves a version counter from even to odd when
// the lock is taken and back to even when it is released, so a reader may read what the
// lock guards WITHOUT taking it and then check that no holder came in between:
//
//   uint32_t v;                    // under the lock: v = lock.version_after_unlock();
//   ...                            // after releasing it:
//   copy the guarded bytes;        // may race with a hold that begins meanwhile, so
//   if (lock.Unchanged(v)) use the copy;   // only a copy no hold began before is used
//   else take the lock and read again.
//
// The version only grows, so an unchanged version after the copy means no hold began
// after v's: every write the copy could have seen comes after the odd store of a later
// hold. The guarded memory must stay allocated for as long as such a reader may look at
// it (the embedding table never frees its rows). A copy that raced with a writer is
// thrown away, never used: the race is the seqlock's benign one (H. Boehm, "Can seqlocks
// get along with programming language memory models?", 2012); reading with per-float
// relaxed atomics instead would cost as much as the lock it saves.
#pragma once

#include <sched.h>

#include <atomic>

#include "absl/base/thread_annotations.h"

namespace ps {

class ABSL_LOCKABLE SpinLock {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    for (int spins = 0; locked_.exchange(true, std::memory_order_acquire); ++spins) {
      while (locked_.load(std::memory_order_relaxed)) {
        if (++spins > 64) {
          sched_yield();
        } else {
          __builtin_ia32_pause();
        }
      }
    }
    // Odd from here: the writer side of a seqlock (the fence keeps the guarded writes
    // after this store; on x86 it is free).
    version_.store(version_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    version_.store(version_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    locked_.store(false, std::memory_order_release);
  }

  // The version once the current hold ends. Call only while holding the lock.
  uint32_t version_after_unlock() const { return version_.load(std::memory_order_relaxed) + 1; }
  // After an optimistic read: true if no hold has begun since the one whose
  // version_after_unlock returned v, so the bytes read are what that holder left.
  bool Unchanged(uint32_t v) const {
    std::atomic_thread_fence(std::memory_order_acquire);  // the read before the check
    return version_.load(std::memory_order_relaxed) == v;
  }

 private:
  std::atomic<bool> locked_{false};
  std::atomic<uint32_t> version_{0};
};

class ABSL_SCOPED_LOCKABLE SpinLockHolder {
 public:
  explicit SpinLockHolder(SpinLock* lock) ABSL_EXCLUSIVE_LOCK_FUNCTION(lock) : lock_(lock) {
    lock_->Lock();
  }
  ~SpinLockHolder() ABSL_UNLOCK_FUNCTION() { lock_->Unlock(); }
  SpinLockHolder(const SpinLockHolder&) = delete;
  SpinLockHolder& operator=(const SpinLockHolder&) = delete;

 private:
  SpinLock* lock_;
};

}  // namespace ps
