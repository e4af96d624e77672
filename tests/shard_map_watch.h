// The master's shard map as the multi-process tests watch it: fetch it, wait for a
// condition on it, and the conditions the replication tests wait for. Thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/master.grpc.pb.h"

namespace ps::integration {

class ShardMapWatch {
 public:
  explicit ShardMapWatch(const std::string& master_address);

  // The master's map now (one GetShardMap, 2 s deadline).
  absl::StatusOr<ShardMapResponse> Fetch() const;
  // Polls every 20 ms until `done(map)` holds: that map, or DEADLINE_EXCEEDED (naming
  // `what`) after `timeout`.
  absl::StatusOr<ShardMapResponse> WaitFor(const std::function<bool(const ShardMapResponse&)>& done,
                                           absl::Duration timeout, const std::string& what) const;

 private:
  std::unique_ptr<Master::Stub> stub_;
};

// The state of pod `pod_id` in `map` (UNKNOWN if it is not there).
PodInfo::State PodState(const ShardMapResponse& map, const std::string& pod_id);
// The vshards `pod_id` owns (leads) in `map`.
std::vector<uint32_t> OwnedVShards(const ShardMapResponse& map, const std::string& pod_id);
// Whether every vshard has `replication` copies (its owner and replication - 1 followers)
// on pods that are all LIVE.
bool FullyReplicated(const ShardMapResponse& map, uint32_t replication);

}  // namespace ps::integration
