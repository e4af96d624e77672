// Which vshards this pod owns, under which shard-map epoch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ps {

// An immutable ownership snapshot; requests check their ids against one snapshot.
class ShardOwnership {
 public:
  // num_vshards must be a power of two in [1, 65536].
  static absl::StatusOr<ShardOwnership> Create(uint32_t num_vshards, uint64_t epoch,
                                               const std::vector<uint32_t>& owned);
  // Every vshard: a single pod started with no map.
  static ShardOwnership All(uint32_t num_vshards);
  // Parses "I/N": the I-th of N pods of a static map, owning the vshards StaticOwner gives.
  static absl::StatusOr<ShardOwnership> FromStaticShard(absl::string_view spec,
                                                        uint32_t num_vshards);

  uint32_t num_vshards() const { return num_vshards_; }
  uint64_t epoch() const { return epoch_; }
  bool Owns(uint32_t vshard) const { return (bits_[vshard >> 6] >> (vshard & 63)) & 1; }
  uint32_t owned_count() const;
  // Bitmap as in DescribeResponse.owned_vshards.
  std::string Bitmap() const;

 private:
  ShardOwnership(uint32_t num_vshards, uint64_t epoch)
      : num_vshards_(num_vshards), epoch_(epoch), bits_((num_vshards + 63) / 64, 0) {}

  uint32_t num_vshards_;
  uint64_t epoch_;
  std::vector<uint64_t> bits_;
};

}  // namespace ps
