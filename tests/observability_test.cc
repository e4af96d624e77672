// Integration tests of observability and transport security with real processes on
// loopback: ps-master and a ps-server pod export Prometheus metrics whose series change
// with traffic; a SIGTERMed pod deregisters and exits 0; a cluster under mutual TLS and a
// shared token serves clients that have both and refuses those that do not; a cluster
// with a worker and an admin token refuses the worker token for pod control and the
// master's admin calls, takes the admin one, refuses absurd epochs and paths outside the
// pods' roots, and writes no file other users can read; and (when Debian's prometheus is
// installed) a real Prometheus scrapes the cluster.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/ps_client.h"
#include "common/rpc/test_certs.h"
#include "common/rpc/transport_security.h"
#include "gtest/gtest.h"
#include "proto/master.grpc.pb.h"
#include "proto/ps.grpc.pb.h"
#include "tests/cluster_test_fixture.h"
#include "tests/http_get.h"
#include "tests/process.h"

namespace ps {
namespace {

using integration::ChildProcess;
using integration::HttpGet;

constexpr absl::Duration kStartTimeout = absl::Seconds(20);

// The value of the sample whose text before the value is exactly `series`, or -1.
double Sample(const std::string& exposition, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (absl::StartsWith(line, series + " ")) {
      double v;
      if (absl::SimpleAtod(line.substr(series.size() + 1), &v)) return v;
    }
  }
  return -1;
}

class ObservabilityTest : public integration::ClusterProcessTest {
 protected:
  ObservabilityTest()
      : ClusterProcessTest("observability_test.", PS_MASTER_BINARY, PS_SERVER_BINARY) {}

  // Polls the pod's /healthz until it answers 200 (registered with the master).
  bool WaitReady(int metrics_port) {
    const absl::Time deadline = absl::Now() + kStartTimeout;
    while (absl::Now() < deadline) {
      if (HttpGet(metrics_port, "/healthz").ok()) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }

  // The fixture's ps-master with `flags`, serving metrics; returns {grpc port, metrics
  // port}, or zeros (and a failure).
  std::pair<int, int> StartMasterWithMetrics(const std::vector<std::string>& flags) {
    std::vector<std::string> all = MetricsFlags("master");
    all.insert(all.end(), flags.begin(), flags.end());
    const absl::Status started = StartMaster(all);
    EXPECT_TRUE(started.ok()) << started;
    if (!started.ok()) return {0, 0};
    auto metrics = MetricsPort("master");
    EXPECT_TRUE(metrics.ok()) << metrics.status();
    return {master_port_, metrics.value_or(0)};
  }

  // Pod `id` of the master at `master` with `flags`, once ready (registered); returns {grpc
  // port, metrics port}, or {0, 0} (and a failure) if it did not become ready.
  std::pair<int, int> StartReadyPod(const std::string& id, const std::string& master,
                                    const std::vector<std::string>& flags) {
    std::vector<std::string> argv = {PS_SERVER_BINARY, "--master=" + master, "--pod_id=" + id};
    argv.insert(argv.end(), flags.begin(), flags.end());
    const std::vector<std::string> metrics_flags = MetricsFlags(id);
    argv.insert(argv.end(), metrics_flags.begin(), metrics_flags.end());
    auto port = StartServer(id, argv);
    EXPECT_TRUE(port.ok()) << port.status();
    auto metrics = MetricsPort(id);
    EXPECT_TRUE(metrics.ok()) << metrics.status();
    if (port.ok() && metrics.ok() && WaitReady(*metrics)) return {*port, *metrics};
    ADD_FAILURE() << id << " never became ready";
    return {0, 0};
  }

  // A client with `options` creates table `table` (dim `dim`), pushes `grad` to every element
  // of `ids` and, if `pulled`, pulls them back into it.
  static void CreateAndPush(const ClientOptions& options, const std::string& table, int dim,
                            const std::vector<int64_t>& ids, float grad,
                            std::vector<float>* pulled = nullptr) {
    auto client = PsClient::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status();
    TableSpec spec;
    spec.set_name(table);
    spec.set_dim(dim);
    ASSERT_TRUE((*client)->CreateTable(spec).ok());
    std::vector<float> grads(ids.size() * dim, grad);
    ASSERT_TRUE((*client)->Push({{table, ids, grads.data()}}).ok());
    if (pulled == nullptr) return;
    pulled->resize(ids.size() * dim);
    ASSERT_TRUE((*client)->Pull({{table, ids, pulled->data()}}).ok());
  }

  // Runs `ps-admin --master=<master> <flags> <command>` (up to a minute); returns how it
  // ended and what it printed: "exited with code N: <output>".
  std::string Admin(const std::string& master, std::vector<std::string> flags,
                    const std::string& command) {
    std::vector<std::string> argv = {PS_ADMIN_BINARY, "--master=" + master};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back(command);
    auto c = ChildProcess::Start(argv, Path(absl::StrCat("admin", admin_runs_++, ".out")));
    if (!c.ok() || !(*c)->WaitExit(absl::Seconds(60))) return std::string("did not run");
    const std::string d = (*c)->Describe();
    return d.substr(d.find(' ', 4) + 1) + ": " + integration::FileTail((*c)->log_path());
  }

  std::string Scrape(int port) {
    auto body = HttpGet(port, "/metrics");
    EXPECT_TRUE(body.ok()) << body.status();
    return body.value_or("");
  }

  int admin_runs_ = 0;
};

TEST_F(ObservabilityTest, MetricsFollowTrafficAndAPodDeregistersOnSigterm) {
  auto [master_port, master_metrics] = StartMasterWithMetrics(
      {"--num_ps=1", "--num_vshards=64", "--lease_ms=2000", "--shutdown_grace_ms=200"});
  ASSERT_GT(master_metrics, 0);
  const std::string master = absl::StrCat("127.0.0.1:", master_port);
  auto [pod_port, pod_metrics] =
      StartReadyPod("ps-0", master,
                    {"--num_vshards=64", "--data_dir=" + Path("ps-0"), "--shutdown_grace_ms=500"});
  ASSERT_GT(pod_metrics, 0);

  std::string pod = Scrape(pod_metrics);
  EXPECT_TRUE(absl::StrContains(pod, "# TYPE ps_pushed_rows_total counter\n")) << pod;
  EXPECT_EQ(Sample(pod, "ps_ready"), 1);
  EXPECT_EQ(Sample(pod, "ps_owned_vshards"), 64);
  EXPECT_EQ(Sample(pod, "ps_pushed_rows_total"), 0);
  EXPECT_GE(Sample(pod, "ps_recovery_seconds"), 0);
  EXPECT_EQ(Sample(pod, "ps_log_pending_bytes"), 0);
  const std::string push_ok =
      "grpc_server_handled_total{grpc_service=\"ps.ParameterServer\",grpc_method=\"Push\","
      "grpc_code=\"OK\"}";
  EXPECT_EQ(Sample(pod, push_ok), 0);

  ClientOptions options;
  options.master = master;
  std::vector<float> rows;
  CreateAndPush(options, "user", 4, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 0.5f, &rows);
  if (HasFatalFailure()) return;

  pod = Scrape(pod_metrics);
  EXPECT_EQ(Sample(pod, "ps_pushed_rows_total"), 10);
  EXPECT_EQ(Sample(pod, "ps_pulled_rows_total"), 10);
  EXPECT_EQ(Sample(pod, "ps_table_rows{table=\"user\"}"), 10);
  EXPECT_GT(Sample(pod, "ps_table_memory_bytes{table=\"user\"}"), 0);
  EXPECT_GE(Sample(pod, push_ok), 1);
  EXPECT_GE(Sample(pod,
                   "grpc_server_handling_seconds_count{grpc_service=\"ps.ParameterServer\","
                   "grpc_method=\"Pull\"}"),
            1);
  // The log's counters are updated by its writer thread, right after the acknowledgement.
  for (int i = 0; i < 50 && Sample(pod, "ps_log_records_total") < 1; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    pod = Scrape(pod_metrics);
  }
  EXPECT_GE(Sample(pod, "ps_log_records_total"), 1);

  std::string m = Scrape(master_metrics);
  EXPECT_EQ(Sample(m, "ps_master_pods{state=\"live\"}"), 1) << m;
  EXPECT_EQ(Sample(m, "ps_master_pods{state=\"lost\"}"), 0);
  EXPECT_EQ(Sample(m, "ps_master_pod_vshards{pod=\"ps-0\"}"), 64);
  EXPECT_GE(Sample(m, "ps_master_shard_map_epoch"), 1);
  EXPECT_EQ(Sample(m, "ps_master_lease_losses_total{kind=\"pod\"}"), 0);
  EXPECT_GE(Sample(m,
                   "grpc_server_handled_total{grpc_service=\"ps.Master\","
                   "grpc_method=\"RegisterPod\",grpc_code=\"OK\"}"),
            1);
  EXPECT_GE(Sample(m,
                   "grpc_server_handled_total{grpc_service=\"ps.Master\","
                   "grpc_method=\"GetShardMap\",grpc_code=\"OK\"}"),
            1);

  // SIGTERM: the pod stops, deregisters (the master shows it LOST at once, not after
  // its lease) and exits 0.
  children_["ps-0"]->Signal(SIGTERM);
  ASSERT_TRUE(children_["ps-0"]->WaitExit(absl::Seconds(10)));
  EXPECT_EQ(children_["ps-0"]->Describe().substr(children_["ps-0"]->Describe().find(' ', 4) + 1),
            "exited with code 0");
  EXPECT_TRUE(absl::StrContains(integration::FileTail(Path("ps-0.log")), "deregistered"));
  EXPECT_TRUE(absl::StrContains(integration::FileTail(Path("master.log")), "pod ps-0 at"));
  m = Scrape(master_metrics);
  EXPECT_EQ(Sample(m, "ps_master_pods{state=\"lost\"}"), 1) << m;
  // A deregistration is not a lease loss.
  EXPECT_EQ(Sample(m, "ps_master_lease_losses_total{kind=\"pod\"}"), 0);
}

// Replication (R = 2, two pods, each following the other): the pods' stream and follower
// series and the master's replication series follow a push, and ps-admin shows each
// vshard's replicas (shards), the replication summary (status) and the tables' counters.
TEST_F(ObservabilityTest, ReplicationSeriesAndAdminViews) {
  // A long lag bound: a follower whose address reaches its primary a heartbeat late is not
  // what this test is about.
  auto [master_port, master_metrics] = StartMasterWithMetrics(
      {"--num_ps=2", "--num_vshards=16", "--replication=2", "--lease_ms=3000",
       "--replication_max_lag_ms=60000", "--shutdown_grace_ms=200"});
  ASSERT_GT(master_metrics, 0);
  const std::string master = absl::StrCat("127.0.0.1:", master_port);
  std::map<std::string, int> pod_metrics;
  for (const std::string id : {"ps-0", "ps-1"}) {
    pod_metrics[id] =
        StartReadyPod(id, master,
                      {"--num_vshards=16", "--data_dir=" + Path(id), "--shutdown_grace_ms=500"})
            .second;
    ASSERT_GT(pod_metrics[id], 0);
  }
  std::string m = Scrape(master_metrics);
  EXPECT_EQ(Sample(m, "ps_master_replication_factor"), 2) << m;
  EXPECT_EQ(Sample(m, "ps_master_under_replicated_vshards"), 0);
  EXPECT_EQ(Sample(m, "ps_master_failovers_total"), 0);
  EXPECT_EQ(Sample(m, "ps_master_ack_set_removals_total{cause=\"lag\"}"), 0);

  ClientOptions options;
  options.master = master;
  std::vector<int64_t> ids;
  for (int64_t i = 1; i <= 64; ++i) ids.push_back(i);  // on both pods
  CreateAndPush(options, "user", 4, ids, 0.5f);
  if (HasFatalFailure()) return;

  // Acknowledged: each pod's follower holds its part, nothing is waiting.
  double acked = 0, applied = 0;
  for (const auto& [id, port] : pod_metrics) {
    const std::string pod = Scrape(port);
    const std::string other = id == "ps-0" ? "ps-1" : "ps-0";
    EXPECT_EQ(Sample(pod, "ps_replication_factor"), 2) << pod;
    EXPECT_EQ(Sample(pod, "ps_replication_followers"), 1) << pod;
    EXPECT_GT(Sample(pod, "ps_replication_following_vshards"), 0) << pod;
    const std::string label = "{follower=\"" + other + "\"}";
    EXPECT_EQ(Sample(pod, "ps_replication_lag_records" + label), 0) << pod;
    EXPECT_GE(Sample(pod, "ps_replication_failed_calls_total" + label), 0) << pod;
    acked += Sample(pod, "ps_replication_acked_records_total" + label);
    applied += Sample(pod, "ps_replicated_records_applied_total");
    EXPECT_EQ(Sample(pod, "ps_write_lease_refusals_total"), 0);
  }
  EXPECT_GE(acked, 2);  // one record per pod's part of the push
  EXPECT_EQ(applied, acked);

  auto admin = [&](const std::string& command) { return Admin(master, {}, command); };
  const std::string shards = admin("shards");
  EXPECT_TRUE(absl::StrContains(shards, "REPLICAS (R=2")) << shards;
  EXPECT_TRUE(absl::StrContains(shards, "ps-0     ps-1")) << shards;
  EXPECT_TRUE(absl::StrContains(shards, "ps-1     ps-0")) << shards;
  const std::string status = admin("status");
  EXPECT_TRUE(absl::StrContains(status, "replication: R=2, ack all")) << status;
  EXPECT_TRUE(absl::StrContains(status, "0 vshards under-replicated")) << status;
  const std::string tables = admin("tables");
  EXPECT_TRUE(absl::StrContains(tables, "DROPPED GRADIENTS")) << tables;
  // 64 rows, each on its primary and its follower.
  EXPECT_TRUE(absl::StrContains(tables, "  128  ")) << tables;
  EXPECT_TRUE(absl::StrContains(tables, "sum over 2 pods (each row held by 2 of them)")) << tables;
}

TEST_F(ObservabilityTest, MutualTlsAndTokenAcrossTheCluster) {
  TestCerts certs;
  if (!certs.ok()) GTEST_SKIP() << "openssl is missing";
  std::ofstream(Path("token")) << "cluster-secret\n";
  std::ofstream(Path("wrong")) << "not-the-secret\n";
  // The token is the workers'; the admin role comes with a certificate: the servers'
  // (the master and pods calling each other) and ps-admin's (make-certs.sh's admin.crt).
  const std::vector<std::string> tls = {
      "--tls_cert=" + certs.file("server.crt"), "--tls_key=" + certs.file("server.key"),
      "--tls_ca=" + certs.file("ca.crt"), "--auth_token_file=" + Path("token"),
      "--admin_identities=ps-server,ps-admin"};
  std::vector<std::string> margv = {"--num_ps=1", "--num_vshards=64"};
  margv.insert(margv.end(), tls.begin(), tls.end());
  auto [master_port, master_metrics] = StartMasterWithMetrics(margv);
  ASSERT_GT(master_metrics, 0);
  // The certificate names 127.0.0.1 and localhost: the pod advertises 127.0.0.1:PORT.
  const std::string master = absl::StrCat("localhost:", master_port);
  std::vector<std::string> pargv = {"--num_vshards=64"};
  pargv.insert(pargv.end(), tls.begin(), tls.end());
  // Ready: it registered over mutual TLS.
  ASSERT_GT(StartReadyPod("ps-0", master, pargv).second, 0);

  std::vector<int64_t> many(64);
  for (int64_t i = 0; i < 64; ++i) many[i] = i;
  std::vector<float> before, after(many.size() * 2);
  ClientOptions options;
  options.master = master;
  options.connect_timeout_ms = 3000;
  options.max_attempts = 2;
  options.security.ca_file = certs.file("ca.crt");
  options.security.cert_file = certs.file("client.crt");
  options.security.key_file = certs.file("client.key");
  options.security.auth_token = "cluster-secret";
  CreateAndPush(options, "t", 2, many, 1.0f, &before);
  if (HasFatalFailure()) return;
  {
    ClientOptions wrong = options;
    wrong.security.auth_token = "not-the-secret";
    auto client = PsClient::Connect(wrong);
    EXPECT_EQ(client.status().code(), absl::StatusCode::kUnauthenticated) << client.status();
  }
  {
    ClientOptions no_cert = options;
    no_cert.security.cert_file.clear();
    no_cert.security.key_file.clear();
    auto client = PsClient::Connect(no_cert);
    EXPECT_FALSE(client.ok());
  }
  // ps-admin with the same credentials, then without the token.
  auto admin = [&](std::vector<std::string> extra, const std::string& command = "status",
                   const std::string& cert = "client") {
    extra.insert(extra.begin(),
                 {"--tls_ca=" + certs.file("ca.crt"), "--tls_cert=" + certs.file(cert + ".crt"),
                  "--tls_key=" + certs.file(cert + ".key")});
    return Admin(master, extra, command);
  };
  std::string ok = admin({"--auth_token_file=" + Path("token")});
  EXPECT_TRUE(absl::StartsWith(ok, "exited with code 0")) << ok;
  EXPECT_TRUE(absl::StrContains(ok, "ps-0")) << ok;
  std::string refused = admin({"--auth_token_file=" + Path("wrong")});
  EXPECT_TRUE(absl::StartsWith(refused, "exited with code 1")) << refused;
  EXPECT_TRUE(absl::StrContains(refused, "UNAUTHENTICATED")) << refused;

  // A second pod and a rebalance: the master's calls to the pods and the pods' copy between
  // them go over mutual TLS, admin by their certificate; the pushed rows move with their
  // vshards. A worker's certificate with the token may not rebalance; ps-admin's may.
  const int pod1_metrics = StartReadyPod("ps-1", master, pargv).second;
  ASSERT_GT(pod1_metrics, 0);
  std::string denied = admin({"--auth_token_file=" + Path("token")}, "rebalance");
  EXPECT_TRUE(absl::StartsWith(denied, "exited with code 1")) << denied;
  EXPECT_TRUE(absl::StrContains(denied, "PERMISSION_DENIED")) << denied;
  std::string moved = admin({}, "rebalance", "admin");
  EXPECT_TRUE(absl::StartsWith(moved, "exited with code 0")) << moved;
  EXPECT_EQ(Sample(Scrape(pod1_metrics), "ps_owned_vshards"), 32);
  auto client = PsClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Pull({{"t", many, after.data()}}).ok());
  EXPECT_EQ(before, after);  // half of them now served by ps-1
  EXPECT_GT(Sample(Scrape(pod1_metrics), "ps_table_rows{table=\"t\"}"), 0);
}

// Calls `method` of `stub` with a 30 s deadline.
template <typename Stub, typename Req, typename Resp>
grpc::Status Call(Stub& stub, grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*),
                  const Req& req, Resp* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return (stub.*method)(&ctx, req, resp);
}

// Every file and directory under `dir` whose mode lets other users in, with its mode.
std::vector<std::string> OpenToOthers(const std::string& dir) {
  std::vector<std::string> open;
  auto check = [&open](const std::string& path) {
    struct stat st;
    if (lstat(path.c_str(), &st) == 0 && !S_ISLNK(st.st_mode) && (st.st_mode & S_IRWXO)) {
      open.push_back(absl::StrFormat("%s (mode %o)", path, st.st_mode & 07777));
    }
  };
  check(dir);
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    check(it->path().string());
  }
  return open;
}

TEST_F(ObservabilityTest, WorkersCannotControlPodsAndTheAdminCanWithinLimits) {
  // Children inherit the usual umask: what protects the files must be the servers' own.
  umask(022);
  std::ofstream(Path("worker.token")) << "worker-secret\n";
  std::ofstream(Path("admin.token")) << "admin-secret\n";
  const std::vector<std::string> tokens = {"--auth_token_file=" + Path("worker.token"),
                                           "--admin_token_file=" + Path("admin.token")};
  std::vector<std::string> margv = {"--num_ps=1", "--num_vshards=64", "--shutdown_grace_ms=200",
                                    "--checkpoint_dir=" + Path("ckpts")};
  margv.insert(margv.end(), tokens.begin(), tokens.end());
  auto [master_port, master_metrics] = StartMasterWithMetrics(margv);
  ASSERT_GT(master_port, 0);
  const std::string master = absl::StrCat("127.0.0.1:", master_port);
  std::map<std::string, int> pod_ports, pod_metrics;
  for (const std::string id : {"ps-0", "ps-1"}) {
    std::vector<std::string> pargv = {"--num_vshards=64",
                                      "--data_dir=" + Path(id),
                                      "--materialize_ms=100",
                                      "--shutdown_grace_ms=200",
                                      "--checkpoint_root=" + Path("ckpts"),
                                      "--export_root=" + Path("exports")};
    pargv.insert(pargv.end(), tokens.begin(), tokens.end());
    // Ready = registered: the pod presents the admin token to the master.
    std::tie(pod_ports[id], pod_metrics[id]) = StartReadyPod(id, master, pargv);
    ASSERT_GT(pod_metrics[id], 0) << id << " never registered";
  }

  // A worker trains with the worker token.
  ClientOptions options;
  options.master = master;
  options.security.auth_token = "worker-secret";
  std::vector<int64_t> ids(64);
  for (int64_t i = 0; i < 64; ++i) ids[i] = i;
  std::vector<float> before, after(ids.size() * 2);
  CreateAndPush(options, "t", 2, ids, 1.0f, &before);
  if (HasFatalFailure()) return;

  auto channel = [](const std::string& address, const std::string& token) {
    ChannelSecurity security;
    security.auth_token = token;
    return ChannelMaker::Create(security)->Make(address);
  };
  const std::string pod0 = absl::StrCat("127.0.0.1:", pod_ports["ps-0"]);
  auto worker_pod = ParameterServer::NewStub(channel(pod0, "worker-secret"));
  auto worker_transfer = PodTransfer::NewStub(channel(pod0, "worker-secret"));
  auto worker_master = Master::NewStub(channel(master, "worker-secret"));
  auto admin_pod = ParameterServer::NewStub(channel(pod0, "admin-secret"));
  auto admin_transfer = PodTransfer::NewStub(channel(pod0, "admin-secret"));

  // The worker token: every control call is PERMISSION_DENIED.
  const grpc::StatusCode denied = grpc::StatusCode::PERMISSION_DENIED;
  Assignment detach;  // the attack: epoch 2^64-1 and no vshards
  detach.set_epoch(std::numeric_limits<uint64_t>::max());
  detach.set_num_vshards(64);
  ApplyAssignmentResponse assigned;
  PodCheckpointRequest checkpoint;
  checkpoint.set_dir(Path("ckpts/by-worker"));
  PodCheckpointResponse checkpointed;
  ExportRequest exp;
  exp.set_dir(Path("exports/by-worker"));
  ExportResponse exported;
  ImportRowsResponse imported;
  DrainRequest drain;
  drain.set_pod_id("ps-0");
  DrainResponse drained;
  CheckpointResponse cluster_checkpoint;
  RegisterPodRequest impostor;  // a worker posing as a pod
  impostor.set_pod_id("ps-9");
  impostor.set_address("127.0.0.1:1");
  impostor.set_num_vshards(64);
  RegisterPodResponse registered;
  const std::vector<std::pair<std::string, std::function<grpc::Status()>>> control_calls = {
      {"pod ApplyAssignment",
       [&] {
         return Call(*worker_pod, &ParameterServer::Stub::ApplyAssignment, detach, &assigned);
       }},
      {"pod Checkpoint",
       [&] {
         return Call(*worker_pod, &ParameterServer::Stub::Checkpoint, checkpoint, &checkpointed);
       }},
      {"pod Export",
       [&] { return Call(*worker_transfer, &PodTransfer::Stub::Export, exp, &exported); }},
      {"pod ImportRows",
       [&] {
         return Call(*worker_transfer, &PodTransfer::Stub::ImportRows, ImportRowsRequest(),
                     &imported);
       }},
      {"master Drain", [&] { return Call(*worker_master, &Master::Stub::Drain, drain, &drained); }},
      {"master Checkpoint",
       [&] {
         return Call(*worker_master, &Master::Stub::Checkpoint, CheckpointRequest(),
                     &cluster_checkpoint);
       }},
      {"master RegisterPod",
       [&] { return Call(*worker_master, &Master::Stub::RegisterPod, impostor, &registered); }},
  };
  for (const auto& [what, call] : control_calls) {
    EXPECT_EQ(call().error_code(), denied) << what;
  }
  // ps-admin with the worker token only.
  auto admin_cli = [&](const std::string& token_flag, const std::string& command) {
    return Admin(master, {token_flag}, command);
  };
  std::string refused = admin_cli("--auth_token_file=" + Path("worker.token"), "rebalance");
  EXPECT_TRUE(absl::StartsWith(refused, "exited with code 1")) << refused;
  EXPECT_TRUE(absl::StrContains(refused, "PERMISSION_DENIED")) << refused;
  // Status is a worker call.
  std::string status = admin_cli("--auth_token_file=" + Path("worker.token"), "status");
  EXPECT_TRUE(absl::StartsWith(status, "exited with code 0")) << status;
  // Nothing changed: ps-0 still owns every vshard (its rows are checked below).
  EXPECT_EQ(Sample(Scrape(pod_metrics["ps-0"]), "ps_owned_vshards"), 64);
  EXPECT_FALSE(std::filesystem::exists(Path("ckpts/by-worker")));
  EXPECT_FALSE(std::filesystem::exists(Path("exports/by-worker")));

  // The admin token: an absurd epoch and paths outside the roots are still refused.
  EXPECT_EQ(
      Call(*admin_pod, &ParameterServer::Stub::ApplyAssignment, detach, &assigned).error_code(),
      grpc::StatusCode::INVALID_ARGUMENT);
  checkpoint.set_dir(Path("ps-1/stolen"));  // another pod's data dir
  EXPECT_EQ(
      Call(*admin_pod, &ParameterServer::Stub::Checkpoint, checkpoint, &checkpointed).error_code(),
      grpc::StatusCode::INVALID_ARGUMENT);
  exp.set_dir("../ps-1");
  EXPECT_EQ(Call(*admin_transfer, &PodTransfer::Stub::Export, exp, &exported).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(std::filesystem::exists(Path("ps-1/stolen")));
  // ... and within them, it controls the cluster: a rebalance (the master's calls to the
  // pods and the pods' copy between them are admin calls), a cluster checkpoint, an export.
  std::string moved = admin_cli("--admin_token_file=" + Path("admin.token"), "rebalance");
  EXPECT_TRUE(absl::StartsWith(moved, "exited with code 0")) << moved;
  EXPECT_EQ(Sample(Scrape(pod_metrics["ps-1"]), "ps_owned_vshards"), 32);
  std::string copied = admin_cli("--admin_token_file=" + Path("admin.token"), "checkpoint");
  EXPECT_TRUE(absl::StartsWith(copied, "exited with code 0")) << copied;
  exp.set_dir("e1");
  grpc::Status s = Call(*admin_transfer, &PodTransfer::Stub::Export, exp, &exported);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(std::filesystem::exists(Path("exports/e1/manifest.json")));
  {
    auto client = PsClient::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_TRUE((*client)->Pull({{"t", ids, after.data()}}).ok());
    EXPECT_EQ(before, after);  // no refused call touched a row; the move kept them all
  }

  // Nothing the servers wrote is open to other users.
  for (const std::string dir : {"ps-0", "ps-1", "master-db", "ckpts", "exports"}) {
    ASSERT_TRUE(std::filesystem::exists(Path(dir))) << dir;
    EXPECT_EQ(OpenToOthers(Path(dir)), std::vector<std::string>()) << dir;
  }
}

// A free loopback port (bound and released: Prometheus cannot take port 0).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST_F(ObservabilityTest, PrometheusScrapesTheCluster) {
  const std::string prometheus = "/usr/bin/prometheus";
  if (access(prometheus.c_str(), X_OK) != 0) {
    GTEST_SKIP() << "Debian's prometheus is not installed (scripts/install_deps.sh installs it)";
  }
  auto [master_port, master_metrics] = StartMasterWithMetrics({"--num_ps=1"});
  const std::string master = absl::StrCat("127.0.0.1:", master_port);
  auto [pod_port, pod_metrics] = StartReadyPod("ps-0", master, {});
  ASSERT_GT(pod_metrics, 0);
  ClientOptions options;
  options.master = master;
  CreateAndPush(options, "user", 4, {1, 2, 3}, 0.5f);
  if (HasFatalFailure()) return;

  const int web_port = FreePort();
  std::ofstream(Path("prometheus.yml"))
      << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
      << "scrape_configs:\n"
      << "  - job_name: ps-master\n    static_configs:\n      - targets: ['127.0.0.1:"
      << master_metrics << "']\n"
      << "  - job_name: ps\n    static_configs:\n      - targets: ['127.0.0.1:" << pod_metrics
      << "']\n";
  auto prom = ChildProcess::Start({prometheus, "--config.file=" + Path("prometheus.yml"),
                                   "--storage.tsdb.path=" + Path("prom-data"),
                                   absl::StrCat("--web.listen-address=127.0.0.1:", web_port)},
                                  Path("prometheus.log"));
  ASSERT_TRUE(prom.ok()) << prom.status();
  children_["prometheus"] = *std::move(prom);

  // Until both targets are up and the series carry the expected values.
  const std::vector<std::pair<std::string, std::string>> queries = {
      {"ps_pushed_rows_total", "\"3\"]"},
      {"ps_table_rows", "\"table\":\"user\""},
      {"ps_master_pods%7Bstate%3D%22live%22%7D", "\"1\"]"},
      {"grpc_server_handled_total%7Bgrpc_method%3D%22Push%22%7D", "\"job\":\"ps\""},
      {"up%7Bjob%3D%22ps-master%22%7D", "\"1\"]"},
  };
  std::map<std::string, std::string> last;
  const absl::Time deadline = absl::Now() + absl::Seconds(40);
  size_t found = 0;
  while (found < queries.size() && absl::Now() < deadline && children_["prometheus"]->Running()) {
    found = 0;
    for (const auto& [q, want] : queries) {
      auto body = HttpGet(web_port, "/api/v1/query?query=" + q);
      last[q] = body.ok() ? *body : body.status().ToString();
      if (body.ok() && absl::StrContains(*body, want)) ++found;
    }
    if (found < queries.size()) absl::SleepFor(absl::Milliseconds(500));
  }
  for (const auto& [q, want] : queries) {
    EXPECT_TRUE(absl::StrContains(last[q], want)) << q << " -> " << last[q];
  }
}

}  // namespace
}  // namespace ps
