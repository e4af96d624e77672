#include "master/master_service.h"

#include <glog/logging.h>

#include "common/rpc/grpc_status.h"

namespace ps {

template <typename Req, typename Resp>
grpc::ServerUnaryReactor* MasterService::Run(grpc::CallbackServerContext* ctx, const char* method,
                                             const Req* req, Resp* resp,
                                             absl::Status (MasterCore::*handler)(const Req&,
                                                                                 Resp*)) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (auth_ != nullptr) {
    if (absl::Status s = auth_->Authorize(*ctx, method); !s.ok()) {
      reactor->Finish(ToGrpcStatus(s));  // the Authorizer logs refusals
      return reactor;
    }
  }
  MasterCore* core = core_;
  bool queued = pool_->TrySubmit([core, ctx, req, resp, reactor, handler] {
    absl::Status s = (core->*handler)(*req, resp);
    if (!s.ok()) VLOG(1) << "request from " << ctx->peer() << " failed: " << s;
    reactor->Finish(ToGrpcStatus(s));
  });
  if (!queued) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "master work queue is full; retry with backoff"));
  }
  return reactor;
}

#define PS_MASTER_RPC(Name, Req, Resp)                                                            \
  grpc::ServerUnaryReactor* MasterService::Name(grpc::CallbackServerContext* ctx, const Req* req, \
                                                Resp* resp) {                                     \
    return Run(ctx, "/ps.Master/" #Name, req, resp, &MasterCore::Name);                           \
  }

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

}  // namespace ps
