// A running master: the gRPC server with the Master service and grpc.health.v1, and a
// thread that expires leases.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics/metrics_http.h"
#include "common/rpc/transport_security.h"
#include "master/master_core.h"

namespace ps {

struct MasterServerOptions {
  std::string host = "0.0.0.0";
  int port = 0;  // 0: the kernel picks a free port (see MasterServer::port)
  // RPC threads. Master calls are small; each state change waits for an fsync, so a few
  // threads let independent callers overlap their waits.
  int threads = 4;
  MasterOptions core;
  // TLS and the credentials of the calls the master serves: security.auth_token (workers)
  // and security.admin_token / admin_identities (pods and operators), checked against the
  // role table (common/rpc/auth_policy.h; health stays open). Default: every call allowed.
  ServerSecurity security;
  // Prometheus metrics over HTTP (GET /metrics, /healthz) on metrics.port; off by default.
  bool metrics_enabled = false;
  MetricsHttpOptions metrics;
};

class MasterServer {
 public:
  // Opens the state (MasterCore::Open), binds and starts serving, or returns the error.
  static absl::StatusOr<std::unique_ptr<MasterServer>> Start(const MasterServerOptions& options);
  virtual ~MasterServer() = default;

  virtual int port() const = 0;
  virtual MasterCore& core() = 0;
  // The metrics HTTP port, 0 when metrics are off.
  virtual int metrics_port() const = 0;
  // Stops accepting, waits up to `grace_ms` for calls in flight, then cancels the rest.
  virtual void Shutdown(int grace_ms) = 0;
  // Blocks until Shutdown.
  virtual void Wait() = 0;
};

}  // namespace ps
