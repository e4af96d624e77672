#include "master/move_runner.h"

#include <glog/logging.h>

#include <algorithm>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"

namespace ps {
namespace {

constexpr size_t kRecentMoves = 32;

Assignment ToAssignment(const PodAssignment& a) {
  Assignment out;
  out.set_epoch(a.epoch());
  out.set_num_vshards(a.num_vshards());
  *out.mutable_owned() = a.owned_vshards();
  *out.mutable_moving_in() = a.moving_in();
  *out.mutable_moving_out() = a.moving_out();
  if (a.has_replication()) *out.mutable_replication() = a.replication();
  return out;
}

MoveInfo Ended(const MoveRecord& move, MoveInfo::State state) {
  MoveInfo info;
  info.set_move_id(move.move_id());
  *info.mutable_vshards() = move.vshards();
  info.set_source(move.source());
  info.set_destination(move.destination());
  info.set_follower(move.follower());
  info.set_replaces(move.replaces());
  info.set_state(state);
  return info;
}

}  // namespace

void MoveRunner::Load(const std::vector<MoveRecord>& aborted_at_start) {
  absl::MutexLock lock(&mu_);
  for (const MoveRecord& move : aborted_at_start) {
    MoveInfo info = Ended(move, MoveInfo::ABORTED);
    info.set_error("the master restarted during the move");
    recent_.push_back(std::move(info));
  }
}

void MoveRunner::Remember(MoveInfo info) {
  recent_.push_back(std::move(info));
  if (recent_.size() > kRecentMoves) recent_.erase(recent_.begin());
}

void MoveRunner::NotifyPod(const std::string& pod_id) {
  std::optional<Membership::AddressedAssignment> a = membership_->AssignmentOf(pod_id);
  if (!a.has_value()) return;
  absl::Status s = options_.pod_control->ApplyAssignment(a->address, ToAssignment(a->assignment));
  if (!s.ok()) {
    LOG(WARNING) << "telling pod " << pod_id << " at " << a->address << " its assignment (epoch "
                 << a->assignment.epoch() << ") failed; its next heartbeat brings it: " << s;
  }
}

void MoveRunner::NotifyPods(const std::vector<std::string>& pods) {
  std::vector<std::thread> threads;
  for (const std::string& pod : pods) threads.emplace_back([this, &pod] { NotifyPod(pod); });
  for (std::thread& t : threads) t.join();
}

void MoveRunner::NotifyPodsSoon(const std::vector<std::string>& pods) {
  if (pods.empty()) return;
  absl::MutexLock lock(&later_mu_);
  later_.insert(pods.begin(), pods.end());
  if (!notifier_.joinable()) notifier_ = std::thread([this] { NotifyLoop(); });
}

void MoveRunner::NotifyLoop() {
  for (;;) {
    std::vector<std::string> pods;
    {
      absl::MutexLock lock(&later_mu_);
      later_mu_.Await(absl::Condition(
          +[](MoveRunner* r)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return !r->later_.empty() || r->stopping_; },
          this));
      if (stopping_) return;  // what is queued is left to the pods' heartbeats
      pods.assign(later_.begin(), later_.end());
      later_.clear();
    }
    NotifyPods(pods);
  }
}

MoveRunner::~MoveRunner() {
  std::thread notifier;
  {
    absl::MutexLock lock(&later_mu_);
    stopping_ = true;
    notifier = std::move(notifier_);
  }
  if (notifier.joinable()) notifier.join();
}

void MoveRunner::NotifyPods(const std::string& source, const std::string& destination,
                            const std::vector<std::string>& others) {
  std::vector<std::string> pods = {source, destination};
  pods.insert(pods.end(), others.begin(), others.end());
  NotifyPods(pods);
}

void MoveRunner::AbortMove(uint64_t id, const std::vector<std::string>& also_told,
                           const std::string& why) {
  MoveRecord move;
  {
    // Held across the abort, so that status never shows the move both in flight and ended.
    absl::MutexLock lock(&mu_);
    absl::StatusOr<std::optional<Membership::AbortedMove>> aborted = membership_->AbortMove(id);
    if (!aborted.ok()) {
      // Still recorded: the next master start aborts it. The pods keep the move's state
      // (the source fenced at worst) until then.
      LOG(ERROR) << "cannot record the abort of move " << id << ": " << aborted.status();
      return;
    }
    if (!aborted->has_value()) return;
    move = (*aborted)->move;
    MoveInfo info = Ended(move, MoveInfo::ABORTED);
    info.set_error(why);
    Remember(std::move(info));
    LOG(WARNING) << "move " << id << " (" << move.source() << " -> " << move.destination()
                 << ") aborted: " << why << "; epoch " << (*aborted)->epoch;
  }
  NotifyPods(move.source(), move.destination(), also_told);
}

absl::StatusOr<MoveInfo> MoveRunner::MoveVShards(const std::string& source,
                                                 const std::string& destination,
                                                 const std::vector<uint32_t>& vshards) {
  return Run(source, destination, vshards, /*follower=*/false, /*replaces=*/"");
}

absl::StatusOr<MoveInfo> MoveRunner::FillFollower(const std::string& primary,
                                                  const std::string& follower,
                                                  const std::vector<uint32_t>& vshards,
                                                  const std::string& replaces) {
  return Run(primary, follower, vshards, /*follower=*/true, replaces);
}

absl::StatusOr<MoveInfo> MoveRunner::Run(const std::string& source, const std::string& destination,
                                         const std::vector<uint32_t>& vshards, bool follower,
                                         const std::string& replaces) {
  ASSIGN_OR_RETURN(Membership::StartedMove started,
                   membership_->BeginMove(source, destination, vshards, follower, replaces));
  const MoveRecord& move = started.move;
  const uint64_t id = move.move_id();
  const absl::Time start = absl::Now();
  // Both pods learn the move before any copying: the destination keeps what it receives,
  // the source refuses pushes to the vshards should it restart mid-move. Their followers
  // learn the epoch their records now carry.
  NotifyPods(source, destination, started.also_told);
  MigrateBeginRequest begin;
  begin.set_move_id(id);
  *begin.mutable_vshards() = move.vshards();
  MigrateBeginResponse begun;
  if (absl::Status s = options_.pod_control->MigrateBegin(started.source_address, begin, &begun);
      !s.ok()) {
    AbortMove(id, started.also_told, absl::StrCat("MigrateBegin on ", source, ": ", s.message()));
    return absl::Status(s.code(), absl::StrCat("move ", id, " aborted: MigrateBegin on ", source,
                                               " failed: ", s.message()));
  }
  MigrateImportRequest import;
  import.set_move_id(id);
  import.set_source(started.source_address);
  *import.mutable_vshards() = move.vshards();
  import.set_fence_rows(options_.fence_rows);
  MigrateImportResponse imported;
  if (absl::Status s =
          options_.pod_control->MigrateImport(started.destination_address, import, &imported);
      !s.ok()) {
    AbortMove(id, started.also_told,
              absl::StrCat("MigrateImport on ", destination, ": ", s.message()));
    return absl::Status(s.code(), absl::StrCat("move ", id, " aborted: MigrateImport on ",
                                               destination, " failed: ", s.message()));
  }
  const absl::Time commit_start = absl::Now();
  if (absl::StatusOr<uint64_t> committed = membership_->CommitMove(id); !committed.ok()) {
    AbortMove(id, started.also_told, absl::StrCat("cannot commit: ", committed.status().message()));
    return committed.status();
  }
  // All at once: the destination starts serving (or following), the source drops the rows
  // (or unfences, streaming to its new follower), and the followers take the new epoch's
  // records (the new primary's, for an owner move; a replaced follower stops following).
  NotifyPods(source, destination, started.also_told);
  const absl::Time end = absl::Now();
  MoveInfo info = Ended(move, MoveInfo::COMMITTED);
  info.set_rows(imported.rows());
  info.set_bytes(imported.bytes());
  info.set_copy_seconds(absl::ToDoubleSeconds(end - start));
  info.set_fence_ms(imported.final_ms() + absl::ToDoubleMilliseconds(end - commit_start));
  uint64_t epoch;
  {
    absl::MutexLock lock(&mu_);
    Remember(info);
    epoch = membership_->epoch();
  }
  const double seconds = std::max(1e-6, info.copy_seconds());
  LOG(INFO) << (follower ? "follower copy " : "move ") << id << " committed at epoch " << epoch
            << (follower ? " (" + destination + " now follows them)" : std::string())
            << ": vshards " << absl::StrJoin(move.vshards(), ",") << " " << source << " -> "
            << destination << ", " << imported.rows() << " rows, " << imported.bytes()
            << " bytes in " << seconds << " s (" << imported.bytes() / seconds / 1e6 << " MB/s, "
            << imported.rounds() << " catch-up rounds); fence " << info.fence_ms()
            << " ms (final delta " << imported.final_rows() << " rows)";
  return info;
}

void MoveRunner::Describe(StatusResponse* resp) const {
  absl::MutexLock lock(&mu_);
  for (MoveInfo& info : membership_->MovesInFlight()) *resp->add_moves() = std::move(info);
  for (auto it = recent_.rbegin(); it != recent_.rend(); ++it) *resp->add_moves() = *it;
}

}  // namespace ps
