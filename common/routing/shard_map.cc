#include "common/routing/shard_map.h"

#include "absl/strings/str_cat.h"
#include "common/routing/vshards.h"

namespace ps {

absl::StatusOr<ShardMap> ShardMap::Static(uint32_t num_vshards, uint32_t num_pods) {
  if (num_pods == 0 || num_pods > num_vshards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a static map of ", num_pods, " pods needs 1..num_vshards (", num_vshards, ") pods"));
  }
  std::vector<uint32_t> owner(num_vshards);
  for (uint32_t v = 0; v < num_vshards; ++v) owner[v] = StaticOwner(v, num_vshards, num_pods);
  return FromOwners(std::move(owner), num_pods, 0);
}

absl::StatusOr<ShardMap> ShardMap::FromOwners(std::vector<uint32_t> owner, uint32_t num_pods,
                                              uint64_t epoch) {
  const size_t v = owner.size();
  if (absl::Status s = CheckNumVShards(v); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("shard map: ", s.message()));
  }
  for (uint32_t pod : owner) {
    if (pod >= num_pods) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard map names pod ", pod, " of only ", num_pods));
    }
  }
  return ShardMap(std::move(owner), num_pods, epoch);
}

absl::Status ShardMap::SetFollowers(std::vector<std::vector<uint32_t>> followers) {
  if (!followers.empty() && followers.size() != owner_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard map: followers of ", followers.size(), " vshards for ", owner_.size()));
  }
  for (size_t v = 0; v < followers.size(); ++v) {
    for (uint32_t pod : followers[v]) {
      if (pod >= num_pods_ || pod == owner_[v]) {
        return absl::InvalidArgumentError(absl::StrCat("shard map: vshard ", v, " names pod ", pod,
                                                       " as a follower (owner ", owner_[v],
                                                       ", pods ", num_pods_, ")"));
      }
    }
  }
  followers_ = std::move(followers);
  return absl::OkStatus();
}

std::optional<ShardMap> ShardMap::ReadReplicaView(uint32_t unreachable,
                                                  const std::vector<bool>& up) const {
  if (followers_.empty()) return std::nullopt;
  ShardMap view(owner_, num_pods_, epoch_);
  bool moved = false;
  for (size_t v = 0; v < owner_.size(); ++v) {
    if (owner_[v] != unreachable) continue;
    for (uint32_t pod : followers_[v]) {
      if (pod != unreachable && pod < up.size() && up[pod]) {
        view.owner_[v] = pod;
        moved = true;
        break;
      }
    }
  }
  if (!moved) return std::nullopt;
  return view;
}

}  // namespace ps
