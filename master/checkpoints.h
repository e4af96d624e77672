// Checkpoints: cluster checkpoints. One asks every pod that owns vshards for its
// PodCheckpoint into <checkpoint_dir>/ckpt-<id>/<pod id>, then records the checkpoint and
// copies the master's store into .../ckpt-<id>/master. It owns the store keys
// `checkpoint/<id>` (and, in `counters`, next_checkpoint_id).
//
// With replication (R >= 2) the pods' copies are cut one after another while pushes flow,
// so a vshard's copies on its primary and its followers are cut at different moments. The
// checkpoint therefore takes each vshard's primary's copy as the authoritative one: the
// master's copy of the map keeps the primaries and has empty ack sets (epoch + 1). After a
// restore each pod drops the rows of the vshards it no longer follows, and re-replication
// fills the followers from the primaries (a copy of every follower at restore time), so
// every replica is the primary's checkpointed state, bit for bit.
//
// A checkpoint holds the operation lock (operation_lock.h): no drain or rebalance may change
// the map while the pods copy their state. Thread-safety: every method is thread-safe; its
// mutex guards only the last checkpoint, and nothing else is locked under it.
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "master/counters_record.h"
#include "master/master_options.h"
#include "master/master_store.h"
#include "master/membership.h"
#include "proto/master.pb.h"

namespace ps {

class Checkpoints {
 public:
  // Every pointer must outlive this. Call Load before anything else.
  Checkpoints(const MasterOptions& options, MasterStore* store, CountersRecord* counters,
              Membership* membership, absl::Mutex* operation_mu)
      : options_(options),
        store_(store),
        counters_(counters),
        membership_(membership),
        operation_mu_(operation_mu) {}

  // Reads the newest checkpoint record. DATA_LOSS for one that does not parse.
  absl::Status Load() ABSL_LOCKS_EXCLUDED(mu_);

  // The Checkpoint RPC of proto/master.proto: FAILED_PRECONDITION without a checkpoint_dir;
  // ABORTED while a drain or rebalance runs; UNAVAILABLE when a pod owning vshards is not
  // live; a pod's error (with its code) when its copy failed; at R >= 2, ABORTED when a
  // vshard's primary changed while the pods copied (a failover: take it again).
  absl::Status Checkpoint(const CheckpointRequest& req, CheckpointResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Adds the last checkpoint taken to the status, if there is one.
  void Describe(StatusResponse* resp) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const MasterOptions& options_;
  MasterStore* const store_;
  CountersRecord* const counters_;
  Membership* const membership_;
  absl::Mutex* const operation_mu_;

  mutable absl::Mutex mu_;
  CheckpointInfo last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps
