#include "common/metrics/metrics.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/metrics/metrics_http.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(MetricsWriterTest, WritesHelpTypeAndEscapedLabels) {
  MetricsWriter w;
  w.Family("requests_total", "Requests\nwith a \\ in help.", MetricType::kCounter);
  w.Sample({{"method", "Pull"}, {"note", "a\"b\\c\nd"}}, 42);
  w.Sample({}, 1.5);
  EXPECT_EQ(w.text(),
            "# HELP requests_total Requests\\nwith a \\\\ in help.\n"
            "# TYPE requests_total counter\n"
            "requests_total{method=\"Pull\",note=\"a\\\"b\\\\c\\nd\"} 42\n"
            "requests_total 1.5\n");
}

TEST(MetricsWriterTest, DropsInvalidAndRepeatedFamilies) {
  MetricsWriter w;
  w.Family("1bad", "x", MetricType::kGauge);
  w.Sample({}, 1);
  w.Family("good", "x", MetricType::kGauge);
  w.Sample({}, 2);
  w.Family("good", "again", MetricType::kGauge);
  w.Sample({}, 3);
  EXPECT_EQ(w.text(), "# HELP good x\n# TYPE good gauge\ngood 2\n");
}

TEST(MetricsWriterTest, FormatsValues) {
  EXPECT_EQ(FormatMetricValue(0), "0");
  EXPECT_EQ(FormatMetricValue(18446744073709551615.0), "18446744073709551616");
  EXPECT_EQ(FormatMetricValue(1e300), "1e+300");
  EXPECT_EQ(FormatMetricValue(123456789012), "123456789012");
  EXPECT_EQ(FormatMetricValue(0.25), "0.25");
  EXPECT_EQ(FormatMetricValue(1.0 / 0.0), "+Inf");
  EXPECT_EQ(FormatMetricValue(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(FormatMetricValue(0.0 / 0.0), "NaN");
}

TEST(HistogramTest, CumulativeBucketsSumAndCount) {
  Histogram h({0.1, 1, 10});
  h.Observe(0.05);
  h.Observe(0.1);  // on a bound: counted in that bucket (le)
  h.Observe(5);
  h.Observe(100);
  HistogramSnapshot s = h.Snapshot();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{2, 2, 3}));
  EXPECT_EQ(s.count, 4u);
  EXPECT_NEAR(s.sum, 105.15, 1e-6);
  MetricsWriter w;
  w.Family("lat_seconds", "Latency.", MetricType::kHistogram);
  w.Histogram({{"m", "Pull"}}, s);
  EXPECT_EQ(w.text(),
            "# HELP lat_seconds Latency.\n# TYPE lat_seconds histogram\n"
            "lat_seconds_bucket{m=\"Pull\",le=\"0.1\"} 2\n"
            "lat_seconds_bucket{m=\"Pull\",le=\"1\"} 2\n"
            "lat_seconds_bucket{m=\"Pull\",le=\"10\"} 3\n"
            "lat_seconds_bucket{m=\"Pull\",le=\"+Inf\"} 4\n"
            "lat_seconds_sum{m=\"Pull\"} 105.15\n"
            "lat_seconds_count{m=\"Pull\"} 4\n");
}

TEST(MetricsRegistryTest, RendersOwnedFamiliesAndCollectors) {
  MetricsRegistry r;
  auto* family = r.AddCounter("calls_total", "Calls.", {"method"});
  family->WithLabels({"Push"})->Add(3);
  family->WithLabels({"Pull"})->Add();
  EXPECT_EQ(family->WithLabels({"Push"})->value(), 3u);
  r.AddCollector([](MetricsWriter* w) {
    w->Family("rows", "Rows.", MetricType::kGauge);
    w->Sample({{"table", "user"}}, 7);
  });
  EXPECT_EQ(r.Render(),
            "# HELP calls_total Calls.\n# TYPE calls_total counter\n"
            "calls_total{method=\"Pull\"} 1\ncalls_total{method=\"Push\"} 3\n"
            "# HELP rows Rows.\n# TYPE rows gauge\nrows{table=\"user\"} 7\n");
}

// A connected loopback socket, or -1.
int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// A blocking HTTP exchange over loopback: sends `request`, reads until the peer closes.
std::string Exchange(int port, const std::string& request) {
  const int fd = Connect(port);
  if (fd < 0) return "connect failed";
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, n);
  close(fd);
  return out;
}

TEST(MetricsHttpServerTest, ServesMetricsHealthAndErrors) {
  bool healthy = true;
  MetricsHttpHandlers handlers;
  handlers.metrics = [] { return std::string("up 1\n"); };
  handlers.healthy = [&healthy] { return healthy; };
  MetricsHttpOptions options;
  options.host = "127.0.0.1";
  auto server = MetricsHttpServer::Start(options, handlers);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);

  std::string r = Exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(r, HasSubstr("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(r, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(r, HasSubstr("Content-Length: 5\r\n"));
  EXPECT_THAT(r, HasSubstr("\r\n\r\nup 1\n"));

  // Keep-alive: two pipelined requests on one connection, the second closing it.
  r = Exchange(port,
               "GET /healthz HTTP/1.1\r\n\r\nGET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(r, HasSubstr("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n"
                           "\r\nok\n"));
  EXPECT_THAT(r, HasSubstr("up 1\n"));

  healthy = false;
  EXPECT_THAT(Exchange(port, "GET /healthz HTTP/1.0\r\n\r\n"), HasSubstr("503"));
  EXPECT_THAT(Exchange(port, "GET /nope HTTP/1.0\r\n\r\n"), HasSubstr("404"));
  EXPECT_THAT(Exchange(port, "POST /metrics HTTP/1.0\r\n\r\n"), HasSubstr("405"));
  EXPECT_THAT(Exchange(port, "garbage\r\n\r\n"), HasSubstr("400"));
  EXPECT_THAT(Exchange(port, std::string(10000, 'a')), HasSubstr("431"));
}

TEST(MetricsHttpServerTest, ClosesIdleConnectionsAndBoundsTheirNumber) {
  MetricsHttpOptions options;
  options.host = "127.0.0.1";
  options.max_connections = 2;
  options.idle_timeout = absl::Milliseconds(200);
  auto server = MetricsHttpServer::Start(options, MetricsHttpHandlers{});
  ASSERT_TRUE(server.ok()) << server.status();
  int fds[3];
  for (int& fd : fds) {
    fd = Connect((*server)->port());
    ASSERT_GE(fd, 0);
  }
  char c;
  // Over the bound, a new connection replaces an idle one; the rest are closed once idle.
  for (int fd : fds) EXPECT_EQ(recv(fd, &c, 1, 0), 0);
  for (int fd : fds) close(fd);
  // Still serving afterwards.
  EXPECT_THAT(Exchange((*server)->port(), "GET /healthz HTTP/1.0\r\n\r\n"), HasSubstr("200"));
}

// Clients that send a request a byte at a time, for as long as the server lets them.
class SlowWriters {
 public:
  SlowWriters(int port, int n) {
    for (int i = 0; i < n; ++i) {
      const int fd = Connect(port);
      if (fd >= 0) fds_.push_back(fd);
    }
    {
      absl::MutexLock lock(&mu_);
      closed_.assign(fds_.size(), false);
    }
    thread_ = std::thread([this] {
      for (int i = 0; !stop_.WaitForNotificationWithTimeout(absl::Milliseconds(100)); ++i) {
        absl::MutexLock lock(&mu_);
        for (size_t k = 0; k < fds_.size(); ++k) {
          if (closed_[k]) continue;
          const char* part = i == 0 ? "GET /metr" : "i";
          (void)send(fds_[k], part, std::strlen(part), MSG_NOSIGNAL | MSG_DONTWAIT);
          char c;
          const ssize_t r = recv(fds_[k], &c, 1, MSG_DONTWAIT);
          if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) closed_[k] = true;
        }
      }
    });
  }
  ~SlowWriters() {
    stop_.Notify();
    thread_.join();
    for (int fd : fds_) close(fd);
  }
  size_t connected() const { return fds_.size(); }
  // How many the server has closed so far.
  size_t closed() {
    absl::MutexLock lock(&mu_);
    size_t n = 0;
    for (size_t k = 0; k < fds_.size(); ++k) n += closed_[k];
    return n;
  }

 private:
  std::vector<int> fds_;
  absl::Mutex mu_;
  std::vector<bool> closed_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread thread_;
};

TEST(MetricsHttpServerTest, SlowClientsNeitherLockOutHealthzNorHoldTheirConnections) {
  MetricsHttpOptions options;
  options.host = "127.0.0.1";
  options.request_timeout = absl::Seconds(1);
  auto server = MetricsHttpServer::Start(options, MetricsHttpHandlers{});
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  // More slow clients than the server takes connections; each keeps sending a byte every
  // 100 ms, so an idle timer alone would never close them.
  SlowWriters slow(port, options.max_connections + 8);
  ASSERT_EQ(slow.connected(), size_t(options.max_connections + 8));

  // /healthz answers while they hold on (tries within a generous deadline, not a timing).
  bool answered = false;
  for (const absl::Time end = absl::Now() + absl::Seconds(60); !answered && absl::Now() < end;) {
    answered = absl::StrContains(Exchange(port, "GET /healthz HTTP/1.0\r\n\r\n"), "200 OK");
    if (!answered) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(answered) << "slow clients locked out /healthz";

  // And none of them keeps its connection: each is closed (by the request deadline, or
  // replaced by a newer connection), although it never stops sending.
  for (const absl::Time end = absl::Now() + absl::Seconds(60);
       slow.closed() < slow.connected() && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(slow.closed(), slow.connected());
  EXPECT_THAT(Exchange(port, "GET /healthz HTTP/1.0\r\n\r\n"), HasSubstr("200 OK"));
}

TEST(MetricsHttpServerTest, RefusesABusyPort) {
  MetricsHttpOptions options;
  options.host = "127.0.0.1";
  auto first = MetricsHttpServer::Start(options, MetricsHttpHandlers{});
  ASSERT_TRUE(first.ok());
  options.port = (*first)->port();
  auto second = MetricsHttpServer::Start(options, MetricsHttpHandlers{});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(absl::StrCat(options.port)));
}

}  // namespace
}  // namespace ps
