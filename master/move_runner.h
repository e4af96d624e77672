// MoveRunner: one live vshard move, source pod A -> destination pod B, start to commit or
// abort, and the record of the last finished moves for status.
//   1. Record it (Membership::BeginMove: MoveRecord, epoch + 1, one synced write), then
//      send A and B their assignments (moving_out / moving_in), and the followers of
//      their vshards theirs (the epoch A's and B's records now carry).
//   2. A: MigrateBegin (tracking starts). B: MigrateImport, which copies from A, fences A
//      for the final delta and returns once B holds everything durably.
//   3. Commit (Membership::CommitMove: the map names B, epoch + 1, the record deleted, one
//      synced write). Then B, A and those followers (a replaced follower too) get their
//      assignments at once: B serves, A drops the rows, the followers take B's records.
//      A follower copy (FillFollower, re-replication) commits B into the vshards' ack sets
//      instead: A keeps serving them, and ships its records to B from its fence's end on.
// Any failure before the commit aborts: the record is deleted (epoch + 1) and the same pods
// told; A keeps the vshards (and unfences), B drops what it copied. A master that restarts
// with a record aborts it (Membership::Load). So the map always names exactly one owner.
//
// Thread-safety: every method is thread-safe; Membership allows one move in flight, so a
// second concurrent MoveVShards is refused. Lock order: this one's, then Membership's.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "master/master_options.h"
#include "master/membership.h"
#include "proto/master.pb.h"
#include "proto/master_state.pb.h"

namespace ps {

class MoveRunner {
 public:
  // `options` (its pod_control set) and `membership` must outlive this.
  MoveRunner(const MasterOptions& options, Membership* membership)
      : options_(options), membership_(membership) {}

  // Lists the moves Membership::Load aborted (left by the previous master) as recent ones.
  void Load(const std::vector<MoveRecord>& aborted_at_start) ABSL_LOCKS_EXCLUDED(mu_);

  // One move of `vshards` from pod `source` to pod `destination` (both live), start to
  // commit or abort. The errors of Membership::BeginMove (ABORTED while another move runs),
  // or the error of the failed step (the move aborted).
  absl::StatusOr<MoveInfo> MoveVShards(const std::string& source, const std::string& destination,
                                       const std::vector<uint32_t>& vshards)
      ABSL_LOCKS_EXCLUDED(mu_);

  // A follower copy (re-replication, master/rereplicator.h; a follower moved by a drain):
  // the same steps, but the commit adds `follower` to the ack sets of `vshards` (in place
  // of `replaces` when given; Membership::CommitMove), and `primary` keeps them: its fence
  // ends with the commit, after it has started streaming to `follower`. The errors of
  // MoveVShards.
  absl::StatusOr<MoveInfo> FillFollower(const std::string& primary, const std::string& follower,
                                        const std::vector<uint32_t>& vshards,
                                        const std::string& replaces = "") ABSL_LOCKS_EXCLUDED(mu_);

  // Adds to the status the move in flight (COPYING), then the recent moves, newest first.
  void Describe(StatusResponse* resp) const ABSL_LOCKS_EXCLUDED(mu_);

  // Sends pod `pod_id` its assignment now (best effort: a failure is logged, and the pod's
  // next heartbeat brings it). Also used after a failover.
  void NotifyPod(const std::string& pod_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Tells each of `pods` its assignment, all at once (NotifyPod each, one thread each);
  // returns when all answered or failed.
  void NotifyPods(const std::vector<std::string>& pods) ABSL_LOCKS_EXCLUDED(mu_);
  // Tells `pods` their assignments (as they are when sent) from a thread of this runner's,
  // without waiting: for callers that must not wait for a pod that does not answer (a
  // registration, whose own RPC has a deadline of its own). Pods already queued are told
  // once. The destructor waits for the pods being told, if any, and drops the rest (their
  // heartbeats bring it).
  void NotifyPodsSoon(const std::vector<std::string>& pods) ABSL_LOCKS_EXCLUDED(later_mu_);
  ~MoveRunner() ABSL_LOCKS_EXCLUDED(later_mu_);

 private:
  // MoveVShards (follower false) or FillFollower (true).
  absl::StatusOr<MoveInfo> Run(const std::string& source, const std::string& destination,
                               const std::vector<uint32_t>& vshards, bool follower,
                               const std::string& replaces) ABSL_LOCKS_EXCLUDED(mu_);
  // Aborts move `id` (the source keeps its vshards) and tells both pods and `also_told`
  // (Membership::StartedMove).
  void AbortMove(uint64_t id, const std::vector<std::string>& also_told, const std::string& why)
      ABSL_LOCKS_EXCLUDED(mu_);
  // NotifyPods of `source`, `destination` and `others`.
  void NotifyPods(const std::string& source, const std::string& destination,
                  const std::vector<std::string>& others) ABSL_LOCKS_EXCLUDED(mu_);
  void Remember(MoveInfo info) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The thread of NotifyPodsSoon: tells what is queued until stopping_.
  void NotifyLoop() ABSL_LOCKS_EXCLUDED(later_mu_);

  const MasterOptions& options_;
  Membership* const membership_;

  absl::Mutex later_mu_;                                    // never held with another lock
  std::set<std::string> later_ ABSL_GUARDED_BY(later_mu_);  // pods to tell soon
  bool stopping_ ABSL_GUARDED_BY(later_mu_) = false;
  std::thread notifier_ ABSL_GUARDED_BY(later_mu_);  // started at the first NotifyPodsSoon

  mutable absl::Mutex mu_ ABSL_ACQUIRED_BEFORE(membership_->mutex());
  std::vector<MoveInfo> recent_ ABSL_GUARDED_BY(mu_);  // oldest first
};

}  // namespace ps
