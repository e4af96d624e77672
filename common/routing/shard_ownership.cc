#include "common/routing/shard_ownership.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/routing/vshards.h"

namespace ps {
absl::StatusOr<ShardOwnership> ShardOwnership::Create(uint32_t num_vshards, uint64_t epoch,
                                                      const std::vector<uint32_t>& owned) {
  if (auto s = CheckNumVShards(num_vshards); !s.ok()) return s;
  ShardOwnership o(num_vshards, epoch);
  for (uint32_t v : owned) {
    if (v >= num_vshards) {
      return absl::InvalidArgumentError(
          absl::StrCat("vshard ", v, " is outside [0, ", num_vshards, ")"));
    }
    o.bits_[v >> 6] |= uint64_t{1} << (v & 63);
  }
  return o;
}

ShardOwnership ShardOwnership::All(uint32_t num_vshards) {
  ShardOwnership o(num_vshards, 0);
  for (uint32_t v = 0; v < num_vshards; ++v) o.bits_[v >> 6] |= uint64_t{1} << (v & 63);
  return o;
}

absl::StatusOr<ShardOwnership> ShardOwnership::FromStaticShard(absl::string_view spec,
                                                               uint32_t num_vshards) {
  std::vector<absl::string_view> parts = absl::StrSplit(spec, '/');
  uint32_t index = 0, count = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &index) ||
      !absl::SimpleAtoi(parts[1], &count) || count == 0 || index >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("static shard '", spec, "' is not I/N with 0 <= I < N"));
  }
  if (auto s = CheckNumVShards(num_vshards); !s.ok()) return s;
  if (count > num_vshards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "static map of ", count, " pods needs at least as many vshards, not ", num_vshards));
  }
  std::vector<uint32_t> owned;
  for (uint32_t v = 0; v < num_vshards; ++v) {
    if (StaticOwner(v, num_vshards, count) == index) owned.push_back(v);
  }
  return Create(num_vshards, 0, owned);
}

uint32_t ShardOwnership::owned_count() const {
  uint32_t n = 0;
  for (uint64_t w : bits_) n += __builtin_popcountll(w);
  return n;
}

std::string ShardOwnership::Bitmap() const {
  std::string out((num_vshards_ + 7) / 8, '\0');
  for (uint32_t v = 0; v < num_vshards_; ++v) {
    if (Owns(v)) out[v >> 3] |= static_cast<char>(1 << (v & 7));
  }
  return out;
}

}  // namespace ps
