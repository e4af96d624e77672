// Membership: the move in flight, and the trim of ack sets beyond R - 1 (re-replication's
// other map change). The protocol around a move's map changes (telling the pods, the copy,
// aborting on failure) is MoveRunner's (move_runner.h).
#include <glog/logging.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "master/keys.h"
#include "master/membership.h"

namespace ps {

absl::StatusOr<Membership::StartedMove> Membership::BeginMove(const std::string& source,
                                                              const std::string& destination,
                                                              const std::vector<uint32_t>& vshards,
                                                              bool follower,
                                                              const std::string& replaces) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = Now();
  if (!moves_.empty()) {
    return absl::AbortedError(
        absl::StrCat("move ", moves_.begin()->first, " is in progress; one move at a time"));
  }
  if (config_.replication() < 2 && follower) {
    return absl::FailedPreconditionError("follower copies need replication >= 2");
  }
  if (!replaces.empty() && (!follower || replaces == destination)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a move replacing ", replaces, " must be a follower copy to another pod"));
  }
  if (vshards.empty() || source == destination) {
    return absl::InvalidArgumentError("a move needs vshards and two different pods");
  }
  for (const std::string& pod : {source, destination}) {
    if (!Live(pod, now)) {
      return absl::UnavailableError(absl::StrCat("pod ", pod, " is not live"));
    }
  }
  for (uint32_t v : vshards) {
    if (v >= config_.num_vshards() || map_.owner(v) != source) {
      return absl::FailedPreconditionError(
          absl::StrCat("vshard ", v, " is not owned by ", source, " at epoch ", map_.epoch()));
    }
    if (InAckSet(v, destination)) {
      return absl::FailedPreconditionError(
          absl::StrCat("pod ", destination, " already follows vshard ", v, " at epoch ",
                       map_.epoch(), follower ? "" : ": copies of a vshard stay on distinct pods"));
    }
    if (!replaces.empty() && !InAckSet(v, replaces)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "pod ", replaces, " does not follow vshard ", v, " at epoch ", map_.epoch()));
    }
  }
  // next_move_id is ours (see counters_record.h): read now, written with the move.
  StartedMove started;
  MoveRecord& move = started.move;
  move.set_move_id(counters_->Get().next_move_id() + 1);
  for (uint32_t v : vshards) move.add_vshards(v);
  move.set_source(source);
  move.set_destination(destination);
  move.set_follower(follower);
  move.set_replaces(replaces);
  ShardMapRecord map = map_;
  map.set_epoch(map.epoch() + 1);
  StoreBatch batch;
  batch.Put(keys::Move(move.move_id()), move);
  batch.Put(std::string(keys::kMap), map);
  RETURN_IF_ERROR(counters_->Write(std::move(batch),
                                   [&](Counters* c) { c->set_next_move_id(move.move_id()); }));
  map_ = std::move(map);
  moves_[move.move_id()] = move;
  for (int v = 0; v < map_.owner_size() && v < map_.followers_size(); ++v) {
    if (map_.owner(v) != source && map_.owner(v) != destination) continue;
    for (const std::string& pod : map_.followers(v).pods()) {
      if (pod != source && pod != destination &&
          std::find(started.also_told.begin(), started.also_told.end(), pod) ==
              started.also_told.end()) {
        started.also_told.push_back(pod);
      }
    }
  }
  if (!replaces.empty() && std::find(started.also_told.begin(), started.also_told.end(),
                                     replaces) == started.also_told.end()) {
    started.also_told.push_back(replaces);
  }
  started.source_address = pods_[source].record.address();
  started.destination_address = pods_[destination].record.address();
  return started;
}

absl::StatusOr<uint64_t> Membership::CommitMove(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = moves_.find(id);
  if (it == moves_.end()) {
    return absl::InternalError(absl::StrCat("move ", id, " is not in flight; cannot commit it"));
  }
  const MoveRecord& move = it->second;
  ShardMapRecord map = map_;
  map.set_epoch(map.epoch() + 1);
  // The copy is only good while its source leads the vshards.
  for (uint32_t v : move.vshards()) {
    if (map.owner(v) != move.source()) {
      return absl::FailedPreconditionError(
          absl::StrCat("vshard ", v, " is no longer led by ", move.source(), " (now ", map.owner(v),
                       "): the copy on ", move.destination(), " may miss changes"));
    }
  }
  if (move.follower()) {
    // A follower that is not live would be waited for by the primary's pushes with no
    // lease loss left to drop it.
    if (!Live(move.destination(), Now())) {
      return absl::FailedPreconditionError(
          absl::StrCat("pod ", move.destination(), " is not live; not adding it as a follower"));
    }
    for (uint32_t v : move.vshards()) {
      ReplicaSet* set = map.mutable_followers(v);
      std::vector<std::string> pods(set->pods().begin(), set->pods().end());
      pods.erase(std::remove(pods.begin(), pods.end(), move.replaces()), pods.end());
      if (std::find(pods.begin(), pods.end(), move.destination()) == pods.end()) {
        pods.push_back(move.destination());
      }
      set->clear_pods();
      for (const std::string& p : pods) set->add_pods(p);
    }
  } else {
    for (uint32_t v : move.vshards()) map.set_owner(v, move.destination());
  }
  StoreBatch batch;
  batch.Delete(keys::Move(id));
  RETURN_IF_ERROR(WriteMap(std::move(batch), std::move(map)));
  moves_.erase(it);
  return map_.epoch();
}

absl::StatusOr<std::optional<Membership::AbortedMove>> Membership::AbortMove(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = moves_.find(id);
  if (it == moves_.end()) return std::nullopt;
  ShardMapRecord map = map_;
  map.set_epoch(map.epoch() + 1);
  StoreBatch batch;
  batch.Delete(keys::Move(id));
  RETURN_IF_ERROR(WriteMap(std::move(batch), std::move(map)));
  AbortedMove out{std::move(it->second), map_.epoch()};
  moves_.erase(it);
  return out;
}

absl::StatusOr<std::vector<std::string>> Membership::TrimAckSets(
    const std::map<uint32_t, std::vector<std::string>>& drops) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = Now();
  const size_t wanted = config_.replication() >= 2 ? config_.replication() - 1 : 0;
  std::set<uint32_t> moving;
  for (const auto& [id, move] : moves_) moving.insert(move.vshards().begin(), move.vshards().end());
  ShardMapRecord next = map_;
  std::set<std::string> tell;
  std::map<std::string, std::vector<uint32_t>> dropped;  // follower -> vshards
  uint32_t removed = 0;
  for (const auto& [v, pods] : drops) {
    if (v >= static_cast<uint32_t>(next.followers_size()) || moving.count(v) > 0 ||
        !Live(next.owner(v), now)) {
      continue;
    }
    ReplicaSet* set = next.mutable_followers(v);
    for (const std::string& f : pods) {
      if (static_cast<size_t>(set->pods_size()) <= wanted) break;
      auto it = std::find(set->pods().begin(), set->pods().end(), f);
      if (it == set->pods().end()) continue;
      set->mutable_pods()->erase(set->mutable_pods()->begin() + (it - set->pods().begin()));
      ++removed;
      dropped[f].push_back(v);
      tell.insert(next.owner(v));
      if (Live(f, now)) tell.insert(f);
    }
  }
  if (removed == 0) return std::vector<std::string>();
  next.set_epoch(next.epoch() + 1);
  RETURN_IF_ERROR(WriteMap(StoreBatch(), std::move(next)));
  removed_surplus_.fetch_add(removed);
  for (const auto& [f, vshards] : dropped) {
    LOG(WARNING)
        << "ACK SET: " << f << " removed from the ack set of " << vshards.size() << " vshards ("
        << absl::StrJoin(vshards, ",") << ") at epoch " << map_.epoch()
        << ": they had more than R = " << config_.replication()
        << " copies (a copy was made in place of a follower not live then, e.g. not started yet)"
        << (Live(f, now) ? "; it drops their rows" : "; it is not live");
  }
  return std::vector<std::string>(tell.begin(), tell.end());
}

bool Membership::InAckSet(uint32_t v, const std::string& pod_id) const {
  if (v >= static_cast<uint32_t>(map_.followers_size())) return false;
  const auto& pods = map_.followers(v).pods();
  return std::find(pods.begin(), pods.end(), pod_id) != pods.end();
}

std::vector<MoveInfo> Membership::MovesInFlightLocked() const {
  std::vector<MoveInfo> out;
  for (const auto& [id, move] : moves_) {
    MoveInfo& info = out.emplace_back();
    info.set_move_id(id);
    *info.mutable_vshards() = move.vshards();
    info.set_source(move.source());
    info.set_destination(move.destination());
    info.set_follower(move.follower());
    info.set_replaces(move.replaces());
    info.set_state(MoveInfo::COPYING);
  }
  return out;
}

std::vector<MoveInfo> Membership::MovesInFlight() const {
  absl::MutexLock lock(&mu_);
  return MovesInFlightLocked();
}

}  // namespace ps
