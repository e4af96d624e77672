#include "master/pod_control.h"

#include <grpcpp/grpcpp.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "common/rpc/grpc_status.h"
#include "proto/ps.grpc.pb.h"

namespace ps {
namespace {

class GrpcPodControl final : public PodControl {
 public:
  explicit GrpcPodControl(const GrpcPodControlOptions& options) : options_(options) {}

  absl::Status ApplyAssignment(const std::string& address, const Assignment& req) override {
    ParameterServer::Stub* stub;
    RETURN_IF_ERROR(Connected(address, options_.assign_timeout, &stub));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.assign_timeout));
    ApplyAssignmentResponse resp;
    return FromGrpcStatus(stub->ApplyAssignment(&ctx, req, &resp));
  }

  absl::Status MigrateBegin(const std::string& address, const MigrateBeginRequest& req,
                            MigrateBeginResponse* resp) override {
    ParameterServer::Stub* stub;
    RETURN_IF_ERROR(Connected(address, options_.connect_timeout, &stub));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.begin_timeout));
    return FromGrpcStatus(stub->MigrateBegin(&ctx, req, resp));
  }

  absl::Status MigrateImport(const std::string& address, const MigrateImportRequest& req,
                             MigrateImportResponse* resp) override {
    ParameterServer::Stub* stub;
    RETURN_IF_ERROR(Connected(address, options_.connect_timeout, &stub));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.import_timeout));
    return FromGrpcStatus(stub->MigrateImport(&ctx, req, resp));
  }

  absl::Status Checkpoint(const std::string& address, const PodCheckpointRequest& req,
                          PodCheckpointResponse* resp) override {
    ParameterServer::Stub* stub;
    RETURN_IF_ERROR(Connected(address, options_.connect_timeout, &stub));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.import_timeout));
    return FromGrpcStatus(stub->Checkpoint(&ctx, req, resp));
  }

 private:
  // The stub of `address` once its channel is connected (a pod that just restarted is
  // reached as soon as it listens, not after the channel's reconnect backoff); UNAVAILABLE
  // if it does not connect within `timeout`.
  absl::Status Connected(const std::string& address, absl::Duration timeout,
                         ParameterServer::Stub** stub) {
    std::shared_ptr<grpc::Channel> channel;
    {
      absl::MutexLock lock(&mu_);
      Entry& e = pods_[address];
      if (e.stub == nullptr) {
        grpc::ChannelArguments args;
        args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
        args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
        args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
        e.channel = options_.channels.Make(address, args);
        e.stub = ParameterServer::NewStub(e.channel);
      }
      channel = e.channel;
      *stub = e.stub.get();
    }
    if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout))) {
      return absl::UnavailableError(absl::StrCat("pod at ", address, " is not reachable (",
                                                 absl::FormatDuration(timeout), ")"));
    }
    return absl::OkStatus();
  }

  struct Entry {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<ParameterServer::Stub> stub;
  };

  const GrpcPodControlOptions options_;
  absl::Mutex mu_;
  std::map<std::string, Entry> pods_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<PodControl> NewGrpcPodControl(const GrpcPodControlOptions& options) {
  return std::make_shared<GrpcPodControl>(options);
}

}  // namespace ps
