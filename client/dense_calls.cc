#include "client/dense_calls.h"

#include <cstring>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/finite_check.h"
#include "common/base/status_macros.h"
#include "common/routing/hash.h"
#include "proto/wrong_shard.h"

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

bool DenseCalls::Reroutable(const absl::Status& s, int round) const {
  return router_->follows_master() && round < options_.max_reroutes && WrongShardOf(s).has_value();
}

void DenseCalls::AwaitRefresh(uint64_t epoch) {
  absl::Notification refreshed;
  router_->Refresh(epoch, [&] { refreshed.Notify(); });
  refreshed.WaitForNotification();
}

absl::Status DenseCalls::Pull(const std::vector<std::string>& names,
                              const std::vector<float*>& out) {
  counters_->pulls.fetch_add(1, std::memory_order_relaxed);
  if (names.size() != out.size()) return absl::InvalidArgumentError("names and out differ in size");
  ASSIGN_OR_RETURN(const std::vector<size_t> numel, Numels(names));
  // A pull is idempotent: after a map change it simply runs again under the new map.
  for (int round = 0;; ++round) {
    auto r = router_->current();
    std::vector<std::unique_ptr<Rpc<DensePullRequest, DensePullResponse>>> rpcs;
    std::vector<int> rpc_of_pod(r->map.num_pods(), -1);
    for (size_t i = 0; i < names.size(); ++i) {
      const uint32_t pod = r->map.PodOfVShard(DenseVShard(names[i], r->map.num_vshards()));
      if (rpc_of_pod[pod] < 0) {
        rpc_of_pod[pod] = static_cast<int>(rpcs.size());
        rpcs.push_back(MakeRpc<DensePullRequest, DensePullResponse>(r->pods[pod], r->map.epoch()));
        rpcs.back()->req.set_epoch(r->map.epoch());
      }
      rpcs[rpc_of_pod[pod]]->req.add_names(names[i]);
    }
    absl::Status s = runner_->RunAll(&ParameterServer::Stub::PrepareAsyncPullDense, &rpcs);
    if (!s.ok()) {
      if (!Reroutable(s, round)) return s;
      counters_->reroutes.fetch_add(1, std::memory_order_relaxed);
      AwaitRefresh(r->map.epoch());
      continue;
    }
    absl::flat_hash_map<std::string, const std::string*> values;
    for (const auto& rpc : rpcs) {
      for (const DenseValues& v : rpc->resp.tensors()) values[v.name()] = &v.values();
    }
    for (size_t i = 0; i < names.size(); ++i) {
      auto it = values.find(names[i]);
      if (it == values.end() || it->second->size() != numel[i] * sizeof(float)) {
        return absl::InternalError(
            absl::StrCat("dense pull of '", names[i], "' came back malformed"));
      }
      std::memcpy(out[i], it->second->data(), it->second->size());
    }
    return absl::OkStatus();
  }
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
  // Tensors still to push; after a pod refuses its part (applying none of it) that part
  // goes out again under the new map with a new key.
  std::vector<size_t> todo(names.size());
  for (size_t i = 0; i < todo.size(); ++i) todo[i] = i;
  for (int round = 0;; ++round) {
    auto r = router_->current();
    std::vector<std::unique_ptr<Rpc<DensePushRequest, PushResponse>>> rpcs;
    std::vector<std::vector<size_t>> tensors_of_rpc;
    std::vector<int> rpc_of_pod(r->map.num_pods(), -1);
    for (size_t i : todo) {
      const uint32_t pod = r->map.PodOfVShard(DenseVShard(names[i], r->map.num_vshards()));
      if (rpc_of_pod[pod] < 0) {
        rpc_of_pod[pod] = static_cast<int>(rpcs.size());
        rpcs.push_back(MakeRpc<DensePushRequest, PushResponse>(r->pods[pod], r->map.epoch()));
        rpcs.back()->req.set_epoch(r->map.epoch());
        // A key per pod: a follower holds its primary's records with their keys.
        *rpcs.back()->req.mutable_key() = keys_->Next();
        auto* rpc = rpcs.back().get();
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
    absl::Status s = runner_->RunAll(&ParameterServer::Stub::PrepareAsyncPushDense, &rpcs);
    if (s.ok()) return s;
    std::vector<size_t> again;
    for (size_t k = 0; k < rpcs.size(); ++k) {
      const absl::Status& rs = rpcs[k]->status;
      if (rs.ok()) continue;
      if (!Reroutable(rs, round)) return rs;
      counters_->reroutes.fetch_add(1, std::memory_order_relaxed);
      again.insert(again.end(), tensors_of_rpc[k].begin(), tensors_of_rpc[k].end());
    }
    todo = std::move(again);
    AwaitRefresh(r->map.epoch());
  }
}

}  // namespace ps::internal
