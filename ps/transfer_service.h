// The gRPC face of export and import (service PodTransfer in proto/ps.proto). ImportRows
// runs on the pod's WorkPool like a push; Export, which takes seconds to minutes, runs on
// a thread of its own so it never holds a request thread (one export at a time; another
// meanwhile gets UNAVAILABLE).
#pragma once

#include <atomic>

#include "common/base/work_pool.h"
#include "common/rpc/authorizer.h"
#include "proto/ps.grpc.pb.h"
#include "ps/path_root.h"
#include "ps/ps_core.h"

namespace ps {

struct PodTransferServiceOptions {
  // Checks every call first (both methods need the admin role). Null: every call is
  // allowed. Must outlive the service.
  const Authorizer* auth = nullptr;
  // Where Export may write (--export_root). Default: nowhere (refused).
  PathRoot export_root{"", "--export_root"};
};

class PodTransferService final : public PodTransfer::CallbackService {
 public:
  // `core` and `pool` must outlive the service. A call the Authorizer refuses gets
  // UNAUTHENTICATED or PERMISSION_DENIED; an Export outside the export root
  // INVALID_ARGUMENT (FAILED_PRECONDITION without a root).
  PodTransferService(PsCore* core, WorkPool* pool, PodTransferServiceOptions options = {})
      : core_(core),
        pool_(pool),
        options_(std::move(options)),
        export_pool_(WorkPoolOptions{1, 1}) {}

  grpc::ServerUnaryReactor* Export(grpc::CallbackServerContext* ctx, const ExportRequest* req,
                                   ExportResponse* resp) override;
  grpc::ServerUnaryReactor* ImportRows(grpc::CallbackServerContext* ctx,
                                       const ImportRowsRequest* req,
                                       ImportRowsResponse* resp) override;

 private:
  PsCore* const core_;
  WorkPool* const pool_;
  const PodTransferServiceOptions options_;
  std::atomic<bool> exporting_{false};
  WorkPool export_pool_;  // one thread; declared last, so joined first
};

}  // namespace ps
