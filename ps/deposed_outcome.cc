#include "ps/deposed_outcome.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstring>
#include <iterator>

#include "absl/strings/cord.h"
#include "common/routing/hash.h"
#include "ps/storage/log_record.h"

namespace ps {
namespace {
// The payload naming a DeposedOutcome's kept vshards: little-endian uint32s.
constexpr absl::string_view kKeptVShardsUrl = "type.googleapis.com/ps.DeposedKeptVShards";
}  // namespace

absl::Status DeposedOutcome(const std::string& record, const ShardOwnership& own,
                            const absl::Status& why) {
  absl::StatusOr<LogRecordView> view = ParseLogRecord(record);
  if (!view.ok()) {
    LOG(ERROR) << "a queued record does not parse (" << view.status()
               << "): it fails as if none of its vshards were kept";
    return why;
  }
  const uint32_t n = own.num_vshards();
  std::vector<uint32_t> vshards;
  auto add_ids = [&](absl::string_view table, uint32_t count, const LogArrayView& ids) {
    const uint64_t h = NameHash(table);
    for (uint32_t i = 0; i < count; ++i) {
      vshards.push_back(VShardOf(RouteHash(h, ids.Get<int64_t>(i)), n));
    }
  };
  for (const LogTableView& t : view->tables) add_ids(t.table, t.n, t.ids);
  for (const LogInstallView& t : view->installs) add_ids(t.table, t.n, t.ids);
  for (const LogDeleteView& t : view->deletes) add_ids(t.table, t.n, t.ids);
  for (const LogDecayView& d : view->decays) {
    for (uint32_t i = 0; i < d.n; ++i) vshards.push_back(d.vshard(i));
  }
  for (const LogDenseView& d : view->dense) vshards.push_back(DenseVShard(d.name, n));
  for (const LogDenseInstallView& d : view->dense_installs) {
    vshards.push_back(DenseVShard(d.name, n));
  }
  std::sort(vshards.begin(), vshards.end());
  vshards.erase(std::unique(vshards.begin(), vshards.end()), vshards.end());
  std::string kept;
  size_t lost = 0;
  for (uint32_t v : vshards) {
    if (v >= n || !own.Owns(v)) {
      ++lost;
      continue;
    }
    char bytes[sizeof(v)];
    std::memcpy(bytes, &v, sizeof(v));
    kept.append(bytes, sizeof(v));
  }
  if (lost == 0) return absl::OkStatus();
  if (kept.empty()) return why;
  absl::Status out = why;
  out.SetPayload(kKeptVShardsUrl, absl::Cord(kept));
  return out;
}

std::optional<std::vector<uint32_t>> KeptVShards(const absl::Status& s) {
  if (s.ok()) return std::nullopt;
  const auto payload = s.GetPayload(kKeptVShardsUrl);  // absl::optional<absl::Cord>
  if (!payload.has_value()) return std::nullopt;
  const std::string bytes(*payload);
  std::vector<uint32_t> out(bytes.size() / sizeof(uint32_t));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(uint32_t));
  return out;
}

void FinishPushKey(PushDedup& dedup, const PushKey& key, const absl::Status& s,
                   const std::vector<uint32_t>* part) {
  std::optional<std::vector<uint32_t>> kept = KeptVShards(s);
  if (kept.has_value() && part != nullptr) {
    std::vector<uint32_t> both;
    std::set_intersection(kept->begin(), kept->end(), part->begin(), part->end(),
                          std::back_inserter(both));
    kept = std::move(both);
  }
  if (kept.has_value() && !kept->empty()) {
    dedup.Finish(key, /*applied=*/true, &*kept);
  } else {
    dedup.Finish(key, /*applied=*/s.ok(), part);
  }
}

}  // namespace ps
