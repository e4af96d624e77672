#include "master/master_server.h"

#include <glog/logging.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/base/work_pool.h"
#include "common/rpc/rpc_metrics.h"
#include "master/master_metrics.h"
#include "master/master_service.h"

namespace ps {
namespace {

class MasterServerImpl final : public MasterServer {
 public:
  MasterServerImpl(const MasterServerOptions& options, std::unique_ptr<MasterCore> core)
      : core_(std::move(core)),
        pool_(WorkPoolOptions{options.threads, 4096}),
        auth_(options.security),
        service_(core_.get(), &pool_, &auth_) {
    auth_.LogConfiguration("ps-master",
                           "admin calls (Drain, Rebalance, Checkpoint) and the pods' "
                           "registration (RegisterPod, PodHeartbeat, LeavePod)");
  }

  absl::Status Start(const MasterServerOptions& options) {
    auto credentials = MakeServerCredentials(options.security);
    if (!credentials.ok()) return credentials.status();
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat(options.host, ":", options.port), *credentials, &port_);
    builder.RegisterService(&service_);
    if (options.metrics_enabled) {
      rpc_metrics_ =
          std::make_unique<RpcMetrics>(&registry_, std::vector<std::string>{"ps.Master"});
      AddMasterMetrics(core_.get(), &registry_);
      std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> icpt;
      icpt.push_back(rpc_metrics_->InterceptorFactory());
      builder.experimental().SetInterceptorCreators(std::move(icpt));
    }
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port_ == 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", options.host, ":", options.port));
    }
    if (options.metrics_enabled) {
      MetricsHttpHandlers handlers;
      handlers.metrics = [this] { return registry_.Render(); };
      auto http = MetricsHttpServer::Start(options.metrics, std::move(handlers));
      if (!http.ok()) return http.status();
      http_ = *std::move(http);
    }
    // Leases are checked a few times per lease so that expiry is noticed promptly.
    const absl::Duration period = std::max(absl::Milliseconds(10), core_->options().lease / 8);
    lease_thread_ = std::thread([this, period] {
      while (!stop_.WaitForNotificationWithTimeout(period)) {
        if (absl::Status s = core_->ExpireLeases(); !s.ok()) {
          LOG(ERROR) << "lease expiry failed (will retry): " << s;
        }
      }
    });
    return absl::OkStatus();
  }

  int port() const override { return port_; }
  MasterCore& core() override { return *core_; }
  int metrics_port() const override { return http_ == nullptr ? 0 : http_->port(); }

  void Shutdown(int grace_ms) override {
    if (!stop_.HasBeenNotified()) stop_.Notify();
    server_->GetHealthCheckService()->SetServingStatus(false);
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(grace_ms));
  }

  void Wait() override { server_->Wait(); }

  ~MasterServerImpl() override {
    http_.reset();  // first: its scrapes read the core
    if (server_ != nullptr) {
      Shutdown(0);
      server_->Wait();
    }
    if (lease_thread_.joinable()) lease_thread_.join();
  }

 private:
  std::unique_ptr<MasterCore> core_;
  WorkPool pool_;
  const Authorizer auth_;
  MasterService service_;
  MetricsRegistry registry_;
  std::unique_ptr<RpcMetrics> rpc_metrics_;  // outlives server_ (its interceptors)
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MetricsHttpServer> http_;
  int port_ = 0;
  absl::Notification stop_;
  std::thread lease_thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MasterServer>> MasterServer::Start(
    const MasterServerOptions& options) {
  auto core = MasterCore::Open(options.core);
  if (!core.ok()) return core.status();
  auto server = std::make_unique<MasterServerImpl>(options, *std::move(core));
  if (auto s = server->Start(options); !s.ok()) return s;
  return std::unique_ptr<MasterServer>(std::move(server));
}

}  // namespace ps
