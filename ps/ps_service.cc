#include "ps/ps_service.h"

#include <glog/logging.h>

#include <limits>

#include "absl/strings/str_cat.h"
#include "proto/wire.h"

namespace ps {

namespace {

// Has the table write a pull's rows straight into the response's slices.
class WirePullSink final : public PullSink {
 public:
  void SetEpoch(uint64_t epoch) override { writer_.set_epoch(epoch); }
  float* AddEntry(const std::string& table, size_t floats) override {
    return reinterpret_cast<float*>(writer_.AddEntry(table, floats * sizeof(float)));
  }
  grpc::ByteBuffer Finish() { return writer_.Finish(); }

 private:
  wire::PullResponseWriter writer_;
};

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

grpc::ServerUnaryReactor* PsService::Submit(grpc::CallbackServerContext* ctx,
                                            std::function<absl::Status()> work,
                                            size_t request_bytes) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  PsCore* core = core_;
  auto run = [core, ctx, reactor, work = std::move(work)] {
    absl::Status s = work();
    if (!s.ok()) {
      if (s.code() == absl::StatusCode::kFailedPrecondition) {
        ctx->AddTrailingMetadata("ps-epoch", absl::StrCat(core->ownership()->epoch()));
      }
      LOG_EVERY_N(WARNING, 1000) << "request from " << ctx->peer() << " failed: " << s
                                 << " (every 1000th failure is logged)";
    }
    reactor->Finish(ToGrpcStatus(s));
  };
  if (request_bytes <= inline_request_bytes_) {
    run();  // tiny: a hand-off to the pool would cost more than the work
    return reactor;
  }
  if (!pool_->TrySubmit(std::move(run))) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "server work queue is full; retry with backoff"));
  }
  return reactor;
}

template <typename Req, typename Resp>
grpc::ServerUnaryReactor* PsService::Run(grpc::CallbackServerContext* ctx, const Req* req,
                                         Resp* resp,
                                         absl::Status (PsCore::*method)(const Req&, Resp*)) {
  PsCore* core = core_;
  return Submit(
      ctx, [core, req, resp, method] { return (core->*method)(*req, resp); },
      std::numeric_limits<size_t>::max());
}

grpc::ServerUnaryReactor* PsService::Pull(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* req, grpc::ByteBuffer* resp) {
  PsCore* core = core_;
  return Submit(
      ctx,
      [core, req, resp]() -> absl::Status {
        grpc::ByteBuffer raw(*req);  // shares the slices; Deserialize consumes its argument
        PullRequest request;
        if (!grpc::SerializationTraits<PullRequest>::Deserialize(&raw, &request).ok()) {
          return absl::InvalidArgumentError("request is not a PullRequest");
        }
        WirePullSink sink;
        absl::Status s = core->Pull(request, &sink);
        if (s.ok()) *resp = sink.Finish();
        return s;
      },
      req->Length());
}

grpc::ServerUnaryReactor* PsService::Push(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* req, grpc::ByteBuffer* resp) {
  PsCore* core = core_;
  return Submit(
      ctx,
      [core, req, resp]() -> absl::Status {
        grpc::ByteBuffer raw(*req);  // shares the slices; Deserialize consumes its argument
        PushRequest request;
        if (!grpc::SerializationTraits<PushRequest>::Deserialize(&raw, &request).ok()) {
          return absl::InvalidArgumentError("request is not a PushRequest");
        }
        PushResponse response;
        absl::Status s = core->Push(request, &response);
        if (s.ok()) {
          bool own_buffer;
          grpc::SerializationTraits<PushResponse>::Serialize(response, resp, &own_buffer);
        }
        return s;
      },
      req->Length());
}

#define PS_RPC(Name, Req, Resp)                                                               \
  grpc::ServerUnaryReactor* PsService::Name(grpc::CallbackServerContext* ctx, const Req* req, \
                                            Resp* resp) {                                     \
    return Run(ctx, req, resp, &PsCore::Name);                                                \
  }

PS_RPC(CreateTable, CreateTableRequest, CreateTableResponse)
PS_RPC(CreateDense, CreateDenseRequest, CreateDenseResponse)
PS_RPC(Describe, DescribeRequest, DescribeResponse)
PS_RPC(PullDense, DensePullRequest, DensePullResponse)
PS_RPC(PushDense, DensePushRequest, PushResponse)
PS_RPC(Stats, StatsRequest, StatsResponse)

#undef PS_RPC

}  // namespace ps
