#include "common/rpc/rpc_metrics.h"

#include <google/protobuf/descriptor.h>
#include <grpcpp/support/status.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <string>

#include "absl/status/status.h"

namespace ps {

struct RpcMetrics::Method {
  std::string path;  // "/ps.ParameterServer/Pull"
  std::string service, name;
  std::array<Counter, 17> by_code;  // grpc::StatusCode 0..16
  Histogram latency{DefaultLatencyBuckets()};
};

namespace {

// The canonical name of a gRPC status code (the same codes as absl's).
std::string CodeName(int code) {
  std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  return name.empty() ? "UNKNOWN" : name;
}

// One per call: notes the start, and at PRE_SEND_STATUS the code and the latency.
class CallInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit CallInterceptor(RpcMetrics::Method* method)
      : method_(method), start_(std::chrono::steady_clock::now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const int code = methods->GetSendStatus().error_code();
      method_->by_code[code >= 0 && code < 17 ? code : 2].Add();
      method_->latency.Observe(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    }
    methods->Proceed();
  }

 private:
  RpcMetrics::Method* const method_;
  const std::chrono::steady_clock::time_point start_;
};

}  // namespace

class RpcMetrics::Factory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit Factory(const std::vector<std::unique_ptr<Method>>* methods) : methods_(methods) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    const char* path = info->method();
    if (path == nullptr) return nullptr;
    auto it = std::lower_bound(
        methods_->begin(), methods_->end(), path,
        [](const std::unique_ptr<Method>& m, const char* p) { return m->path < p; });
    if (it == methods_->end() || (*it)->path != path) return nullptr;
    return new CallInterceptor(it->get());  // owned by gRPC's call (its API)
  }

 private:
  const std::vector<std::unique_ptr<Method>>* const methods_;
};

RpcMetrics::RpcMetrics(MetricsRegistry* registry, const std::vector<std::string>& services) {
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  for (const std::string& s : services) {
    const google::protobuf::ServiceDescriptor* d = pool->FindServiceByName(s);
    if (d == nullptr) continue;
    for (int i = 0; i < d->method_count(); ++i) {
      auto m = std::make_unique<Method>();
      m->service = s;
      m->name = d->method(i)->name();
      m->path = "/" + s + "/" + m->name;
      methods_.push_back(std::move(m));
    }
  }
  std::sort(methods_.begin(), methods_.end(),
            [](const auto& a, const auto& b) { return a->path < b->path; });
  const auto* methods = &methods_;
  registry->AddCollector([methods](MetricsWriter* w) {
    w->Family("grpc_server_handled_total", "RPCs completed, by method and status code.",
              MetricType::kCounter);
    for (const auto& m : *methods) {
      for (int code = 0; code < 17; ++code) {
        const uint64_t n = m->by_code[code].value();
        // OK is always exported (so rates start at 0); other codes once they happen.
        if (n == 0 && code != 0) continue;
        w->Sample(
            {{"grpc_service", m->service}, {"grpc_method", m->name}, {"grpc_code", CodeName(code)}},
            static_cast<double>(n));
      }
    }
    w->Family("grpc_server_handling_seconds",
              "Time from a call's arrival to its status being sent, by method.",
              MetricType::kHistogram);
    for (const auto& m : *methods) {
      w->Histogram({{"grpc_service", m->service}, {"grpc_method", m->name}}, m->latency.Snapshot());
    }
  });
}

RpcMetrics::~RpcMetrics() = default;

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
RpcMetrics::InterceptorFactory() {
  return std::make_unique<Factory>(&methods_);
}

}  // namespace ps
