// The client against in-process pods on loopback: routing, de-duplication, multi-table
// calls, exact agreement with a reference store, and retries.
#include "client/ps_client.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "embedding/model_store.h"
#include "gtest/gtest.h"
#include "proto/ps.grpc.pb.h"
#include "ps/ps_server.h"

namespace ps {
namespace {

TableSpec Spec(std::string name, uint32_t dim, OptimizerSpec::Kind opt) {
  TableSpec t;
  t.set_name(std::move(name));
  t.set_dim(dim);
  t.mutable_initializer()->set_kind(InitializerSpec::NORMAL);
  t.mutable_initializer()->set_stddev(0.1f);
  t.mutable_optimizer()->set_kind(opt);
  return t;
}

class ClientTest : public testing::Test {
 protected:
  void StartPods(int n, uint32_t vshards = 64) {
    for (int i = 0; i < n; ++i) {
      PsServerOptions o;
      o.host = "127.0.0.1";
      auto own = ShardOwnership::FromStaticShard(absl::StrCat(i, "/", n), vshards);
      ASSERT_TRUE(own.ok()) << own.status();
      auto server = PsServer::Start(o, *own);
      ASSERT_TRUE(server.ok()) << server.status();
      options_.servers.push_back(absl::StrCat("127.0.0.1:", (*server)->port()));
      servers_.push_back(std::move(server).value());
    }
    options_.num_vshards = vshards;
    options_.deadline_ms = 5000;
  }

  std::unique_ptr<PsClient> Connect() {
    auto c = PsClient::Connect(options_);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  // Table "emb": dim 4, zeros, SGD at learning rate 1, so a push of -1 adds 1.
  static bool CreateCounterTable(PsClient& client) {
    TableSpec spec = Spec("emb", 4, OptimizerSpec::SGD);
    spec.mutable_initializer()->set_kind(InitializerSpec::ZEROS);
    spec.mutable_optimizer()->set_learning_rate(1.0f);
    return client.CreateTable(spec).ok();
  }
  static std::vector<int64_t> Iota(int n) {
    std::vector<int64_t> ids(n);
    for (int i = 0; i < n; ++i) ids[i] = i;
    return ids;
  }

  ClientOptions options_;
  std::vector<std::unique_ptr<PsServer>> servers_;
};

TEST_F(ClientTest, MatchesReferenceStoreExactlyAcrossPodsAndTables) {
  StartPods(3);
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  ModelStore reference;
  std::vector<TableSpec> specs = {Spec("user", 8, OptimizerSpec::ADAGRAD),
                                  Spec("item", 4, OptimizerSpec::ADAM)};
  for (const auto& s : specs) {
    ASSERT_TRUE(client->CreateTable(s).ok());
    ASSERT_TRUE(reference.CreateTable(s).ok());
  }
  std::mt19937_64 rng(1);
  for (int step = 0; step < 30; ++step) {
    std::vector<std::vector<int64_t>> ids(2);
    std::vector<std::vector<float>> grads(2);
    std::vector<PushSpec> push;
    for (int t = 0; t < 2; ++t) {
      for (int i = 0; i < 200; ++i) ids[t].push_back(static_cast<int64_t>(rng() % 300) - 50);
      grads[t].resize(ids[t].size() * specs[t].dim());
      for (float& g : grads[t]) g = static_cast<float>(rng() % 1000) / 1000.0f - 0.5f;
      push.push_back({specs[t].name(), ids[t], grads[t].data()});
    }
    ASSERT_TRUE(client->Push(push).ok());
    // The reference applies the same de-duplicated, summed gradients.
    for (int t = 0; t < 2; ++t) {
      const uint32_t dim = specs[t].dim();
      std::vector<int64_t> order;
      absl::flat_hash_map<int64_t, std::vector<float>> sum;
      for (size_t i = 0; i < ids[t].size(); ++i) {
        auto [it, fresh] = sum.try_emplace(ids[t][i], std::vector<float>(dim, 0.0f));
        if (fresh) order.push_back(ids[t][i]);
        for (uint32_t j = 0; j < dim; ++j) it->second[j] += grads[t][i * dim + j];
      }
      for (int64_t id : order) {
        std::vector<int64_t> one = {id};
        reference.FindTable(specs[t].name())->Push(one, sum[id].data(), 0);
      }
    }
  }
  for (int t = 0; t < 2; ++t) {
    std::vector<int64_t> ids;
    for (int64_t id = -60; id < 260; ++id) ids.push_back(id);
    ids.push_back(5);  // duplicates come back too
    const uint32_t dim = specs[t].dim();
    std::vector<float> got(ids.size() * dim), want(ids.size() * dim);
    ASSERT_TRUE(client->Pull({{specs[t].name(), ids, got.data()}}).ok());
    reference.FindTable(specs[t].name())->Pull(ids, want.data(), false);
    ASSERT_EQ(got, want) << specs[t].name();
  }
  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok());
  uint64_t rows = 0;
  for (const auto& s : *stats) {
    EXPECT_GT(s.rows(), 0u) << "every pod holds some rows";
    rows += s.rows();
  }
  EXPECT_EQ(rows, reference.FindTable("user")->rows() + reference.FindTable("item")->rows());
}

TEST_F(ClientTest, AsyncCallsInFlightTogether) {
  StartPods(2);
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(CreateCounterTable(*client));
  const std::vector<int64_t> ids = Iota(100);
  std::vector<float> ones(400, -1.0f);  // each push adds 1 to every element
  std::vector<Handle> handles;
  for (int k = 0; k < 16; ++k) handles.push_back(client->PushAsync({{"emb", ids, ones.data()}}));
  for (auto& h : handles) ASSERT_TRUE(h.Wait().ok());
  std::vector<float> out(400);
  ASSERT_TRUE(client->Pull({{"emb", ids, out.data()}}).ok());
  for (float v : out) ASSERT_EQ(v, 16.0f);
}

// Then: a chain of pushes, each started from the completion callback of the last (on
// the client's thread), all applied; a pull's duplicate ids are filled in before its
// callback runs; a call that failed before any RPC, or an empty handle, calls back at
// once on the calling thread with the error.
TEST_F(ClientTest, ThenRunsOnCompletionAndCanStartTheNextCall) {
  StartPods(2);
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(CreateCounterTable(*client));
  const std::vector<int64_t> ids = Iota(100);
  std::vector<float> ones(400, -1.0f);  // each push adds 1 to every element

  constexpr int kChain = 20;
  absl::Mutex mu;
  int done = 0;
  absl::Status first_error;
  std::function<void()> next = [&] {
    client->PushAsync({{"emb", ids, ones.data()}}).Then([&](absl::Status s) {
      absl::MutexLock lock(&mu);
      if (!s.ok() && first_error.ok()) first_error = s;
      if (++done < kChain && s.ok()) {
        mu.Unlock();
        next();
        mu.Lock();
      }
    });
  };
  next();
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](int* n) { return *n >= kChain; }, &done));
    ASSERT_TRUE(first_error.ok()) << first_error;
  }

  // Duplicates (id 7 three times) are copied from their first row before the callback.
  std::vector<int64_t> pull_ids = {7, 1, 7, 99, 7};
  std::vector<float> out(pull_ids.size() * 4, 0.0f);
  absl::Notification pulled;
  std::vector<float> seen;
  absl::Status pull_status;
  client->PullAsync({{"emb", pull_ids, out.data()}}).Then([&](absl::Status s) {
    pull_status = s;
    seen = out;
    pulled.Notify();
  });
  pulled.WaitForNotification();
  ASSERT_TRUE(pull_status.ok()) << pull_status;
  for (float v : seen) EXPECT_EQ(v, static_cast<float>(kChain));

  // From a callback (on the completion thread): waiting for an unfinished call is refused
  // rather than deadlocked; a blocking method works (it drains a queue of its own), and
  // so does a pull of a table this client has not seen yet (its catalog refresh blocks
  // the same way).
  auto other = Connect();
  ASSERT_NE(other, nullptr);
  TableSpec late = Spec("late", 4, OptimizerSpec::SGD);
  late.mutable_initializer()->set_kind(InitializerSpec::CONSTANT);
  late.mutable_initializer()->set_value(2.5f);
  ASSERT_TRUE(other->CreateTable(late).ok());
  absl::Notification inner_done;
  absl::Status wait_status, describe_status, late_status;
  std::vector<float> late_out(4, 0.0f);
  std::vector<int64_t> one = {5};
  client->PushAsync({{"emb", ids, ones.data()}}).Then([&](absl::Status) {
    wait_status = client->PushAsync({{"emb", ids, ones.data()}}).Wait();
    describe_status = client->GetTable("emb").status();
    client->PullAsync({{"late", one, late_out.data()}}).Then([&](absl::Status s) {
      late_status = s;
      inner_done.Notify();
    });
  });
  inner_done.WaitForNotification();
  EXPECT_EQ(wait_status.code(), absl::StatusCode::kFailedPrecondition) << wait_status;
  EXPECT_TRUE(describe_status.ok()) << describe_status;
  ASSERT_TRUE(late_status.ok()) << late_status;
  for (float v : late_out) EXPECT_EQ(v, 2.5f);

  // Failed before any RPC: the callback runs at once, on this thread.
  bool called = false;
  client->PullAsync({{"missing", pull_ids, out.data()}}).Then([&](absl::Status s) {
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    called = true;
  });
  EXPECT_TRUE(called);
  called = false;
  Handle().Then([&](absl::Status s) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    called = true;
  });
  EXPECT_TRUE(called);
}

TEST_F(ClientTest, ErrorsSurfaceWithTheirCodes) {
  StartPods(2);
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<int64_t> ids = {1};
  std::vector<float> out(4);
  EXPECT_EQ(client->Pull({{"missing", ids, out.data()}}).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(client->CreateTable(Spec("emb", 4, OptimizerSpec::SGD)).ok());
  EXPECT_EQ(client->CreateTable(Spec("emb", 8, OptimizerSpec::SGD)).code(),
            absl::StatusCode::kAlreadyExists);
  std::vector<float> nan = {0, 0, 0, std::nanf("")};
  absl::Status s = client->Push({{"emb", ids, nan.data()}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("non-finite"), std::string::npos) << s;
}

TEST_F(ClientTest, ConnectRejectsMisconfiguredCluster) {
  StartPods(2);
  ClientOptions swapped = options_;
  std::swap(swapped.servers[0], swapped.servers[1]);
  auto c = PsClient::Connect(swapped);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find("--shard=i/2"), std::string::npos) << c.status();
  ClientOptions vshards = options_;
  vshards.num_vshards = 128;
  EXPECT_EQ(PsClient::Connect(vshards).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ClientTest, UnreachablePodFailsAfterBoundedRetries) {
  ClientOptions o;
  o.servers = {"127.0.0.1:1"};  // nothing listens on port 1
  o.max_attempts = 3;
  o.initial_backoff_ms = 5;
  o.max_backoff_ms = 10;
  o.deadline_ms = 1000;
  auto c = PsClient::Connect(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("after 3 attempts"), std::string::npos) << c.status();
}

// A worker process restarted with a fixed worker id and the default incarnation (the
// pods remember its keys) must have every push applied: its sequences start from the
// clock, above every key its predecessor used.
TEST_F(ClientTest, RestartedClientWithAFixedIdentityLosesNoPush) {
  StartPods(2);
  options_.worker_id = 42;
  const std::vector<int64_t> ids = Iota(10);
  std::vector<float> ones(ids.size() * 4, -1.0f);  // each push adds 1
  for (int run = 0; run < 2; ++run) {
    auto client = Connect();  // the same identity each time
    ASSERT_NE(client, nullptr);
    if (run == 0) ASSERT_TRUE(CreateCounterTable(*client));
    for (int k = 0; k < 5; ++k) ASSERT_TRUE(client->Push({{"emb", ids, ones.data()}}).ok());
    const ClientStats stats = client->client_stats();
    EXPECT_EQ(stats.pushes, 5u);
    EXPECT_GE(stats.push_rpcs, 5u);
    EXPECT_EQ(stats.duplicate_pushes, 0u) << "run " << run;
    EXPECT_EQ(stats.reused_keys, 0u) << "run " << run;
  }
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<float> rows(ids.size() * 4);
  ASSERT_TRUE(client->Pull({{"emb", ids, rows.data()}}).ok());
  for (float v : rows) ASSERT_EQ(v, 10.0f);
}

// A push answered `duplicate` to its first attempt was dropped: the client counts it.
TEST_F(ClientTest, ReusedPushKeysAreCounted) {
  StartPods(2);
  options_.worker_id = 7;
  options_.first_push_sequence = 1;  // two clients handed the same sequences
  const std::vector<int64_t> ids = Iota(10);
  std::vector<float> ones(ids.size() * 4, -1.0f);
  auto a = Connect();
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(CreateCounterTable(*a));
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(a->Push({{"emb", ids, ones.data()}}).ok());
  auto b = Connect();
  ASSERT_NE(b, nullptr);
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(b->Push({{"emb", ids, ones.data()}}).ok());
  const ClientStats stats = b->client_stats();
  EXPECT_GE(stats.push_rpcs, 3u);
  EXPECT_EQ(stats.duplicate_pushes, stats.push_rpcs);
  EXPECT_EQ(stats.reused_keys, stats.push_rpcs);
  EXPECT_EQ(a->client_stats().duplicate_pushes, 0u);
  std::vector<float> rows(ids.size() * 4);
  ASSERT_TRUE(b->Pull({{"emb", ids, rows.data()}}).ok());
  for (float v : rows) ASSERT_EQ(v, 3.0f);  // b's pushes were dropped as a's
}

TEST_F(ClientTest, SetIdentityChangesThePushKeys) {
  StartPods(1);
  options_.worker_id = 9;
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(CreateCounterTable(*client));
  EXPECT_EQ(client->worker_id(), 9u);
  EXPECT_EQ(client->incarnation(), 1u);
  EXPECT_EQ(client->SetIdentity(0, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->SetIdentity(9, 0).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int64_t> ids = Iota(4);
  std::vector<float> ones(ids.size() * 4, -1.0f);
  ASSERT_TRUE(client->Push({{"emb", ids, ones.data()}}).ok());
  ASSERT_TRUE(client->SetIdentity(9, 2).ok());  // re-registered: a new incarnation
  EXPECT_EQ(client->incarnation(), 2u);
  ASSERT_TRUE(client->Push({{"emb", ids, ones.data()}}).ok());
  // The old incarnation is superseded on the pod: a push under it is refused.
  options_.incarnation = 1;
  options_.worker_id = 9;
  auto old = Connect();
  ASSERT_NE(old, nullptr);
  EXPECT_EQ(old->Push({{"emb", ids, ones.data()}}).code(), absl::StatusCode::kFailedPrecondition);
  std::vector<float> rows(ids.size() * 4);
  ASSERT_TRUE(client->Pull({{"emb", ids, rows.data()}}).ok());
  for (float v : rows) ASSERT_EQ(v, 2.0f);
  EXPECT_EQ(client->client_stats().duplicate_pushes, 0u);
}

TEST_F(ClientTest, DenseTensorsRouteToTheirPod) {
  StartPods(3);
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<std::string> names;
  for (int i = 0; i < 6; ++i) {
    DenseSpec d;
    d.set_name(absl::StrCat("layer", i));
    d.add_shape(2);
    d.add_shape(i + 1);
    d.mutable_initializer()->set_kind(InitializerSpec::CONSTANT);
    d.mutable_initializer()->set_value(static_cast<float>(i));
    d.mutable_optimizer()->set_learning_rate(1.0f);
    ASSERT_TRUE(client->CreateDense(d).ok());
    names.push_back(d.name());
  }
  std::vector<std::vector<float>> grads(6), out(6);
  std::vector<const float*> gp;
  std::vector<float*> op;
  for (int i = 0; i < 6; ++i) {
    grads[i].assign(2 * (i + 1), 0.5f);
    out[i].resize(2 * (i + 1));
    gp.push_back(grads[i].data());
    op.push_back(out[i].data());
  }
  ASSERT_TRUE(client->PushDense(names, gp).ok());
  ASSERT_TRUE(client->PullDense(names, op).ok());
  for (int i = 0; i < 6; ++i) {
    for (float v : out[i]) EXPECT_EQ(v, i - 0.5f);
  }
}

// The pod's Pull is served raw and the client's pull and push are sent raw (proto/wire.h);
// a stock protobuf stub must see the same service.
TEST_F(ClientTest, StockProtobufStubInteroperatesWithRawPaths) {
  StartPods(1);
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const TableSpec spec = Spec("emb", 16, OptimizerSpec::ADAGRAD);
  ASSERT_TRUE(client->CreateTable(spec).ok());
  std::vector<int64_t> ids;
  for (int i = 0; i < 300; ++i) ids.push_back(i * 7 - 100);
  ids.push_back(5);  // a duplicate
  std::vector<float> grads(ids.size() * 16);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i % 11) * 0.01f;
  ASSERT_TRUE(client->Push({{"emb", ids, grads.data()}}).ok());  // raw request

  auto stub = ParameterServer::NewStub(
      grpc::CreateChannel(options_.servers[0], grpc::InsecureChannelCredentials()));
  PushRequest push;  // protobuf-serialized request to the pod
  push.set_epoch(0);
  TableGrads* g = push.add_tables();
  g->set_table("emb");
  g->set_ids(std::string(reinterpret_cast<const char*>(ids.data()), 8 * 10));
  g->set_grads(std::string(reinterpret_cast<const char*>(grads.data()), 4 * 16 * 10));
  PushResponse push_resp;
  grpc::ClientContext push_ctx;
  ASSERT_TRUE(stub->Push(&push_ctx, push, &push_resp).ok());

  PullRequest pull;  // protobuf-parsed response of the raw server method
  TableIds* t = pull.add_tables();
  t->set_table("emb");
  t->set_ids(std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 8));
  PullResponse pulled;
  grpc::ClientContext pull_ctx;
  grpc::Status st = stub->Pull(&pull_ctx, pull, &pulled);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_EQ(pulled.tables_size(), 1);
  EXPECT_EQ(pulled.tables(0).table(), "emb");
  std::vector<float> out(ids.size() * 16);
  ASSERT_TRUE(client->Pull({{"emb", ids, out.data()}}).ok());  // raw response, scattered
  ASSERT_EQ(pulled.tables(0).values().size(), out.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(pulled.tables(0).values().data(), out.data(), out.size() * 4), 0);

  // Errors keep their codes through the raw method.
  t->set_table("missing");
  grpc::ClientContext missing_ctx;
  EXPECT_EQ(stub->Pull(&missing_ctx, pull, &pulled).error_code(), grpc::StatusCode::NOT_FOUND);
  grpc::ClientContext garbage_ctx;
  grpc::GenericStub raw(
      grpc::CreateChannel(options_.servers[0], grpc::InsecureChannelCredentials()));
  const std::string junk = "\x12\xff";  // an entry longer than the message
  grpc::Slice slice(junk);
  grpc::ByteBuffer junk_req(&slice, 1), junk_resp;
  absl::Notification done;
  grpc::Status junk_status;
  raw.UnaryCall(&garbage_ctx, "/ps.ParameterServer/Pull", grpc::StubOptions(), &junk_req,
                &junk_resp, [&](grpc::Status s) {
                  junk_status = s;
                  done.Notify();
                });
  done.WaitForNotification();
  EXPECT_EQ(junk_status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace ps
