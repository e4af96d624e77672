// Membership: replication. The role each pod is told (its followers, the vshards it
// follows) and failover when a pod's lease runs out. The design is in
// docs/architecture.md, "Replication".
#include <glog/logging.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "master/keys.h"
#include "master/membership.h"

namespace ps {

void Membership::FillReplication(const std::string& pod_id, ReplicationRole* out) const {
  out->set_pod_id(pod_id);
  out->set_factor(config_.replication());
  out->set_ack_leader(options_.replication_ack_leader);
  out->set_lease_ms(absl::ToInt64Milliseconds(options_.lease));
  out->set_max_lag_ms(absl::ToInt64Milliseconds(options_.replication_max_lag));
  std::set<std::string> followers;
  std::map<std::string, std::vector<uint32_t>> following;  // primary -> vshards
  for (int v = 0; v < map_.followers_size(); ++v) {
    const auto& set = map_.followers(v).pods();
    if (map_.owner(v) == pod_id) {
      followers.insert(set.begin(), set.end());
      if (set.empty() && config_.replication() >= 2) out->add_sole_copy(v);
    }
    if (std::find(set.begin(), set.end(), pod_id) != set.end()) {
      following[map_.owner(v)].push_back(v);
    }
  }
  for (const std::string& f : followers) {
    ReplicaPeer* peer = out->add_followers();
    peer->set_pod_id(f);
    // A follower that never registered has no address yet: the primary's stream to it
    // fails (and its pushes wait) until it registers, or its lease loss drops it.
    auto it = pods_.find(f);
    if (it != pods_.end()) peer->set_address(it->second.record.address());
  }
  for (auto& [primary, vshards] : following) {
    FollowedVShards* f = out->add_following();
    f->set_primary(primary);
    for (uint32_t v : vshards) f->add_vshards(v);
  }
}

absl::StatusOr<std::vector<std::string>> Membership::FailOver(const std::vector<std::string>& lost,
                                                              absl::Time now) {
  if (map_.followers_size() == 0) return std::vector<std::string>();
  const std::set<std::string> gone(lost.begin(), lost.end());
  ShardMapRecord next = map_;
  std::set<std::string> tell;
  std::map<std::string, std::vector<uint32_t>> promoted;  // new primary -> vshards
  std::vector<uint32_t> stranded;                         // no live follower to promote
  std::map<std::string, std::vector<uint32_t>> resynced;  // follower left out -> vshards
  uint32_t dropped = 0;
  // The live pod of a vshard's `ack_set` with the most of `primary`'s log: the fewest
  // records shipped to it and not yet acknowledged in the primary's latest lag report
  // (unreported: last, it may have just joined; ties: the earlier in the ack set).
  auto most_caught_up = [&](const std::string& primary, std::vector<std::string>& ack_set) {
    std::map<std::string, uint64_t> unheld;
    if (auto it = lag_reports_.find(primary); it != lag_reports_.end()) {
      for (const FollowerLag& f : it->second.followers) unheld[f.follower()] = f.records();
    }
    auto best = ack_set.end();
    uint64_t best_unheld = 0;
    for (auto f = ack_set.begin(); f != ack_set.end(); ++f) {
      if (!Live(*f, now)) continue;
      auto reported = unheld.find(*f);
      const uint64_t n = reported == unheld.end() ? UINT64_MAX : reported->second;
      if (best == ack_set.end() || n < best_unheld) {
        best = f;
        best_unheld = n;
      }
    }
    return best;
  };
  for (int v = 0; v < next.owner_size(); ++v) {
    ReplicaSet* set = next.mutable_followers(v);
    // The lost pods leave the ack set: the primary acknowledges without them from now on.
    std::vector<std::string> kept;
    for (const std::string& f : set->pods()) {
      if (gone.count(f) > 0) {
        ++dropped;
        tell.insert(next.owner(v));
      } else {
        kept.push_back(f);
      }
    }
    const std::string owner = next.owner(v);
    if (gone.count(owner) > 0) {
      // Every follower still in the ack set holds every acknowledged record, so any live
      // one is correct; the one with the most of the log keeps the most unacknowledged.
      auto live = most_caught_up(owner, kept);
      if (live == kept.end()) {
        stranded.push_back(v);
      } else {
        next.set_owner(v, *live);
        promoted[*live].push_back(v);
        tell.insert(owner);  // if only paused, it learns at once that it was deposed
        kept.erase(live);
        // R >= 3: the other followers may lack records the promoted one holds (shipped by
        // the lost primary, not yet acknowledged): a client's retry of one is answered
        // "duplicate" by the new primary, and a second failover to such a follower would
        // lose it. No follower can tell which of the lost primary's records another holds
        // (each stream is numbered on its own), so they leave the ack set and
        // re-replication copies the new primary's state (rows and push keys) to them.
        for (const std::string& f : kept) {
          tell.insert(f);
          resynced[f].push_back(v);
        }
        kept.clear();
      }
    }
    set->clear_pods();
    for (const std::string& f : kept) set->add_pods(f);
  }
  if (dropped == 0 && promoted.empty()) return std::vector<std::string>();
  next.set_epoch(next.epoch() + 1);
  RETURN_IF_ERROR(WriteMap(StoreBatch(), std::move(next)));
  for (const auto& [pod, vshards] : promoted) {
    tell.insert(pod);
    failovers_.fetch_add(1);
    LOG(WARNING) << "FAILOVER: " << pod << " promoted to primary of " << vshards.size()
                 << " vshards of " << absl::StrJoin(lost, ", ") << " at epoch " << map_.epoch();
  }
  if (dropped > 0) {
    removed_lease_.fetch_add(dropped);
    LOG(WARNING) << absl::StrJoin(lost, ", ") << " left the ack sets of " << dropped
                 << " vshard copies at epoch " << map_.epoch()
                 << "; those vshards have fewer copies until re-replication";
  }
  for (const auto& [pod, vshards] : resynced) {
    removed_failover_.fetch_add(vshards.size());
    LOG(WARNING) << "ACK SET: " << pod << " removed from the ack sets of " << vshards.size()
                 << " vshards whose primary failed over at epoch " << map_.epoch()
                 << ": it may lack records the new primary holds; re-replication copies them "
                    "to it again";
  }
  if (!stranded.empty()) {
    LOG(ERROR) << stranded.size() << " vshards of " << absl::StrJoin(lost, ", ")
               << " have no live follower to promote: unavailable until their primary returns";
  }
  return std::vector<std::string>(tell.begin(), tell.end());
}

bool Membership::StorageLost(const PodRecord& record, const RegisterPodRequest& req) {
  if (req.storage_id().empty()) return false;  // an older pod: nothing reported
  if (!record.storage_id().empty()) return record.storage_id() != req.storage_id();
  return req.fresh_storage();
}

absl::Status Membership::LoseStorage(const PodRecord& record, const RegisterPodRequest& req,
                                     absl::Time now, std::vector<std::string>* tell) {
  const std::string& pod_id = record.pod_id();
  LOG(ERROR) << "LOST STORAGE: pod " << pod_id << " registered with storage id " << req.storage_id()
             << (req.fresh_storage() ? " (created by its start)" : "") << ", not the "
             << (record.storage_id().empty() ? "data it had" : record.storage_id())
             << ": its data dir was lost or replaced, so every copy it held is gone";
  storage_losses_.fetch_add(1);
  if (config_.replication() < 2) {
    const uint32_t owned = OwnedBy(pod_id);
    if (owned > 0) {
      LOG(ERROR) << "with --replication=1 the rows of the " << owned << " vshards " << pod_id
                 << " owns are lost; it serves them from its empty data (restore a checkpoint "
                    "to get them back)";
    }
    return absl::OkStatus();
  }
  // Its copies are gone now, whether or not its lease ran out: the same step as a lease
  // loss, without the wait (the lease check is skipped: the pod is registering).
  return FailOverRegistering(pod_id, now, tell);
}

absl::Status Membership::LoseLogTail(const std::string& pod_id, absl::Time now,
                                     std::vector<std::string>* tell) {
  uint32_t led = 0, followed = 0;
  for (int v = 0; v < map_.owner_size(); ++v) {
    led +=
        map_.owner(v) == pod_id && map_.followers_size() > v && map_.followers(v).pods_size() > 0;
    followed += InAckSet(v, pod_id);
  }
  LOG(WARNING) << "LOG TAIL LOST: pod " << pod_id
               << " restarted after a crash in a durability mode that acknowledges before "
                  "writing (periodic): its log may lack records it acknowledged, which its "
                  "followers or primaries hold; it gives up "
               << led << " vshards it led with followers and " << followed
               << " follower copies (failed over and refilled by re-replication)";
  log_tail_losses_.fetch_add(1);
  // A primary with a short log behind followers that hold more would serve and extend rows
  // its followers hold newer updates of; a follower missing what it acknowledged could be
  // promoted later. Both are the case of a lost volume, for the tail only.
  return FailOverRegistering(pod_id, now, tell);
}

absl::Status Membership::FailOverRegistering(const std::string& pod_id, absl::Time now,
                                             std::vector<std::string>* tell) {
  ASSIGN_OR_RETURN(std::vector<std::string> changed, FailOver({pod_id}, now));
  if (tell != nullptr) {
    for (std::string& p : changed) {
      if (p != pod_id) tell->push_back(std::move(p));  // it learns from its registration
    }
  }
  return absl::OkStatus();
}

absl::Status Membership::RecordStorage(const std::string& pod_id, const std::string& storage_id) {
  PodRecord record = pods_[pod_id].record;
  record.set_storage_id(storage_id);
  StoreBatch batch;
  batch.Put(keys::Pod(pod_id), record);
  RETURN_IF_ERROR(store_->Write(batch));
  pods_[pod_id].record = std::move(record);
  return absl::OkStatus();
}

}  // namespace ps
