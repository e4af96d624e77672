#include "tests/shard_map_watch.h"

#include <grpcpp/grpcpp.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/grpc_status.h"

namespace ps::integration {

ShardMapWatch::ShardMapWatch(const std::string& master_address)
    : stub_(Master::NewStub(
          grpc::CreateChannel(master_address, grpc::InsecureChannelCredentials()))) {}

absl::StatusOr<ShardMapResponse> ShardMapWatch::Fetch() const {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  ShardMapResponse map;
  absl::Status s = FromGrpcStatus(stub_->GetShardMap(&ctx, GetShardMapRequest(), &map));
  if (!s.ok()) return s;
  return map;
}

absl::StatusOr<ShardMapResponse> ShardMapWatch::WaitFor(
    const std::function<bool(const ShardMapResponse&)>& done, absl::Duration timeout,
    const std::string& what) const {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last;
  for (;;) {
    absl::StatusOr<ShardMapResponse> map = Fetch();
    if (map.ok() && done(*map)) return map;
    if (!map.ok()) last = map.status();
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the master's map did not show ", what, " within ", absl::FormatDuration(timeout),
          last.ok() ? "" : absl::StrCat(" (last fetch: ", last.ToString(), ")")));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

PodInfo::State PodState(const ShardMapResponse& map, const std::string& pod_id) {
  for (const PodInfo& p : map.pods()) {
    if (p.pod_id() == pod_id) return p.state();
  }
  return PodInfo::UNKNOWN;
}

std::vector<uint32_t> OwnedVShards(const ShardMapResponse& map, const std::string& pod_id) {
  std::vector<uint32_t> out;
  for (int v = 0; v < map.owner_size(); ++v) {
    if (map.pods(map.owner(v)).pod_id() == pod_id) out.push_back(v);
  }
  return out;
}

bool FullyReplicated(const ShardMapResponse& map, uint32_t replication) {
  for (const PodInfo& p : map.pods()) {
    if (p.state() != PodInfo::LIVE && p.state() != PodInfo::NEVER_REGISTERED) return false;
  }
  for (int v = 0; v < map.owner_size(); ++v) {
    if (map.pods(map.owner(v)).state() != PodInfo::LIVE) return false;
    const int followers = v < map.followers_size() ? map.followers(v).pods_size() : 0;
    if (static_cast<uint32_t>(followers) + 1 < replication) return false;
    if (v >= map.followers_size()) continue;
    for (uint32_t f : map.followers(v).pods()) {
      if (map.pods(f).state() != PodInfo::LIVE) return false;
    }
  }
  return true;
}

}  // namespace ps::integration
