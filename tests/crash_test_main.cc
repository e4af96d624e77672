// ps-crash-test: kills a durable ps-server with SIGKILL at random moments while clients
// push, restarts it on the same data dir, and verifies that every acknowledged push is
// applied exactly once (periodic durability: lost pushes only within --flush_ms).
//
// With --replication=R (R >= 1) it runs a cluster instead: ps-master and --pods pods, the
// C++ client following the master's map, and kills of pods in turn, with --lose_disk their
// data dirs deleted too (tests/cluster_crash.h). Without it, one pod and no master, as
// below.
//
// Each push of client c with sequence s adds 1 (SGD, lr 1, gradient -1, zero-initialized
// rows) to its own marker row (c << 32 | s) and to 8 distinct rows of a shared set of 64,
// which every client touches. At the end (after one more kill and restart), a marker of 1
// means applied once, 0 lost, 2 or more applied twice; every shared row must equal the
// number of applied pushes that touched it, exactly. Its last output line is JSON.
#include <arpa/inet.h>
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/base/binary_init.h"
#include "proto/ps.grpc.pb.h"
#include "tests/cluster_crash.h"
#include "tests/process.h"

DEFINE_string(durability, "process", "ps-server --durability: process, machine or periodic.");
DEFINE_int32(kills, 5, "SIGKILLs during the run (one more precedes the final check).");
DEFINE_uint64(seed, 1, "Seed of the kill times and the rows each push touches.");
DEFINE_double(seconds, 10, "How long clients keep starting new pushes.");
DEFINE_int32(clients, 4, "Concurrent clients, one push in flight each.");
DEFINE_int32(flush_ms, 100, "ps-server --flush_ms (periodic durability's loss bound).");
DEFINE_int32(materialize_ms, 300,
             "ps-server --materialize_ms: short, so kills land in every phase of the "
             "materializer as well as the log.");
DEFINE_string(server, "", "ps-server binary (default: ps-server beside this program).");
DEFINE_string(server_flags, "",
              "More ps-server flags, space-separated (e.g. \"--memory_budget_mb=0.25 "
              "--lazy_start\"): the same checks under eviction or a lazy start.");
DEFINE_bool(keep_dir, false, "Keep the data dir and server logs (their path is printed).");
DEFINE_uint32(replication, 0,
              "0: one pod, no master (the modes above). R >= 1: a cluster (ps-master "
              "--replication=R and --pods pods) pushed through the C++ client; each kill "
              "waits for the master to see the pod lost (with R >= 2 its vshards fail over "
              "to their followers), then restarts it at a new address.");
DEFINE_uint32(pods, 3, "Pods of the cluster (--replication >= 1).");
DEFINE_string(replication_ack, "all",
              "ps-master --replication_ack (--replication >= 2): all, or leader (weaker: a push "
              "acknowledged on its primary alone may die with it; losses are then reported in "
              "the JSON but do not fail the run).");
DEFINE_int32(lease_ms, 1000, "ps-master --lease_ms (--replication >= 1).");
DEFINE_bool(lose_disk, false,
            "With --replication >= 1: each kill also deletes the pod's data dir, and the pod "
            "comes back at once at its address with an empty one (a lost volume). Before each "
            "such loss the test waits until the master shows every vshard with R copies.");
DEFINE_bool(restart_in_place, false,
            "With --replication >= 1: a kill without --lose_disk restarts the pod at once at "
            "its address, within its lease (a container restarted in its pod), instead of "
            "after the master saw it lost. With --durability=periodic and R >= 2 the master "
            "then fails its vshards over at its registration (its log may lack records it "
            "acknowledged).");
DEFINE_double(heal_timeout_s, 120,
              "With --lose_disk, or --durability=periodic at R >= 2 (a crash loses the log's "
              "unwritten tail): the longest wait for every vshard to have R copies again "
              "(re-replication) before the next kill; the run fails after it.");
DEFINE_string(master, "", "ps-master binary (default: ps-master beside this program).");

namespace {

using ps::integration::ChildProcess;

constexpr int kDim = 4;
constexpr int kShared = 64;
constexpr int kSharedPerPush = 8;

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

std::string PackIds(const std::vector<int64_t>& ids) {
  return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int64_t));
}

struct Acked {
  int64_t marker;
  std::vector<int64_t> shared;
  // The pod acknowledged the push at some time in [sent_at, acked_at] (its acknowledged
  // attempt's send and receipt); see AckedNoEarlierThan.
  absl::Time sent_at, acked_at;
};

class Server {
 public:
  Server(std::string binary, std::string dir, int port)
      : binary_(std::move(binary)), dir_(std::move(dir)), port_(port) {}

  absl::Status Start() {
    const std::string port_file = dir_ + "/port";
    std::filesystem::remove(port_file);
    std::vector<std::string> argv = {binary_,
                                     "--host=127.0.0.1",
                                     absl::StrCat("--port=", port_),
                                     "--port_file=" + port_file,
                                     "--data_dir=" + dir_ + "/data",
                                     "--durability=" + FLAGS_durability,
                                     absl::StrCat("--flush_ms=", FLAGS_flush_ms),
                                     absl::StrCat("--materialize_ms=", FLAGS_materialize_ms),
                                     "--shutdown_grace_ms=100"};
    for (absl::string_view f : absl::StrSplit(FLAGS_server_flags, ' ', absl::SkipEmpty())) {
      argv.emplace_back(f);
    }
    auto child = ChildProcess::Start(argv, absl::StrCat(dir_, "/server.log"));
    if (!child.ok()) return child.status();
    child_ = *std::move(child);
    return ps::integration::WaitForPortFile(port_file, *child_, absl::Seconds(60)).status();
  }
  void Kill() { child_->Kill(); }
  void Stop() {
    if (child_ != nullptr) child_->Stop();
  }

 private:
  std::string binary_, dir_;
  int port_;
  std::unique_ptr<ChildProcess> child_;
};

std::unique_ptr<ps::ParameterServer::Stub> Connect(int port) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 20);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
  return ps::ParameterServer::NewStub(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args));
}

// The earliest moment the pod can have acknowledged `a`: after the send, and at most
// kDelivery before the client got the answer. The answer to a push acknowledged just
// before a kill can reach the client after it; without the allowance such a push (lost
// within the bound) would be charged to the next kill, seconds later.
constexpr absl::Duration kDelivery = absl::Milliseconds(50);
absl::Time AckedNoEarlierThan(const Acked& a) {
  return std::max(a.sent_at, a.acked_at - kDelivery);
}

// Sends `req` until it is acknowledged (the same key every time); sets the send time of
// the acknowledged attempt and the time its answer arrived.
void PushUntilAcked(ps::ParameterServer::Stub& stub, const ps::PushRequest& req, Acked* a) {
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    ctx.set_wait_for_ready(true);  // wait out a restart rather than fail fast
    ps::PushResponse resp;
    const absl::Time sent = absl::Now();
    grpc::Status s = stub.Push(&ctx, req, &resp);
    if (s.ok()) {
      a->sent_at = sent;
      a->acked_at = absl::Now();
      return;
    }
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
        s.error_code() != grpc::StatusCode::ABORTED &&
        s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED &&
        s.error_code() != grpc::StatusCode::CANCELLED) {
      LOG(FATAL) << "push failed with a non-retryable error: " << s.error_message();
    }
    LOG_EVERY_N(INFO, 50) << "push retry after: " << s.error_code() << " " << s.error_message();
    absl::SleepFor(absl::Milliseconds(10));
  }
}

// Ids per page of the final read: 16k rows of kDim floats is 256 KB, far below gRPC's
// default 4 MB limit on a received message, however long the run was.
constexpr size_t kPullPage = 16384;

// Reads the rows of `ids` (read-only, so nothing is created) into *values, kDim floats per
// id, one page of ids per call; each page rides out the restart's first moments.
absl::Status PullAll(ps::ParameterServer::Stub& stub, const std::vector<int64_t>& ids,
                     std::vector<float>* values) {
  values->assign(ids.size() * kDim, 0.0f);
  for (size_t begin = 0; begin < ids.size(); begin += kPullPage) {
    const size_t n = std::min(kPullPage, ids.size() - begin);
    ps::PullRequest pull;
    ps::TableIds* t = pull.add_tables();
    t->set_table("crash");
    t->set_ids(PackIds(std::vector<int64_t>(ids.begin() + begin, ids.begin() + begin + n)));
    pull.set_read_only(true);
    ps::PullResponse resp;
    grpc::Status s;
    for (int attempt = 0; attempt < 50; ++attempt) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      s = stub.Pull(&ctx, pull, &resp);
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE) break;
      absl::SleepFor(absl::Milliseconds(100));
    }
    if (!s.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                          absl::StrCat("ids ", begin, "..", begin + n, ": ", s.error_message()));
    }
    if (resp.tables_size() != 1 || resp.tables(0).values().size() != n * kDim * sizeof(float)) {
      return absl::InternalError(
          absl::StrCat("ids ", begin, "..", begin + n, ": the answer has the wrong shape"));
    }
    std::memcpy(values->data() + begin * kDim, resp.tables(0).values().data(),
                n * kDim * sizeof(float));
  }
  return absl::OkStatus();
}

int Main() {
  std::string server_binary = FLAGS_server;
  if (server_binary.empty()) {
    server_binary =
        (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "ps-server").string();
  }
  auto durability_ok = FLAGS_durability == "process" || FLAGS_durability == "machine" ||
                       FLAGS_durability == "periodic";
  if (!durability_ok || FLAGS_kills < 0 || FLAGS_clients < 1 || FLAGS_seconds <= 0) {
    LOG(ERROR) << "bad flags (see --help)";
    return 2;
  }
  if (FLAGS_replication >= 1) {
    if (FLAGS_replication > FLAGS_pods || FLAGS_pods < 1 || FLAGS_lease_ms < 1) {
      LOG(ERROR) << "--replication must be at most --pods, --lease_ms >= 1 (see --help)";
      return 2;
    }
    ps::integration::ClusterCrashOptions o;
    o.master_binary = FLAGS_master;
    if (o.master_binary.empty()) {
      o.master_binary =
          (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "ps-master").string();
    }
    o.server_binary = server_binary;
    o.replication = FLAGS_replication;
    o.pods = FLAGS_pods;
    o.durability = FLAGS_durability;
    if (FLAGS_replication_ack != "all" && FLAGS_replication_ack != "leader") {
      LOG(ERROR) << "--replication_ack must be all or leader, not " << FLAGS_replication_ack;
      return 2;
    }
    o.ack_leader = FLAGS_replication_ack == "leader";
    o.flush_ms = FLAGS_flush_ms;
    o.materialize_ms = FLAGS_materialize_ms;
    o.server_flags = absl::StrSplit(FLAGS_server_flags, ' ', absl::SkipEmpty());
    o.lease_ms = FLAGS_lease_ms;
    o.kills = FLAGS_kills;
    o.lose_disk = FLAGS_lose_disk;
    o.restart_in_place = FLAGS_restart_in_place;
    o.seconds = FLAGS_seconds;
    o.clients = FLAGS_clients;
    o.seed = FLAGS_seed;
    o.heal_timeout_s = FLAGS_heal_timeout_s;
    o.keep_dir = FLAGS_keep_dir;
    return ps::integration::RunClusterCrash(o);
  }
  if (FLAGS_lose_disk || FLAGS_restart_in_place) {
    LOG(ERROR) << "--lose_disk and --restart_in_place need --replication >= 1 (a cluster)";
    return 2;
  }
  auto dir = std::make_unique<ps::integration::TempDir>("ps-crash-test");
  if (dir->path().empty()) return 2;
  const int port = FreePort();
  Server server(server_binary, dir->path(), port);
  if (absl::Status s = server.Start(); !s.ok()) {
    LOG(ERROR) << "ps-server did not start: " << s;
    return 1;
  }
  auto admin = Connect(port);
  {
    ps::CreateTableRequest req;
    ps::TableSpec* spec = req.mutable_spec();
    spec->set_name("crash");
    spec->set_dim(kDim);
    spec->mutable_optimizer()->set_kind(ps::OptimizerSpec::SGD);
    spec->mutable_optimizer()->set_learning_rate(1);
    grpc::ClientContext ctx;
    ps::CreateTableResponse resp;
    grpc::Status s = admin->CreateTable(&ctx, req, &resp);
    if (!s.ok()) {
      LOG(ERROR) << "CreateTable: " << s.error_message();
      return 1;
    }
  }

  const absl::Time start = absl::Now();
  const absl::Time stop_new = start + absl::Seconds(FLAGS_seconds);
  absl::Mutex mu;
  std::vector<Acked> acked;
  std::vector<std::thread> clients;
  for (int c = 0; c < FLAGS_clients; ++c) {
    clients.emplace_back([&, c] {
      auto stub = Connect(port);
      std::mt19937_64 rng(FLAGS_seed * 1000 + c);
      std::vector<int64_t> all(kShared);
      for (int i = 0; i < kShared; ++i) all[i] = i;
      const std::vector<float> minus_one((1 + kSharedPerPush) * kDim, -1.0f);
      for (uint64_t seq = 1; absl::Now() < stop_new; ++seq) {
        Acked a;
        a.marker = (int64_t{c + 1} << 32) | static_cast<int64_t>(seq);
        std::shuffle(all.begin(), all.end(), rng);
        a.shared.assign(all.begin(), all.begin() + kSharedPerPush);
        std::vector<int64_t> ids = {a.marker};
        ids.insert(ids.end(), a.shared.begin(), a.shared.end());
        ps::PushRequest req;
        req.mutable_key()->set_worker_id(c + 1);
        req.mutable_key()->set_incarnation(1);
        req.mutable_key()->set_sequence(seq);
        ps::TableGrads* t = req.add_tables();
        t->set_table("crash");
        t->set_ids(PackIds(ids));
        t->set_grads(std::string(reinterpret_cast<const char*>(minus_one.data()),
                                 minus_one.size() * sizeof(float)));
        PushUntilAcked(*stub, req, &a);
        absl::MutexLock lock(&mu);
        acked.push_back(std::move(a));
      }
    });
  }

  // Kills at random moments in the run, then one more after the clients finish.
  std::mt19937_64 rng(FLAGS_seed);
  std::uniform_real_distribution<double> when(0, FLAGS_seconds);
  std::vector<double> at(FLAGS_kills);
  for (double& t : at) t = when(rng);
  std::sort(at.begin(), at.end());
  std::vector<absl::Time> kills;
  double max_restart_ms = 0;
  auto kill_and_restart = [&]() -> bool {
    kills.push_back(absl::Now());  // before the signal: pushes sent before it may be lost
    server.Kill();
    absl::Status s = server.Start();
    max_restart_ms =
        std::max(max_restart_ms, absl::ToDoubleMilliseconds(absl::Now() - kills.back()));
    if (!s.ok()) LOG(ERROR) << "restart failed: " << s;
    return s.ok();
  };
  bool ok = true;
  for (double t : at) {
    absl::SleepFor(start + absl::Seconds(t) - absl::Now());
    ok = ok && kill_and_restart();
    if (!ok) break;
  }
  if (!ok) {
    server.Stop();
    for (auto& t : clients) t.detach();
    return 1;
  }
  for (auto& t : clients) t.join();
  ok = kill_and_restart();
  if (!ok) return 1;

  // Read every marker and shared row back, in pages (a long run acknowledges more pushes
  // than one answer may carry).
  std::vector<int64_t> ids;
  for (const Acked& a : acked) ids.push_back(a.marker);
  for (int i = 0; i < kShared; ++i) ids.push_back(i);
  std::vector<float> values;
  {
    auto stub = Connect(port);
    if (absl::Status s = PullAll(*stub, ids, &values); !s.ok()) {
      LOG(ERROR) << "final pull failed: " << s << "\nserver log:\n"
                 << ps::integration::FileTail(dir->path() + "/server.log");
      return 1;
    }
  }
  const float* v = values.data();
  uint64_t lost = 0, duplicated = 0, torn = 0;
  double max_loss_ms = 0;
  std::map<int64_t, int64_t> expected_shared;
  for (size_t i = 0; i < acked.size(); ++i) {
    const float x = v[i * kDim];
    for (int d = 1; d < kDim; ++d) torn += v[i * kDim + d] != x;
    if (x == 0) {
      ++lost;
      // The loss is measured to the first kill after the acknowledgement.
      const absl::Time acked_from = AckedNoEarlierThan(acked[i]);
      auto k = std::upper_bound(kills.begin(), kills.end(), acked_from);
      if (k != kills.end()) {
        max_loss_ms = std::max(max_loss_ms, absl::ToDoubleMilliseconds(*k - acked_from));
      }
    } else if (x >= 2) {
      ++duplicated;
    }
    if (x >= 1) {
      for (int64_t id : acked[i].shared) expected_shared[id] += static_cast<int64_t>(x);
    }
  }
  uint64_t shared_mismatches = 0;
  for (int i = 0; i < kShared; ++i) {
    const float* row = v + (acked.size() + i) * kDim;
    for (int d = 0; d < kDim; ++d) {
      shared_mismatches += row[d] != static_cast<float>(expected_shared[i]);
    }
  }
  server.Stop();

  const bool periodic = FLAGS_durability == "periodic";
  const bool pass = duplicated == 0 && torn == 0 && shared_mismatches == 0 &&
                    (periodic ? max_loss_ms <= FLAGS_flush_ms : lost == 0);
  if (!pass || FLAGS_keep_dir) {
    std::fprintf(stderr, "data dir and server log kept in %s\n", dir->path().c_str());
    std::filesystem::rename(dir->path(), dir->path() + ".kept");
  }
  std::printf(
      "{\"durability\": \"%s\", \"kills\": %zu, \"seconds\": %.1f, \"clients\": %d, "
      "\"acked_pushes\": %zu, \"lost\": %lu, \"duplicated\": %lu, \"torn_rows\": %lu, "
      "\"shared_row_mismatches\": %lu, \"max_loss_ms\": %.1f, \"flush_ms\": %d, "
      "\"max_restart_ms\": %.0f, \"pass\": %s}\n",
      FLAGS_durability.c_str(), kills.size(), FLAGS_seconds, FLAGS_clients, acked.size(), lost,
      duplicated, torn, shared_mismatches, max_loss_ms, FLAGS_flush_ms, max_restart_ms,
      pass ? "true" : "false");
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  ps::InitBinary(&argc, &argv,
                 "ps-crash-test: SIGKILLs a durable ps-server at random moments while clients "
                 "push, restarts it on the same data dir, verifies exactly-once.\n"
                 "Usage: ps-crash-test --durability=process|machine|periodic --kills=N "
                 "--seed=S --seconds=T [--replication=R --pods=P [--lose_disk]]",
                 __FILE__);
  return Main();
}
