// The routing a call is made with (the vshard map and its pods), and how the client keeps
// it current: built once at Connect (a static map, or the master's), then, with a master,
// refreshed from it when a pod refuses ids it no longer owns or stays unreachable.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/client_counters.h"
#include "client/inflight.h"
#include "client/pod.h"
#include "client/ps_client.h"
#include "client/timer.h"
#include "common/routing/shard_map.h"
#include "proto/master.grpc.pb.h"

namespace ps::internal {

// One immutable snapshot: the pods and the vshard map one call routes with. Shared
// (shared_ptr<const Routing>) by every call made with it.
struct Routing {
  ShardMap map;
  std::vector<std::shared_ptr<Pod>> pods;  // index = the map's pod index
  // Per pod: reachable as far as the master knows (LIVE or DRAINED; always with a static
  // map). Calls to every pod (create, stats, the catalog at Connect) skip the others: a
  // drained pod that was removed stays in the master's list as LOST.
  std::vector<bool> up;
  // The master's replication factor R (1: a static map, or no followers).
  uint32_t replication = 1;
};

// The static map of options.servers (pod i started --shard=i/N). INVALID_ARGUMENT for a
// bad vshard count.
absl::StatusOr<std::shared_ptr<const Routing>> StaticRouting(const ClientOptions& options);

// The routing of a master's map. Pods keep their channels (the same Pod) when their id and
// address are the same as in `previous` (may be null). UNAVAILABLE when an owner has no
// address yet.
absl::StatusOr<std::shared_ptr<const Routing>> RoutingFromMap(const ClientOptions& options,
                                                              const ShardMapResponse& resp,
                                                              const Routing* previous);

// The current routing, and its refresh from the master shared by every call that needs
// one. Thread-safe.
class Router {
 public:
  // `master` is null with a static map (which never changes). `options`, `master`, `timer`,
  // `inflight` and `counters` must outlive the Router; a refresh in flight counts in
  // `inflight`, and each one in counters->map_refreshes.
  Router(const ClientOptions& options, std::shared_ptr<const Routing> initial, Master::Stub* master,
         Timer* timer, InFlight* inflight, ClientCounters* counters);

  // The snapshot to route a call with; it stays valid (and unchanged) while held.
  std::shared_ptr<const Routing> current() const {
    absl::MutexLock lock(&mu_);
    return routing_;
  }
  bool follows_master() const { return master_ != nullptr; }

  // Calls `then` once the routing is newer than `seen_epoch`: at once if it already is,
  // else after one refresh from the master, whatever it brought (the master down, say).
  // Refreshes are shared by every waiting caller, at most one per
  // ClientOptions::map_refresh_ms. `then` runs on this thread or the timer's thread, so
  // it must not block for long. Without a master, `then` runs at once.
  void Refresh(uint64_t seen_epoch, std::function<void()> then);

  // The pod with `pod`'s id in the current routing (its address may have changed), or
  // `pod` itself if that id is gone or has no address.
  std::shared_ptr<Pod> Resolve(const std::shared_ptr<Pod>& pod) const;

  // The epoch a retry of an RPC routed at `rpc_epoch`, whose attempt just failed at
  // `pod`, must see a newer map than (Refresh's `seen_epoch`): the current routing's when
  // it still names `pod` (that id at that address: the address that failed is the newest
  // the client knows, so only a fetch can find a new one, e.g. the pod restarted
  // elsewhere), else `rpc_epoch`.
  uint64_t StaleAfter(const Pod& pod, uint64_t rpc_epoch) const;

  // Whether the vshards `pod` led at `seen_epoch` failed over: the current routing is
  // newer, replicated (R >= 2), and `pod` is in it no longer up (its lease ran out: the
  // master promoted its followers). A pod that is up answers for itself (it knows the
  // keys it applied; a pod back without its data, or deposed, refuses with WrongShard).
  bool FailedOver(const Pod& pod, uint64_t seen_epoch) const;

 private:
  // On the timer thread: a blocking call to the master (it answers in a few ms, or fails
  // at once when down; 2 s at most), then wakes the waiters.
  void RefreshNow();

  // Constant after construction.
  const ClientOptions& options_;
  Master::Stub* const master_;
  Timer* const timer_;
  InFlight* const inflight_;
  ClientCounters* const counters_;

  mutable absl::Mutex mu_;
  std::shared_ptr<const Routing> routing_ ABSL_GUARDED_BY(mu_);
  absl::Mutex refresh_mu_ ABSL_ACQUIRED_AFTER(mu_);
  bool refresh_in_flight_ ABSL_GUARDED_BY(refresh_mu_) = false;
  absl::Time last_refresh_ ABSL_GUARDED_BY(refresh_mu_) = absl::InfinitePast();
  std::vector<std::function<void()>> waiters_ ABSL_GUARDED_BY(refresh_mu_);
};

}  // namespace ps::internal
