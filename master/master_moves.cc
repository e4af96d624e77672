// MasterCore: live vshard moves, Drain and Rebalance.
//
// A move (one batch of vshards, source pod A -> destination pod B):
//   1. Record it (MoveRecord, epoch + 1) in one synced write, then send A and B their
//      assignments (moving_out / moving_in).
//   2. A: MigrateBegin (tracking starts). B: MigrateImport, which copies from A, fences A
//      for the final delta and returns once B holds everything durably.
//   3. Commit: the map names B, epoch + 1, the record deleted, in one synced write. Then B
//      and A get their assignments at once: B serves, A drops the rows.
// Any failure before the commit aborts: the record is deleted (epoch + 1) and both pods
// told; A keeps the vshards (and unfences), B drops what it copied. A master that restarts
// with a record aborts it (MasterCore::Load). So the map always names exactly one owner.
#include <glog/logging.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "master/keys.h"
#include "master/master_core.h"

namespace ps {
namespace {

Assignment ToAssignment(const PodAssignment& a) {
  Assignment out;
  out.set_epoch(a.epoch());
  out.set_num_vshards(a.num_vshards());
  *out.mutable_owned() = a.owned_vshards();
  *out.mutable_moving_in() = a.moving_in();
  *out.mutable_moving_out() = a.moving_out();
  return out;
}

constexpr size_t kRecentMoves = 32;

}  // namespace

uint32_t MasterCore::OwnedBy(const std::string& pod_id) const {
  uint32_t n = 0;
  for (const std::string& o : map_.owner()) n += o == pod_id;
  return n;
}

bool MasterCore::Live(const std::string& pod_id, absl::Time now) const {
  auto it = pods_.find(pod_id);
  return it != pods_.end() && it->second.lease_deadline > now;
}

void MasterCore::NotifyPod(const std::string& pod_id) {
  std::string address;
  PodAssignment a;
  {
    absl::MutexLock lock(&mu_);
    auto it = pods_.find(pod_id);
    if (it == pods_.end()) return;
    address = it->second.record.address();
    FillAssignment(pod_id, &a);
  }
  absl::Status s = options_.pod_control->ApplyAssignment(address, ToAssignment(a));
  if (!s.ok()) {
    LOG(WARNING) << "telling pod " << pod_id << " at " << address << " its assignment (epoch "
                 << a.epoch() << ") failed; its next heartbeat brings it: " << s;
  }
}

void MasterCore::AbortMove(uint64_t id, const std::string& why) {
  MoveRecord move;
  {
    absl::MutexLock lock(&mu_);
    auto it = moves_.find(id);
    if (it == moves_.end()) return;
    move = it->second;
    ShardMapRecord map = map_;
    map.set_epoch(map.epoch() + 1);
    StoreBatch batch;
    batch.Delete(keys::Move(id));
    batch.Put(std::string(keys::kMap), map);
    if (absl::Status s = store_->Write(batch); !s.ok()) {
      // Still recorded: the next master start aborts it. The pods keep the move's state
      // (the source fenced at worst) until then.
      LOG(ERROR) << "cannot record the abort of move " << id << ": " << s;
      return;
    }
    map_ = std::move(map);
    moves_.erase(it);
    MoveInfo info;
    info.set_move_id(id);
    *info.mutable_vshards() = move.vshards();
    info.set_source(move.source());
    info.set_destination(move.destination());
    info.set_state(MoveInfo::ABORTED);
    info.set_error(why);
    recent_moves_.push_back(std::move(info));
    if (recent_moves_.size() > kRecentMoves) recent_moves_.erase(recent_moves_.begin());
    LOG(WARNING) << "move " << id << " (" << move.source() << " -> " << move.destination()
                 << ") aborted: " << why << "; epoch " << map_.epoch();
  }
  NotifyPod(move.source());
  NotifyPod(move.destination());
}

absl::StatusOr<MoveInfo> MasterCore::MoveVShards(const std::string& source,
                                                 const std::string& destination,
                                                 const std::vector<uint32_t>& vshards) {
  MoveRecord move;
  std::string source_address, destination_address;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = Now();
    if (!moves_.empty()) {
      return absl::AbortedError(
          absl::StrCat("move ", moves_.begin()->first, " is in progress; one move at a time"));
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
    }
    Counters counters = counters_;
    counters.set_next_move_id(counters.next_move_id() + 1);
    move.set_move_id(counters.next_move_id());
    for (uint32_t v : vshards) move.add_vshards(v);
    move.set_source(source);
    move.set_destination(destination);
    ShardMapRecord map = map_;
    map.set_epoch(map.epoch() + 1);
    StoreBatch batch;
    batch.Put(keys::Move(move.move_id()), move);
    batch.Put(std::string(keys::kCounters), counters);
    batch.Put(std::string(keys::kMap), map);
    RETURN_IF_ERROR(store_->Write(batch));
    counters_ = std::move(counters);
    map_ = std::move(map);
    moves_[move.move_id()] = move;
    source_address = pods_[source].record.address();
    destination_address = pods_[destination].record.address();
  }
  const uint64_t id = move.move_id();
  const absl::Time start = absl::Now();
  // Both pods learn the move before any copying: the destination keeps what it receives,
  // the source refuses pushes to the vshards should it restart mid-move.
  NotifyPod(destination);
  NotifyPod(source);
  MigrateBeginRequest begin;
  begin.set_move_id(id);
  *begin.mutable_vshards() = move.vshards();
  MigrateBeginResponse begun;
  if (absl::Status s = options_.pod_control->MigrateBegin(source_address, begin, &begun); !s.ok()) {
    AbortMove(id, absl::StrCat("MigrateBegin on ", source, ": ", s.message()));
    return absl::Status(s.code(), absl::StrCat("move ", id, " aborted: MigrateBegin on ", source,
                                               " failed: ", s.message()));
  }
  MigrateImportRequest import;
  import.set_move_id(id);
  import.set_source(source_address);
  *import.mutable_vshards() = move.vshards();
  import.set_fence_rows(options_.fence_rows);
  MigrateImportResponse imported;
  if (absl::Status s = options_.pod_control->MigrateImport(destination_address, import, &imported);
      !s.ok()) {
    AbortMove(id, absl::StrCat("MigrateImport on ", destination, ": ", s.message()));
    return absl::Status(s.code(), absl::StrCat("move ", id, " aborted: MigrateImport on ",
                                               destination, " failed: ", s.message()));
  }
  // Commit.
  const absl::Time commit_start = absl::Now();
  MoveInfo info;
  {
    absl::ReleasableMutexLock lock(&mu_);
    ShardMapRecord map = map_;
    map.set_epoch(map.epoch() + 1);
    for (uint32_t v : vshards) map.set_owner(v, destination);
    StoreBatch batch;
    batch.Delete(keys::Move(id));
    batch.Put(std::string(keys::kMap), map);
    if (absl::Status s = store_->Write(batch); !s.ok()) {
      lock.Release();
      AbortMove(id, absl::StrCat("cannot commit: ", s.message()));
      return s;
    }
    map_ = std::move(map);
    moves_.erase(id);
  }
  // Both at once: the destination starts serving, the source drops the rows.
  std::thread to_source([&] { NotifyPod(source); });
  NotifyPod(destination);
  to_source.join();
  const absl::Time end = absl::Now();
  info.set_move_id(id);
  *info.mutable_vshards() = move.vshards();
  info.set_source(source);
  info.set_destination(destination);
  info.set_state(MoveInfo::COMMITTED);
  info.set_rows(imported.rows());
  info.set_bytes(imported.bytes());
  info.set_copy_seconds(absl::ToDoubleSeconds(end - start));
  info.set_fence_ms(imported.final_ms() + absl::ToDoubleMilliseconds(end - commit_start));
  uint64_t epoch;
  {
    absl::MutexLock lock(&mu_);
    recent_moves_.push_back(info);
    if (recent_moves_.size() > kRecentMoves) recent_moves_.erase(recent_moves_.begin());
    epoch = map_.epoch();
  }
  const double seconds = std::max(1e-6, info.copy_seconds());
  LOG(INFO) << "move " << id << " committed at epoch " << epoch << ": vshards "
            << absl::StrJoin(move.vshards(), ",") << " " << source << " -> " << destination << ", "
            << imported.rows() << " rows, " << imported.bytes() << " bytes in " << seconds << " s ("
            << imported.bytes() / seconds / 1e6 << " MB/s, " << imported.rounds()
            << " catch-up rounds); fence " << info.fence_ms() << " ms (final delta "
            << imported.final_rows() << " rows)";
  return info;
}

absl::StatusOr<uint32_t> MasterCore::RunMoves(
    const std::vector<std::tuple<std::string, std::string, std::vector<uint32_t>>>& plan) {
  uint32_t moved = 0;
  for (const auto& [source, destination, vshards] : plan) {
    absl::StatusOr<MoveInfo> done = MoveVShards(source, destination, vshards);
    absl::MutexLock lock(&mu_);
    if (!done.ok()) {
      operation_.set_error(std::string(done.status().message()));
      operation_.set_done(true);
      return done.status();
    }
    moved += vshards.size();
    operation_.set_moves_done(operation_.moves_done() + 1);
  }
  absl::MutexLock lock(&mu_);
  operation_.set_done(true);
  return moved;
}

namespace {

// Groups (source, destination, vshard) triples into moves of at most `batch` vshards.
std::vector<std::tuple<std::string, std::string, std::vector<uint32_t>>> Batch(
    const std::vector<std::tuple<std::string, std::string, uint32_t>>& single, uint32_t batch) {
  std::map<std::pair<std::string, std::string>, std::vector<uint32_t>> by_pair;
  for (const auto& [s, d, v] : single) by_pair[{s, d}].push_back(v);
  std::vector<std::tuple<std::string, std::string, std::vector<uint32_t>>> plan;
  for (auto& [pair, vs] : by_pair) {
    for (size_t i = 0; i < vs.size(); i += batch) {
      plan.emplace_back(
          pair.first, pair.second,
          std::vector<uint32_t>(vs.begin() + i, vs.begin() + std::min(vs.size(), i + batch)));
    }
  }
  return plan;
}

}  // namespace

// Holds operation_mu_ (taken with TryLock) until destroyed.
class OperationLock {
 public:
  explicit OperationLock(absl::Mutex* mu) : mu_(mu), held_(mu->TryLock()) {}
  ~OperationLock() {
    if (held_) mu_->Unlock();
  }
  bool held() const { return held_; }

 private:
  absl::Mutex* const mu_;
  const bool held_;
};

absl::Status MasterCore::Drain(const DrainRequest& req, DrainResponse* resp) {
  OperationLock op(&operation_mu_);
  if (!op.held()) {
    return absl::AbortedError("another drain or rebalance is running; see ps-admin status");
  }
  std::vector<std::tuple<std::string, std::string, uint32_t>> single;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = Now();
    const std::vector<std::string> ids = KnownPodIds();
    if (std::find(ids.begin(), ids.end(), req.pod_id()) == ids.end()) {
      return absl::NotFoundError(
          absl::StrCat("unknown pod '", req.pod_id(), "'; known: ", absl::StrJoin(ids, ", ")));
    }
    resp->set_epoch(map_.epoch());
    auto pod = pods_.find(req.pod_id());
    if (pod != pods_.end() && !pod->second.record.drained()) {
      // Recorded first, so a rebalance (or a drain retried after a failure) gives it nothing.
      PodRecord record = pod->second.record;
      record.set_drained(true);
      StoreBatch batch;
      batch.Put(keys::Pod(req.pod_id()), record);
      RETURN_IF_ERROR(store_->Write(batch));
      pod->second.record = std::move(record);
    }
    const uint32_t owned = OwnedBy(req.pod_id());
    if (owned == 0) return absl::OkStatus();  // nothing to move: drained
    std::map<std::string, uint32_t> load;     // targets: live, not drained
    for (const std::string& id : ids) {
      auto p = pods_.find(id);
      if (id != req.pod_id() && Live(id, now) && p != pods_.end() && !p->second.record.drained()) {
        load[id] = OwnedBy(id);
      }
    }
    if (load.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot drain ", req.pod_id(), ": no other live pod to take its ", owned, " vshards"));
    }
    if (!Live(req.pod_id(), now)) {
      return absl::UnavailableError(
          absl::StrCat("cannot drain ", req.pod_id(),
                       ": it is not live, and its rows are only on its volume; restart it first"));
    }
    for (uint32_t v = 0; v < config_.num_vshards(); ++v) {
      if (map_.owner(v) != req.pod_id()) continue;
      auto least = std::min_element(load.begin(), load.end(), [](const auto& a, const auto& b) {
        return a.second < b.second;
      });
      single.emplace_back(req.pod_id(), least->first, v);
      ++least->second;
    }
    operation_ = OperationInfo();
  }
  auto plan = Batch(single, options_.vshards_per_move);
  {
    absl::MutexLock lock(&mu_);
    operation_.set_operation_id(++next_operation_);
    operation_.set_kind(absl::StrCat("drain ", req.pod_id()));
    operation_.set_moves_total(static_cast<uint32_t>(plan.size()));
    resp->set_operation_id(operation_.operation_id());
  }
  LOG(INFO) << "draining " << req.pod_id() << ": " << single.size() << " vshards in " << plan.size()
            << " moves";
  ASSIGN_OR_RETURN(uint32_t moved, RunMoves(plan));
  absl::MutexLock lock(&mu_);
  resp->set_epoch(map_.epoch());
  resp->set_moved_vshards(moved);
  return absl::OkStatus();
}

absl::Status MasterCore::Rebalance(const RebalanceRequest&, RebalanceResponse* resp) {
  OperationLock op(&operation_mu_);
  if (!op.held()) {
    return absl::AbortedError("another drain or rebalance is running; see ps-admin status");
  }
  std::vector<std::tuple<std::string, std::string, uint32_t>> single;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = Now();
    resp->set_epoch(map_.epoch());
    std::vector<std::string> targets;  // live and not drained, in natural order
    for (const std::string& id : KnownPodIds()) {
      auto p = pods_.find(id);
      if (Live(id, now) && p != pods_.end() && !p->second.record.drained()) targets.push_back(id);
    }
    if (targets.empty()) return absl::FailedPreconditionError("no live pod to balance over");
    const std::set<std::string> is_target(targets.begin(), targets.end());
    std::map<std::string, std::vector<uint32_t>> owned;
    uint32_t movable = 0;
    for (uint32_t v = 0; v < config_.num_vshards(); ++v) {
      const std::string& o = map_.owner(v);
      // A pod that is not live keeps its vshards: only its volume has their rows.
      if (is_target.count(o) || Live(o, now)) {
        owned[o].push_back(v);
        ++movable;
      }
    }
    // Targets with the most vshards get the larger shares, so the fewest vshards move.
    std::vector<std::string> order = targets;
    std::stable_sort(order.begin(), order.end(), [&](const std::string& a, const std::string& b) {
      return owned[a].size() > owned[b].size();
    });
    const uint32_t n = static_cast<uint32_t>(order.size());
    std::map<std::string, uint32_t> desired;
    for (uint32_t i = 0; i < n; ++i) desired[order[i]] = movable / n + (i < movable % n ? 1 : 0);
    std::vector<std::pair<std::string, uint32_t>> surplus;  // (source, vshard)
    for (auto& [pod, vs] : owned) {
      const uint32_t keep = desired.count(pod) ? desired[pod] : 0;
      for (size_t k = keep; k < vs.size(); ++k) surplus.emplace_back(pod, vs[k]);
    }
    size_t next = 0;
    for (const std::string& t : targets) {
      for (uint32_t have = owned[t].size(); have < desired[t] && next < surplus.size(); ++have) {
        single.emplace_back(surplus[next].first, t, surplus[next].second);
        ++next;
      }
    }
    if (single.empty()) return absl::OkStatus();  // balanced
    operation_ = OperationInfo();
  }
  auto plan = Batch(single, options_.vshards_per_move);
  {
    absl::MutexLock lock(&mu_);
    operation_.set_operation_id(++next_operation_);
    operation_.set_kind("rebalance");
    operation_.set_moves_total(static_cast<uint32_t>(plan.size()));
    resp->set_operation_id(operation_.operation_id());
  }
  LOG(INFO) << "rebalancing: " << single.size() << " vshards in " << plan.size() << " moves";
  ASSIGN_OR_RETURN(uint32_t moved, RunMoves(plan));
  absl::MutexLock lock(&mu_);
  resp->set_epoch(map_.epoch());
  resp->set_moved_vshards(moved);
  return absl::OkStatus();
}

absl::Status MasterCore::Checkpoint(const CheckpointRequest&, CheckpointResponse* resp) {
  if (options_.checkpoint_dir.empty()) {
    return absl::FailedPreconditionError(
        "this master has no --checkpoint_dir: start it with one to take cluster checkpoints");
  }
  // No move may change the map while the pods copy their state.
  OperationLock op(&operation_mu_);
  if (!op.held()) {
    return absl::AbortedError("a drain or rebalance is running; checkpoint after it");
  }
  const absl::Time start = absl::Now();
  CheckpointInfo info;
  std::vector<std::pair<std::string, std::string>> pods;  // (id, address)
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = Now();
    Counters counters = counters_;
    counters.set_next_checkpoint_id(counters.next_checkpoint_id() + 1);
    StoreBatch batch;
    batch.Put(std::string(keys::kCounters), counters);
    RETURN_IF_ERROR(store_->Write(batch));
    counters_ = std::move(counters);
    info.set_checkpoint_id(counters_.next_checkpoint_id());
    info.set_dir(absl::StrCat(options_.checkpoint_dir, "/ckpt-", info.checkpoint_id()));
    info.set_epoch(map_.epoch());
    for (const std::string& id : KnownPodIds()) {
      if (OwnedBy(id) == 0) continue;
      if (!Live(id, now)) {
        return absl::UnavailableError(absl::StrCat(
            "pod ", id, " owns vshards but is not live: its state cannot be checkpointed now"));
      }
      pods.emplace_back(id, pods_[id].record.address());
    }
  }
  for (const auto& [id, address] : pods) {
    PodCheckpointRequest req;
    req.set_dir(absl::StrCat(info.dir(), "/", id));
    PodCheckpointResponse pod_resp;
    if (absl::Status s = options_.pod_control->Checkpoint(address, req, &pod_resp); !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("checkpoint ", info.checkpoint_id(), ": pod ", id,
                                       " could not write ", req.dir(), ": ", s.message()));
    }
    info.add_pods(id);
  }
  info.set_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  info.set_unix_seconds(absl::ToUnixSeconds(absl::Now()));
  {
    // Recorded first, so the master's own copy lists the checkpoint it belongs to.
    absl::MutexLock lock(&mu_);
    StoreBatch batch;
    batch.Put(keys::Checkpoint(info.checkpoint_id()), info);
    RETURN_IF_ERROR(store_->Write(batch));
    std::error_code ec;
    std::filesystem::create_directories(info.dir(), ec);  // pods on other hosts made theirs
    if (ec) {
      return absl::InternalError(absl::StrCat("cannot create ", info.dir(), ": ", ec.message()));
    }
    RETURN_IF_ERROR(store_->Checkpoint(absl::StrCat(info.dir(), "/master")));
    last_checkpoint_ = info;
  }
  LOG(INFO) << "checkpoint " << info.checkpoint_id() << " in " << info.dir() << " at epoch "
            << info.epoch() << ": " << info.pods_size() << " pods, " << info.seconds() << " s";
  *resp->mutable_checkpoint() = info;
  return absl::OkStatus();
}

}  // namespace ps
