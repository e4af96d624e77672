// The one retry policy of every client call (pods and master, C++ and, through the
// binding, Python): which codes are retried, the backoff between attempts, the deadline
// of each attempt, and when a client that follows a master refreshes its shard map.
//
//   RetryPolicy policy({.max_attempts = 5});
//   absl::Status s = policy.Run([&](grpc::ClientContext* ctx) {
//     return stub->GetTask(ctx, req, &resp);
//   }, "master host:port GetTask");
//
// The rules:
// - Retried: UNAVAILABLE (not reachable, queue full, a fenced vshard), ABORTED (the same
//   push key is being applied now) and DEADLINE_EXCEEDED (its fate unknown). Only calls
//   that are safe to repeat are retried this way: reads, idempotent creations, pushes with
//   their key, master calls the master de-duplicates. Every other code is final.
// - Backoff before attempt k+1 (after k failed): uniform in [b/2, b] with
//   b = min(max_backoff, initial_backoff * 2^(k-1)). The jitter spreads the retries of
//   many workers after a shared fault.
// - Map refresh: from the third attempt on, a client that follows a master refreshes its
//   map before resending (a pod restarted at a new address is found there); one or two
//   transient errors do not cost a master round trip.
// - A wrong-shard refusal (proto/wrong_shard.h) is not a retry: the request is routed
//   again under the new map (client/rpc_runner.h).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ps {

struct RetryOptions {
  // Attempts per call, the first included. With the backoff below, 10 attempts wait 4.5
  // to 9.1 s in all: enough to ride out a pod or master restart, not a permanent outage.
  int max_attempts = 10;
  absl::Duration initial_backoff = absl::Milliseconds(20);
  absl::Duration max_backoff = absl::Seconds(4);
  // Deadline of each attempt. A 1M-row batch takes well under a second on loopback; 10 s
  // leaves room for a loaded pod without hanging a worker on a dead one.
  absl::Duration attempt_timeout = absl::Seconds(10);
};

// Immutable after construction; thread-safe.
class RetryPolicy {
 public:
  explicit RetryPolicy(RetryOptions options = {}) : options_(options) {}

  // INVALID_ARGUMENT unless max_attempts >= 1, 0 < initial_backoff <= max_backoff and
  // attempt_timeout > 0.
  static absl::Status Validate(const RetryOptions& options);

  const RetryOptions& options() const { return options_; }

  // UNAVAILABLE, ABORTED, DEADLINE_EXCEEDED.
  static bool IsRetryable(absl::StatusCode code);
  // Whether a call whose attempt number `attempts` (1-based) just failed with `code` is
  // tried again: a retryable code with attempts left.
  bool ShouldRetry(absl::StatusCode code, int attempts) const {
    return IsRetryable(code) && attempts < options_.max_attempts;
  }
  // The wait before the next attempt after `attempts` failed ones (>= 1), with jitter.
  absl::Duration Backoff(int attempts) const;
  // Whether a client following a master refreshes its map before attempt `attempt`
  // (1-based): from the third on.
  static bool RefreshMapBefore(int attempt) { return attempt >= 3; }
  // The deadline of an attempt that starts now.
  std::chrono::system_clock::time_point AttemptDeadline() const;

  // The final status of a call as the caller sees it: `s` converted (FromGrpcStatus, with
  // `where` naming the peer), and "[after N attempts]" when it was tried more than once.
  static absl::Status Final(const grpc::Status& s, absl::string_view where, int attempts);

  // A blocking call under this policy: runs `attempt` with a fresh context whose deadline
  // is AttemptDeadline(), retrying as ShouldRetry says after Backoff (sleeping on this
  // thread), and returns Final(...). `*attempts` (if given) receives the attempts made.
  // `attempt` must reset whatever response it fills, if a partial answer matters.
  absl::Status Run(const std::function<grpc::Status(grpc::ClientContext*)>& attempt,
                   absl::string_view where, int* attempts = nullptr) const;

 private:
  const RetryOptions options_;
};

}  // namespace ps
