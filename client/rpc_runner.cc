#include "client/rpc_runner.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_status.h"
#include "proto/wrong_shard.h"

namespace ps::internal {

RetryOptions RetryOptionsOf(const ClientOptions& options) {
  RetryOptions r;
  r.max_attempts = options.max_attempts;
  r.initial_backoff = absl::Milliseconds(options.initial_backoff_ms);
  r.max_backoff = absl::Milliseconds(options.max_backoff_ms);
  r.attempt_timeout = absl::Milliseconds(options.deadline_ms);
  return r;
}

void RpcRunner::BeginAll(RawMethod method, std::vector<std::shared_ptr<RawRpc>> rpcs,
                         const std::shared_ptr<Op>& op) {
  for (auto& rpc : rpcs) {
    op->Keep(rpc);
    Begin(method, rpc.get(), op);
  }
}

bool RpcRunner::AfterAttempt(RpcState* rpc, const grpc::Status& s, const std::shared_ptr<Op>& op) {
  ++rpc->attempt;
  if (s.ok()) {
    Done(rpc, op.get(), rpc->on_ok ? rpc->on_ok() : absl::OkStatus());
    return true;
  }
  const auto code = static_cast<absl::StatusCode>(s.error_code());
  // A pod's refusal that says it applied nothing (proto/wrong_shard.h) makes the fate known,
  // even after an earlier attempt's was unknown: a pod that still owns the vshards (a
  // deposed one refuses as not their owner) and neither applied nor is applying the key (a
  // restarted one holds the keys of its recovered log) means no copy holds it. Kept, the key
  // would name every part a re-route splits the call into, but each pod's part of a call
  // needs a key of its own (PushBatch draws one per part; docs/architecture.md, "Exactly
  // once across map changes"): a follower holds its primary's records with their keys, so a
  // pod that applied one part, or follows one that did, would answer another part under the
  // same key "duplicate".
  if (IsNotApplied(FromGrpcStatus(s))) {
    rpc->fate_unknown = false;
  } else if (RetryPolicy::IsRetryable(code)) {
    rpc->fate_unknown = true;
  }
  if (rpc->fallback &&
      (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded) &&
      rpc->fallback(op)) {
    Done(rpc, op.get(), absl::OkStatus());  // its ids went to followers, as new RPCs of op
    return true;
  }
  if (policy_->ShouldRetry(code, rpc->attempt)) {
    counters_->retries.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  absl::Status status = RetryPolicy::Final(
      s, absl::StrCat("pod ", rpc->pod->id, " (", rpc->pod->address, ")"), rpc->attempt);
  if (router_->follows_master() && Reroutable(*rpc) && WrongShardOf(status).has_value()) {
    // The refresh ends on the timer thread; the re-routing runs on a completion thread.
    router_->Refresh(rpc->epoch, [this, rpc, op] { Reroute(rpc, op); });
    return true;
  }
  Done(rpc, op.get(), status);
  return true;
}

void RpcRunner::Reroute(RpcState* rpc, const std::shared_ptr<Op>& op) {
  counters_->reroutes.fetch_add(1, std::memory_order_relaxed);
  // The re-routing (which may finish the call and run its Then callback) runs on a
  // completion thread, as every completion does.
  // A blocking fan-out's RPC ends on the queue its caller drains.
  completions_->Run(
      [this, rpc, op] {
        if (rpc->reroute) {
          rpc->reroute(op);  // adds its RPCs to the op before this one is done
        } else {
          rpc->rerouted = true;  // its caller sends it again (RpcState::reroutable)
        }
        Done(rpc, op.get(), absl::OkStatus());
      },
      rpc->queue);
}

bool RpcRunner::Reroutable(const RpcState& rpc) const {
  return (rpc.reroute || rpc.reroutable) && rpc.reroutes < options_.max_reroutes;
}

void RpcRunner::Retry(RpcState* rpc, const std::shared_ptr<Op>& op, std::function<void()> resend) {
  auto again = [this, rpc, resend = std::move(resend)] {
    rpc->pod = router_->Resolve(rpc->pod);
    resend();
  };
  const absl::Duration backoff = policy_->Backoff(rpc->attempt);
  if (router_->follows_master() && RetryPolicy::RefreshMapBefore(rpc->attempt + 1)) {
    timer_->After(backoff, [this, rpc, op, again = std::move(again)]() mutable {
      // A map newer than the one that gave the failed address (not merely newer than the
      // RPC's own), so that a pod restarted elsewhere is found however old the RPC is.
      router_->Refresh(router_->StaleAfter(*rpc->pod, rpc->epoch),
                       [this, rpc, op, again = std::move(again)] {
                         if (Reroutable(*rpc) && router_->FailedOver(*rpc->pod, rpc->epoch)) {
                           return Reroute(rpc, op);
                         }
                         again();
                       });
    });
  } else {
    timer_->After(backoff, std::move(again));
  }
}

void RpcRunner::Done(RpcState* rpc, Op* op, const absl::Status& status) {
  rpc->status = status;
  op->RpcDone(status);
  inflight_->End();
}

std::unique_ptr<grpc::ClientContext> RpcRunner::NewContext() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(policy_->AttemptDeadline());
  return ctx;
}

}  // namespace ps::internal
