// The gRPC face of export and import (service PodTransfer in proto/ps.proto). ImportRows
// runs on the pod's WorkPool like a push; Export, which takes seconds to minutes, runs on
// a thread of its own so it never holds a request thread (one export at a time; another
// meanwhile gets UNAVAILABLE).
#pragma once

#include <atomic>

#include "common/base/work_pool.h"
#include "common/rpc/transport_security.h"
#include "proto/ps.grpc.pb.h"
#include "ps/ps_core.h"

namespace ps {

class PodTransferService final : public PodTransfer::CallbackService {
 public:
  // `core` and `pool` must outlive the service.
  // With `auth` (which must outlive the service too), every call is checked first and
  // refused with UNAUTHENTICATED.
  PodTransferService(PsCore* core, WorkPool* pool, const TokenAuthenticator* auth = nullptr)
      : core_(core), pool_(pool), auth_(auth), export_pool_(WorkPoolOptions{1, 1}) {}

  grpc::ServerUnaryReactor* Export(grpc::CallbackServerContext* ctx, const ExportRequest* req,
                                   ExportResponse* resp) override;
  grpc::ServerUnaryReactor* ImportRows(grpc::CallbackServerContext* ctx,
                                       const ImportRowsRequest* req,
                                       ImportRowsResponse* resp) override;

 private:
  PsCore* const core_;
  WorkPool* const pool_;
  const TokenAuthenticator* const auth_;  // null: no token required
  std::atomic<bool> exporting_{false};
  WorkPool export_pool_;  // one thread; declared last, so joined first
};

}  // namespace ps
