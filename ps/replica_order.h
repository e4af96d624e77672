// A follower's ordering of its primaries' pipelined batches (docs/architecture.md,
// "Replication"). A primary keeps several ReplicateRecords calls in flight per follower
// (ps/replicator.h); they may reach the follower in any order, on any pool thread. Submit
// runs each primary's batches strictly in record-number order, one at a time: a batch
// ahead of the next expected number is parked (no thread waits for it) and run by the
// thread that finishes the batch before it.
//
// Per primary (pod id) it keeps one stream: its id and the next record number expected. A
// batch (proto/ps.proto, ReplicateRecordsRequest: stream, first, restart)
//  - of stream 0 (a sender that does not number its batches) runs at once, unordered;
//  - of the known stream, whose first number is at most the next expected, runs (records
//    that come again are replayed idempotently, as a retried batch always was);
//  - ahead of the next expected number is parked, at most max_parked per primary (beyond
//    that: UNAVAILABLE);
//  - with `restart` runs in its turn and (re)starts the stream at `first` when the stream is
//    new or `first` is ahead (the primary says every record below `first` is held here);
//    the parked batches of another stream then fail (UNAVAILABLE);
//  - of another stream without `restart` fails at once (UNAVAILABLE): this follower
//    restarted, or the primary started a new stream; the primary resends from the records
//    it knows are held, with `restart`.
// A batch that applies fewer records than it carries fails the parked batches after it
// (the primary resends from its acknowledged point). A batch parked longer than max_wait
// (the primary's call has timed out and it will resend) fails at the next Submit.
//
// Thread-safety: thread-safe. `run` is called without this class's lock, and never for two
// batches of one primary at once.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ps {

struct ReplicaOrderOptions {
  // Batches parked per primary, at most: the primary's window (ReplicatorOptions::window)
  // plus the batches of a resend after a failed call.
  size_t max_parked = 32;
  // Longer than the primary's call deadline (5 s): by then it has given up on the call.
  absl::Duration max_wait = absl::Seconds(10);
};

class ReplicaOrder {
 public:
  // Called once per batch. With OK: applies the batch, answers the primary (now or once
  // durable) and returns how many of its records applied (all of them unless one failed).
  // With an error: answers the primary with it and returns 0.
  using Run = std::function<uint64_t(absl::Status turn)>;

  explicit ReplicaOrder(ReplicaOrderOptions options = {}) : options_(options) {}
  // Fails every parked batch (the pod is stopping).
  ~ReplicaOrder();

  // Runs `run` for the batch of `count` records numbered from `first` in `primary`'s
  // stream `stream`, in its turn: on this thread, or later on the thread that finishes the
  // batch before it. `primary` is copied (it may die with the batch's answer).
  void Submit(const std::string& primary, uint64_t stream, uint64_t first, uint64_t count,
              bool restart, Run run) ABSL_LOCKS_EXCLUDED(mu_);

  // Batches parked so far (they arrived ahead of their turn), and refused out of order.
  uint64_t parked_total() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t refused_total() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Batch {
    uint64_t stream = 0, first = 0, count = 0;
    bool restart = false;
    Run run;
    absl::Time since;
  };
  struct Primary {
    uint64_t stream = 0;  // 0: none yet
    uint64_t next = 0;    // the number of the next record expected
    bool busy = false;    // a batch of this primary is running
    std::vector<Batch> parked;
  };
  static bool Runnable(const Primary& p, const Batch& b);
  // Moves the parked batches that `fail` selects to `out`.
  template <typename Pred>
  static void TakeParked(Primary& p, Pred fail, std::vector<Batch>* out);
  // Answers each of `batches` UNAVAILABLE (the primary resends) and clears it. Without mu_.
  static void FailAll(std::vector<Batch>* batches);

  const ReplicaOrderOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, Primary> primaries_ ABSL_GUARDED_BY(mu_);
  uint64_t parked_total_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ps
