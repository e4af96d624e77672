// The gRPC face of the master: each RPC runs on a WorkPool (its state changes wait for a
// synced RocksDB write) and finishes its reactor from there, so gRPC threads never block.
#pragma once

#include "common/base/work_pool.h"
#include "common/rpc/authorizer.h"
#include "master/master_core.h"
#include "proto/master.grpc.pb.h"

namespace ps {

class MasterService final : public Master::CallbackService {
 public:
  // `core` and `pool` (and `auth`, if given) must outlive the service. With `auth`, every
  // RPC is checked first against the role table (common/rpc/auth_policy.h) and refused
  // with UNAUTHENTICATED or PERMISSION_DENIED.
  MasterService(MasterCore* core, WorkPool* pool, const Authorizer* auth = nullptr)
      : core_(core), pool_(pool), auth_(auth) {}

#define PS_MASTER_RPC(Name, Req, Resp)                                                         \
  grpc::ServerUnaryReactor* Name(grpc::CallbackServerContext* ctx, const Req* req, Resp* resp) \
      override;
  PS_MASTER_RPC(RegisterPod, RegisterPodRequest, RegisterPodResponse)
  PS_MASTER_RPC(PodHeartbeat, PodHeartbeatRequest, PodHeartbeatResponse)
  PS_MASTER_RPC(LeavePod, LeavePodRequest, LeavePodResponse)
  PS_MASTER_RPC(GetShardMap, GetShardMapRequest, ShardMapResponse)
  PS_MASTER_RPC(CreateTable, CreateTableRequest, CreateTableResponse)
  PS_MASTER_RPC(CreateDense, CreateDenseRequest, CreateDenseResponse)
  PS_MASTER_RPC(ListTables, ListTablesRequest, ListTablesResponse)
  PS_MASTER_RPC(RegisterWorker, RegisterWorkerRequest, RegisterWorkerResponse)
  PS_MASTER_RPC(WorkerHeartbeat, WorkerHeartbeatRequest, WorkerHeartbeatResponse)
  PS_MASTER_RPC(LeaveWorker, LeaveWorkerRequest, LeaveWorkerResponse)
  PS_MASTER_RPC(CreateJob, CreateJobRequest, CreateJobResponse)
  PS_MASTER_RPC(GetTask, GetTaskRequest, GetTaskResponse)
  PS_MASTER_RPC(ReportTask, ReportTaskRequest, ReportTaskResponse)
  PS_MASTER_RPC(Status, StatusRequest, StatusResponse)
  PS_MASTER_RPC(Drain, DrainRequest, DrainResponse)
  PS_MASTER_RPC(Rebalance, RebalanceRequest, RebalanceResponse)
  PS_MASTER_RPC(DeleteJob, DeleteJobRequest, DeleteJobResponse)
  PS_MASTER_RPC(Checkpoint, CheckpointRequest, CheckpointResponse)
#undef PS_MASTER_RPC

 private:
  // Runs `handler` on the pool once the caller may call `method` (its full name).
  template <typename Req, typename Resp>
  grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext* ctx, const char* method,
                                const Req* req, Resp* resp,
                                absl::Status (MasterCore::*handler)(const Req&, Resp*));

  MasterCore* const core_;
  WorkPool* const pool_;
  const Authorizer* const auth_;  // null: every call is allowed
};

}  // namespace ps
