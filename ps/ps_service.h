// The gRPC face of a PS pod: each RPC's work runs on the WorkPool and its reactor is
// finished from there, so gRPC's threads never block on request work.
//
// Tiny pulls and pushes (see inline_request_bytes) run on gRPC's thread: for them the
// hand-off to the pool costs more than the work, and adds a thread wake-up to latency.
//
// Pull and Push are raw methods: their requests are parsed on the pool thread that then
// uses them (so the gradients are in that core's cache), and a pull's response is written
// by hand (proto/wire.h) so the rows go to the socket without being copied into a
// protobuf serialization first. The wire format is ps.proto's either way.
#pragma once

#include <functional>

#include "common/base/work_pool.h"
#include "common/rpc/transport_security.h"
#include "proto/ps.grpc.pb.h"
#include "ps/migrate_import.h"
#include "ps/ps_core.h"

namespace ps {

class PsService final
    : public ParameterServer::WithRawCallbackMethod_Pull<
          ParameterServer::WithRawCallbackMethod_Push<ParameterServer::CallbackService>> {
 public:
  // `core` and `pool` (and `auth`, if given) must outlive the service. Pulls and pushes
  // whose request is at most `inline_request_bytes` run on gRPC's thread instead of the
  // pool. With `auth`, every RPC is checked first and refused with UNAUTHENTICATED.
  // `migrate` configures the imports this pod runs as a move's destination.
  PsService(PsCore* core, WorkPool* pool, size_t inline_request_bytes = 0,
            const TokenAuthenticator* auth = nullptr, MigrateImportOptions migrate = {})
      : core_(core),
        pool_(pool),
        inline_request_bytes_(inline_request_bytes),
        auth_(auth),
        migrate_options_(std::move(migrate)),
        migrate_pool_(WorkPoolOptions{1, 4}) {}

  grpc::ServerUnaryReactor* CreateTable(grpc::CallbackServerContext* ctx,
                                        const CreateTableRequest* req,
                                        CreateTableResponse* resp) override;
  grpc::ServerUnaryReactor* CreateDense(grpc::CallbackServerContext* ctx,
                                        const CreateDenseRequest* req,
                                        CreateDenseResponse* resp) override;
  grpc::ServerUnaryReactor* Describe(grpc::CallbackServerContext* ctx, const DescribeRequest* req,
                                     DescribeResponse* resp) override;
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                 grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                 grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* PullDense(grpc::CallbackServerContext* ctx, const DensePullRequest* req,
                                      DensePullResponse* resp) override;
  grpc::ServerUnaryReactor* PushDense(grpc::CallbackServerContext* ctx, const DensePushRequest* req,
                                      PushResponse* resp) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx, const StatsRequest* req,
                                  StatsResponse* resp) override;
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* ctx,
                                       const PodCheckpointRequest* req,
                                       PodCheckpointResponse* resp) override;
  grpc::ServerUnaryReactor* ApplyAssignment(grpc::CallbackServerContext* ctx, const Assignment* req,
                                            ApplyAssignmentResponse* resp) override;
  grpc::ServerUnaryReactor* MigrateBegin(grpc::CallbackServerContext* ctx,
                                         const MigrateBeginRequest* req,
                                         MigrateBeginResponse* resp) override;
  grpc::ServerUnaryReactor* MigrateExport(grpc::CallbackServerContext* ctx,
                                          const MigrateExportRequest* req,
                                          MigrateExportResponse* resp) override;
  // Runs on its own thread (a move takes seconds): never holds a request worker.
  grpc::ServerUnaryReactor* MigrateImport(grpc::CallbackServerContext* ctx,
                                          const MigrateImportRequest* req,
                                          MigrateImportResponse* resp) override;

 private:
  // Runs `work` (inline if request_bytes <= inline_request_bytes_, else on the pool); the
  // call finishes with the status `work` passes to its callback, whenever it does (a
  // durable push calls back once its log record is written).
  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* ctx,
                                   std::function<void(PsCore::Done)> work, size_t request_bytes);
  template <typename Req, typename Resp>
  grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext* ctx, const Req* req, Resp* resp,
                                absl::Status (PsCore::*method)(const Req&, Resp*));

  PsCore* const core_;
  WorkPool* const pool_;
  const size_t inline_request_bytes_;
  // OK, or UNAUTHENTICATED (logged, 1 in 100) when `auth_` refuses the call. Every RPC
  // checks it first.
  absl::Status Authenticate(const grpc::ServerContextBase& ctx) const;

  const TokenAuthenticator* const auth_;  // null: no token required
  const MigrateImportOptions migrate_options_;
  WorkPool migrate_pool_;  // one import at a time
};

}  // namespace ps
