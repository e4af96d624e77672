#include "tests/chaos_workload.h"

#include <cstdlib>

#include "common/routing/hash.h"

namespace ps::chaos {
namespace {

// Witness ids: (record, epoch, part) << 20 plus an offset below 2^20 (records < 2^36).
// Hot ids: bit 61 set, so they never meet a witness id.
constexpr int64_t kHotBase = int64_t{1} << 61;
constexpr int kOffsetBits = 20;

}  // namespace

Workload::Workload(uint32_t num_vshards)
    : num_vshards_(num_vshards), table_hash_(NameHash(kTable)) {
  hot_ids_.reserve(size_t{num_vshards} * kHotPerVShard);
  for (uint32_t v = 0; v < num_vshards; ++v) {
    for (uint32_t k = 0; k < kHotPerVShard; ++k) {
      const int64_t slot = int64_t{v} * kHotPerVShard + k;
      hot_ids_.push_back(IdIn(v, kHotBase | (slot << kOffsetBits)));
    }
  }
}

int64_t Workload::IdIn(uint32_t vshard, int64_t base) const {
  // About num_vshards tries on average; 2^20 candidates miss with probability
  // (1 - 1/V)^(2^20), which is 0 in double precision for any V <= 2^16.
  for (int64_t offset = 0; offset < (int64_t{1} << kOffsetBits); ++offset) {
    if (VShardOf(RouteHash(table_hash_, base + offset), num_vshards_) == vshard) {
      return base + offset;
    }
  }
  std::abort();  // unreachable for the vshard counts a cluster accepts
}

uint32_t Workload::VShardOfPart(uint64_t record, uint32_t epoch, uint32_t part) const {
  return static_cast<uint32_t>(Mix64((record * kParts + part) ^ (uint64_t{epoch} << 40)) &
                               (num_vshards_ - 1));
}

int64_t Workload::Witness(uint64_t record, uint32_t epoch, uint32_t part) const {
  const int64_t slot = static_cast<int64_t>(((record << 8 | epoch) * kParts + part));
  return IdIn(VShardOfPart(record, epoch, part), slot << kOffsetBits);
}

std::vector<Part> Workload::Record(uint64_t record, uint32_t epoch) const {
  std::vector<Part> parts(kParts);
  for (uint32_t j = 0; j < kParts; ++j) {
    Part& p = parts[j];
    p.vshard = VShardOfPart(record, epoch, j);
    p.ids.push_back(Witness(record, epoch, j));
    p.grads.assign(kDim, 1.0f);
    const uint64_t mix = Mix64(record * 131 + epoch * 7 + j);
    for (uint32_t h = 0; h < kHotPerPart; ++h) {
      // Distinct hot rows of the vshard: consecutive slots from a varying start.
      const uint32_t k = static_cast<uint32_t>((mix + h) % kHotPerVShard);
      p.ids.push_back(hot_ids_[size_t{p.vshard} * kHotPerVShard + k]);
      for (uint32_t e = 0; e < kDim; ++e) {
        p.grads.push_back(static_cast<float>(1 + (mix >> (8 * h + 2 * e)) % 4));  // 1..4
      }
    }
  }
  return parts;
}

}  // namespace ps::chaos
