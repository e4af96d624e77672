// Balancer: Drain and Rebalance, each a plan of vshard moves (move_plan.h) run one after
// another by the MoveRunner, with the operation's progress for status; and, with
// --auto_rebalance, a thread that rebalances whenever a pod that owns nothing joins.
//
// One drain, rebalance or checkpoint runs at a time (OperationLock); another is ABORTED.
// A plan stops at the first failed move: earlier moves stay done, the error names it.
//
// Thread-safety: every method is thread-safe. Its mutex guards only the operation's
// progress and the thread's wake-up; nothing else is locked under it.
#pragma once

#include <cstdint>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "master/master_options.h"
#include "master/membership.h"
#include "master/move_plan.h"
#include "master/move_runner.h"
#include "proto/master.pb.h"

namespace ps {

class Balancer {
 public:
  // `options`, `membership`, `runner` and `operation_mu` (see operation_lock.h) must
  // outlive this.
  Balancer(const MasterOptions& options, Membership* membership, MoveRunner* runner,
           absl::Mutex* operation_mu)
      : options_(options), membership_(membership), runner_(runner), operation_mu_(operation_mu) {}
  // Stops the auto-rebalance thread, waiting for a rebalance it runs.
  ~Balancer() ABSL_LOCKS_EXCLUDED(mu_);

  // Starts the auto-rebalance thread when options.auto_rebalance (call once, after Load).
  void StartAutoRebalance();
  // Wakes the auto-rebalance thread (without it: nothing). Does not wait.
  void RequestRebalance() ABSL_LOCKS_EXCLUDED(mu_);

  // The admin RPCs of proto/master.proto: OK or the most specific error.
  absl::Status Drain(const DrainRequest& req, DrainResponse* resp) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Rebalance(const RebalanceRequest& req, RebalanceResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Adds the last (or running) operation to the status, if there was one.
  void Describe(StatusResponse* resp) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Runs `plan` as operation `kind`, filling the response's operation_id, then epoch and
  // moved_vshards when every move is done. The caller holds the operation lock.
  template <typename Response>
  absl::Status Run(const std::string& kind, const MovePlan& plan, Response* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  void AutoRebalanceLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const MasterOptions& options_;
  Membership* const membership_;
  MoveRunner* const runner_;
  absl::Mutex* const operation_mu_;

  mutable absl::Mutex mu_;
  OperationInfo operation_ ABSL_GUARDED_BY(mu_);
  uint64_t next_operation_ ABSL_GUARDED_BY(mu_) = 0;
  bool rebalance_wanted_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread auto_rebalance_;
};

}  // namespace ps
