// The gRPC face of a PS pod: each RPC's work runs on the WorkPool and its reactor is
// finished from there, so gRPC's threads never block on request work.
#pragma once

#include "proto/ps.grpc.pb.h"
#include "ps/ps_core.h"
#include "ps/work_pool.h"

namespace ps {

class PsService final : public ParameterServer::CallbackService {
 public:
  // `core` and `pool` must outlive the service.
  PsService(PsCore* core, WorkPool* pool) : core_(core), pool_(pool) {}

  grpc::ServerUnaryReactor* CreateTable(grpc::CallbackServerContext* ctx,
                                        const CreateTableRequest* req,
                                        CreateTableResponse* resp) override;
  grpc::ServerUnaryReactor* CreateDense(grpc::CallbackServerContext* ctx,
                                        const CreateDenseRequest* req,
                                        CreateDenseResponse* resp) override;
  grpc::ServerUnaryReactor* Describe(grpc::CallbackServerContext* ctx, const DescribeRequest* req,
                                     DescribeResponse* resp) override;
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* ctx, const PullRequest* req,
                                 PullResponse* resp) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx, const PushRequest* req,
                                 PushResponse* resp) override;
  grpc::ServerUnaryReactor* PullDense(grpc::CallbackServerContext* ctx, const DensePullRequest* req,
                                      DensePullResponse* resp) override;
  grpc::ServerUnaryReactor* PushDense(grpc::CallbackServerContext* ctx, const DensePushRequest* req,
                                      PushResponse* resp) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx, const StatsRequest* req,
                                  StatsResponse* resp) override;
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* ctx,
                                       const PodCheckpointRequest* req,
                                       PodCheckpointResponse* resp) override;

 private:
  template <typename Req, typename Resp>
  grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext* ctx, const Req* req, Resp* resp,
                                absl::Status (PsCore::*method)(const Req&, Resp*));
  // For pushes, which complete when durable: the reactor finishes from PsCore's callback.
  template <typename Req>
  grpc::ServerUnaryReactor* RunAsync(grpc::CallbackServerContext* ctx, const Req* req,
                                     PushResponse* resp,
                                     void (PsCore::*method)(const Req&, PushResponse*,
                                                            PsCore::Done));

  PsCore* const core_;
  WorkPool* const pool_;
};

// absl::Status -> grpc::Status (the codes are the same google.rpc.Code values).
grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

}  // namespace ps
