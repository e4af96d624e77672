// Membership: what replicated primaries report of their followers (the lag of each stream,
// PodHeartbeatRequest.followers), the removal from the ack set of a follower its primary
// cannot keep up to date, and the replication part of status. The design is in
// docs/architecture.md, "Replication".
#include <glog/logging.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "master/membership.h"

namespace ps {

absl::Status Membership::TakeLagReport(const PodHeartbeatRequest& report, absl::Time now) {
  const std::string& primary = report.pod_id();
  if (report.followers().empty()) {
    lag_reports_.erase(primary);
    return absl::OkStatus();
  }
  LagReport& kept = lag_reports_[primary];
  kept.at = now;
  kept.followers.assign(report.followers().begin(), report.followers().end());

  const uint64_t max_lag_ms = absl::ToInt64Milliseconds(options_.replication_max_lag);
  std::set<std::string> lagging;
  for (const FollowerLag& f : report.followers()) {
    if (f.lag_ms() >= max_lag_ms && f.follower() != primary) lagging.insert(f.follower());
  }
  if (lagging.empty()) return absl::OkStatus();
  ShardMapRecord next = map_;
  uint32_t removed = 0;
  std::set<std::string> removed_pods;
  for (int v = 0; v < next.followers_size() && v < next.owner_size(); ++v) {
    if (next.owner(v) != primary) continue;  // only the reporter's own ack sets
    ReplicaSet* set = next.mutable_followers(v);
    std::vector<std::string> stay;
    for (const std::string& f : set->pods()) {
      if (lagging.count(f) > 0) {
        ++removed;
        removed_pods.insert(f);
      } else {
        stay.push_back(f);
      }
    }
    set->clear_pods();
    for (const std::string& f : stay) set->add_pods(f);
  }
  if (removed == 0) return absl::OkStatus();  // already out of the ack sets
  next.set_epoch(next.epoch() + 1);
  RETURN_IF_ERROR(WriteMap(StoreBatch(), std::move(next)));
  removed_lag_.fetch_add(removed);
  for (const FollowerLag& f : report.followers()) {
    if (removed_pods.count(f.follower()) == 0) continue;
    LOG(WARNING) << "ACK SET: " << f.follower() << " removed from the ack set of " << primary
                 << "'s vshards at epoch " << map_.epoch() << ": " << primary << " reports it "
                 << f.lag_ms() << " ms behind (" << f.records() << " records, " << f.bytes()
                 << " bytes, " << f.failed_calls() << " failed calls; bound " << max_lag_ms
                 << " ms); those vshards have fewer copies until re-replication";
  }
  LOG(WARNING) << removed << " vshard copies left the ack sets of " << primary << " ("
               << absl::StrJoin(removed_pods, ", ") << ")";
  return absl::OkStatus();
}

void Membership::AddLags(absl::Time now,
                         google::protobuf::RepeatedPtrField<ReplicaLag>* out) const {
  for (const auto& [primary, report] : lag_reports_) {
    for (const FollowerLag& f : report.followers) {
      ReplicaLag* lag = out->Add();
      lag->set_primary(primary);
      *lag->mutable_lag() = f;
      lag->set_reported_ms_ago(absl::ToInt64Milliseconds(now - report.at));
    }
  }
}

void Membership::DescribeReplication(absl::Time now, ReplicationInfo* out) const {
  const uint32_t factor = std::max(1u, config_.replication());
  out->set_factor(factor);
  out->set_ack_leader(options_.replication_ack_leader);
  out->set_max_lag_ms(absl::ToInt64Milliseconds(options_.replication_max_lag));
  out->set_failovers(failovers_.load());
  out->set_removed_lease(removed_lease_.load());
  out->set_removed_lag(removed_lag_.load());
  out->set_removed_surplus(removed_surplus_.load());
  out->set_removed_failover(removed_failover_.load());
  uint32_t under = 0;
  for (int v = 0; v < map_.owner_size(); ++v) {
    const int copies = 1 + (v < map_.followers_size() ? map_.followers(v).pods_size() : 0);
    under += copies < static_cast<int>(factor);
  }
  out->set_under_replicated_vshards(under);
  AddLags(now, out->mutable_lags());
}

}  // namespace ps
