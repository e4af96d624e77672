// The primary's side of replication: one ordered stream of push-log records per follower
// (docs/architecture.md, "Replication").
//
// Ship() queues one encoded log record (ps/storage/log_record.h) for every follower of the
// current ack set and calls its `done` once each of them has answered that it holds the
// record durably. Each follower has its own sender thread, which sends everything queued
// (up to max_batch_bytes) as one ReplicateRecords call, one call in flight at a time, in
// the order Ship was called: batching is what makes replication cheap per record. A
// failed call is retried (the same batch, with backoff) until the follower answers or the
// master takes it out of the ack set (SetFollowers without it): its queued records then
// count as held, since the master durably stopped waiting for it. Abandon fails every
// queued record instead (this pod is no longer the primary).
//
// Thread-safety: every method is thread-safe. `done` runs on a sender thread or on the
// caller's (SetFollowers, Abandon, Ship with no followers), never under this class's lock.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc/transport_security.h"
#include "proto/ps.pb.h"

namespace ps {

// How a batch reaches a follower: gRPC (NewGrpcReplicaSender), or a PsCore in the same
// process in tests. Send blocks until the answer or its deadline. Thread-safe.
class ReplicaSender {
 public:
  virtual ~ReplicaSender() = default;
  virtual absl::Status Send(const ReplicaPeer& follower, const ReplicateRecordsRequest& req,
                            ReplicateRecordsResponse* resp) = 0;
};

// ReplicateRecords over gRPC, one channel per follower address (kept). `channels` carries
// the pod-to-pod credentials (the admin role, as a move's export calls).
std::shared_ptr<ReplicaSender> NewGrpcReplicaSender(ChannelMaker channels, absl::Duration timeout);

struct ReplicatorOptions {
  // A batch's records, at most (one record may exceed it alone). 4 MiB is a few thousand
  // 1024-row pushes of dim 8: enough to amortize a round trip, small for the message limit.
  size_t max_batch_bytes = size_t{4} << 20;
  // Backoff between attempts of a failed batch, doubling from min to max.
  absl::Duration min_backoff = absl::Milliseconds(10);
  absl::Duration max_backoff = absl::Milliseconds(500);
};

class Replicator {
 public:
  using Done = std::function<void(absl::Status)>;
  // `sender` must be thread-safe; it is shared with nobody else's lifetime rules.
  Replicator(std::shared_ptr<ReplicaSender> sender, ReplicatorOptions options = {});
  // Stops the senders; records still queued get UNAVAILABLE.
  ~Replicator();

  // Installs the ack set: `pod_id` (this pod) at shard-map `epoch`, with these followers.
  // New followers get a stream (starting with the next record shipped); followers no longer
  // listed have their streams stopped and their queued records counted as held.
  void SetFollowers(const std::string& pod_id, uint64_t epoch,
                    const std::vector<ReplicaPeer>& followers) ABSL_LOCKS_EXCLUDED(mu_);
  // Adds streams for the `followers` that have none (starting with the next record
  // shipped) and raises the epoch; removes nobody and finishes nothing, so it may be called
  // under the caller's locks. A pod whose assignment adds a follower calls this before any
  // change can apply under that assignment (a vshard copy's fence, master/rereplicator.h),
  // so the new follower receives every record after the copy; SetFollowers then keeps it.
  void AddFollowers(const std::string& pod_id, uint64_t epoch,
                    const std::vector<ReplicaPeer>& followers) ABSL_LOCKS_EXCLUDED(mu_);
  // The epoch sent with the next batches (a newer assignment with the same followers).
  void SetEpoch(uint64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether any follower is in the ack set.
  bool active() const ABSL_LOCKS_EXCLUDED(mu_);
  // Queues `record` for every follower; done(OK) once all hold it (at once without
  // followers). Call in the order the records must be applied.
  void Ship(std::string record, Done done) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until every record shipped before the call is held by every follower whose
  // stream is still running (a stream stopped meanwhile no longer counts). OK, or
  // DEADLINE_EXCEEDED at `deadline` naming the follower that lags. A primary's vshard
  // move calls it under its fence, so the followers hold all the copy holds.
  absl::Status WaitHeld(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // Fails every queued record with `why` and stops every stream.
  void Abandon(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);

  struct FollowerStats {
    std::string pod_id;
    uint64_t queued_records = 0;  // shipped, not yet held by it (its lag)
    uint64_t queued_bytes = 0;
    uint64_t held_records = 0;  // acknowledged by it since its stream started
    uint64_t failed_calls = 0;
  };
  std::vector<FollowerStats> Stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Join;
  struct Entry;
  struct Stream;
  // A stream's sender thread (detached; it holds the stream alive until it sees stop).
  void Run(Stream* stream);
  // Starts a stream for each of `followers` that has none.
  void AddStreamsLocked(uint64_t epoch, const std::vector<ReplicaPeer>& followers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops `stream` and returns its queued records, for the caller to finish outside mu_.
  std::deque<Entry> StopLocked(Stream* stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<ReplicaSender> sender_;
  const ReplicatorOptions options_;

  mutable absl::Mutex mu_;
  std::string pod_id_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::shared_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  int threads_ ABSL_GUARDED_BY(mu_) = 0;  // sender threads not yet returned
};

}  // namespace ps
