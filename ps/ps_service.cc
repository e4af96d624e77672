#include "ps/ps_service.h"

#include <glog/logging.h>

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_status.h"
#include "proto/wire.h"
#include "ps/migrate_import.h"

namespace ps {

namespace {

// Has the table write a pull's rows straight into the response's slices.
class WirePullSink final : public PullSink {
 public:
  void SetEpoch(uint64_t epoch) override { writer_.set_epoch(epoch); }
  char* AddEntry(const std::string& table, size_t bytes) override {
    return writer_.AddEntry(table, bytes);
  }
  grpc::ByteBuffer Finish() { return writer_.Finish(); }

 private:
  wire::PullResponseWriter writer_;
};

}  // namespace

// The full name of a ParameterServer method, as the role table has it.
#define PS_METHOD(Name) "/ps.ParameterServer/" #Name

absl::Status PsService::Authorize(const grpc::ServerContextBase& ctx, const char* method) const {
  if (options_.auth == nullptr) return absl::OkStatus();
  return options_.auth->Authorize(ctx, method);
}

grpc::ServerUnaryReactor* PsService::Submit(grpc::CallbackServerContext* ctx, const char* method,
                                            std::function<void(PsCore::Done)> work,
                                            size_t request_bytes, WorkPool* pool) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (absl::Status s = Authorize(*ctx, method); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  PsCore* core = core_;
  PsCore::Done finish = [core, ctx, reactor](absl::Status s) {
    if (!s.ok()) {
      if (s.code() == absl::StatusCode::kFailedPrecondition) {
        ctx->AddTrailingMetadata("ps-epoch", absl::StrCat(core->ownership()->epoch()));
      }
      LOG_EVERY_N(WARNING, 1000) << "request from " << ctx->peer() << " failed: " << s
                                 << " (every 1000th failure is logged)";
    }
    reactor->Finish(ToGrpcStatus(s));
  };
  auto run = [work = std::move(work), finish = std::move(finish)] { work(finish); };
  if (request_bytes <= options_.inline_request_bytes) {
    run();  // tiny: a hand-off to the pool would cost more than the work
    return reactor;
  }
  if (!(pool != nullptr ? pool : pool_)->TrySubmit(std::move(run))) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "server work queue is full; retry with backoff"));
  }
  return reactor;
}

template <typename Req, typename Resp>
grpc::ServerUnaryReactor* PsService::Run(grpc::CallbackServerContext* ctx, const char* method,
                                         const Req* req, Resp* resp,
                                         absl::Status (PsCore::*handler)(const Req&, Resp*)) {
  PsCore* core = core_;
  return Submit(
      ctx, method,
      [core, req, resp, handler](PsCore::Done done) { done((core->*handler)(*req, resp)); },
      std::numeric_limits<size_t>::max());
}

grpc::ServerUnaryReactor* PsService::Pull(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* req, grpc::ByteBuffer* resp) {
  PsCore* core = core_;
  return Submit(
      ctx, PS_METHOD(Pull),
      [core, req, resp](PsCore::Done done) {
        grpc::ByteBuffer raw(*req);  // shares the slices; Deserialize consumes its argument
        PullRequest request;
        if (!grpc::SerializationTraits<PullRequest>::Deserialize(&raw, &request).ok()) {
          return done(absl::InvalidArgumentError("request is not a PullRequest"));
        }
        WirePullSink sink;
        absl::Status s = core->Pull(request, &sink);
        if (s.ok()) *resp = sink.Finish();
        done(s);
      },
      req->Length());
}

grpc::ServerUnaryReactor* PsService::Push(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* req, grpc::ByteBuffer* resp) {
  PsCore* core = core_;
  return Submit(
      ctx, PS_METHOD(Push),
      [core, req, resp](PsCore::Done done) {
        // The request and response live until the push is durable (PsCore calls back).
        auto call = std::make_shared<std::pair<PushRequest, PushResponse>>();
        grpc::ByteBuffer raw(*req);  // shares the slices; Deserialize consumes its argument
        if (!grpc::SerializationTraits<PushRequest>::Deserialize(&raw, &call->first).ok()) {
          return done(absl::InvalidArgumentError("request is not a PushRequest"));
        }
        core->PushAsync(
            call->first, &call->second, [call, resp, done = std::move(done)](absl::Status s) {
              if (s.ok()) {
                bool own_buffer;
                grpc::SerializationTraits<PushResponse>::Serialize(call->second, resp, &own_buffer);
              }
              done(s);
            });
      },
      req->Length());
}

grpc::ServerUnaryReactor* PsService::PushDense(grpc::CallbackServerContext* ctx,
                                               const DensePushRequest* req, PushResponse* resp) {
  PsCore* core = core_;
  return Submit(
      ctx, PS_METHOD(PushDense),
      [core, req, resp](PsCore::Done done) { core->PushDenseAsync(*req, resp, std::move(done)); },
      std::numeric_limits<size_t>::max());
}

grpc::ServerUnaryReactor* PsService::ReplicateRecords(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* req,
                                                      grpc::ByteBuffer* resp) {
  PsCore* core = core_;
  // Always on the follower's lane, never inline: a batch may wait for this pod's log room
  // or its move fence. Its own lane: queued behind the pod's pushes, which wait for the
  // other pods' followers, every replicated push waited longer.
  return Submit(
      ctx, PS_METHOD(ReplicateRecords),
      [core, req, resp](PsCore::Done done) {
        // Parsed into a request this pod owns: its log may hold the records past the call.
        auto request = std::make_shared<ReplicateRecordsRequest>();
        grpc::ByteBuffer raw(*req);  // shares the slices; Deserialize consumes its argument
        if (!grpc::SerializationTraits<ReplicateRecordsRequest>::Deserialize(&raw, request.get())
                 .ok()) {
          return done(absl::InvalidArgumentError("request is not a ReplicateRecordsRequest"));
        }
        auto answer = std::make_shared<ReplicateRecordsResponse>();
        core->ReplicateRecords(std::move(request), answer.get(),
                               [answer, resp, done = std::move(done)](absl::Status s) {
                                 if (s.ok()) {
                                   bool own_buffer;
                                   grpc::SerializationTraits<ReplicateRecordsResponse>::Serialize(
                                       *answer, resp, &own_buffer);
                                 }
                                 done(s);
                               });
      },
      std::numeric_limits<size_t>::max(), &replicate_pool_);
}

#define PS_RPC(Name, Req, Resp)                                                               \
  grpc::ServerUnaryReactor* PsService::Name(grpc::CallbackServerContext* ctx, const Req* req, \
                                            Resp* resp) {                                     \
    return Run(ctx, PS_METHOD(Name), req, resp, &PsCore::Name);                               \
  }

PS_RPC(CreateTable, CreateTableRequest, CreateTableResponse)
PS_RPC(CreateDense, CreateDenseRequest, CreateDenseResponse)
PS_RPC(Describe, DescribeRequest, DescribeResponse)
PS_RPC(PullDense, DensePullRequest, DensePullResponse)
PS_RPC(Stats, StatsRequest, StatsResponse)
PS_RPC(MigrateBegin, MigrateBeginRequest, MigrateBeginResponse)
PS_RPC(MigrateExport, MigrateExportRequest, MigrateExportResponse)

grpc::ServerUnaryReactor* PsService::ApplyAssignment(grpc::CallbackServerContext* ctx,
                                                     const Assignment* req,
                                                     ApplyAssignmentResponse* resp) {
  return Run(ctx, PS_METHOD(ApplyAssignment), req, resp, &PsCore::ApplyAssignment);
}

grpc::ServerUnaryReactor* PsService::Checkpoint(grpc::CallbackServerContext* ctx,
                                                const PodCheckpointRequest* req,
                                                PodCheckpointResponse* resp) {
  PsCore* core = core_;
  const PathRoot* root = &options_.checkpoint_root;
  return Submit(
      ctx, PS_METHOD(Checkpoint),
      [core, root, req, resp](PsCore::Done done) {
        absl::StatusOr<std::string> dir = root->Resolve(req->dir());
        if (!dir.ok()) {
          LOG(WARNING) << "checkpoint to '" << req->dir() << "' refused: " << dir.status();
          return done(dir.status());
        }
        PodCheckpointRequest resolved = *req;
        resolved.set_dir(*dir);
        done(core->Checkpoint(resolved, resp));
      },
      std::numeric_limits<size_t>::max());
}

grpc::ServerUnaryReactor* PsService::MigrateImport(grpc::CallbackServerContext* ctx,
                                                   const MigrateImportRequest* req,
                                                   MigrateImportResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (absl::Status s = Authorize(*ctx, PS_METHOD(MigrateImport)); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  PsCore* core = core_;
  if (!migrate_pool_.TrySubmit([this, core, req, resp, reactor] {
        reactor->Finish(ToGrpcStatus(RunMigrateImport(core, *req, resp, options_.migrate)));
      })) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "too many imports queued"));
  }
  return reactor;
}

#undef PS_RPC
#undef PS_METHOD

}  // namespace ps
