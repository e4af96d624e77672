// Pulls and pushes of embedding rows (PsClient::PullAsync / PushAsync): each call's ids
// grouped by pod (client/pod_batch.h), one raw RPC per pod (proto/wire.h), run by the
// RpcRunner; a pull's rows scattered into the caller's buffers on the completion thread
// that receives them (client/pull_scatter.h). The part of a call that a pod refused after
// a map change is grouped again under the new map (ReroutePull / ReroutePush).
#pragma once

#include <memory>
#include <vector>

#include "client/catalog.h"
#include "client/op.h"
#include "client/pod_batch.h"
#include "client/ps_client.h"
#include "client/pull_scatter.h"
#include "client/push_keys.h"
#include "client/routing.h"
#include "client/rpc_runner.h"

namespace ps::internal {

// Thread-safe. Everything passed to the constructor must outlive it and every call it
// started.
class SparseCalls {
 public:
  SparseCalls(Router* router, RpcRunner* runner, Catalog* catalog, PushKeys* keys,
              ClientCounters* counters)
      : router_(router), runner_(runner), catalog_(catalog), keys_(keys), counters_(counters) {}

  // As PsClient::PullAsync and PushAsync.
  Handle Pull(std::vector<PullSpec> specs, const PullOptions& options);
  Handle Push(std::vector<PushSpec> specs);

 private:
  // A pull RPC with where its rows go.
  struct PullRpc : RawRpc {
    std::shared_ptr<PullScatter> scatter;
  };
  // A push RPC with its key (for what the pod's answer says about it).
  struct PushRpc : RawRpc {
    PushKey key;
  };

  // The RPCs of a batch's parts under routing `r`, each following at most
  // max_reroutes - `reroutes` further map changes; read-only pulls of a replicated map may
  // fall back to followers when `may_fall_back`.
  std::vector<std::shared_ptr<RawRpc>> PullRpcs(std::vector<PodRequest> parts, const Routing& r,
                                                int reroutes, bool may_fall_back);
  // Each part carries its own key (PodRequest::key); `fate_unknown` as RpcState's.
  std::vector<std::shared_ptr<RawRpc>> PushRpcs(std::vector<PodRequest> parts, const Routing& r,
                                                int reroutes, bool fate_unknown);
  // The pod refused the whole request (FAILED_PRECONDITION: it applied none of it), or
  // its vshards failed over: its ids are grouped again under the current map and sent as
  // new RPCs of `op` (a push under new keys, or its own key if its fate is unknown with
  // R >= 2: client/rpc_runner.h).
  void ReroutePull(PullRpc* rpc, const std::shared_ptr<Op>& op);
  // A read-only pull whose pod is unreachable: its ids regrouped under the current map's
  // ReadReplicaView (to followers of their vshards) and sent as new RPCs of `op`, which
  // fall back no further. False (nothing sent) when that pod's vshards have no follower up.
  bool FallBackPull(PullRpc* rpc, const std::shared_ptr<Op>& op);
  // The ids of `rpc`'s request grouped again under `map` (of routing `r`), as new RPCs of
  // `op`. False (nothing sent) if the request is unreadable.
  bool RegroupPull(PullRpc* rpc, const ShardMap& map, const Routing& r, bool may_fall_back,
                   const std::shared_ptr<Op>& op);
  void ReroutePush(PushRpc* rpc, const std::shared_ptr<Op>& op);

  Router* const router_;
  RpcRunner* const runner_;
  Catalog* const catalog_;
  PushKeys* const keys_;
  ClientCounters* const counters_;
};

}  // namespace ps::internal
