#include "ps/transfer_service.h"

#include <memory>

#include "common/rpc/grpc_status.h"
#include "ps/pod_transfer.h"

namespace ps {
namespace {

// Finishes `reactor` with UNAUTHENTICATED and returns true when `ctx` lacks the token.
bool Refused(const TokenAuthenticator* auth, grpc::CallbackServerContext* ctx,
             grpc::ServerUnaryReactor* reactor) {
  if (auth == nullptr) return false;
  absl::Status s = auth->Check(*ctx);
  if (s.ok()) return false;
  reactor->Finish(ToGrpcStatus(s));
  return true;
}

}  // namespace

grpc::ServerUnaryReactor* PodTransferService::Export(grpc::CallbackServerContext* ctx,
                                                     const ExportRequest* req,
                                                     ExportResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (Refused(auth_, ctx, reactor)) return reactor;
  if (exporting_.exchange(true)) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "an export is already running on this pod; retry later"));
    return reactor;
  }
  PsCore* core = core_;
  std::atomic<bool>* exporting = &exporting_;
  if (!export_pool_.TrySubmit([core, req, resp, reactor, exporting] {
        absl::Status s = ExportPod(*core, *req, resp);
        exporting->store(false);
        reactor->Finish(ToGrpcStatus(s));
      })) {
    exporting_.store(false);
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "pod is shutting down"));
  }
  return reactor;
}

grpc::ServerUnaryReactor* PodTransferService::ImportRows(grpc::CallbackServerContext* ctx,
                                                         const ImportRowsRequest* req,
                                                         ImportRowsResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (Refused(auth_, ctx, reactor)) return reactor;
  PsCore* core = core_;
  if (!pool_->TrySubmit([core, req, resp, reactor] {
        core->ImportRows(*req, resp,
                         [reactor](absl::Status s) { reactor->Finish(ToGrpcStatus(s)); });
      })) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "server work queue is full; retry with backoff"));
  }
  return reactor;
}

}  // namespace ps
