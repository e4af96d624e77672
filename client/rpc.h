// One RPC to one pod, as the client's state machine (client/rpc_runner.h) runs it: the
// state it keeps across attempts, and how an attempt is started on a pod's channel.
#pragma once

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "client/completion_threads.h"
#include "client/op.h"
#include "client/pod.h"
#include "proto/ps.grpc.pb.h"

namespace ps::internal {

// A typed method of the pods' service, in its completion-queue form
// (&ParameterServer::Stub::PrepareAsyncX).
template <typename Req, typename Resp>
using AsyncMethod = std::unique_ptr<grpc::ClientAsyncResponseReader<Resp>> (
    ParameterServer::Stub::*)(grpc::ClientContext*, const Req&, grpc::CompletionQueue*);

// A method called with raw messages (grpc::ByteBuffer both ways, encoded and decoded by
// proto/wire.h), by its full name.
struct RawMethod {
  const char* name;
};
inline constexpr RawMethod kRawPull{"/ps.ParameterServer/Pull"};
inline constexpr RawMethod kRawPush{"/ps.ParameterServer/Push"};

// What an RPC keeps across its attempts, whatever its message types. Owned by whoever
// started it (the call's Op for pulls and pushes, the caller of a blocking fan-out), and
// touched by one thread at a time: the one that starts an attempt, then the one that
// receives its answer.
struct RpcState {
  std::shared_ptr<Pod> pod;                  // by identity: a retry goes to the pod with this id
  uint64_t epoch = 0;                        // of the routing it was built with
  std::unique_ptr<grpc::ClientContext> ctx;  // of the current attempt
  int attempt = 0;                           // attempts finished
  int reroutes = 0;                          // map changes this part of the call has followed
  // An attempt of this part of the call (or of the part it was re-routed from) failed with
  // a retryable code: a pod may have applied it (its fate is unknown). A re-route of such a
  // push keeps its key (client/rpc_runner.h).
  bool fate_unknown = false;
  absl::Status status;  // the final outcome
  // If set, runs on the completion thread when the RPC succeeds, before the Op learns of
  // it; its error becomes the RPC's. A pull scatters its rows here, while they are in
  // cache.
  std::function<absl::Status()> on_ok;
  // Pull and push RPCs: after the pod refused ids it does not own, or after the vshards of
  // an unreachable pod failed over (Router::FailedOver), routes the request again under
  // the refreshed map, as new RPCs of `op`.
  std::function<void(const std::shared_ptr<Op>& op)> reroute;
  // Blocking fan-outs (RpcRunner::RunAll) whose caller routes again itself, round by
  // round (dense pulls and pushes): in the two cases above, instead of calling a
  // `reroute`, the runner ends the RPC with status OK and `rerouted` set, once the map is
  // refreshed; the caller sends its part again under the new map (a push keeps its key
  // when `fate_unknown` and R >= 2, as above).
  bool reroutable = false;
  bool rerouted = false;
  // Read-only pulls: after an attempt that found the pod unreachable (UNAVAILABLE,
  // DEADLINE_EXCEEDED), sends the request's ids to followers of their vshards as new RPCs
  // of `op` and returns true; false when there is no follower to ask (the RPC goes on as
  // usual). Runs on a completion thread.
  std::function<bool(const std::shared_ptr<Op>& op)> fallback;
  // Set for blocking fan-outs (RpcRunner::RunAll): the queue the calling thread drains;
  // null: the client's completion threads.
  grpc::CompletionQueue* queue = nullptr;
};

// An RPC with its request (re-sent as is on retry: same pod, same push key) and answer.
template <typename Req, typename Resp>
struct Rpc : RpcState {
  Req req;
  Resp resp;
};

using RawRpc = Rpc<grpc::ByteBuffer, grpc::ByteBuffer>;

template <typename Req, typename Resp>
std::unique_ptr<Rpc<Req, Resp>> MakeRpc(std::shared_ptr<Pod> pod, uint64_t epoch) {
  auto rpc = std::make_unique<Rpc<Req, Resp>>();
  rpc->pod = std::move(pod);
  rpc->epoch = epoch;
  return rpc;
}

// Starts one attempt of `rpc` on the pod's next channel, as a call of `completions` (or
// of rpc->queue); done(status) runs once it has finished. ctx, req and resp must stay
// valid until then.
template <typename Req, typename Resp>
void StartAttempt(AsyncMethod<Req, Resp> method, Rpc<Req, Resp>* rpc,
                  std::function<void(grpc::Status)> done, CompletionThreads& completions) {
  ParameterServer::Stub* stub = rpc->pod->stubs[rpc->pod->NextChannel()].get();
  grpc::ClientContext* ctx = rpc->ctx.get();
  const Req* req = &rpc->req;
  completions.Start([&](grpc::CompletionQueue* queue) { return (stub->*method)(ctx, *req, queue); },
                    &rpc->resp, std::move(done), rpc->queue);
}

inline void StartAttempt(RawMethod method, RawRpc* rpc, std::function<void(grpc::Status)> done,
                         CompletionThreads& completions) {
  grpc::GenericStub* stub = rpc->pod->raw_stubs[rpc->pod->NextChannel()].get();
  grpc::ClientContext* ctx = rpc->ctx.get();
  const grpc::ByteBuffer* req = &rpc->req;
  completions.Start(
      [&](grpc::CompletionQueue* queue) {
        return stub->PrepareUnaryCall(ctx, method.name, *req, queue);
      },
      &rpc->resp, std::move(done), rpc->queue);
}

}  // namespace ps::internal
