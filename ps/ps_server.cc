#include "ps/ps_server.h"

#include <glog/logging.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>

#include <atomic>
#include <limits>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "common/base/work_pool.h"
#include "common/rpc/rpc_metrics.h"
#include "ps/ps_metrics.h"
#include "ps/ps_service.h"
#include "ps/transfer_service.h"

namespace ps {
namespace {

// The effective PsServerOptions::inline_request_bytes: -1 picks by whether the pod is
// durable (see there).
size_t InlineRequestBytes(const PsServerOptions& options, PsCore& core) {
  if (options.inline_request_bytes >= 0) return static_cast<size_t>(options.inline_request_bytes);
  if (core.storage() == nullptr) return std::numeric_limits<size_t>::max();
  return static_cast<size_t>(PsServerOptions::kDurableInlineBytes);
}

PsServiceOptions ServiceOptions(const PsServerOptions& options, PsCore& core,
                                const Authorizer* auth, MigrateImportOptions migrate) {
  PsServiceOptions o;
  o.inline_request_bytes = InlineRequestBytes(options, core);
  o.auth = auth;
  o.migrate = std::move(migrate);
  o.checkpoint_root = PathRoot(options.checkpoint_root, "--checkpoint_root");
  return o;
}

PodTransferServiceOptions TransferOptions(const PsServerOptions& options, const Authorizer* auth) {
  PodTransferServiceOptions o;
  o.auth = auth;
  o.export_root = PathRoot(options.export_root, "--export_root");
  return o;
}

class PsServerImpl final : public PsServer {
 public:
  PsServerImpl(const PsServerOptions& options, std::unique_ptr<PsCore> core,
               MigrateImportOptions migrate)
      : core_(std::move(core)),
        pool_(WorkPoolOptions{options.threads, 1024}),
        auth_(options.security),
        service_(core_.get(), &pool_, ServiceOptions(options, *core_, &auth_, std::move(migrate))),
        transfer_(core_.get(), &pool_, TransferOptions(options, &auth_)),
        ready_(options.start_ready) {
    auth_.LogConfiguration("ps-server",
                           "pod-control calls (ApplyAssignment, MigrateBegin/Export/Import, "
                           "Checkpoint, Export, ImportRows)");
  }

  absl::Status Start(const PsServerOptions& options) {
    auto credentials = MakeServerCredentials(options.security);
    if (!credentials.ok()) return credentials.status();
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat(options.host, ":", options.port), *credentials, &port_);
    if (options.metrics_enabled) {
      rpc_metrics_ =
          std::make_unique<RpcMetrics>(&registry_, std::vector<std::string>{"ps.ParameterServer"});
      AddPsCoreMetrics(core_.get(), &registry_);
      registry_.AddCollector([this](MetricsWriter* w) {
        w->Family("ps_ready", "1 when the pod serves its vshards (readiness), else 0.",
                  MetricType::kGauge);
        w->Sample({}, ready_.load() ? 1 : 0);
      });
      std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> icpt;
      icpt.push_back(rpc_metrics_->InterceptorFactory());
      builder.experimental().SetInterceptorCreators(std::move(icpt));
    }
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
    server_->GetHealthCheckService()->SetServingStatus(kReadinessService, ready_.load());
    if (options.metrics_enabled) {
      MetricsHttpHandlers handlers;
      handlers.metrics = [this] { return registry_.Render(); };
      handlers.healthy = [this] { return ready_.load(); };
      auto http = MetricsHttpServer::Start(options.metrics, std::move(handlers));
      if (!http.ok()) return http.status();
      http_ = *std::move(http);
    }
    return absl::OkStatus();
  }

  int port() const override { return port_; }
  PsCore& core() override { return *core_; }
  int metrics_port() const override { return http_ == nullptr ? 0 : http_->port(); }

  void SetReady(bool ready) override {
    absl::MutexLock lock(&health_mu_);
    if (shut_down_) return;
    ready_ = ready;
    server_->GetHealthCheckService()->SetServingStatus(kReadinessService, ready);
  }

  void Shutdown(int grace_ms) override {
    {
      absl::MutexLock lock(&health_mu_);
      shut_down_ = true;
      ready_ = false;
    }
    server_->GetHealthCheckService()->SetServingStatus(false);
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(grace_ms));
  }

  void Wait() override { server_->Wait(); }

  ~PsServerImpl() override {
    http_.reset();  // first: its scrapes read the core
    if (server_ != nullptr) {
      Shutdown(0);
      server_->Wait();
    }
  }

 private:
  std::unique_ptr<PsCore> core_;  // destroyed last: the storage flushes on destruction
  WorkPool pool_;
  const Authorizer auth_;
  PsService service_;
  PodTransferService transfer_;
  MetricsRegistry registry_;
  std::unique_ptr<RpcMetrics> rpc_metrics_;  // outlives server_ (its interceptors)
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MetricsHttpServer> http_;
  int port_ = 0;
  std::atomic<bool> ready_;
  absl::Mutex health_mu_;
  bool shut_down_ ABSL_GUARDED_BY(health_mu_) = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Start(const PsServerOptions& options,
                                                          ShardOwnership ownership) {
  // Recovery (with a data dir) completes before the port opens: a pod that answers
  // serves its recovered state.
  MigrateImportOptions migrate;
  ASSIGN_OR_RETURN(migrate.channels, ChannelMaker::Create(options.peer_security));
  PsCoreOptions core_options = options.core;
  core_options.max_message_bytes = static_cast<size_t>(options.max_message_bytes);  // one limit
  if (core_options.replica_sender == nullptr) {
    // A batch of records is applied and logged by the follower before it answers.
    core_options.replica_sender = NewGrpcReplicaSender(migrate.channels, absl::Seconds(5));
  }
  auto core = PsCore::Open(core_options, std::move(ownership));
  if (!core.ok()) return core.status();
  auto server = std::make_unique<PsServerImpl>(options, *std::move(core), std::move(migrate));
  if (auto s = server->Start(options); !s.ok()) return s;
  return std::unique_ptr<PsServer>(std::move(server));
}

}  // namespace ps
