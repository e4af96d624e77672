#include "master/balancer.h"

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "master/operation_lock.h"

namespace ps {

Balancer::~Balancer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (auto_rebalance_.joinable()) auto_rebalance_.join();
}

void Balancer::StartAutoRebalance() {
  if (options_.auto_rebalance) auto_rebalance_ = std::thread([this] { AutoRebalanceLoop(); });
}

void Balancer::RequestRebalance() {
  if (!options_.auto_rebalance) return;
  absl::MutexLock lock(&mu_);
  rebalance_wanted_ = true;
}

void Balancer::AutoRebalanceLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Balancer* b)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return b->rebalance_wanted_ || b->stopping_; },
          this));
      if (stopping_) return;
      rebalance_wanted_ = false;
    }
    RebalanceResponse resp;
    absl::Status s = Rebalance(RebalanceRequest(), &resp);
    if (s.ok()) {
      LOG(INFO) << "auto rebalance: " << resp.moved_vshards() << " vshards moved; epoch "
                << resp.epoch();
    } else {
      LOG(WARNING) << "auto rebalance failed (retried at the next registration): " << s;
    }
  }
}

template <typename Response>
absl::Status Balancer::Run(const std::string& kind, const MovePlan& plan, Response* resp) {
  {
    absl::MutexLock lock(&mu_);
    operation_ = OperationInfo();
    operation_.set_operation_id(++next_operation_);
    operation_.set_kind(kind);
    operation_.set_moves_total(static_cast<uint32_t>(plan.moves.size()));
    resp->set_operation_id(operation_.operation_id());
  }
  uint32_t moved = 0;
  for (const PlannedMove& m : plan.moves) {
    absl::StatusOr<MoveInfo> done =
        m.follower ? runner_->FillFollower(m.source, m.destination, m.vshards, m.replaces)
                   : runner_->MoveVShards(m.source, m.destination, m.vshards);
    absl::MutexLock lock(&mu_);
    if (!done.ok()) {
      operation_.set_error(std::string(done.status().message()));
      operation_.set_done(true);
      return done.status();
    }
    moved += m.vshards.size();
    operation_.set_moves_done(operation_.moves_done() + 1);
  }
  {
    absl::MutexLock lock(&mu_);
    operation_.set_done(true);
  }
  resp->set_epoch(membership_->epoch());
  resp->set_moved_vshards(moved);
  return absl::OkStatus();
}

absl::Status Balancer::Drain(const DrainRequest& req, DrainResponse* resp) {
  OperationLock op(operation_mu_);
  if (!op.held()) {
    return absl::AbortedError("another drain or rebalance is running; see ps-admin status");
  }
  const ClusterView before = membership_->View();
  if (!before.Known(req.pod_id())) {
    return absl::NotFoundError(absl::StrCat("unknown pod '", req.pod_id(),
                                            "'; known: ", absl::StrJoin(before.known, ", ")));
  }
  resp->set_epoch(before.epoch);
  // Recorded first, so a rebalance (or a drain retried after a failure) gives it nothing.
  RETURN_IF_ERROR(membership_->MarkDrained(req.pod_id()));
  ASSIGN_OR_RETURN(MovePlan plan,
                   PlanDrain(membership_->View(), req.pod_id(), options_.vshards_per_move));
  if (plan.empty()) return absl::OkStatus();  // nothing to move: drained
  LOG(INFO) << "draining " << req.pod_id() << ": " << plan.vshards << " vshards in "
            << plan.moves.size() << " moves";
  return Run(absl::StrCat("drain ", req.pod_id()), plan, resp);
}

absl::Status Balancer::Rebalance(const RebalanceRequest&, RebalanceResponse* resp) {
  OperationLock op(operation_mu_);
  if (!op.held()) {
    return absl::AbortedError("another drain or rebalance is running; see ps-admin status");
  }
  const ClusterView view = membership_->View();
  resp->set_epoch(view.epoch);
  ASSIGN_OR_RETURN(MovePlan plan, PlanRebalance(view, options_.vshards_per_move));
  if (plan.empty()) return absl::OkStatus();  // balanced
  LOG(INFO) << "rebalancing: " << plan.vshards << " vshards in " << plan.moves.size() << " moves";
  return Run("rebalance", plan, resp);
}

void Balancer::Describe(StatusResponse* resp) const {
  absl::MutexLock lock(&mu_);
  if (operation_.operation_id() != 0) *resp->mutable_operation() = operation_;
}

}  // namespace ps
