#include "ps/transfer_service.h"

#include <glog/logging.h>

#include <memory>

#include "common/rpc/grpc_status.h"
#include "ps/pod_transfer.h"

namespace ps {
namespace {

// Finishes `reactor` with the refusal and returns true when `auth` refuses `method` for
// the call.
bool Refused(const Authorizer* auth, grpc::CallbackServerContext* ctx, const char* method,
             grpc::ServerUnaryReactor* reactor) {
  if (auth == nullptr) return false;
  absl::Status s = auth->Authorize(*ctx, method);
  if (s.ok()) return false;
  reactor->Finish(ToGrpcStatus(s));
  return true;
}

}  // namespace

grpc::ServerUnaryReactor* PodTransferService::Export(grpc::CallbackServerContext* ctx,
                                                     const ExportRequest* req,
                                                     ExportResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (Refused(options_.auth, ctx, "/ps.PodTransfer/Export", reactor)) return reactor;
  if (exporting_.exchange(true)) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "an export is already running on this pod; retry later"));
    return reactor;
  }
  PsCore* core = core_;
  std::atomic<bool>* exporting = &exporting_;
  const PathRoot* root = &options_.export_root;
  if (!export_pool_.TrySubmit([core, root, req, resp, reactor, exporting] {
        // The directory must lie under the export root (resolved here, off gRPC's thread:
        // it reads the file system).
        absl::StatusOr<std::string> dir = root->Resolve(req->dir());
        absl::Status s = dir.status();
        if (s.ok()) {
          ExportRequest resolved = *req;
          resolved.set_dir(*dir);
          s = ExportPod(*core, resolved, resp);
        } else {
          LOG(WARNING) << "export to '" << req->dir() << "' refused: " << s;
        }
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
  if (Refused(options_.auth, ctx, "/ps.PodTransfer/ImportRows", reactor)) return reactor;
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
