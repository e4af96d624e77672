// A running PS pod: the gRPC server with the PS service, health and reflection.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics/metrics_http.h"
#include "common/rpc/transport_security.h"
#include "ps/ps_core.h"

namespace ps {

struct PsServerOptions {
  std::string host = "0.0.0.0";
  int port = 0;  // 0: the kernel picks a free port (see PsServer::port)
  // Request-work threads. Pulls and pushes are memory-bound; one per core saturates it.
  int threads = 2;
  // Largest request or response. 256 MB holds a 1M-row batch of dim 64.
  int max_message_bytes = 256 << 20;
  // Memory gRPC may use for buffers of requests and responses in flight; beyond it the
  // pod stops reading from connections until calls finish (backpressure, not failure).
  // 2 GiB holds eight maximal messages, or thousands of ordinary 256 KB batches.
  int64_t memory_quota_bytes = int64_t{2} << 30;
  // Pulls and pushes with a request of at most this many bytes run on gRPC's thread, not
  // the pool, saving a thread hand-off (~6 context switches per call on a VM). A pod in
  // memory only never waits in a pull or push, so by default (-1) it runs every call
  // inline (+10-25% pull rows/s); a durable pod may wait (log space, rows read from disk,
  // eviction), so by default it runs only calls of at most kDurableInlineBytes inline,
  // keeping gRPC's few threads free for I/O. 0: everything goes to the pool.
  int64_t inline_request_bytes = -1;
  static constexpr int64_t kDurableInlineBytes = 1024;
  PsCoreOptions core;
  // TLS and the credentials of the calls this pod serves: security.auth_token (workers)
  // and security.admin_token / admin_identities (the master and operators), checked
  // against the role table (common/rpc/auth_policy.h; health stays open). Default: none,
  // every call allowed (a warning at start says so).
  ServerSecurity security;
  // TLS and token of this pod's own calls to other pods (a move's destination pulls the
  // rows from its source with MigrateExport, an admin call). Default: plain text, no token.
  ChannelSecurity peer_security;
  // The directories Checkpoint and PodTransfer.Export may write under (ps/path_root.h).
  // Empty: such calls are refused with FAILED_PRECONDITION.
  std::string checkpoint_root;
  std::string export_root;
  // Prometheus metrics over HTTP (GET /metrics, /healthz) on metrics.port; off by default.
  bool metrics_enabled = false;
  MetricsHttpOptions metrics;
  // Readiness at start. A pod under a master starts not ready and is made ready once
  // registered (SetReady).
  bool start_ready = true;
};

// The gRPC health service name whose status is the pod's readiness (grpc.health.v1 with
// this service): SERVING once the pod serves its vshards (see PsServer::SetReady). The
// empty service name is SERVING from start to shutdown (liveness).
inline constexpr char kReadinessService[] = "ps.ParameterServer";

class PsServer {
 public:
  // Binds and starts serving, or returns the error (e.g. UNAVAILABLE: port in use).
  static absl::StatusOr<std::unique_ptr<PsServer>> Start(const PsServerOptions& options,
                                                         ShardOwnership ownership);
  virtual ~PsServer() = default;

  virtual int port() const = 0;
  virtual PsCore& core() = 0;
  // The metrics HTTP port, 0 when metrics are off.
  virtual int metrics_port() const = 0;
  // Readiness (health service kReadinessService and /healthz); see start_ready. Recovery
  // is done before the port opens. Thread-safe.
  virtual void SetReady(bool ready) = 0;
  // Stops accepting, waits up to `grace_ms` for calls in flight, then cancels the rest.
  virtual void Shutdown(int grace_ms) = 0;
  // Blocks until Shutdown.
  virtual void Wait() = 0;
};

}  // namespace ps
