// The primary's side of replication: one ordered stream of push-log records per follower
// (docs/architecture.md, "Replication").
//
// Ship() queues one encoded log record (ps/storage/log_record.h) for every follower of the
// current ack set and calls its `done` once each of them has answered that it holds the
// record durably. Each follower's stream is pipelined: records are numbered in the order
// Ship was called, and up to `window` ReplicateRecords calls (each of what is queued and
// not yet sent, up to max_batch_bytes) are in flight at once, from as many sender threads.
// The follower applies them strictly in number order whatever order they arrive in
// (ps/replica_order.h), so an answered batch means it holds every record up to the
// batch's end; a record counts as held once every batch up to it is answered. A failed
// call makes the stream resend from the first record not held (a new generation, whose
// first batch carries `restart` and goes alone until answered), with backoff, until the
// follower answers or the master takes it out of the ack set (SetFollowers without it):
// its queued records then count as held, since the master durably stopped waiting for
// it. Depose decides each queued record's outcome instead (this pod is no longer the
// primary of some vshards), and Abandon fails every one (the pod is stopping).
// Memory: the records queued for a follower that does not answer grow until its lag
// (Stats) gets it out of the ack set (the master's --replication_max_lag_ms); what is in
// flight is bounded by the window and max_inflight_bytes.
//
// Thread-safety: every method is thread-safe. `done` runs on a sender thread or on the
// caller's (SetFollowers, Depose, Abandon, Ship with no followers), never under this class's
// lock.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
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
  // The Replicator's call: `header` (no records) with `records` as its records, which the
  // sender may keep referenced until they are sent (the gRPC sender puts them on the wire
  // without a copy, proto/wire.h). By default, Send of the whole request (a copy).
  virtual absl::Status SendRecords(const ReplicaPeer& follower,
                                   const ReplicateRecordsRequest& header,
                                   absl::Span<const std::shared_ptr<const std::string>> records,
                                   ReplicateRecordsResponse* resp);
};

// ReplicateRecords over gRPC, one channel per follower address (kept). `channels` carries
// the pod-to-pod credentials (the admin role, as a move's export calls).
std::shared_ptr<ReplicaSender> NewGrpcReplicaSender(ChannelMaker channels, absl::Duration timeout);

struct ReplicatorOptions {
  // A batch's records, at most (one record may exceed it alone). 4 MiB is a few thousand
  // 1024-row pushes of dim 8: enough to amortize a round trip, small for the message limit.
  size_t max_batch_bytes = size_t{4} << 20;
  // ReplicateRecords calls in flight per follower, at most (one sender thread each). An
  // acknowledged push waits about one follower round trip plus its apply, instead of up to
  // two when calls go one at a time (docs/benchmarks.md, "Replication").
  int window = 4;
  // Record bytes in flight per follower beyond which no further call starts.
  size_t max_inflight_bytes = size_t{16} << 20;
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
  // listed have their streams stopped and their queued records counted as held. A follower
  // listed at another address than before (it registered, or restarted elsewhere) is still
  // in the ack set: its queued records keep waiting and go to the new address.
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
  // The same for a record shared with the caller (the pod's log holds it too): the
  // streams hold references until their followers hold it, never a copy.
  void Ship(std::shared_ptr<const std::string> record, Done done) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until every record shipped before the call is held by every follower whose
  // stream is still running (a stream stopped meanwhile no longer counts), and the `done`
  // callbacks of the records it held have returned (so a push's key is marked applied by
  // then: the materializer stores the key state after this, ps_core_replicate.cc). OK, or
  // DEADLINE_EXCEEDED at `deadline` naming the follower that lags. A primary's vshard
  // move calls it under its fence, so the followers hold all the copy holds.
  absl::Status WaitHeld(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // Fails every queued record with `why` and stops every stream.
  void Abandon(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);

  // A queued record's outcome when its pod is deposed, from its bytes: OK when this pod
  // still leads all its vshards. Runs under this class's lock, once per record: it must
  // not block nor call this object.
  using Outcome = std::function<absl::Status(const std::string& record)>;
  // This pod, deposed of some vshards at `epoch`, now has `followers`: SetFollowers, but
  // in one step, so that no record shipped meanwhile finds no stream and counts as held,
  // and each queued record's `done` gets outcome(record) rather than OK. A follower still
  // in the ack set keeps its stream: a record queued for it still waits until it holds it
  // (the kept vshards' rows of the record must reach it), then gets its outcome; for one
  // that left, the record's `done` gets its outcome at once.
  void Depose(const std::string& pod_id, uint64_t epoch, const std::vector<ReplicaPeer>& followers,
              const Outcome& outcome) ABSL_LOCKS_EXCLUDED(mu_);

  struct FollowerStats {
    std::string pod_id;
    uint64_t queued_records = 0;  // shipped, not yet held by it (its lag)
    uint64_t queued_bytes = 0;
    uint64_t held_records = 0;  // acknowledged by it since its stream started
    uint64_t failed_calls = 0;
    uint64_t sent_calls = 0;  // ReplicateRecords calls that succeeded
    uint64_t sent_bytes = 0;  // record bytes those calls carried
    absl::Duration lag;       // how long its oldest queued record has waited (0: none)
  };
  std::vector<FollowerStats> Stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Join;
  struct Entry;
  struct Stream;
  // One of a stream's `window` sender threads (detached; the stream outlives them: each
  // sees stop before it returns).
  void Run(Stream* stream);
  // Starts a stream for each of `followers` that has none, with the queue `queues` holds
  // for it (a follower at a new address), if any (`queues` may be null).
  void AddStreamsLocked(uint64_t epoch, const std::vector<ReplicaPeer>& followers,
                        std::map<std::string, std::deque<Entry>>* queues)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SetFollowers (null `outcome`) and Depose.
  void Reassign(const std::string& pod_id, uint64_t epoch,
                const std::vector<ReplicaPeer>& followers, const Outcome* outcome)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Stops `stream` and returns its queued records, for the caller to finish outside mu_.
  std::deque<Entry> StopLocked(Stream* stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<ReplicaSender> sender_;
  const ReplicatorOptions options_;

  mutable absl::Mutex mu_;
  std::string pod_id_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::shared_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  int threads_ ABSL_GUARDED_BY(mu_) = 0;  // sender threads not yet returned
  // Held records' callbacks run outside mu_, a batch at a time: each batch takes a ticket
  // (from next_callbacks_) while they run, so WaitHeld can wait for those before it.
  uint64_t next_callbacks_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<uint64_t> running_callbacks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps
