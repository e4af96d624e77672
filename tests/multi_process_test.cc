// Integration tests against real ps-server processes on loopback: concurrent clients with
// async pushes and pulls agree exactly with the expected values (closed form for an SGD
// table, an in-process ModelStore for an Adagrad one), rows spread over every pod, and a
// pull issued while a pod is down survives the pod's SIGKILL and restart.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/barrier.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/ps_client.h"
#include "common/base/status_macros.h"
#include "common/routing/hash.h"
#include "common/routing/shard_map.h"
#include "embedding/model_store.h"
#include "gtest/gtest.h"
#include "proto/ps.grpc.pb.h"
#include "tests/process.h"

#ifndef PS_SERVER_BINARY
#error "PS_SERVER_BINARY must be defined as the path of the ps-server binary"
#endif

namespace ps {
namespace {

using integration::ChildProcess;

constexpr uint32_t kVShards = 64;
constexpr absl::Duration kStartTimeout = absl::Seconds(20);

// The binary under test; PS_SERVER_BINARY in the environment overrides the built one.
std::string ServerBinary() {
  const char* env = std::getenv("PS_SERVER_BINARY");
  return env != nullptr && *env != '\0' ? env : PS_SERVER_BINARY;
}

// SGD with lr 1 from zeros: a row is exactly minus the sum of the gradients pushed to it
// when those are multiples of 1/8 (every partial sum is representable).
TableSpec SgdSpec(const std::string& name, uint32_t dim) {
  TableSpec t;
  t.set_name(name);
  t.set_dim(dim);
  t.mutable_initializer()->set_kind(InitializerSpec::ZEROS);
  t.mutable_optimizer()->set_kind(OptimizerSpec::SGD);
  t.mutable_optimizer()->set_learning_rate(1.0f);
  return t;
}

TableSpec AdagradSpec(const std::string& name, uint32_t dim) {
  TableSpec t;
  t.set_name(name);
  t.set_dim(dim);
  t.mutable_initializer()->set_kind(InitializerSpec::NORMAL);
  t.mutable_initializer()->set_stddev(0.1f);
  t.mutable_initializer()->set_seed(7);
  t.mutable_optimizer()->set_kind(OptimizerSpec::ADAGRAD);
  t.mutable_optimizer()->set_learning_rate(0.05f);
  return t;
}

// Element-wise exact comparison of rows; "" when equal, else the first differences.
std::string CompareRows(const std::vector<int64_t>& ids, uint32_t dim,
                        const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) {
    return absl::StrCat("size ", got.size(), " != ", want.size());
  }
  std::string diff;
  size_t bad = 0;
  for (size_t k = 0; k < got.size(); ++k) {
    // Bitwise-minded: NaN never matches, and the values are exact by construction.
    if (got[k] == want[k]) continue;
    if (++bad <= 5) {
      absl::StrAppend(&diff, "id ", ids[k / dim], "[", k % dim, "]: got ", got[k], " want ",
                      want[k], "; ");
    }
  }
  if (bad > 0) absl::StrAppend(&diff, bad, " of ", got.size(), " values differ");
  return diff;
}

class MultiProcessTest : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty()) << "mkdtemp failed";
    ASSERT_EQ(access(ServerBinary().c_str(), X_OK), 0) << "cannot execute " << ServerBinary();
  }

  void TearDown() override {
    // Stop the pods here, while the logs still exist, and show them if the test failed.
    for (size_t i = 0; i < pods_.size(); ++i) {
      if (pods_[i] == nullptr) continue;
      pods_[i]->Stop();
      if (HasFailure()) {
        std::fprintf(stderr, "---- pod %zu (%s), log %s:\n%s\n", i, pods_[i]->Describe().c_str(),
                     LogFile(i).c_str(), integration::FileTail(LogFile(i)).c_str());
      }
    }
  }

  std::string PortFile(size_t i) const { return absl::StrCat(tmp_.path(), "/ps-", i, ".port"); }
  std::string LogFile(size_t i) const { return absl::StrCat(tmp_.path(), "/ps-", i, ".log"); }

  // Forks pod i of n on `port` (0: any free port), replacing (and so stopping) a previous
  // process in slot i. AwaitPod then waits until it serves.
  absl::Status LaunchPod(size_t i, size_t n, int port) {
    if (pods_.size() < n) pods_.resize(n);
    if (ports_.size() < n) ports_.resize(n, 0);
    pods_[i].reset();
    unlink(PortFile(i).c_str());
    std::vector<std::string> argv = {ServerBinary(),
                                     "--host=127.0.0.1",
                                     absl::StrCat("--port=", port),
                                     absl::StrCat("--port_file=", PortFile(i)),
                                     absl::StrCat("--shard=", i, "/", n),
                                     absl::StrCat("--num_vshards=", kVShards),
                                     "--shutdown_grace_ms=1000"};
    auto child = ChildProcess::Start(argv, LogFile(i));
    if (!child.ok()) return child.status();
    pods_[i] = std::move(child).value();
    return absl::OkStatus();
  }

  absl::Status AwaitPod(size_t i) {
    auto port = integration::WaitForPortFile(PortFile(i), *pods_[i], kStartTimeout);
    if (!port.ok()) return port.status();
    ports_[i] = *port;
    return absl::OkStatus();
  }

  // Starts n pods (in parallel) and waits until all serve.
  void StartPods(size_t n) {
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(LaunchPod(i, n, 0).ok());
    for (size_t i = 0; i < n; ++i) {
      absl::Status s = AwaitPod(i);
      ASSERT_TRUE(s.ok()) << "pod " << i << ": " << s;
    }
  }

  // Restarts pod i of n on `port` after it died, and re-creates `spec` on it at once.
  //
  // Until then a client's retry that reaches the new pod fails with NOT_FOUND, which is
  // not retried: the pods keep no state across a restart, so this window (from the pod
  // listening to its table existing) is inherent. It is kept to a few milliseconds: the
  // port file is polled every 2 ms and the table is created over a fresh channel to that
  // pod alone (a PsClient would connect to and describe every pod first, ~10 ms; an old
  // channel may still be in reconnect backoff).
  void RestartAndRecreate(size_t i, size_t n, int port, const TableSpec& spec) {
    // The bind fails if an outgoing connection took the port as its ephemeral source
    // port meanwhile (unlikely): try again.
    absl::Status started;
    for (int attempt = 0; attempt < 5; ++attempt) {
      started = LaunchPod(i, n, port);
      if (started.ok()) started = AwaitPod(i);
      if (started.ok()) break;
      absl::SleepFor(absl::Milliseconds(100));
    }
    ASSERT_TRUE(started.ok()) << started;
    ASSERT_EQ(ports_[i], port);
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto stub = ParameterServer::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    ctx.set_wait_for_ready(true);
    CreateTableRequest req;
    *req.mutable_spec() = spec;
    CreateTableResponse resp;
    grpc::Status s = stub->CreateTable(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(resp.created());
  }

  ClientOptions Options(uint64_t worker_id) const {
    ClientOptions o;
    for (int port : ports_) o.servers.push_back(absl::StrCat("127.0.0.1:", port));
    o.num_vshards = kVShards;
    o.worker_id = worker_id;
    return o;
  }

  std::unique_ptr<PsClient> Connect(const ClientOptions& o) {
    auto c = PsClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  // Workload of RunConcurrentClients, then checks; see there.
  void RunConcurrentClients(size_t num_pods);

  integration::TempDir tmp_{"ps-integration-"};
  std::vector<std::unique_ptr<ChildProcess>> pods_;  // by shard index
  std::vector<int> ports_;
};

// ---------------------------------------------------------------------------------------
// Concurrent clients.

constexpr char kSgd[] = "sgd_emb";
constexpr char kAda[] = "ada_emb";
constexpr uint32_t kSgdDim = 8;
constexpr uint32_t kAdaDim = 16;
constexpr int kClients = 4;
constexpr int kRounds = 150;
constexpr size_t kSgdBatch = 128;
constexpr size_t kAdaBatch = 48;
constexpr size_t kPushesInFlight = 4;
// Ids only ever pulled read-only: they must come back at their initial value and never
// be stored.
constexpr int64_t kReadOnlyBase = int64_t{1} << 50;

// What one client did; merged over clients for the final check.
struct ClientRecord {
  absl::Status status;
  // Per SGD id, per element: the sum of the pushed gradients in units of 1/8.
  absl::flat_hash_map<int64_t, std::vector<int64_t>> sgd_eighths;
  absl::flat_hash_set<int64_t> sgd_touched;  // pushed or pulled (so stored)
  absl::flat_hash_set<int64_t> ada_touched;
  int pushes = 0;
  int pulls = 0;
};

// An asynchronous multi-table pull kept in flight across pushes, checked on completion.
struct PendingPull {
  Handle handle;     // sgd + ada, creating rows
  Handle read_only;  // sgd + ada ids nobody touches
  std::vector<int64_t> sgd_ids, ada_ids, ro_ids;
  std::vector<float> sgd_out, ada_out, ro_sgd_out, ro_ada_out;
};

absl::Status CheckPull(PendingPull& p, EmbeddingTable& reference) {
  RETURN_IF_ERROR(p.handle.Wait());
  RETURN_IF_ERROR(p.read_only.Wait());
  // SGD rows are multiples of 1/8 at any moment; a duplicated id gets the same row.
  absl::flat_hash_map<int64_t, size_t> first;
  for (size_t i = 0; i < p.sgd_ids.size(); ++i) {
    const float* row = &p.sgd_out[i * kSgdDim];
    for (uint32_t j = 0; j < kSgdDim; ++j) {
      if (row[j] * 8 != std::nearbyint(row[j] * 8)) {
        return absl::InternalError(
            absl::StrCat("sgd id ", p.sgd_ids[i], " holds ", row[j], ", not a multiple of 1/8"));
      }
    }
    auto [it, fresh] = first.try_emplace(p.sgd_ids[i], i);
    if (!fresh && !std::equal(row, row + kSgdDim, &p.sgd_out[it->second * kSgdDim])) {
      return absl::InternalError(
          absl::StrCat("duplicate sgd id ", p.sgd_ids[i], " came back with different rows"));
    }
  }
  first.clear();
  for (size_t i = 0; i < p.ada_ids.size(); ++i) {
    auto [it, fresh] = first.try_emplace(p.ada_ids[i], i);
    if (!fresh && !std::equal(&p.ada_out[i * kAdaDim], &p.ada_out[(i + 1) * kAdaDim],
                              &p.ada_out[it->second * kAdaDim])) {
      return absl::InternalError(
          absl::StrCat("duplicate ada id ", p.ada_ids[i], " came back with different rows"));
    }
  }
  for (float v : p.ro_sgd_out) {
    if (v != 0.0f) return absl::InternalError(absl::StrCat("read-only sgd row holds ", v));
  }
  std::vector<float> want(p.ro_ids.size() * kAdaDim);
  reference.Pull(p.ro_ids, want.data(), /*read_only=*/true);
  if (std::string d = CompareRows(p.ro_ids, kAdaDim, p.ro_ada_out, want); !d.empty()) {
    return absl::InternalError("read-only ada rows differ from their initial values: " + d);
  }
  return absl::OkStatus();
}

// One client's work: kRounds SGD pushes with up to kPushesInFlight in flight, a
// multi-table pull in flight every few rounds; client 0 also pushes Adagrad gradients
// (one such push in flight at a time, so they apply in order) and mirrors them into
// `reference`.
void RunClient(int c, PsClient& client, EmbeddingTable& reference, absl::Barrier* start,
               ClientRecord& rec) {
  std::deque<Handle> pushes;
  std::unique_ptr<PendingPull> pull;
  Handle last_ada;  // the latest push carrying Adagrad gradients (client 0)
  auto body = [&]() -> absl::Status {
    std::mt19937_64 rng(1000 + c);
    std::vector<int64_t> ada_pushed;
    const int64_t extremes[] = {std::numeric_limits<int64_t>::min(),
                                std::numeric_limits<int64_t>::max(), -1, -(int64_t{1} << 40)};
    if (start->Block()) delete start;
    for (int r = 0; r < kRounds; ++r) {
      // SGD: mostly spread ids, some hot ones (shared by every client, and duplicated
      // within a batch), some extreme ones; gradients k/8 with k in [-8, 8].
      std::vector<int64_t> ids(kSgdBatch);
      std::vector<float> grads(kSgdBatch * kSgdDim);
      for (size_t i = 0; i < kSgdBatch; ++i) {
        const uint64_t x = rng() % 16;
        ids[i] = x == 0   ? static_cast<int64_t>(rng() % 16)
                 : x == 1 ? extremes[rng() % 4]
                          : static_cast<int64_t>(rng() % 2000);
        auto& sum = rec.sgd_eighths[ids[i]];
        sum.resize(kSgdDim, 0);
        for (uint32_t j = 0; j < kSgdDim; ++j) {
          const int k = static_cast<int>(rng() % 17) - 8;
          grads[i * kSgdDim + j] = static_cast<float>(k) / 8.0f;
          sum[j] += k;
        }
        rec.sgd_touched.insert(ids[i]);
      }
      std::vector<PushSpec> specs = {{kSgd, ids, grads.data()}};

      std::vector<int64_t> ada_ids;
      std::vector<float> ada_grads;
      const bool with_ada = c == 0 && r % 2 == 0;
      if (with_ada) {
        for (size_t i = 0; i < kAdaBatch; ++i) {
          ada_ids.push_back(rng() % 4 == 0 ? static_cast<int64_t>(rng() % 8)
                                           : static_cast<int64_t>(rng() % 600) - 300);
          for (uint32_t j = 0; j < kAdaDim; ++j) {
            ada_grads.push_back(static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 997.0f);
          }
          rec.ada_touched.insert(ada_ids.back());
          ada_pushed.push_back(ada_ids.back());
        }
        specs.push_back({kAda, ada_ids, ada_grads.data()});
        // The previous Adagrad push must have been applied before this one is sent.
        if (r > 0) RETURN_IF_ERROR(last_ada.Wait());
        // The reference applies the same de-duplicated batch: duplicates summed into the
        // first occurrence, in first-occurrence order, as the client does.
        std::vector<int64_t> order;
        absl::flat_hash_map<int64_t, size_t> pos;
        std::vector<float> summed;
        for (size_t i = 0; i < ada_ids.size(); ++i) {
          const float* g = &ada_grads[i * kAdaDim];
          auto [it, fresh] = pos.try_emplace(ada_ids[i], order.size());
          if (fresh) {
            order.push_back(ada_ids[i]);
            summed.insert(summed.end(), g, g + kAdaDim);
          } else {
            for (uint32_t j = 0; j < kAdaDim; ++j) summed[it->second * kAdaDim + j] += g[j];
          }
        }
        reference.Push(order, summed.data(), 0);
      }
      Handle h = client.PushAsync(std::move(specs));
      ++rec.pushes;
      if (with_ada) last_ada = h;
      pushes.push_back(h);
      while (pushes.size() > kPushesInFlight) {
        RETURN_IF_ERROR(pushes.front().Wait());
        pushes.pop_front();
      }

      if (r % 4 == 1) {
        if (pull != nullptr) RETURN_IF_ERROR(CheckPull(*pull, reference));
        pull = std::make_unique<PendingPull>();
        for (int i = 0; i < 24; ++i) pull->sgd_ids.push_back(rng() % 2000);
        pull->sgd_ids.push_back(pull->sgd_ids[3]);  // duplicates within one pull
        pull->sgd_ids.push_back(pull->sgd_ids[0]);
        for (int i = 0; i < 16; ++i)
          pull->ada_ids.push_back(static_cast<int64_t>(rng() % 800) - 400);
        pull->ada_ids.push_back(pull->ada_ids[5]);
        for (int i = 0; i < 8; ++i) pull->ro_ids.push_back(kReadOnlyBase + rng() % 100);
        for (int64_t id : pull->sgd_ids) rec.sgd_touched.insert(id);
        for (int64_t id : pull->ada_ids) rec.ada_touched.insert(id);
        pull->sgd_out.assign(pull->sgd_ids.size() * kSgdDim, -1.0f);
        pull->ada_out.assign(pull->ada_ids.size() * kAdaDim, -1.0f);
        pull->ro_sgd_out.assign(pull->ro_ids.size() * kSgdDim, -1.0f);
        pull->ro_ada_out.assign(pull->ro_ids.size() * kAdaDim, -1.0f);
        pull->handle = client.PullAsync({{kSgd, pull->sgd_ids, pull->sgd_out.data()},
                                         {kAda, pull->ada_ids, pull->ada_out.data()}});
        pull->read_only = client.PullAsync({{kAda, pull->ro_ids, pull->ro_ada_out.data()},
                                            {kSgd, pull->ro_ids, pull->ro_sgd_out.data()}},
                                           /*read_only=*/true);
        rec.pulls += 2;
      }

      // Client 0, the only Adagrad writer, checks the pods against the reference mid-run.
      if (c == 0 && r % 10 == 9) {
        RETURN_IF_ERROR(last_ada.Wait());
        std::vector<int64_t> sample(ada_pushed.end() - std::min<size_t>(ada_pushed.size(), 64),
                                    ada_pushed.end());
        std::vector<float> got(sample.size() * kAdaDim), want(sample.size() * kAdaDim);
        RETURN_IF_ERROR(client.Pull({{kAda, sample, got.data()}}));
        ++rec.pulls;
        reference.Pull(sample, want.data(), /*read_only=*/true);
        if (std::string d = CompareRows(sample, kAdaDim, got, want); !d.empty()) {
          return absl::InternalError(absl::StrCat("round ", r, ": adagrad rows differ: ", d));
        }
      }
    }
    while (!pushes.empty()) {
      RETURN_IF_ERROR(pushes.front().Wait());
      pushes.pop_front();
    }
    if (pull != nullptr) RETURN_IF_ERROR(CheckPull(*pull, reference));
    return absl::OkStatus();
  };
  rec.status = body();
  if (!rec.status.ok()) {
    rec.status =
        absl::Status(rec.status.code(), absl::StrCat("client ", c, ": ", rec.status.message()));
    // Leave nothing in flight on the way out (the buffers and the client go away next).
    for (Handle& h : pushes) h.Wait().IgnoreError();
    if (pull != nullptr) {
      pull->handle.Wait().IgnoreError();
      pull->read_only.Wait().IgnoreError();
    }
  }
}

void MultiProcessTest::RunConcurrentClients(size_t num_pods) {
  ASSERT_NO_FATAL_FAILURE(StartPods(num_pods));
  // Tables are created through one client; the others see them through Connect.
  auto creator = Connect(Options(1));
  ASSERT_NE(creator, nullptr);
  ASSERT_TRUE(creator->CreateTable(SgdSpec(kSgd, kSgdDim)).ok());
  ASSERT_TRUE(creator->CreateTable(AdagradSpec(kAda, kAdaDim)).ok());
  ModelStore reference_store;
  ASSERT_TRUE(reference_store.CreateTable(AdagradSpec(kAda, kAdaDim)).ok());
  EmbeddingTable& reference = *reference_store.FindTable(kAda);

  std::vector<std::unique_ptr<PsClient>> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.push_back(Connect(Options(100 + c)));
    ASSERT_NE(clients.back(), nullptr);
  }
  std::vector<ClientRecord> records(kClients);
  auto* start = new absl::Barrier(kClients);  // deleted by the last thread through it
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] { RunClient(c, *clients[c], reference, start, records[c]); });
  }
  for (auto& t : threads) t.join();
  int pushes = 0, pulls = 0;
  for (const auto& rec : records) {
    ASSERT_TRUE(rec.status.ok()) << rec.status;
    pushes += rec.pushes;
    pulls += rec.pulls;
  }
  EXPECT_GT(pushes, kClients * kRounds - 1);
  EXPECT_GT(pulls, 0);

  // Expected state, merged over clients.
  absl::flat_hash_map<int64_t, std::vector<int64_t>> eighths;
  absl::flat_hash_set<int64_t> sgd_touched, ada_touched;
  for (const auto& rec : records) {
    for (const auto& [id, sum] : rec.sgd_eighths) {
      auto& total = eighths[id];
      total.resize(kSgdDim, 0);
      for (uint32_t j = 0; j < kSgdDim; ++j) total[j] += sum[j];
    }
    sgd_touched.insert(rec.sgd_touched.begin(), rec.sgd_touched.end());
    ada_touched.insert(rec.ada_touched.begin(), rec.ada_touched.end());
  }
  std::vector<int64_t> sgd_ids(sgd_touched.begin(), sgd_touched.end());
  std::vector<int64_t> ada_ids(ada_touched.begin(), ada_touched.end());
  std::sort(sgd_ids.begin(), sgd_ids.end());
  std::sort(ada_ids.begin(), ada_ids.end());
  const size_t distinct_sgd = sgd_ids.size(), distinct_ada = ada_ids.size();
  sgd_ids.push_back(sgd_ids[distinct_sgd / 2]);  // a duplicate in the final pull too
  ada_ids.push_back(ada_ids[0]);

  std::vector<float> want_sgd(sgd_ids.size() * kSgdDim, 0.0f);
  for (size_t i = 0; i < sgd_ids.size(); ++i) {
    auto it = eighths.find(sgd_ids[i]);
    if (it == eighths.end()) continue;  // only pulled: still zero
    for (uint32_t j = 0; j < kSgdDim; ++j) {
      want_sgd[i * kSgdDim + j] = static_cast<float>(-static_cast<double>(it->second[j]) / 8.0);
    }
  }
  std::vector<float> want_ada(ada_ids.size() * kAdaDim);
  reference.Pull(ada_ids, want_ada.data(), /*read_only=*/true);

  // One multi-table pull of every touched id, through a fresh client.
  auto checker = Connect(Options(2));
  ASSERT_NE(checker, nullptr);
  std::vector<float> got_sgd(sgd_ids.size() * kSgdDim, -1.0f);
  std::vector<float> got_ada(ada_ids.size() * kAdaDim, -1.0f);
  absl::Status s =
      checker->Pull({{kSgd, sgd_ids, got_sgd.data()}, {kAda, ada_ids, got_ada.data()}});
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(CompareRows(sgd_ids, kSgdDim, got_sgd, want_sgd), "") << kSgd;
  EXPECT_EQ(CompareRows(ada_ids, kAdaDim, got_ada, want_ada), "") << kAda;

  // Stored rows: exactly the touched ids, each on the pod the static map gives it.
  auto map = ShardMap::Static(kVShards, static_cast<uint32_t>(num_pods));
  ASSERT_TRUE(map.ok()) << map.status();
  std::vector<uint64_t> want_rows(num_pods, 0);
  for (int64_t id : sgd_touched) ++want_rows[map->PodOf(NameHash(kSgd), id)];
  for (int64_t id : ada_touched) ++want_rows[map->PodOf(NameHash(kAda), id)];
  auto stats = checker->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(stats->size(), num_pods);
  uint64_t rows = 0;
  for (size_t p = 0; p < num_pods; ++p) {
    const StatsResponse& st = (*stats)[p];
    EXPECT_GT(st.rows(), 0u) << "pod " << p << " holds no rows";
    EXPECT_EQ(st.rows(), want_rows[p]) << "pod " << p;
    EXPECT_GT(st.push_requests(), 0u) << "pod " << p;
    EXPECT_GT(st.pull_requests(), 0u) << "pod " << p;
    EXPECT_EQ(st.rejected_wrong_shard(), 0u) << "pod " << p;
    rows += st.rows();
  }
  EXPECT_EQ(rows, distinct_sgd + distinct_ada);
}

TEST_F(MultiProcessTest, TwoPodsConcurrentClientsMatchExpected) { RunConcurrentClients(2); }

TEST_F(MultiProcessTest, ThreePodsConcurrentClientsMatchExpected) { RunConcurrentClients(3); }

// ---------------------------------------------------------------------------------------
// A pod killed and restarted on its port while a pull waits for it.

TEST_F(MultiProcessTest, PullIssuedWhilePodIsDownSucceedsAfterRestart) {
  constexpr size_t kPods = 2;
  constexpr size_t kVictim = 1;
  constexpr uint32_t kDim = 4;
  ASSERT_NO_FATAL_FAILURE(StartPods(kPods));
  // The retry budget must outlast the pod's absence *and* gRPC's own reconnect backoff:
  // a channel whose connects failed stays in TRANSIENT_FAILURE (RPCs fail at once, without
  // reaching the pod) until its next connect attempt, ~1 s, 2.6 s, 5.2 s... after the first
  // failure, whatever ClientOptions say. 40 attempts backing off 20 ms -> 500 ms span
  // 8.8-17.6 s; the pull typically completes ~1.3 s after it starts, at worst ~3.6 s.
  ClientOptions o = Options(7);
  o.max_attempts = 40;
  o.initial_backoff_ms = 20;
  o.max_backoff_ms = 500;
  o.deadline_ms = 5000;
  auto client = Connect(o);
  ASSERT_NE(client, nullptr);
  const TableSpec spec = SgdSpec("restart_emb", kDim);
  ASSERT_TRUE(client->CreateTable(spec).ok());

  // Row id holds id % 7 + 1 everywhere.
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < 200; ++id) ids.push_back(id);
  std::vector<float> grads;
  for (int64_t id : ids) grads.insert(grads.end(), kDim, -static_cast<float>(id % 7 + 1));
  ASSERT_TRUE(client->Push({{spec.name(), ids, grads.data()}}).ok());
  auto map = ShardMap::Static(kVShards, kPods);
  ASSERT_TRUE(map.ok());
  std::vector<bool> on_victim;
  size_t victim_rows = 0;
  for (int64_t id : ids) {
    on_victim.push_back(map->PodOf(NameHash(spec.name()), id) == kVictim);
    victim_rows += on_victim.back();
  }
  ASSERT_GT(victim_rows, 0u);
  ASSERT_LT(victim_rows, ids.size());
  auto expect_rows = [&](const std::vector<float>& out, float survivor_scale, float victim_scale) {
    std::vector<float> want;
    for (size_t i = 0; i < ids.size(); ++i) {
      want.insert(want.end(), kDim,
                  (on_victim[i] ? victim_scale : survivor_scale) * (ids[i] % 7 + 1));
    }
    return CompareRows(ids, kDim, out, want);
  };
  std::vector<float> out(ids.size() * kDim);
  ASSERT_TRUE(client->Pull({{spec.name(), ids, out.data()}}).ok());
  ASSERT_EQ(expect_rows(out, 1, 1), "");

  // Kill the victim, pull while it is down, restart it on its port, re-create its table,
  // and the pull must complete. A cycle repeats (at most kCycles in all) only on the race
  // of RestartAndRecreate: the pull's retry reached the new pod before its table.
  constexpr int kCycles = 3;
  const int port = ports_[kVictim];
  for (int cycle = 1;; ++cycle) {
    // SIGKILL, and reap so that the port is free.
    pods_[kVictim]->Kill();
    ASSERT_NE(pods_[kVictim]->Describe().find("killed by signal 9"), std::string::npos)
        << pods_[kVictim]->Describe();
    const absl::Time pull_start = absl::Now();
    std::fill(out.begin(), out.end(), -1.0f);
    Handle pull = client->PullAsync({{spec.name(), ids, out.data()}});
    absl::SleepFor(absl::Milliseconds(800));  // several attempts fail meanwhile
    ASSERT_NO_FATAL_FAILURE(RestartAndRecreate(kVictim, kPods, port, spec));
    // Through the old client too: idempotent.
    absl::Status created = client->CreateTable(spec);
    ASSERT_TRUE(created.ok()) << created;

    absl::Status s = pull.Wait();
    const absl::Duration pull_time = absl::Now() - pull_start;
    if (s.ok()) {
      EXPECT_GE(pull_time, absl::Milliseconds(800));
      RecordProperty("cycles", cycle);
      RecordProperty("pull_ms", static_cast<int>(absl::ToInt64Milliseconds(pull_time)));
      break;
    }
    ASSERT_TRUE(absl::IsNotFound(s) && cycle < kCycles)
        << "cycle " << cycle << ": " << s << " after " << pull_time;
    std::fprintf(stderr,
                 "cycle %d: a retry reached the restarted pod before its table (%s); "
                 "killing it again\n",
                 cycle, s.ToString().c_str());
  }
  // The survivor kept its rows; the victim's state was in memory only: back to zeros.
  EXPECT_EQ(expect_rows(out, 1, 0), "");

  // Pushes work again (the new pod's de-duplication state starts empty; the client's
  // sequence numbers continue).
  ASSERT_TRUE(client->Push({{spec.name(), ids, grads.data()}}).ok());
  ASSERT_TRUE(client->Pull({{spec.name(), ids, out.data()}}).ok());
  EXPECT_EQ(expect_rows(out, 2, 1), "");

  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ((*stats)[kVictim].rows(), victim_rows);
  EXPECT_EQ((*stats)[1 - kVictim].rows(), ids.size() - victim_rows);
  EXPECT_LT((*stats)[kVictim].uptime_seconds(), (*stats)[1 - kVictim].uptime_seconds());
}

}  // namespace
}  // namespace ps
