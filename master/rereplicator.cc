#include "master/rereplicator.h"

#include <glog/logging.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "master/operation_lock.h"
#include "master/rereplicate_plan.h"

namespace ps {

Rereplicator::~Rereplicator() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Rereplicator::Start(absl::Duration interval) {
  thread_ = std::thread([this, interval] { Loop(interval); });
}

void Rereplicator::Wake() {
  absl::MutexLock lock(&mu_);
  wanted_ = true;
}

void Rereplicator::Loop(absl::Duration interval) {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(
                               +[](Rereplicator* r) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                 return r->wanted_ || r->stopping_;
                               },
                               this),
                           interval);
      if (stopping_) return;
      wanted_ = false;
    }
    absl::Status s = RunOnce();
    if (!s.ok() && s.code() != absl::StatusCode::kAborted) {
      LOG(WARNING) << "re-replication round failed (the next round retries): " << s;
    }
  }
}

absl::Status Rereplicator::Trim() {
  std::map<uint32_t, std::vector<std::string>> drops = PlanTrims(membership_->View());
  if (drops.empty()) return absl::OkStatus();
  std::vector<std::string> tell;
  {
    // A drain plans from a view: its follower moves name the followers it saw.
    OperationLock op(operation_mu_);
    if (!op.held()) {
      return absl::AbortedError("a drain, rebalance or checkpoint is running; trims wait");
    }
    ASSIGN_OR_RETURN(tell, membership_->TrimAckSets(drops));
  }
  runner_->NotifyPods(tell);
  return absl::OkStatus();
}

absl::Status Rereplicator::RunOnce() {
  RETURN_IF_ERROR(Trim());
  MovePlan plan = PlanFills(membership_->View(), options_.vshards_per_move);
  if (plan.empty()) return absl::OkStatus();
  LOG(INFO) << "re-replication: " << plan.vshards << " vshard copies missing, in "
            << plan.moves.size() << " follower copies";
  for (const PlannedMove& move : plan.moves) {
    OperationLock op(operation_mu_);
    if (!op.held()) {
      return absl::AbortedError("a drain, rebalance or checkpoint is running; copies wait");
    }
    absl::StatusOr<MoveInfo> done =
        runner_->FillFollower(move.source, move.destination, move.vshards);
    if (!done.ok()) {
      if (done.status().code() != absl::StatusCode::kAborted) failures_.fetch_add(1);
      return absl::Status(
          done.status().code(),
          absl::StrCat("follower copy of vshards ", absl::StrJoin(move.vshards, ","), " from ",
                       move.source, " to ", move.destination, ": ", done.status().message()));
    }
    copies_.fetch_add(1);
    rows_.fetch_add(done->rows());
    bytes_.fetch_add(done->bytes());
  }
  // A copy may have filled the place of a follower that is not live yet (never started):
  // once it commits, that one is the surplus.
  return Trim();
}

Rereplicator::Stats Rereplicator::stats() const {
  Stats out;
  out.copies = copies_.load();
  out.failures = failures_.load();
  out.rows = rows_.load();
  out.bytes = bytes_.load();
  return out;
}

}  // namespace ps
