// The keys of a client's pushes: (worker id, incarnation, sequence), which the pods use to
// apply each push once however often it is retried.
#pragma once

#include <atomic>
#include <cstdint>
#include <random>

#include "proto/ps.pb.h"

namespace ps::internal {

// Thread-safe.
class PushKeys {
 public:
  // worker_id 0: a random non-zero id is drawn (a master assigns ids in production).
  PushKeys(uint64_t worker_id, uint64_t incarnation)
      : worker_id_(worker_id), incarnation_(incarnation) {
    if (worker_id_ == 0) {
      std::random_device rd;
      while (worker_id_ == 0) worker_id_ = (uint64_t{rd()} << 32) | rd();
    }
  }

  uint64_t worker_id() const { return worker_id_; }

  // A key no earlier call of this client used: sequences count up from 1.
  PushKey Next() {
    PushKey key;
    key.set_worker_id(worker_id_);
    key.set_incarnation(incarnation_);
    key.set_sequence(sequence_.fetch_add(1, std::memory_order_relaxed));
    return key;
  }

 private:
  uint64_t worker_id_;  // constant after construction
  const uint64_t incarnation_;
  std::atomic<uint64_t> sequence_{1};
};

}  // namespace ps::internal
