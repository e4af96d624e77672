// Membership: the PS pods (registry and leases) and the vshard -> pod map with its epoch,
// including the move in flight (the map's vshards being copied; at most one). It owns the
// store keys `map`, `pod/<id>` and `move/<id>` (and, in `counters`, next_move_id).
//
// Every change is written to the store (synced) before memory changes; on error nothing
// changed. Leases live in memory only: Load gives every known pod a fresh one.
//
// Thread-safety: every method is thread-safe, under one mutex of its own that is never held
// while talking to pods. A heartbeat or GetShardMap waits only for another membership
// change's synced write (BeginMove's includes the counters record, so it may first wait for
// another part's write of that), never for the catalog's or the job dispatcher's work or a
// move's copy. Lock order: MoveRunner's lock, then this one, then CountersRecord's.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "master/cluster_view.h"
#include "master/counters_record.h"
#include "master/master_options.h"
#include "master/master_store.h"
#include "proto/master.pb.h"
#include "proto/master_state.pb.h"

namespace ps {

class Membership {
 public:
  // `options`, `store` and `counters` must outlive this. Call Load before anything else.
  Membership(const MasterOptions& options, const ClusterConfig& config, MasterStore* store,
             CountersRecord* counters)
      : options_(options), config_(config), store_(store), counters_(counters) {}

  // Reads the map and the pods (each LIVE until `lease_deadline`), and aborts the moves a
  // previous master left in flight: their records deleted and epoch + 1 in one synced write
  // (the sources still own the vshards; both pods drop the move's state at their next
  // heartbeat). Returns those moves. DATA_LOSS for a missing or malformed record; store
  // errors as they come.
  absl::StatusOr<std::vector<MoveRecord>> Load(absl::Time lease_deadline) ABSL_LOCKS_EXCLUDED(mu_);

  // The pod RPCs of proto/master.proto: OK or the most specific error, nothing changed on
  // error. RegisterPod sets `*joined_empty` (when not null) to whether a pod at a new address
  // that owns no vshards joined (a new pod, or a drained one back): worth a rebalance.
  // A pod that registers with another storage id than the one recorded (its volume was
  // lost; membership_replicas.cc), or at R >= 2 with `log_tail_lost` (its log may lack
  // records it acknowledged before a crash), has its copies forgotten as ExpireLeases
  // does, at once; the pods whose role that changed are appended to `*tell` (when not
  // null), and so are, when it registers at a new address, the primaries it follows
  // (their streams to it need that address).
  absl::Status RegisterPod(const RegisterPodRequest& req, RegisterPodResponse* resp,
                           bool* joined_empty, std::vector<std::string>* tell = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status PodHeartbeat(const PodHeartbeatRequest& req, PodHeartbeatResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status LeavePod(const LeavePodRequest& req, LeavePodResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status GetShardMap(const GetShardMapRequest& req, ShardMapResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Marks (and logs, once) the pods whose lease ran out by `now` as LOST. With replication
  // (membership_replicas.cc), a lost pod also leaves the ack sets it was in, and each vshard
  // it was the primary of is promoted to its first live follower (it holds every
  // acknowledged push): one synced write, epoch + 1, logged and counted. Returns the pods
  // whose role changed, to be told at once (their heartbeats bring it otherwise).
  std::vector<std::string> ExpireLeases(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // Promotions since this master started, and the longest time from a primary's last
  // heartbeat to its vshards' promotion.
  uint64_t failovers() const { return failovers_.load(); }
  // Vshard copies taken out of ack sets since this master started: by the follower's loss
  // (FailOver: its lease ran out, or its data was lost), and by a primary's report of a lagging or
  // unreachable follower (membership_reports.cc).
  uint64_t ack_set_removals_lease() const { return removed_lease_.load(); }
  uint64_t ack_set_removals_lag() const { return removed_lag_.load(); }
  // At R >= 3, the followers a failover leaves out of a promoted vshard's ack set (they may
  // lack records the new primary holds; re-replication copies them again).
  uint64_t ack_set_removals_failover() const { return removed_failover_.load(); }
  // Registrations whose data was not what the pod had (a lost volume) since this master
  // started.
  uint64_t storage_losses() const { return storage_losses_.load(); }
  // Registrations at R >= 2 whose log may lack acknowledged records (log_tail_lost) since
  // this master started.
  uint64_t log_tail_losses() const { return log_tail_losses_.load(); }
  // Fills the status's epoch, num_vshards and pods as of `now`.
  void Describe(absl::Time now, StatusResponse* resp) const ABSL_LOCKS_EXCLUDED(mu_);
  // A copy of the map and the pods now, for planning drains, rebalances and checkpoints.
  ClusterView View() const ABSL_LOCKS_EXCLUDED(mu_);
  // Records pod `pod_id` as drained (a rebalance gives it nothing); OK without a write when
  // it is not registered or already drained.
  absl::Status MarkDrained(const std::string& pod_id) ABSL_LOCKS_EXCLUDED(mu_);

  // ---- The move in flight (MoveRunner drives it) ----
  struct StartedMove {
    MoveRecord move;
    std::string source_address, destination_address;
    // The other pods to tell of each map change of the move (begin, commit, abort) with
    // source and destination: the followers of every vshard either leads (their streams
    // carry the new epoch, and a follower behind a record's epoch refuses rows of vshards
    // it does not follow until it learns it: told at its next heartbeat only, the streams
    // stall and so do the pushes and the fence waiting on them; an owner move's followers
    // also get a new primary) and a follower copy's `replaces` (it leaves the ack sets).
    std::vector<std::string> also_told;
  };
  // Records a move of `vshards` from `source` to `destination` (both live) and bumps the
  // epoch: the pods' assignments now carry it. With `follower` it is a follower copy
  // (master/rereplicator.h): at the commit `destination` joins the vshards' ack sets (in
  // place of `replaces` when given, which must be in each) and `source` keeps them. At
  // R >= 2 an owner move's destination must not be in a vshard's ack set (copies stay on
  // distinct pods); its followers stay. ABORTED while another move is in flight;
  // INVALID_ARGUMENT without vshards or with source == destination; UNAVAILABLE for a pod
  // that is not live; FAILED_PRECONDITION for a vshard `source` does not own, a follower
  // copy at R = 1, or a destination or `replaces` the ack sets rule out.
  absl::StatusOr<StartedMove> BeginMove(const std::string& source, const std::string& destination,
                                        const std::vector<uint32_t>& vshards, bool follower = false,
                                        const std::string& replaces = "") ABSL_LOCKS_EXCLUDED(mu_);
  // Commits move `id`: its vshards belong to its destination (a follower copy: the
  // destination joins their ack sets), epoch + 1, the record deleted, in one synced write.
  // Returns the new epoch. INTERNAL when `id` is not in flight; FAILED_PRECONDITION (nothing
  // written; abort it) when its source no longer owns the vshards (a failover came
  // between: the copy may miss what the new primary took), or for a follower copy whose
  // destination is no longer live.
  absl::StatusOr<uint64_t> CommitMove(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  struct AbortedMove {
    MoveRecord move;
    uint64_t epoch = 0;  // after the abort
  };
  // Aborts move `id`: its record deleted and epoch + 1 in one synced write; the source
  // keeps the vshards. nullopt (nothing written) when `id` is not in flight.
  absl::StatusOr<std::optional<AbortedMove>> AbortMove(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // The moves in flight (state COPYING), for status.
  std::vector<MoveInfo> MovesInFlight() const ABSL_LOCKS_EXCLUDED(mu_);

  // Takes the followers `drops` lists (vshard -> pods; rereplicate_plan.h PlanTrims) out
  // of the vshards' ack sets, in one synced write, epoch + 1, logged and counted; only
  // while a vshard's ack set still names more than R - 1 pods, its primary is live and no
  // move in flight touches it (anything else is skipped: the next round plans again).
  // Returns the pods to tell: the primaries (they stop streaming to the dropped pods) and
  // the dropped pods that are live (they drop the rows). Store errors as they come, nothing
  // changed.
  absl::StatusOr<std::vector<std::string>> TrimAckSets(
      const std::map<uint32_t, std::vector<std::string>>& drops) ABSL_LOCKS_EXCLUDED(mu_);
  // Vshard copies TrimAckSets took out of ack sets since this master started.
  uint64_t ack_set_removals_surplus() const { return removed_surplus_.load(); }

  struct AddressedAssignment {
    std::string address;
    PodAssignment assignment;
  };
  // What pod `pod_id` should be told now, and where; nullopt when it never registered.
  std::optional<AddressedAssignment> AssignmentOf(const std::string& pod_id) const
      ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t epoch() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t pod_count() const ABSL_LOCKS_EXCLUDED(mu_);
  // Leases that ran out since Load. Thread-safe.
  uint64_t lease_losses() const { return lease_losses_.load(); }

  // For the ABSL_ACQUIRED_BEFORE annotations of callers' locks; never lock it from outside.
  absl::Mutex* mutex() const ABSL_LOCK_RETURNED(mu_) { return &mu_; }

 private:
  struct Pod {
    PodRecord record;
    absl::Time lease_deadline;
    bool lost_logged = false;
  };

  absl::Time Now() const { return CurrentTime(options_); }
  void FillAssignment(const std::string& pod_id, PodAssignment* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pods named by the map or registered, in natural order (ps-2 before ps-10).
  std::vector<std::string> KnownPodIds() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PodInfo DescribePod(const std::string& pod_id, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t OwnedBy(const std::string& pod_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The live primaries (as of `now`) of the vshards whose ack set names `pod_id`, but
  // itself, each once: the pods that stream to it.
  std::vector<std::string> LivePrimariesFollowedBy(const std::string& pod_id, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Live(const std::string& pod_id, absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<MoveInfo> MovesInFlightLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `pod_id` is in vshard v's ack set.
  bool InAckSet(uint32_t v, const std::string& pod_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The replication role of `pod_id` (R >= 2): its followers (the ack set of the vshards it
  // owns) with their addresses, and the vshards it follows, by primary.
  void FillReplication(const std::string& pod_id, ReplicationRole* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the pods in `lost` out of every ack set and promotes the vshards they were the
  // primary of (see ExpireLeases); returns the pods to tell.
  absl::StatusOr<std::vector<std::string>> FailOver(const std::vector<std::string>& lost,
                                                    absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps the followers' lag that `report` (a primary's heartbeat) gives, and takes each
  // follower whose lag reached options_.replication_max_lag out of the ack sets of the
  // vshards the reporter owns: one synced write, epoch + 1, logged and counted. On a store
  // error nothing changed (the next heartbeat reports it again).
  absl::Status TakeLagReport(const PodHeartbeatRequest& report, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The status's replication part (R >= 2): factor, counters, copies short of R, the lags.
  void DescribeReplication(absl::Time now, ReplicationInfo* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The latest lag reports, for status and shards.
  void AddLags(absl::Time now, google::protobuf::RepeatedPtrField<ReplicaLag>* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `req` brings other data than pod `record` had: another storage id than the
  // recorded one, or a fresh one where none was recorded (a pod that registered before).
  static bool StorageLost(const PodRecord& record, const RegisterPodRequest& req);
  // The pod of `record` lost its data (StorageLost): logged and counted; with replication
  // it leaves every ack set and its vshards are promoted as for an expired lease (FailOver,
  // one synced write), the pods to tell appended to `*tell` (when not null). Store errors
  // as they come, nothing changed.
  absl::Status LoseStorage(const PodRecord& record, const RegisterPodRequest& req, absl::Time now,
                           std::vector<std::string>* tell) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pod `pod_id` registers with a log that may lack records it acknowledged before a
  // crash (RegisterPodRequest.log_tail_lost; R >= 2): logged and counted; it leaves every
  // ack set and its vshards are promoted as for an expired lease (FailOver), even while its
  // lease is live: a follower holds records it lost. Store errors as they come.
  absl::Status LoseLogTail(const std::string& pod_id, absl::Time now,
                           std::vector<std::string>* tell) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FailOver({pod_id}) for a pod that is registering now; the pods to tell, but `pod_id`
  // (it learns from its registration), appended to `*tell` (when not null).
  absl::Status FailOverRegistering(const std::string& pod_id, absl::Time now,
                                   std::vector<std::string>* tell)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records `storage_id` as pod `pod_id`'s (synced).
  absl::Status RecordStorage(const std::string& pod_id, const std::string& storage_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `batch` with the map as `map` (epoch already bumped), then installs the map.
  absl::Status WriteMap(StoreBatch batch, ShardMapRecord map) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const MasterOptions& options_;
  const ClusterConfig config_;
  MasterStore* const store_;
  CountersRecord* const counters_;

  mutable absl::Mutex mu_ ABSL_ACQUIRED_BEFORE(counters_->write_mutex());
  ShardMapRecord map_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Pod> pods_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, MoveRecord> moves_ ABSL_GUARDED_BY(mu_);  // in flight: at most one
  std::atomic<uint64_t> lease_losses_{0};
  std::atomic<uint64_t> failovers_{0};
  std::atomic<uint64_t> removed_lease_{0}, removed_lag_{0}, removed_surplus_{0},
      removed_failover_{0};
  struct LagReport {
    absl::Time at;
    std::vector<FollowerLag> followers;
  };
  // Primary -> its latest report (memory only: a restarted master waits for the next one).
  std::map<std::string, LagReport> lag_reports_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> storage_losses_{0};
  std::atomic<uint64_t> log_tail_losses_{0};
};

}  // namespace ps
