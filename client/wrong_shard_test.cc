// The wrong-shard signal end to end: a pod's refusal carries the WrongShard detail (with
// its epoch and the vshard) across gRPC; a client following a master re-routes on that
// detail, and only on it: a FAILED_PRECONDITION without it is final, whatever its text.
#include "proto/wrong_shard.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/ps_client.h"
#include "client/test_fakes.h"
#include "common/routing/hash.h"
#include "common/rpc/grpc_status.h"
#include "gtest/gtest.h"
#include "proto/master.grpc.pb.h"
#include "proto/ps.grpc.pb.h"
#include "ps/ps_server.h"

namespace ps {
namespace {

using testing_fakes::FakeMaster;
using testing_fakes::Serve;

constexpr uint32_t kVShards = 16;

// A map of `owner` (vshard -> index into `addresses`, every pod LIVE).
ShardMapResponse Map(uint64_t epoch, const std::vector<std::string>& addresses,
                     const std::vector<uint32_t>& owner) {
  ShardMapResponse m;
  m.set_epoch(epoch);
  m.set_num_vshards(kVShards);
  for (size_t i = 0; i < addresses.size(); ++i) {
    PodInfo* p = m.add_pods();
    p->set_pod_id(absl::StrCat("ps-", i));
    p->set_address(addresses[i]);
    p->set_state(PodInfo::LIVE);
  }
  for (uint32_t o : owner) m.add_owner(o);
  return m;
}

std::vector<uint32_t> Owned(uint32_t from, uint32_t to) {
  std::vector<uint32_t> v;
  for (uint32_t i = from; i < to; ++i) v.push_back(i);
  return v;
}

TableSpec Counter() { return testing_fakes::CounterTable("emb", 4); }

std::unique_ptr<PsServer> StartPod(uint64_t epoch, const std::vector<uint32_t>& owned) {
  PsServerOptions o;
  o.host = "127.0.0.1";
  auto own = ShardOwnership::Create(kVShards, epoch, owned);
  EXPECT_TRUE(own.ok()) << own.status();
  auto pod = PsServer::Start(o, *own);
  EXPECT_TRUE(pod.ok()) << pod.status();
  CreateTableRequest req;
  *req.mutable_spec() = Counter();
  CreateTableResponse resp;
  EXPECT_TRUE((*pod)->core().CreateTable(req, &resp).ok());
  return std::move(pod).value();
}

std::string Packed(const std::vector<int64_t>& ids) {
  return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int64_t));
}

TEST(WrongShardTest, PodRefusalCarriesTheDetailWithItsEpoch) {
  auto pod = StartPod(/*epoch=*/7, Owned(0, kVShards / 2));
  auto stub = ParameterServer::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", pod->port()),
                                                           grpc::InsecureChannelCredentials()));
  // An id of a vshard the pod does not own.
  int64_t id = 0;
  while (VShardOf(RouteHash(NameHash("emb"), id), kVShards) < kVShards / 2) ++id;
  const uint32_t vshard = VShardOf(RouteHash(NameHash("emb"), id), kVShards);

  PushRequest push;
  push.set_epoch(7);
  push.mutable_key()->set_worker_id(1);
  push.mutable_key()->set_incarnation(1);
  push.mutable_key()->set_sequence(1);
  TableGrads* g = push.add_tables();
  g->set_table("emb");
  g->set_ids(Packed({id}));
  g->set_grads(std::string(4 * sizeof(float), '\0'));
  PullRequest pull;
  pull.set_epoch(7);
  TableIds* t = pull.add_tables();
  t->set_table("emb");
  t->set_ids(Packed({id}));
  for (int call = 0; call < 2; ++call) {
    grpc::ClientContext ctx;
    PushResponse push_resp;
    PullResponse pull_resp;
    const grpc::Status gs =
        call == 0 ? stub->Push(&ctx, push, &push_resp) : stub->Pull(&ctx, pull, &pull_resp);
    const absl::Status s = FromGrpcStatus(gs);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    auto detail = WrongShardOf(s);
    ASSERT_TRUE(detail.has_value()) << s;
    EXPECT_EQ(detail->epoch(), 7u);
    EXPECT_EQ(detail->vshard(), vshard);
    // For humans and older clients, as before.
    EXPECT_NE(s.message().find("which this pod does not own at epoch 7"), std::string::npos) << s;
    auto epoch = ctx.GetServerTrailingMetadata().find("ps-epoch");
    ASSERT_NE(epoch, ctx.GetServerTrailingMetadata().end());
    EXPECT_EQ(std::string(epoch->second.data(), epoch->second.size()), "7");
  }
}

TEST(WrongShardTest, ClientFollowingAMasterReroutesOnTheDetail) {
  auto pod0 = StartPod(1, Owned(0, kVShards / 2));
  auto pod1 = StartPod(1, Owned(kVShards / 2, kVShards));
  const std::vector<std::string> addresses = {absl::StrCat("127.0.0.1:", pod0->port()),
                                              absl::StrCat("127.0.0.1:", pod1->port())};
  std::vector<uint32_t> owner(kVShards);
  for (uint32_t v = 0; v < kVShards; ++v) owner[v] = v < kVShards / 2 ? 0 : 1;
  FakeMaster master;
  master.Set(Map(1, addresses, owner));
  int master_port = 0;
  auto master_server = Serve({&master}, &master_port);
  ClientOptions options;
  options.master = absl::StrCat("127.0.0.1:", master_port);
  options.num_vshards = kVShards;
  auto client = PsClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();

  // Every vshard moves to pod 0 (epoch 2); the client still routes with epoch 1.
  auto all = ShardOwnership::Create(kVShards, 2, Owned(0, kVShards));
  auto none = ShardOwnership::Create(kVShards, 2, {});
  ASSERT_TRUE(all.ok() && none.ok());
  pod0->core().SetOwnership(*all);
  pod1->core().SetOwnership(*none);
  master.Set(Map(2, addresses, std::vector<uint32_t>(kVShards, 0)));

  std::vector<int64_t> ids(100);
  for (int i = 0; i < 100; ++i) ids[i] = i;
  std::vector<float> ones(ids.size() * 4, -1.0f);
  ASSERT_TRUE((*client)->Push({{"emb", ids, ones.data()}}).ok());
  const ClientStats after_push = (*client)->client_stats();
  EXPECT_GE(after_push.reroutes, 1u);
  EXPECT_GE(after_push.map_refreshes, 1u);
  EXPECT_EQ(after_push.duplicate_pushes, 0u);
  std::vector<float> rows(ids.size() * 4);
  ASSERT_TRUE((*client)->Pull({{"emb", ids, rows.data()}}).ok());
  for (float v : rows) ASSERT_EQ(v, 1.0f);  // every push applied once, on pod 0
  EXPECT_EQ(pod1->core().ownership()->owned_count(), 0u);
}

// A pod whose pushes answer what the test queues, then OK.
class ScriptedPod final : public ParameterServer::Service {
 public:
  void Queue(grpc::Status s) {
    absl::MutexLock lock(&mu_);
    answers_.push_back(std::move(s));
  }
  int pushes() {
    absl::MutexLock lock(&mu_);
    return pushes_;
  }
  grpc::Status Describe(grpc::ServerContext*, const DescribeRequest*,
                        DescribeResponse* resp) override {
    testing_fakes::DescribeAll(kVShards, Counter(), DenseSpec(), resp);
    return grpc::Status::OK;
  }
  grpc::Status Push(grpc::ServerContext*, const PushRequest*, PushResponse*) override {
    absl::MutexLock lock(&mu_);
    ++pushes_;
    if (answers_.empty()) return grpc::Status::OK;
    grpc::Status s = answers_.front();
    answers_.pop_front();
    return s;
  }

 private:
  absl::Mutex mu_;
  std::deque<grpc::Status> answers_ ABSL_GUARDED_BY(mu_);
  int pushes_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(WrongShardTest, OnlyTheDetailMakesARefusalAWrongShard) {
  ScriptedPod pod;
  int pod_port = 0;
  auto pod_server = Serve({&pod}, &pod_port);
  FakeMaster master;
  master.Set(Map(1, {absl::StrCat("127.0.0.1:", pod_port)}, std::vector<uint32_t>(kVShards, 0)));
  int master_port = 0;
  auto master_server = Serve({&master}, &master_port);
  ClientOptions options;
  options.master = absl::StrCat("127.0.0.1:", master_port);
  options.num_vshards = kVShards;
  auto client = PsClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<int64_t> ids = {1, 2, 3};
  std::vector<float> grads(ids.size() * 4, 1.0f);
  const std::string text =
      "id 1 of table 'emb' is in vshard 3, which this pod does not own at "
      "epoch 2";

  // The old message, no detail: final, not re-routed, no map refresh.
  pod.Queue(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, text));
  absl::Status s = (*client)->Push({{"emb", ids, grads.data()}});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(pod.pushes(), 1);
  EXPECT_EQ((*client)->client_stats().reroutes, 0u);
  EXPECT_EQ((*client)->client_stats().map_refreshes, 0u);

  // The same refusal with the detail: refreshed and sent again (under the new map, which
  // here names the same pod).
  pod.Queue(ToGrpcStatus(WrongShardError(text, 2, 3)));
  s = (*client)->Push({{"emb", ids, grads.data()}});
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(pod.pushes(), 1 + 2);
  EXPECT_EQ((*client)->client_stats().reroutes, 1u);
  EXPECT_GE((*client)->client_stats().map_refreshes, 1u);
}

}  // namespace
}  // namespace ps
