// Pulls and pushes of dense tensors (PsClient::PullDense / PushDense). A tensor routes by
// name (DenseVShard); one blocking fan-out per round, one RPC per pod. The runner
// (client/rpc_runner.h) re-routes as for sparse calls: after a pod refused a tensor it does
// not own (a map change), or after the vshards of an unreachable pod failed over to their
// followers (R >= 2), it ends that RPC as `rerouted` once the map is refreshed, and the
// next round sends those tensors again under the new map. A pull simply asks again. A
// push goes under a new key, unless an attempt's fate was unknown with R >= 2: then its
// key goes along, so the promoted follower, which holds the old primary's records with
// their keys, applies it once (or answers `duplicate`), as for a sparse push.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/catalog.h"
#include "client/ps_client.h"
#include "client/push_keys.h"
#include "client/routing.h"
#include "client/rpc_runner.h"

namespace ps::internal {

// Thread-safe; blocking. Everything passed to the constructor must outlive it.
class DenseCalls {
 public:
  DenseCalls(const ClientOptions& options, Router* router, RpcRunner* runner, Catalog* catalog,
             PushKeys* keys, ClientCounters* counters)
      : options_(options),
        router_(router),
        runner_(runner),
        catalog_(catalog),
        keys_(keys),
        counters_(counters) {}

  // As PsClient::PullDense and PushDense.
  absl::Status Pull(const std::vector<std::string>& names, const std::vector<float*>& out);
  absl::Status Push(const std::vector<std::string>& names, const std::vector<const float*>& grads,
                    float learning_rate);

 private:
  // Tensors (indices into the call's names) to push in one round, with what they carry
  // over from the RPC they were re-routed from.
  struct PushPart {
    std::vector<size_t> tensors;
    int reroutes = 0;
    // Set: the tensors keep this key (and count `attempt` attempts so far); else each
    // pod's RPC gets a new key.
    std::optional<PushKey> key;
    int attempt = 0;
  };

  // The element counts of `names`' tensors, from the catalog.
  absl::StatusOr<std::vector<size_t>> Numels(const std::vector<std::string>& names);

  const ClientOptions& options_;
  Router* const router_;
  RpcRunner* const runner_;
  Catalog* const catalog_;
  PushKeys* const keys_;
  ClientCounters* const counters_;
};

}  // namespace ps::internal
