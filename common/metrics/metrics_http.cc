#include "common/metrics/metrics_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/metrics/http_request.h"

namespace ps {
namespace {

struct Connection {
  // What the connection is doing, and so which timeout applies (MetricsHttpOptions).
  enum class Phase {
    kIdle,       // waiting for a request to begin: idle_timeout
    kReceiving,  // part of a request is in: request_timeout from its first byte
    kWriting,    // an answer is going out: response_timeout
  };
  int fd = -1;
  std::string in;
  std::string out;
  size_t written = 0;
  bool close_after_write = false;
  Phase phase = Phase::kIdle;
  absl::Time since;     // when the phase began
  absl::Time deadline;  // when the phase must be over, else the connection is closed
};

class MetricsHttpServerImpl final : public MetricsHttpServer {
 public:
  MetricsHttpServerImpl(const MetricsHttpOptions& options, MetricsHttpHandlers handlers)
      : options_(options), handlers_(std::move(handlers)) {}

  absl::Status Listen() {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    const std::string port = absl::StrCat(options_.port);
    const char* host = options_.host.empty() ? nullptr : options_.host.c_str();
    if (int rc = getaddrinfo(host, port.c_str(), &hints, &res); rc != 0) {
      return absl::InvalidArgumentError(absl::StrCat("metrics address ", options_.host, ":",
                                                     options_.port, ": ", gai_strerror(rc)));
    }
    std::string error = "no address";
    for (addrinfo* a = res; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
      int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0) {
        listen_fd_ = fd;
      } else {
        error = std::strerror(errno);
        close(fd);
      }
    }
    freeaddrinfo(res);
    if (listen_fd_ < 0) {
      return absl::UnavailableError(absl::StrCat("cannot listen for metrics on ", options_.host,
                                                 ":", options_.port, ": ", error));
    }
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return absl::InternalError("eventfd failed");
    thread_ = std::thread([this] { Loop(); });
    return absl::OkStatus();
  }

  ~MetricsHttpServerImpl() override {
    if (thread_.joinable()) {
      uint64_t one = 1;
      (void)!write(wake_fd_, &one, sizeof(one));
      thread_.join();
    }
    for (Connection& c : conns_) close(c.fd);
    if (listen_fd_ >= 0) close(listen_fd_);
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  int port() const override { return port_; }

 private:
  // Starts `phase` on `c` at `now`, with that phase's deadline.
  void Enter(Connection* c, Connection::Phase phase, absl::Time now) const {
    c->phase = phase;
    c->since = now;
    switch (phase) {
      case Connection::Phase::kIdle:
        c->deadline = now + options_.idle_timeout;
        break;
      case Connection::Phase::kReceiving:
        c->deadline = now + options_.request_timeout;
        break;
      case Connection::Phase::kWriting:
        c->deadline = now + options_.response_timeout;
        break;
    }
  }

  void Loop() {
    std::vector<pollfd> fds;
    for (;;) {
      fds.clear();
      fds.push_back({wake_fd_, POLLIN, 0});
      fds.push_back({listen_fd_, POLLIN, 0});
      absl::Time next = absl::Now() + absl::Seconds(1);
      for (const Connection& c : conns_) {
        fds.push_back({c.fd, static_cast<short>(c.out.size() > c.written ? POLLOUT : POLLIN), 0});
        next = std::min(next, c.deadline);
      }
      // Wake up for the nearest deadline (at least every second).
      const int timeout_ms = static_cast<int>(
          std::clamp<int64_t>(absl::ToInt64Milliseconds(next - absl::Now()) + 1, 0, 1000));
      if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) return;
      if (fds[0].revents != 0) return;  // woken to stop
      const absl::Time now = absl::Now();
      for (size_t i = 0; i < conns_.size(); ++i) {
        const short ev = fds[i + 2].revents;
        if (ev & (POLLERR | POLLHUP | POLLNVAL)) {
          conns_[i].close_after_write = true;
          conns_[i].out.clear();
        } else if (ev & POLLOUT) {
          Write(&conns_[i], now);
        } else if (ev & POLLIN) {
          Read(&conns_[i], now);
        }
      }
      // Close finished and failed connections, and those past their phase's deadline.
      for (size_t i = conns_.size(); i-- > 0;) {
        Connection& c = conns_[i];
        const bool done = c.close_after_write && c.written >= c.out.size();
        if (done || now >= c.deadline) Close(i);
      }
      if (fds[1].revents & POLLIN) Accept(now);
    }
  }

  void Close(size_t i) {
    close(conns_[i].fd);
    conns_.erase(conns_.begin() + i);
  }

  // When every slot is taken: the connection a new one replaces. The one idle the
  // longest, else the one whose request began first (a slow sender); never one whose
  // answer is going out. -1 if there is none.
  int Victim() const {
    int victim = -1;
    for (size_t i = 0; i < conns_.size(); ++i) {
      const Connection& c = conns_[i];
      if (c.phase == Connection::Phase::kWriting) continue;
      if (victim < 0) {
        victim = static_cast<int>(i);
        continue;
      }
      const Connection& v = conns_[victim];
      const bool idle = c.phase == Connection::Phase::kIdle;
      const bool victim_idle = v.phase == Connection::Phase::kIdle;
      if ((idle && !victim_idle) || (idle == victim_idle && c.since < v.since)) {
        victim = static_cast<int>(i);
      }
    }
    return victim;
  }

  void Accept(absl::Time now) {
    for (;;) {
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      if (static_cast<int>(conns_.size()) >= options_.max_connections) {
        const int victim = Victim();
        if (victim < 0) {
          close(fd);  // every slot is sending an answer: the client sees the connection closed
          continue;
        }
        Close(victim);
      }
      Connection c;
      c.fd = fd;
      Enter(&c, Connection::Phase::kIdle, now);
      conns_.push_back(std::move(c));
    }
  }

  void Read(Connection* c, absl::Time now) {
    char buf[4096];
    ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        c->close_after_write = true;
        c->out.clear();
        c->written = 0;
      }
      return;
    }
    if (c->phase == Connection::Phase::kIdle) Enter(c, Connection::Phase::kReceiving, now);
    c->in.append(buf, n);
    const size_t end = c->in.find("\r\n\r\n");
    if (end == std::string::npos) {
      if (c->in.size() > options_.max_request_bytes) {
        Respond(c, 431, "Request Header Fields Too Large", "text/plain", "request too large\n",
                /*close=*/true);
        Enter(c, Connection::Phase::kWriting, now);
        Write(c, now);
      }
      return;
    }
    const std::string head = c->in.substr(0, end);
    c->in.erase(0, end + 4);  // requests carry no body: GET only
    Handle(c, head);
    Enter(c, Connection::Phase::kWriting, now);
    Write(c, now);
  }

  void Handle(Connection* c, const std::string& head) {
    const HttpRequest req = ParseHttpRequest(head);
    if (req.error == 400) {
      Respond(c, 400, "Bad Request", "text/plain", "bad request\n", req.close);
      return;
    }
    if (req.error == 405) {
      Respond(c, 405, "Method Not Allowed", "text/plain", "GET only\n", req.close);
      return;
    }
    if (req.path == "/metrics") {
      std::string body = handlers_.metrics ? handlers_.metrics() : std::string();
      Respond(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", body, req.close,
              req.head_only);
    } else if (req.path == "/healthz") {
      const bool ok = !handlers_.healthy || handlers_.healthy();
      Respond(c, ok ? 200 : 503, ok ? "OK" : "Service Unavailable", "text/plain",
              ok ? "ok\n" : "not ready\n", req.close, req.head_only);
    } else {
      Respond(c, 404, "Not Found", "text/plain", "try /metrics or /healthz\n", req.close,
              req.head_only);
    }
  }

  void Respond(Connection* c, int code, absl::string_view reason, absl::string_view type,
               absl::string_view body, bool close, bool head_only = false) {
    absl::StrAppend(&c->out, "HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", type,
                    "\r\nContent-Length: ", body.size(), close ? "\r\nConnection: close" : "",
                    "\r\n\r\n");
    if (!head_only) c->out.append(body.data(), body.size());
    c->close_after_write = c->close_after_write || close;
    if (close) c->in.clear();
  }

  void Write(Connection* c, absl::Time now) {
    while (c->written < c->out.size()) {
      ssize_t n = send(c->fd, c->out.data() + c->written, c->out.size() - c->written, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        c->close_after_write = true;
        c->out.clear();
        c->written = 0;
        return;
      }
      c->written += n;
    }
    c->out.clear();
    c->written = 0;
    if (c->close_after_write) return;
    // A pipelined request already buffered: answer it now.
    if (c->in.find("\r\n\r\n") != std::string::npos) {
      const size_t end = c->in.find("\r\n\r\n");
      const std::string head = c->in.substr(0, end);
      c->in.erase(0, end + 4);
      Handle(c, head);
      Enter(c, Connection::Phase::kWriting, now);
      Write(c, now);
      return;
    }
    // The next request: begun already (part of it is in) or awaited.
    Enter(c, c->in.empty() ? Connection::Phase::kIdle : Connection::Phase::kReceiving, now);
  }

  const MetricsHttpOptions options_;
  const MetricsHttpHandlers handlers_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  int port_ = 0;
  std::vector<Connection> conns_;  // used by the thread only
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const MetricsHttpOptions& options, MetricsHttpHandlers handlers) {
  auto server = std::make_unique<MetricsHttpServerImpl>(options, std::move(handlers));
  if (absl::Status s = server->Listen(); !s.ok()) return s;
  return std::unique_ptr<MetricsHttpServer>(std::move(server));
}

}  // namespace ps
