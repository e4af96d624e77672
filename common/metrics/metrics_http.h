// A small HTTP/1.1 server for Prometheus scrapes and health checks: GET /metrics and
// GET /healthz, nothing else. Plain sockets and poll() on one thread of its own, so a
// scrape never runs on (or waits for) a request thread of the data path. Keep-alive is
// supported (Prometheus reuses its connection).
//
// Bounded, so that slow or idle clients cannot lock out the probes: requests of at most
// max_request_bytes; a request must arrive whole within request_timeout of its first byte
// and its answer be taken within response_timeout (however slowly the bytes trickle); a
// connection waiting for a request is closed after idle_timeout; and of at most
// max_connections at once, a new connection closes the one that has waited longest for a
// request of its own (idle first, then the oldest unfinished request), so /healthz gets in.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ps {

struct MetricsHttpOptions {
  std::string host = "0.0.0.0";
  int port = 0;  // 0: the kernel picks a free port (see MetricsHttpServer::port)
  // A scraper or two and a probe or an operator's curl; more means something is wrong.
  int max_connections = 16;
  // Request line and headers; a scrape's are a few hundred bytes.
  size_t max_request_bytes = 8192;
  // From a request's first byte to its last (a scrape sends its few hundred bytes at once;
  // a client that trickles them is closed).
  absl::Duration request_timeout = absl::Seconds(5);
  // For the client to take a whole answer (a scrape's is at most a few MB).
  absl::Duration response_timeout = absl::Seconds(30);
  // A connection that has not begun a request for this long is closed (Prometheus scrapes
  // every 15-60 s and reconnects when needed).
  absl::Duration idle_timeout = absl::Seconds(120);
};

struct MetricsHttpHandlers {
  // The /metrics body (Prometheus text format). Called on the server's thread.
  std::function<std::string()> metrics;
  // /healthz answers 200 "ok" when this returns true (or is unset), else 503.
  std::function<bool()> healthy;
};

class MetricsHttpServer {
 public:
  // Binds and starts the thread, or UNAVAILABLE naming the address when it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const MetricsHttpOptions& options,
                                                                  MetricsHttpHandlers handlers);
  // Stops the thread and closes every connection.
  virtual ~MetricsHttpServer() = default;

  virtual int port() const = 0;
};

}  // namespace ps
