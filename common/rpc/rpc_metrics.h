// Per-RPC request counts (by status code) and latency histograms of a gRPC server, taken
// by a server interceptor, so every method of the registered services is counted without
// code in the handlers. Exported with the names go-grpc-prometheus made common:
//   grpc_server_handled_total{grpc_service, grpc_method, grpc_code}
//   grpc_server_handling_seconds{grpc_service, grpc_method}  (histogram)
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <string>
#include <vector>

#include "common/metrics/metrics.h"

namespace ps {

class RpcMetrics {
 public:
  // Counts the methods of `services` (full names, e.g. "ps.ParameterServer"; looked up in
  // the generated descriptor pool) into `registry`, which must outlive this object. Calls
  // of other methods (reflection) are not counted.
  RpcMetrics(MetricsRegistry* registry, const std::vector<std::string>& services);
  ~RpcMetrics();

  // The interceptor factory to give grpc::ServerBuilder::experimental().
  // SetInterceptorCreators. It refers to this object, which must outlive the server.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> InterceptorFactory();

  struct Method;

 private:
  class Factory;
  std::vector<std::unique_ptr<Method>> methods_;  // sorted by path, fixed after construction
};

}  // namespace ps
