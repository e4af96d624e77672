// The client's RPC state machine: every RPC to a pod runs through RpcRunner, which gives
// each attempt its deadline, retries what may be retried and re-routes what a pod refused
// after a map change. The rules are the one RetryPolicy's (common/rpc/retry_policy.h):
//
// - A retryable code: the same request again to the same pod identity (found again by
//   id, possibly at a new address), after the policy's backoff, up to its max_attempts.
//   Before the attempts the policy names (the third on) a client that follows a master
//   refreshes the map first (for a map newer than the one that gave the address that
//   failed: Router::StaleAfter), so a pod restarted at a new address is found, however
//   old the RPC's own epoch. A push keeps
//   its key: the pod applies it once.
// - Failover (R >= 2): when that refresh shows that the pod's vshards failed over to their
//   followers (Router::FailedOver: the master holds the pod lost), an RPC with
//   a `reroute` is routed again under the new map instead of waiting for the old primary.
//   Its fate is unknown, so a push keeps its key at the new primaries: each was the
//   vshard's follower and holds the old primary's records with their keys, so it applies
//   the push once (or answers that it has it).
// - A wrong-shard refusal (the WrongShard detail, proto/wrong_shard.h: a vshard moved; the
//   pod applied nothing), for RPCs with a `reroute`: after a map refresh, reroute(op)
//   routes the request's ids again as new RPCs of the same call (a push under a new key),
//   up to max_reroutes times (a push under a new key, unless its fate was unknown with
//   R >= 2: a deposed primary's refusal does not say its followers lack the record, so the
//   key goes along). A FAILED_PRECONDITION without the detail is final.
// - Blocking fan-outs that route again themselves (RpcState::reroutable: dense pulls and
//   pushes) take both re-routes above the same way, except that the runner ends the RPC
//   as `rerouted` once the map is refreshed and the caller sends it in its next round.
// - An unreachable pod (UNAVAILABLE, DEADLINE_EXCEEDED), for RPCs with a `fallback` (the
//   read-only pulls of a replicated map): fallback(op) sends the ids to followers of their
//   vshards as new RPCs of the call, once, before any retry; without a follower the RPC
//   retries as usual.
// - Anything else is the RPC's final status, named after its pod ("pod <id> (<address>)")
//   and, after retries, "[after N attempts]" (RetryPolicy::Final).
// Backoff waits run on the timer thread, never on a completion thread; a re-route runs on
// a completion thread, as every completion does.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/client_counters.h"
#include "client/completion_threads.h"
#include "client/inflight.h"
#include "client/op.h"
#include "client/ps_client.h"
#include "client/routing.h"
#include "client/rpc.h"
#include "client/timer.h"
#include "common/rpc/retry_policy.h"

namespace ps::internal {

// The retry options of a client's calls, from its ClientOptions (deadline_ms,
// max_attempts, initial_backoff_ms, max_backoff_ms).
RetryOptions RetryOptionsOf(const ClientOptions& options);

// Thread-safe. Everything passed to the constructor must outlive the runner, and every
// RPC must be done (InFlight idle) before `completions` and `timer` go.
class RpcRunner {
 public:
  RpcRunner(const ClientOptions& options, const RetryPolicy* policy, Router* router,
            CompletionThreads* completions, Timer* timer, InFlight* inflight,
            ClientCounters* counters)
      : options_(options),
        policy_(policy),
        router_(router),
        completions_(completions),
        timer_(timer),
        inflight_(inflight),
        counters_(counters) {}

  // Sends `rpc` (retries included) as an RPC of `op`, whose pending count must include
  // it; reports its final status to `op`. `rpc` must stay valid until then. Counts in
  // InFlight from now until that report.
  template <typename Method, typename Req, typename Resp>
  void Begin(Method method, Rpc<Req, Resp>* rpc, std::shared_ptr<Op> op) {
    inflight_->Begin();
    Attempt(method, rpc, std::move(op));
  }

  // Begins `rpcs` as RPCs of `op` (whose pending count already includes them); the op
  // keeps them alive.
  void BeginAll(RawMethod method, std::vector<std::shared_ptr<RawRpc>> rpcs,
                const std::shared_ptr<Op>& op);

  // A blocking fan-out over caller-owned RPCs: the first error, or OK once every RPC
  // succeeded (their answers in rpc->resp, their outcomes in rpc->status). The calls run
  // on a queue of their own that this thread drains (retries included), so a blocking
  // call never waits on a completion thread: it works from one too.
  template <typename Req, typename Resp>
  absl::Status RunAll(AsyncMethod<Req, Resp> method,
                      std::vector<std::unique_ptr<Rpc<Req, Resp>>>* rpcs) {
    auto op = std::make_shared<Op>(static_cast<int>(rpcs->size()));
    grpc::CompletionQueue queue;
    for (auto& rpc : *rpcs) {
      rpc->queue = &queue;
      Begin(method, rpc.get(), op);
    }
    CompletionThreads::Drain(&queue, [&op] { return op->done(); });
    queue.Shutdown();
    CompletionThreads::Drain(&queue, [] { return false; });  // empty: every call is done
    return op->Wait();
  }

 private:
  // Starts one attempt; its completion decides what comes next.
  template <typename Method, typename Req, typename Resp>
  void Attempt(Method method, Rpc<Req, Resp>* rpc, std::shared_ptr<Op> op) {
    rpc->ctx = NewContext();
    StartAttempt(
        method, rpc,
        [this, method, rpc, op = std::move(op)](grpc::Status s) mutable {
          if (AfterAttempt(rpc, s, op)) return;
          Retry(rpc, op, [this, method, rpc, op]() mutable {
            rpc->resp.Clear();
            Attempt(method, rpc, std::move(op));
          });
        },
        *completions_);
  }

  // After an attempt that ended with `s`: false if the RPC is to be retried (see Retry);
  // otherwise true, the RPC having been reported to `op` or handed to a re-route.
  bool AfterAttempt(RpcState* rpc, const grpc::Status& s, const std::shared_ptr<Op>& op);
  // Runs `resend` after the policy's backoff (and a map refresh when the policy says so),
  // with rpc->pod resolved again by id; or, when the refresh shows a failover of the pod's
  // vshards, re-routes the RPC (see the file comment).
  void Retry(RpcState* rpc, const std::shared_ptr<Op>& op, std::function<void()> resend);
  // Hands `rpc` to its reroute (on a completion thread, or the queue of its blocking
  // fan-out) and ends it; without a reroute, ends it as `rerouted` for its caller.
  void Reroute(RpcState* rpc, const std::shared_ptr<Op>& op);
  // Whether `rpc` may be routed again (a reroute, or reroutable) with re-routes left.
  bool Reroutable(const RpcState& rpc) const;
  // Reports the RPC's final status to `op` and ends its InFlight count.
  void Done(RpcState* rpc, Op* op, const absl::Status& status);
  std::unique_ptr<grpc::ClientContext> NewContext() const;

  const ClientOptions& options_;
  const RetryPolicy* const policy_;
  Router* const router_;
  CompletionThreads* const completions_;
  Timer* const timer_;
  InFlight* const inflight_;
  ClientCounters* const counters_;
};

}  // namespace ps::internal
