#include "client/rpc_runner.h"

#include <algorithm>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_status.h"

namespace ps::internal {
namespace {

bool Retryable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::ABORTED ||
         code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

// A pod refused ids of a vshard it does not own (the map changed).
bool WrongShard(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
         s.error_message().find("does not own") != std::string::npos;
}

}  // namespace

void RpcRunner::BeginAll(RawMethod method, std::vector<std::shared_ptr<RawRpc>> rpcs,
                         const std::shared_ptr<Op>& op) {
  for (auto& rpc : rpcs) {
    op->Keep(rpc);
    Begin(method, rpc.get(), op);
  }
}

bool RpcRunner::AfterAttempt(RpcState* rpc, const grpc::Status& s, const std::shared_ptr<Op>& op) {
  ++rpc->attempt;
  if (!s.ok() && Retryable(s.error_code()) && rpc->attempt < options_.max_attempts) {
    return false;
  }
  if (router_->follows_master() && rpc->reroute && WrongShard(s) &&
      rpc->reroutes < options_.max_reroutes) {
    // The refresh ends on the timer thread; the re-routing (which may finish the call and
    // run its Then callback) runs on a completion thread, as every completion does.
    router_->Refresh(rpc->epoch, [this, rpc, op] {
      completions_->Run([this, rpc, op] {
        rpc->reroute(op);  // adds its RPCs to the op before this one is done
        Done(rpc, op.get(), absl::OkStatus());
      });
    });
    return true;
  }
  absl::Status status;
  if (!s.ok()) {
    status = FromGrpcStatus(s, absl::StrCat("pod ", rpc->pod->id, " (", rpc->pod->address, ")"));
    if (rpc->attempt > 1) {
      status = absl::Status(status.code(),
                            absl::StrCat(status.message(), " [after ", rpc->attempt, " attempts]"));
    }
  } else if (rpc->on_ok) {
    status = rpc->on_ok();
  }
  Done(rpc, op.get(), status);
  return true;
}

void RpcRunner::Retry(RpcState* rpc, std::function<void()> resend) {
  auto again = [this, rpc, resend = std::move(resend)] {
    rpc->pod = router_->Resolve(rpc->pod);
    resend();
  };
  const absl::Duration backoff = Backoff(rpc->attempt);
  if (router_->follows_master() && rpc->attempt >= 3) {
    timer_->After(backoff, [this, rpc, again = std::move(again)]() mutable {
      router_->Refresh(rpc->epoch, std::move(again));
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

absl::Duration RpcRunner::Backoff(int attempt) const {
  const int64_t cap = std::min<int64_t>(
      options_.max_backoff_ms, int64_t{options_.initial_backoff_ms} << std::min(attempt - 1, 20));
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::Milliseconds(cap / 2 + static_cast<int64_t>(rng() % (cap / 2 + 1)));
}

std::unique_ptr<grpc::ClientContext> RpcRunner::NewContext() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(options_.deadline_ms));
  return ctx;
}

}  // namespace ps::internal
