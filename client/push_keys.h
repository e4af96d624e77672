// The keys of a client's pushes: (worker id, incarnation, sequence), which the pods use to
// apply each push once however often it is retried, and what the client learns from the
// pods' answers to them (duplicates, reused keys).
#pragma once

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "client/client_counters.h"
#include "proto/ps.pb.h"

namespace ps::internal {

// Thread-safe.
class PushKeys {
 public:
  // worker_id 0: a random non-zero id is drawn (a master assigns ids in production).
  // first_sequence 0: the clock's microseconds since the Unix epoch (ClientOptions::
  // first_push_sequence says why). `counters` must outlive this.
  PushKeys(uint64_t worker_id, uint64_t incarnation, uint64_t first_sequence,
           ClientCounters* counters);

  uint64_t worker_id() const;
  uint64_t incarnation() const;

  // As PsClient::SetIdentity.
  absl::Status SetIdentity(uint64_t worker_id, uint64_t incarnation);

  // A key no earlier call of this client used: sequences count up by one.
  PushKey Next();

  // Records a pod's acknowledgement of a push RPC sent with `key`: `duplicate` as the
  // answer says, `attempts` the attempts it took. A duplicate answer to a first attempt
  // means the key was used before by someone else, and this push was dropped: counted and
  // logged (rate-limited WARNING).
  void Acknowledged(const PushKey& key, bool duplicate, int attempts);

 private:
  ClientCounters* const counters_;
  mutable absl::Mutex mu_;
  uint64_t worker_id_ ABSL_GUARDED_BY(mu_);
  uint64_t incarnation_ ABSL_GUARDED_BY(mu_);
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::internal
