// Pulls and pushes of dense tensors (PsClient::PullDense / PushDense). A tensor routes by
// name (DenseVShard); one blocking fan-out per call, one RPC per pod. After a pod refused
// a tensor it does not own (a map change), a pull runs again whole under the new map and a
// push sends the refused tensors again, under a new key.
#pragma once

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
  // The element counts of `names`' tensors, from the catalog.
  absl::StatusOr<std::vector<size_t>> Numels(const std::vector<std::string>& names);
  // Whether `s` (for a routing of `round` map changes so far) calls for a map refresh and
  // another round: a wrong-shard refusal (proto/wrong_shard.h), with a master, rounds left.
  bool Reroutable(const absl::Status& s, int round) const;
  // Waits for a map newer than `epoch` (or one refresh).
  void AwaitRefresh(uint64_t epoch);

  const ClientOptions& options_;
  Router* const router_;
  RpcRunner* const runner_;
  Catalog* const catalog_;
  PushKeys* const keys_;
  ClientCounters* const counters_;
};

}  // namespace ps::internal
