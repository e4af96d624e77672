#include "client/dense_calls.h"

#include <cstring>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "client/finite_check.h"
#include "common/base/status_macros.h"
#include "common/routing/hash.h"

namespace ps::internal {

absl::StatusOr<std::vector<size_t>> DenseCalls::Numels(const std::vector<std::string>& names) {
  std::vector<size_t> numel(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    ASSIGN_OR_RETURN(DenseSpec spec, catalog_->Dense(names[i]));
    numel[i] = 1;
    for (int64_t d : spec.shape()) numel[i] *= d;
  }
  return numel;
}

absl::Status DenseCalls::Pull(const std::vector<std::string>& names,
                              const std::vector<float*>& out) {
  counters_->pulls.fetch_add(1, std::memory_order_relaxed);
  if (names.size() != out.size()) return absl::InvalidArgumentError("names and out differ in size");
  ASSIGN_OR_RETURN(const std::vector<size_t> numel, Numels(names));
  // A pull is idempotent: what the runner re-routed is simply asked again under the new map.
  std::vector<size_t> todo(names.size());
  for (size_t i = 0; i < todo.size(); ++i) todo[i] = i;
  for (int round = 0; !todo.empty(); ++round) {
    auto r = router_->current();
    std::vector<std::unique_ptr<Rpc<DensePullRequest, DensePullResponse>>> rpcs;
    std::vector<std::vector<size_t>> tensors_of_rpc;
    std::vector<int> rpc_of_pod(r->map.num_pods(), -1);
    for (size_t i : todo) {
      const uint32_t pod = r->map.PodOfVShard(DenseVShard(names[i], r->map.num_vshards()));
      if (rpc_of_pod[pod] < 0) {
        rpc_of_pod[pod] = static_cast<int>(rpcs.size());
        rpcs.push_back(MakeRpc<DensePullRequest, DensePullResponse>(r->pods[pod], r->map.epoch()));
        rpcs.back()->req.set_epoch(r->map.epoch());
        rpcs.back()->reroutable = true;
        rpcs.back()->reroutes = round;
        tensors_of_rpc.emplace_back();
      }
      rpcs[rpc_of_pod[pod]]->req.add_names(names[i]);
      tensors_of_rpc[rpc_of_pod[pod]].push_back(i);
    }
    RETURN_IF_ERROR(runner_->RunAll(&ParameterServer::Stub::PrepareAsyncPullDense, &rpcs));
    std::vector<size_t> again;
    for (size_t k = 0; k < rpcs.size(); ++k) {
      const auto& rpc = rpcs[k];
      if (rpc->rerouted) {
        again.insert(again.end(), tensors_of_rpc[k].begin(), tensors_of_rpc[k].end());
        continue;
      }
      absl::flat_hash_map<std::string, const std::string*> values;
      for (const DenseValues& v : rpc->resp.tensors()) values[v.name()] = &v.values();
      for (size_t i : tensors_of_rpc[k]) {
        auto it = values.find(names[i]);
        if (it == values.end() || it->second->size() != numel[i] * sizeof(float)) {
          return absl::InternalError(
              absl::StrCat("dense pull of '", names[i], "' came back malformed"));
        }
        std::memcpy(out[i], it->second->data(), it->second->size());
      }
    }
    todo = std::move(again);
  }
  return absl::OkStatus();
}

absl::Status DenseCalls::Push(const std::vector<std::string>& names,
                              const std::vector<const float*>& grads, float learning_rate) {
  counters_->pushes.fetch_add(1, std::memory_order_relaxed);
  if (names.size() != grads.size()) {
    return absl::InvalidArgumentError("names and grads differ in size");
  }
  ASSIGN_OR_RETURN(const std::vector<size_t> numel, Numels(names));
  for (size_t i = 0; i < names.size(); ++i) {
    RETURN_IF_ERROR(
        CheckFinite(absl::StrCat("dense push to '", names[i], "'"), grads[i], numel[i], 1));
  }
  std::vector<PushPart> todo(1);
  todo[0].tensors.resize(names.size());
  for (size_t i = 0; i < names.size(); ++i) todo[0].tensors[i] = i;
  while (!todo.empty()) {
    auto r = router_->current();
    using DensePushRpc = Rpc<DensePushRequest, PushResponse>;
    std::vector<std::unique_ptr<DensePushRpc>> rpcs;
    std::vector<std::vector<size_t>> tensors_of_rpc;
    for (const PushPart& part : todo) {
      // One RPC per pod and part: parts that keep their keys never share an RPC.
      std::vector<int> rpc_of_pod(r->map.num_pods(), -1);
      for (size_t i : part.tensors) {
        const uint32_t pod = r->map.PodOfVShard(DenseVShard(names[i], r->map.num_vshards()));
        if (rpc_of_pod[pod] < 0) {
          rpc_of_pod[pod] = static_cast<int>(rpcs.size());
          rpcs.push_back(MakeRpc<DensePushRequest, PushResponse>(r->pods[pod], r->map.epoch()));
          DensePushRpc* rpc = rpcs.back().get();
          rpc->req.set_epoch(r->map.epoch());
          // A key per pod (a follower holds its primary's records with their keys), or
          // the part's own.
          *rpc->req.mutable_key() = part.key.has_value() ? *part.key : keys_->Next();
          rpc->attempt = part.attempt;
          rpc->fate_unknown = part.key.has_value();
          rpc->reroutes = part.reroutes;
          rpc->reroutable = true;
          rpc->on_ok = [this, rpc] {
            keys_->Acknowledged(rpc->req.key(), rpc->resp.duplicate(), rpc->attempt);
            return absl::OkStatus();
          };
          tensors_of_rpc.emplace_back();
        }
        DenseGrads* g = rpcs[rpc_of_pod[pod]]->req.add_tensors();
        g->set_name(names[i]);
        g->set_grads(reinterpret_cast<const char*>(grads[i]), numel[i] * sizeof(float));
        g->set_learning_rate(learning_rate);
        tensors_of_rpc[rpc_of_pod[pod]].push_back(i);
      }
    }
    RETURN_IF_ERROR(runner_->RunAll(&ParameterServer::Stub::PrepareAsyncPushDense, &rpcs));
    // What the runner re-routed goes again under the new map: under a new key when every
    // attempt was answered (applied nowhere), else (R >= 2) under its own key, which the
    // promoted follower knows if the old primary's record reached it.
    std::vector<PushPart> again;
    const uint32_t replication = router_->current()->replication;
    for (size_t k = 0; k < rpcs.size(); ++k) {
      if (!rpcs[k]->rerouted) continue;
      PushPart& part = again.emplace_back();
      part.tensors = std::move(tensors_of_rpc[k]);
      part.reroutes = rpcs[k]->reroutes + 1;
      if (rpcs[k]->fate_unknown && replication >= 2) {
        part.key = rpcs[k]->req.key();
        part.attempt = rpcs[k]->attempt;
      }
    }
    todo = std::move(again);
  }
  return absl::OkStatus();
}

}  // namespace ps::internal
