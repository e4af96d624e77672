#include "master/pod_control.h"

#include <grpcpp/grpcpp.h>

#include <map>

#include "absl/synchronization/mutex.h"
#include "proto/ps.grpc.pb.h"
#include "ps/ps_service.h"

namespace ps {
namespace {

class GrpcPodControl final : public PodControl {
 public:
  explicit GrpcPodControl(const GrpcPodControlOptions& options) : options_(options) {}

  absl::Status ApplyAssignment(const std::string& address, const Assignment& req) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.assign_timeout));
    ApplyAssignmentResponse resp;
    return FromGrpcStatus(StubFor(address)->ApplyAssignment(&ctx, req, &resp));
  }

  absl::Status MigrateBegin(const std::string& address, const MigrateBeginRequest& req,
                            MigrateBeginResponse* resp) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.begin_timeout));
    return FromGrpcStatus(StubFor(address)->MigrateBegin(&ctx, req, resp));
  }

  absl::Status MigrateImport(const std::string& address, const MigrateImportRequest& req,
                             MigrateImportResponse* resp) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.import_timeout));
    return FromGrpcStatus(StubFor(address)->MigrateImport(&ctx, req, resp));
  }

  absl::Status Checkpoint(const std::string& address, const PodCheckpointRequest& req,
                          PodCheckpointResponse* resp) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.import_timeout));
    return FromGrpcStatus(StubFor(address)->Checkpoint(&ctx, req, resp));
  }

 private:
  ParameterServer::Stub* StubFor(const std::string& address) {
    absl::MutexLock lock(&mu_);
    auto& stub = stubs_[address];
    if (stub == nullptr) {
      stub = ParameterServer::NewStub(
          grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    }
    return stub.get();
  }

  const GrpcPodControlOptions options_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<ParameterServer::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<PodControl> NewGrpcPodControl(const GrpcPodControlOptions& options) {
  return std::make_shared<GrpcPodControl>(options);
}

}  // namespace ps
