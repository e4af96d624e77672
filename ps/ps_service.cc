#include "ps/ps_service.h"

#include <glog/logging.h>

#include "absl/strings/str_cat.h"

namespace ps {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

template <typename Req, typename Resp>
grpc::ServerUnaryReactor* PsService::Run(grpc::CallbackServerContext* ctx, const Req* req,
                                         Resp* resp,
                                         absl::Status (PsCore::*method)(const Req&, Resp*)) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  PsCore* core = core_;
  bool queued = pool_->TrySubmit([core, ctx, req, resp, reactor, method] {
    absl::Status s = (core->*method)(*req, resp);
    if (!s.ok()) {
      if (s.code() == absl::StatusCode::kFailedPrecondition) {
        ctx->AddTrailingMetadata("ps-epoch", absl::StrCat(core->ownership()->epoch()));
      }
      LOG_EVERY_N(WARNING, 1000) << "request from " << ctx->peer() << " failed: " << s
                                 << " (every 1000th failure is logged)";
    }
    reactor->Finish(ToGrpcStatus(s));
  });
  if (!queued) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "server work queue is full; retry with backoff"));
  }
  return reactor;
}

template <typename Req>
grpc::ServerUnaryReactor* PsService::RunAsync(grpc::CallbackServerContext* ctx, const Req* req,
                                              PushResponse* resp,
                                              void (PsCore::*method)(const Req&, PushResponse*,
                                                                     PsCore::Done)) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  PsCore* core = core_;
  bool queued = pool_->TrySubmit([core, ctx, req, resp, reactor, method] {
    (core->*method)(*req, resp, [core, ctx, reactor](absl::Status s) {
      if (!s.ok()) {
        if (s.code() == absl::StatusCode::kFailedPrecondition) {
          ctx->AddTrailingMetadata("ps-epoch", absl::StrCat(core->ownership()->epoch()));
        }
        LOG_EVERY_N(WARNING, 1000) << "push from " << ctx->peer() << " failed: " << s
                                   << " (every 1000th failure is logged)";
      }
      reactor->Finish(ToGrpcStatus(s));
    });
  });
  if (!queued) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "server work queue is full; retry with backoff"));
  }
  return reactor;
}

grpc::ServerUnaryReactor* PsService::Push(grpc::CallbackServerContext* ctx, const PushRequest* req,
                                          PushResponse* resp) {
  return RunAsync(ctx, req, resp, &PsCore::PushAsync);
}

grpc::ServerUnaryReactor* PsService::PushDense(grpc::CallbackServerContext* ctx,
                                               const DensePushRequest* req, PushResponse* resp) {
  return RunAsync(ctx, req, resp, &PsCore::PushDenseAsync);
}

#define PS_RPC(Name, Req, Resp)                                                               \
  grpc::ServerUnaryReactor* PsService::Name(grpc::CallbackServerContext* ctx, const Req* req, \
                                            Resp* resp) {                                     \
    return Run(ctx, req, resp, &PsCore::Name);                                                \
  }

PS_RPC(CreateTable, CreateTableRequest, CreateTableResponse)
PS_RPC(CreateDense, CreateDenseRequest, CreateDenseResponse)
PS_RPC(Describe, DescribeRequest, DescribeResponse)
PS_RPC(Pull, PullRequest, PullResponse)
PS_RPC(PullDense, DensePullRequest, DensePullResponse)
PS_RPC(Stats, StatsRequest, StatsResponse)
PS_RPC(Checkpoint, PodCheckpointRequest, PodCheckpointResponse)

#undef PS_RPC

}  // namespace ps
