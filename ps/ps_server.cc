#include "ps/ps_server.h"

#include <glog/logging.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>

#include "absl/strings/str_cat.h"
#include "ps/ps_service.h"
#include "ps/transfer_service.h"
#include "ps/work_pool.h"

namespace ps {
namespace {

class PsServerImpl final : public PsServer {
 public:
  PsServerImpl(const PsServerOptions& options, std::unique_ptr<PsCore> core)
      : core_(std::move(core)),
        pool_(WorkPoolOptions{options.threads, 1024}),
        service_(core_.get(), &pool_, options.inline_request_bytes),
        transfer_(core_.get(), &pool_) {}

  absl::Status Start(const PsServerOptions& options) {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat(options.host, ":", options.port),
                             grpc::InsecureServerCredentials(), &port_);
    builder.SetMaxReceiveMessageSize(options.max_message_bytes);
    builder.SetMaxSendMessageSize(options.max_message_bytes);
    grpc::ResourceQuota quota("ps-server");
    quota.Resize(static_cast<size_t>(options.memory_quota_bytes));
    builder.SetResourceQuota(quota);
    builder.RegisterService(&service_);
    builder.RegisterService(&transfer_);  // export / import (issue 3)
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port_ == 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", options.host, ":", options.port));
    }
    return absl::OkStatus();
  }

  int port() const override { return port_; }
  PsCore& core() override { return *core_; }

  void Shutdown(int grace_ms) override {
    server_->GetHealthCheckService()->SetServingStatus(false);
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(grace_ms));
  }

  void Wait() override { server_->Wait(); }

  ~PsServerImpl() override {
    Shutdown(0);
    server_->Wait();
  }

 private:
  std::unique_ptr<PsCore> core_;  // destroyed last: the storage flushes on destruction
  WorkPool pool_;
  PsService service_;
  PodTransferService transfer_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Start(const PsServerOptions& options,
                                                          ShardOwnership ownership) {
  // Recovery (with a data dir) completes before the port opens: a pod that answers
  // serves its recovered state.
  auto core = PsCore::Open(options.core, std::move(ownership));
  if (!core.ok()) return core.status();
  auto server = std::make_unique<PsServerImpl>(options, *std::move(core));
  if (auto s = server->Start(options); !s.ok()) return s;
  return std::unique_ptr<PsServer>(std::move(server));
}

}  // namespace ps
