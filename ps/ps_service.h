// The gRPC face of a PS pod: each RPC's work runs on the WorkPool and its reactor is
// finished from there, so gRPC's threads never block on request work.
//
// Tiny pulls and pushes (see inline_request_bytes) run on gRPC's thread: for them the
// hand-off to the pool costs more than the work, and adds a thread wake-up to latency.
// A primary's ReplicateRecords batches run on the follower's own lane (replicate_pool),
// never behind the pod's pushes: those wait for other pods' followers in turn.
//
// Pull and Push are raw methods: their requests are parsed on the pool thread that then
// uses them (so the gradients are in that core's cache), and a pull's response is written
// by hand (proto/wire.h) so the rows go to the socket without being copied into a
// protobuf serialization first. ReplicateRecords is raw too: its request is parsed into a
// message this pod owns, whose records its log then holds as they came (no copy). The
// wire format is ps.proto's either way.
#pragma once

#include <functional>

#include "common/base/work_pool.h"
#include "common/rpc/authorizer.h"
#include "proto/ps.grpc.pb.h"
#include "ps/migrate_import.h"
#include "ps/path_root.h"
#include "ps/ps_core.h"

namespace ps {

struct PsServiceOptions {
  // Pulls and pushes whose request is at most this many bytes run on gRPC's thread
  // instead of the pool (PsServerOptions::inline_request_bytes says when that pays).
  size_t inline_request_bytes = 0;
  // Checks every RPC against the role table (common/rpc/auth_policy.h) first. Null:
  // every call is allowed. Must outlive the service.
  const Authorizer* auth = nullptr;
  // The imports this pod runs as a move's destination.
  MigrateImportOptions migrate;
  // Where Checkpoint may write (--checkpoint_root). Default: nowhere (refused).
  PathRoot checkpoint_root{"", "--checkpoint_root"};
  // The follower's own lane for its primaries' ReplicateRecords batches: they never wait
  // behind the pod's pushes and pulls in the request pool, whose acknowledgements (R >= 2,
  // ack all) wait for the other pods' follower lanes. One thread: a primary's batches run
  // one at a time anyway (ps/replica_order.h), and each primary ships one stream. 64
  // queued: the windows (ReplicatorOptions::window, 4 calls) of 16 primaries, each call
  // holding up to 4 MiB of records; beyond that the primary resends with backoff.
  WorkPoolOptions replicate_pool{/*threads=*/1, /*max_queued=*/64};
};

class PsService final : public ParameterServer::WithRawCallbackMethod_Pull<
                            ParameterServer::WithRawCallbackMethod_Push<
                                ParameterServer::WithRawCallbackMethod_ReplicateRecords<
                                    ParameterServer::CallbackService>>> {
 public:
  // `core` and `pool` must outlive the service. A call its options' Authorizer refuses
  // gets UNAUTHENTICATED or PERMISSION_DENIED before anything else happens; a Checkpoint
  // outside the checkpoint root INVALID_ARGUMENT (FAILED_PRECONDITION without a root).
  PsService(PsCore* core, WorkPool* pool, PsServiceOptions options = {})
      : core_(core),
        pool_(pool),
        options_(std::move(options)),
        migrate_pool_(WorkPoolOptions{1, 4}),
        replicate_pool_(options_.replicate_pool) {}

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
  // A follower's side of replication (PsCore::ReplicateRecords), on its own lane
  // (PsServiceOptions::replicate_pool); a full lane answers UNAVAILABLE (the primary
  // resends with backoff).
  grpc::ServerUnaryReactor* ReplicateRecords(grpc::CallbackServerContext* ctx,
                                             const grpc::ByteBuffer* req,
                                             grpc::ByteBuffer* resp) override;
  // Runs on its own thread (a move takes seconds): never holds a request worker.
  grpc::ServerUnaryReactor* MigrateImport(grpc::CallbackServerContext* ctx,
                                          const MigrateImportRequest* req,
                                          MigrateImportResponse* resp) override;

 private:
  // Runs `work` (inline if request_bytes <= inline_request_bytes, else on `pool`, the
  // request pool when null) once the caller may call `method` (its full name); the call
  // finishes with the status `work` passes to its callback, whenever it does (a durable
  // push calls back once its log record is written).
  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* ctx, const char* method,
                                   std::function<void(PsCore::Done)> work, size_t request_bytes,
                                   WorkPool* pool = nullptr);
  template <typename Req, typename Resp>
  grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext* ctx, const char* method,
                                const Req* req, Resp* resp,
                                absl::Status (PsCore::*handler)(const Req&, Resp*));
  // OK, or the Authorizer's refusal of `method` for this call.
  absl::Status Authorize(const grpc::ServerContextBase& ctx, const char* method) const;

  PsCore* const core_;
  WorkPool* const pool_;
  const PsServiceOptions options_;
  WorkPool migrate_pool_;    // one import at a time
  WorkPool replicate_pool_;  // follower batches (ReplicateRecords)
};

}  // namespace ps
