// MasterOptions: how a master is configured (flags are turned into this in master_main.cc).
// Shared by MasterCore and its parts, which keep a reference to the facade's copy.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "master/pod_control.h"

namespace ps {

struct MasterOptions {
  std::string data_dir;  // RocksDB directory; required
  // Virtual shards in the cluster: a power of two in [1, 65536], fixed for the data dir.
  // 256 spreads load evenly over up to ~64 pods while keeping the map small.
  uint32_t num_vshards = 256;
  // Expected PS pods: vshards start assigned to ps-0 .. ps-(num_ps-1) in contiguous ranges
  // (StaticOwner), as `ps-server --shard=i/num_ps` would own them. Fixed for the data dir.
  uint32_t num_ps = 1;
  // Pods and workers that do not heartbeat for this long are LOST. 10 s rides out a GC
  // pause or a brief network blip yet re-queues a dead worker's task quickly.
  absl::Duration lease = absl::Seconds(10);
  // A task failing this many times (failed reports plus lost holders) becomes FAILED.
  uint32_t max_task_failures = 3;
  // Most tasks one job may have (all epochs), refused beyond (INVALID_ARGUMENT). A million
  // tasks (e.g. 10^10 records at 10^4 per task) took the master to ~490 MB resident and
  // 2-5 s to create (measured); each task also holds its file's path.
  uint64_t max_tasks_per_job = 1'000'000;
  // Retention (job_dispatcher.h). Finished jobs are deleted, tasks and all, this long after
  // their last task finished: a week leaves time to read the results. Zero: no time limit.
  absl::Duration job_retention = absl::Hours(24 * 7);
  // At most this many finished jobs are kept (the oldest finished are deleted first), so a
  // master that runs many jobs keeps bounded state. 0: no count limit.
  uint32_t max_finished_jobs = 100;
  // Workers that left or lost their lease are forgotten this long after: an hour of
  // history in status, then their records go. Zero: kept forever.
  absl::Duration worker_retention = absl::Hours(1);
  // How often a background thread applies retention; zero: no thread (tests call
  // MasterCore::EnforceRetention themselves).
  absl::Duration retention_interval = absl::Seconds(10);
  // Time source; null means absl::Now. Tests inject a fake clock.
  std::function<absl::Time()> clock;
  // How moves reach the pods; null: gRPC (NewGrpcPodControl). Tests inject a fake.
  std::shared_ptr<PodControl> pod_control;
  // Vshards copied by one move. A move fences its vshards once at the end, so a small
  // batch keeps each fence short while amortizing the per-move round trips.
  uint32_t vshards_per_move = 4;
  // A move's catch-up rounds stop (and its fence starts) at this many changed rows.
  uint32_t fence_rows = 2000;
  // Rebalance by itself (on a background thread) when a new pod registers: a pod id not
  // seen before, or a drained one back at a new address.
  bool auto_rebalance = false;
  // Replication factor R (issue 16): each vshard has a primary and R-1 followers on other
  // pods, which hold every acknowledged push. 1 (no followers) keeps a single copy, on the
  // owner's volume. Fixed for the data dir. At most 8: each copy costs a pod's CPU and disk.
  uint32_t replication = 1;
  // Acknowledge pushes once the primary holds them (true), or once every follower in the
  // ack set does too (false, the default): "leader" is faster but a push acknowledged just
  // before the primary's loss may be lost.
  bool replication_ack_leader = false;
  // With replication >= 2, how often a background thread looks for vshards short of R
  // copies and fills new followers (rereplicator.h); it also runs when a pod registers or
  // fails over. Zero: no thread (tests call MasterCore::Rereplicate themselves).
  absl::Duration rereplicate_interval = absl::Seconds(10);
  // Where cluster checkpoints go (ckpt-<id> below it, on each pod's filesystem and the
  // master's); empty: Checkpoint is refused.
  std::string checkpoint_dir;
};

// The time by `options.clock` (absl::Now when unset). Leases are measured with it.
inline absl::Time CurrentTime(const MasterOptions& options) {
  return options.clock ? options.clock() : absl::Now();
}

}  // namespace ps
