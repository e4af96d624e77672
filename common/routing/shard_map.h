// The client's view of which pod owns each vshard, under an epoch.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/routing/hash.h"

namespace ps {

class ShardMap {
 public:
  ShardMap() = default;  // empty: no vshards
  // The static map of `num_pods` pods: pod i owns the contiguous vshards StaticOwner gives
  // (common/routing/shard_ownership.h), matching `ps-server --shard=i/num_pods`.
  static absl::StatusOr<ShardMap> Static(uint32_t num_vshards, uint32_t num_pods);
  // An explicit map: owner[v] is the pod index of vshard v.
  static absl::StatusOr<ShardMap> FromOwners(std::vector<uint32_t> owner, uint32_t num_pods,
                                             uint64_t epoch);

  uint32_t num_vshards() const { return static_cast<uint32_t>(owner_.size()); }
  uint32_t num_pods() const { return num_pods_; }
  uint64_t epoch() const { return epoch_; }
  uint32_t PodOfVShard(uint32_t vshard) const { return owner_[vshard]; }
  uint32_t PodOf(uint64_t name_hash, int64_t id) const {
    return owner_[VShardOf(RouteHash(name_hash, id), num_vshards())];
  }

  // Replication (issue 16): followers[v] are the pods (indexes, as owners) that follow
  // vshard v, in the master's order; empty (the default) when there are none.
  // INVALID_ARGUMENT unless `followers` is empty or has one entry per vshard naming known
  // pods other than the vshard's owner.
  absl::Status SetFollowers(std::vector<std::vector<uint32_t>> followers);
  bool has_followers() const { return !followers_.empty(); }

  // The map a read-only pull falls back to when pod `unreachable` does not answer: each of
  // its vshards goes to its first follower that is `up` (indexed by pod), the others keep
  // their owners. nullopt when no vshard of that pod has such a follower.
  std::optional<ShardMap> ReadReplicaView(uint32_t unreachable, const std::vector<bool>& up) const;

 private:
  ShardMap(std::vector<uint32_t> owner, uint32_t num_pods, uint64_t epoch)
      : owner_(std::move(owner)), num_pods_(num_pods), epoch_(epoch) {}

  std::vector<uint32_t> owner_;
  std::vector<std::vector<uint32_t>> followers_;  // per vshard, or empty
  uint32_t num_pods_ = 0;
  uint64_t epoch_ = 0;
};

}  // namespace ps
