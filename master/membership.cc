// Membership: loading, pods and their leases, the map as pods and clients see it. The move
// in flight is in membership_moves.cc.
#include "master/membership.h"

#include <glog/logging.h>

#include <algorithm>
#include <cctype>
#include <set>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "master/keys.h"

namespace ps {
namespace {

// Natural order of pod ids: "ps-2" < "ps-10"; ids without a numeric suffix sort by text.
bool PodIdLess(const std::string& a, const std::string& b) {
  auto split = [](const std::string& s) {
    size_t i = s.size();
    while (i > 0 && std::isdigit(static_cast<unsigned char>(s[i - 1]))) --i;
    uint64_t n = 0;
    const bool has_num = i < s.size() && absl::SimpleAtoi(s.substr(i), &n);
    return std::make_tuple(s.substr(0, i), has_num ? 0 : 1, n, s);
  };
  return split(a) < split(b);
}

int64_t RemainingMs(absl::Time deadline, absl::Time now) {
  return absl::ToInt64Milliseconds(deadline - now);
}

}  // namespace

absl::StatusOr<std::vector<MoveRecord>> Membership::Load(absl::Time lease_deadline) {
  ASSIGN_OR_RETURN(std::optional<ShardMapRecord> map,
                   GetRecord<ShardMapRecord>(*store_, keys::kMap));
  if (!map.has_value()) return absl::DataLossError("master store: no shard map record");
  if (map->followers_size() != 0 &&
      map->followers_size() != static_cast<int>(config_.num_vshards())) {
    return absl::DataLossError(absl::StrCat("master store: shard map has ", map->followers_size(),
                                            " follower sets for ", config_.num_vshards(),
                                            " vshards"));
  }
  if (map->owner_size() != static_cast<int>(config_.num_vshards())) {
    return absl::DataLossError(absl::StrCat("master store: shard map has ", map->owner_size(),
                                            " owners for ", config_.num_vshards(), " vshards"));
  }
  std::map<std::string, Pod> pods;
  RETURN_IF_ERROR(
      ScanRecords<PodRecord>(*store_, keys::kPodPrefix, [&](absl::string_view, PodRecord record) {
        Pod& pod = pods[record.pod_id()];
        pod.record = std::move(record);
        pod.lease_deadline = lease_deadline;
        return absl::OkStatus();
      }));
  StoreBatch batch;
  std::vector<MoveRecord> aborted;
  std::vector<std::string> names;
  RETURN_IF_ERROR(ScanRecords<MoveRecord>(
      *store_, keys::kMovePrefix, [&](absl::string_view key, MoveRecord move) {
        batch.Delete(std::string(key));
        names.push_back(absl::StrCat("move ", move.move_id(), " (", move.source(), " -> ",
                                     move.destination(), ", ", move.vshards_size(), " vshards)"));
        aborted.push_back(std::move(move));
        return absl::OkStatus();
      }));
  absl::MutexLock lock(&mu_);
  map_ = *std::move(map);
  pods_ = std::move(pods);
  if (!aborted.empty()) {
    ShardMapRecord next = map_;
    next.set_epoch(next.epoch() + 1);
    RETURN_IF_ERROR(WriteMap(std::move(batch), std::move(next)));
    LOG(WARNING) << "aborted " << absl::StrJoin(names, ", ")
                 << " left by the previous master; epoch " << map_.epoch();
  }
  return aborted;
}

absl::Status Membership::WriteMap(StoreBatch batch, ShardMapRecord map) {
  batch.Put(std::string(keys::kMap), map);
  RETURN_IF_ERROR(store_->Write(batch));
  map_ = std::move(map);
  return absl::OkStatus();
}

void Membership::FillAssignment(const std::string& pod_id, PodAssignment* out) const {
  out->set_epoch(map_.epoch());
  out->set_num_vshards(config_.num_vshards());
  for (int v = 0; v < map_.owner_size(); ++v) {
    if (map_.owner(v) == pod_id) out->add_owned_vshards(v);
  }
  out->set_lease_ms(absl::ToInt64Milliseconds(options_.lease));
  out->set_catalog_version(counters_->catalog_version());
  for (const auto& [id, move] : moves_) {
    if (move.destination() == pod_id) *out->mutable_moving_in() = move.vshards();
    if (move.source() == pod_id) *out->mutable_moving_out() = move.vshards();
  }
  if (config_.replication() >= 2) FillReplication(pod_id, out->mutable_replication());
}

absl::Status Membership::RegisterPod(const RegisterPodRequest& req, RegisterPodResponse* resp,
                                     bool* joined_empty, std::vector<std::string>* tell) {
  if (req.pod_id().empty() || req.pod_id().size() > 128 || req.address().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("RegisterPod needs a pod_id (1..128 characters) and an address; got pod_id '",
                     req.pod_id(), "', address '", req.address(), "'"));
  }
  if (joined_empty != nullptr) *joined_empty = false;
  absl::MutexLock lock(&mu_);
  if (req.num_vshards() != 0 && req.num_vshards() != config_.num_vshards()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pod ", req.pod_id(), " runs with num_vshards = ", req.num_vshards(),
                     " but the cluster has ", config_.num_vshards(),
                     "; restart it with --num_vshards=", config_.num_vshards()));
  }
  const absl::Time now = Now();
  auto it = pods_.find(req.pod_id());
  const bool known = it != pods_.end();
  if (known && it->second.record.address() != req.address() && it->second.lease_deadline > now) {
    return absl::AlreadyExistsError(
        absl::StrCat("pod ", req.pod_id(), " is registered at ", it->second.record.address(),
                     " with a live lease (", RemainingMs(it->second.lease_deadline, now),
                     " ms left); refusing the same identity from ", req.address(),
                     ". If the old pod is gone, retry after its lease expires."));
  }
  if (known && StorageLost(it->second.record, req)) {
    RETURN_IF_ERROR(LoseStorage(it->second.record, req, now, tell));
  } else if (req.log_tail_lost() && config_.replication() >= 2) {
    RETURN_IF_ERROR(LoseLogTail(req.pod_id(), now, tell));
  }
  const bool address_changed = !known || it->second.record.address() != req.address();
  if (address_changed) {
    PodRecord record;  // a new process: not drained (any more)
    record.set_pod_id(req.pod_id());
    record.set_address(req.address());
    record.set_storage_id(req.storage_id().empty() && known ? it->second.record.storage_id()
                                                            : req.storage_id());
    ShardMapRecord map = map_;
    map.set_epoch(map.epoch() + 1);
    StoreBatch batch;
    batch.Put(keys::Pod(req.pod_id()), record);
    RETURN_IF_ERROR(WriteMap(std::move(batch), std::move(map)));
    pods_[req.pod_id()].record = std::move(record);
    LOG(INFO) << "pod " << req.pod_id() << " registered at " << req.address() << "; epoch "
              << map_.epoch();
    // A pod that owns nothing joined (new, or undrained): spread the vshards onto it.
    if (joined_empty != nullptr) *joined_empty = OwnedBy(req.pod_id()) == 0;
    // Its primaries stream to it at its address: told now, not at their next heartbeat (a
    // third of a lease away, while their pushes wait for it and its lag passes the bound).
    if (tell != nullptr) {
      for (std::string& primary : LivePrimariesFollowedBy(req.pod_id(), now)) {
        tell->push_back(std::move(primary));
      }
    }
  } else if (!req.storage_id().empty() && it->second.record.storage_id() != req.storage_id()) {
    RETURN_IF_ERROR(RecordStorage(req.pod_id(), req.storage_id()));
  }
  Pod& pod = pods_[req.pod_id()];
  pod.lease_deadline = now + options_.lease;
  pod.lost_logged = false;
  FillAssignment(req.pod_id(), resp->mutable_assignment());
  return absl::OkStatus();
}

absl::Status Membership::PodHeartbeat(const PodHeartbeatRequest& req, PodHeartbeatResponse* resp) {
  absl::MutexLock lock(&mu_);
  auto it = pods_.find(req.pod_id());
  if (it == pods_.end()) {
    return absl::NotFoundError(
        absl::StrCat("pod ", req.pod_id(), " is not registered; call RegisterPod first"));
  }
  if (it->second.record.address() != req.address()) {
    return absl::FailedPreconditionError(absl::StrCat("pod ", req.pod_id(), " is registered at ",
                                                      it->second.record.address(), ", not ",
                                                      req.address(), "; register again"));
  }
  if (it->second.lost_logged) LOG(INFO) << "pod " << req.pod_id() << " is back";
  const absl::Time now = Now();
  it->second.lease_deadline = now + options_.lease;
  it->second.lost_logged = false;
  if (config_.replication() >= 2) {
    if (absl::Status s = TakeLagReport(req, now); !s.ok()) {
      // The heartbeat still renews the lease; the next one reports the lag again.
      LOG(ERROR) << "pod " << req.pod_id() << "'s report of lagging followers not applied: " << s;
    }
  }
  FillAssignment(req.pod_id(), resp->mutable_assignment());
  return absl::OkStatus();
}

absl::Status Membership::LeavePod(const LeavePodRequest& req, LeavePodResponse*) {
  absl::MutexLock lock(&mu_);
  auto it = pods_.find(req.pod_id());
  if (it == pods_.end()) {
    return absl::NotFoundError(absl::StrCat("pod ", req.pod_id(), " is not registered"));
  }
  if (it->second.record.address() != req.address()) {
    return absl::FailedPreconditionError(absl::StrCat("pod ", req.pod_id(), " is registered at ",
                                                      it->second.record.address(), ", not ",
                                                      req.address()));
  }
  it->second.lease_deadline = Now();
  it->second.lost_logged = true;
  LOG(INFO) << "pod " << req.pod_id() << " at " << req.address()
            << " left (shutting down); its vshards stay assigned to it, epoch " << map_.epoch();
  return absl::OkStatus();
}

std::vector<std::string> Membership::ExpireLeases(absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> lost;
  for (auto& [id, pod] : pods_) {
    if (pod.lease_deadline <= now && !pod.lost_logged) {
      pod.lost_logged = true;
      lease_losses_.fetch_add(1);
      lost.push_back(id);
      LOG(WARNING) << "pod " << id << " at " << pod.record.address() << " LOST: no heartbeat for "
                   << absl::FormatDuration(options_.lease + (now - pod.lease_deadline));
    }
  }
  if (lost.empty() || config_.replication() < 2) return {};
  absl::StatusOr<std::vector<std::string>> tell = FailOver(lost, now);
  if (!tell.ok()) {
    // Nothing changed: the next round tries again.
    LOG(ERROR) << "failover after losing " << absl::StrJoin(lost, ", ")
               << " failed: " << tell.status();
    for (const std::string& id : lost) pods_[id].lost_logged = false;
    lease_losses_.fetch_sub(lost.size());
    return {};
  }
  return *std::move(tell);
}

std::vector<std::string> Membership::KnownPodIds() const {
  std::set<std::string> ids(map_.owner().begin(), map_.owner().end());
  for (const auto& [id, pod] : pods_) ids.insert(id);
  std::vector<std::string> out(ids.begin(), ids.end());
  std::sort(out.begin(), out.end(), PodIdLess);
  return out;
}

std::vector<std::string> Membership::LivePrimariesFollowedBy(const std::string& pod_id,
                                                             absl::Time now) const {
  std::set<std::string> primaries;
  for (int v = 0; v < map_.followers_size() && v < map_.owner_size(); ++v) {
    const std::string& owner = map_.owner(v);
    if (owner != pod_id && InAckSet(v, pod_id) && Live(owner, now)) primaries.insert(owner);
  }
  return std::vector<std::string>(primaries.begin(), primaries.end());
}

uint32_t Membership::OwnedBy(const std::string& pod_id) const {
  uint32_t n = 0;
  for (const std::string& o : map_.owner()) n += o == pod_id;
  return n;
}

bool Membership::Live(const std::string& pod_id, absl::Time now) const {
  auto it = pods_.find(pod_id);
  return it != pods_.end() && it->second.lease_deadline > now;
}

PodInfo Membership::DescribePod(const std::string& pod_id, absl::Time now) const {
  PodInfo info;
  info.set_pod_id(pod_id);
  const uint32_t owned = OwnedBy(pod_id);
  info.set_vshards(owned);
  auto it = pods_.find(pod_id);
  if (it == pods_.end()) {
    info.set_state(PodInfo::NEVER_REGISTERED);
    return info;
  }
  info.set_address(it->second.record.address());
  info.set_lease_remaining_ms(RemainingMs(it->second.lease_deadline, now));
  info.set_state(it->second.lease_deadline > now ? PodInfo::LIVE : PodInfo::LOST);
  if (info.state() == PodInfo::LIVE && it->second.record.drained() && owned == 0) {
    info.set_state(PodInfo::DRAINED);
  }
  return info;
}

absl::Status Membership::GetShardMap(const GetShardMapRequest&, ShardMapResponse* resp) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = Now();
  resp->set_epoch(map_.epoch());
  resp->set_num_vshards(config_.num_vshards());
  std::map<std::string, uint32_t> index;
  for (const std::string& id : KnownPodIds()) {
    index[id] = resp->pods_size();
    *resp->add_pods() = DescribePod(id, now);
  }
  for (const std::string& o : map_.owner()) resp->add_owner(index[o]);
  resp->set_replication(std::max(1u, config_.replication()));
  for (const ReplicaSet& set : map_.followers()) {
    Followers* f = resp->add_followers();
    for (const std::string& p : set.pods()) f->add_pods(index[p]);
  }
  resp->set_failovers(failovers_.load());
  if (config_.replication() >= 2) AddLags(now, resp->mutable_lags());
  for (MoveInfo& info : MovesInFlightLocked()) *resp->add_moves() = std::move(info);
  return absl::OkStatus();
}

void Membership::Describe(absl::Time now, StatusResponse* resp) const {
  absl::MutexLock lock(&mu_);
  resp->set_epoch(map_.epoch());
  resp->set_num_vshards(config_.num_vshards());
  for (const std::string& id : KnownPodIds()) *resp->add_pods() = DescribePod(id, now);
  if (config_.replication() >= 2) DescribeReplication(now, resp->mutable_replication());
}

ClusterView Membership::View() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = Now();
  ClusterView view;
  view.epoch = map_.epoch();
  view.owner.assign(map_.owner().begin(), map_.owner().end());
  view.replication = std::max(1u, config_.replication());
  for (const ReplicaSet& set : map_.followers())
    view.followers.emplace_back(set.pods().begin(), set.pods().end());
  view.known = KnownPodIds();
  for (const auto& [id, pod] : pods_) {
    ClusterView::Pod& p = view.registered[id];
    p.address = pod.record.address();
    p.live = pod.lease_deadline > now;
    p.drained = pod.record.drained();
  }
  return view;
}

absl::Status Membership::MarkDrained(const std::string& pod_id) {
  absl::MutexLock lock(&mu_);
  auto pod = pods_.find(pod_id);
  if (pod == pods_.end() || pod->second.record.drained()) return absl::OkStatus();
  PodRecord record = pod->second.record;
  record.set_drained(true);
  StoreBatch batch;
  batch.Put(keys::Pod(pod_id), record);
  RETURN_IF_ERROR(store_->Write(batch));
  pod->second.record = std::move(record);
  return absl::OkStatus();
}

std::optional<Membership::AddressedAssignment> Membership::AssignmentOf(
    const std::string& pod_id) const {
  absl::MutexLock lock(&mu_);
  auto it = pods_.find(pod_id);
  if (it == pods_.end()) return std::nullopt;
  AddressedAssignment out;
  out.address = it->second.record.address();
  FillAssignment(pod_id, &out.assignment);
  return out;
}

uint64_t Membership::epoch() const {
  absl::MutexLock lock(&mu_);
  return map_.epoch();
}

size_t Membership::pod_count() const {
  absl::MutexLock lock(&mu_);
  return pods_.size();
}

}  // namespace ps
