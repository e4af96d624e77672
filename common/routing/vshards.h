// The vshard rules every process shares: how many vshards a cluster may have, and which
// pod owns a vshard in a static map. One statement of each, used by ps-server, ps-master
// and the client (C++ and, through its bindings, Python).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ps {

// A cluster has a power of two of vshards, at most this many (the ownership bitmap and the
// shard map are sized by it).
inline constexpr uint64_t kMaxVShards = 65536;

// OK when `num_vshards` is a power of two in [1, kMaxVShards], else INVALID_ARGUMENT naming
// the value. Thread-safe (pure).
inline absl::Status CheckNumVShards(uint64_t num_vshards) {
  if (num_vshards < 1 || num_vshards > kMaxVShards || (num_vshards & (num_vshards - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_vshards = ", num_vshards, " must be a power of two in [1, ", kMaxVShards, "]"));
  }
  return absl::OkStatus();
}

// The pod index that owns `vshard` in a static map of `num_pods` pods: contiguous ranges,
// vshard * num_pods / num_vshards (`ps-server --shard=i/N`, the master's first map).
inline uint32_t StaticOwner(uint32_t vshard, uint32_t num_vshards, uint32_t num_pods) {
  return static_cast<uint32_t>(uint64_t{vshard} * num_pods / num_vshards);
}

}  // namespace ps
