// A push whose fate is unknown when its primary goes (R = 2): the client re-sends it with
// the same key to the follower the master promoted, which applies it once, whether or not
// the dead primary's record had reached it. The primary is a scripted pod that, like a
// replicated primary, ships the push to its follower (here: the follower's core applies it
// under its key, as replay does) before it fails to answer; the follower is a real pod.
#include <grpcpp/grpcpp.h>

#include <deque>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/ps_client.h"
#include "common/rpc/grpc_status.h"
#include "gtest/gtest.h"
#include "proto/master.grpc.pb.h"
#include "proto/ps.grpc.pb.h"
#include "proto/wrong_shard.h"
#include "ps/ps_server.h"

namespace ps {
namespace {

constexpr uint32_t kVShards = 16;
constexpr int kDim = 4;

std::unique_ptr<grpc::Server> Serve(grpc::Service* service, int* port) {
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  b.RegisterService(service);
  return b.BuildAndStart();
}

// A master that only serves the shard map the test sets.
class FakeMaster final : public Master::Service {
 public:
  void Set(ShardMapResponse map) {
    absl::MutexLock lock(&mu_);
    map_ = std::move(map);
  }
  grpc::Status GetShardMap(grpc::ServerContext*, const GetShardMapRequest*,
                           ShardMapResponse* resp) override {
    absl::MutexLock lock(&mu_);
    *resp = map_;
    return grpc::Status::OK;
  }

 private:
  absl::Mutex mu_;
  ShardMapResponse map_ ABSL_GUARDED_BY(mu_);
};

// R = 2 over pods ps-0 (primary of every vshard, followed by ps-1) and ps-1; after the
// failover ps-1 owns everything and ps-0 is LOST.
ShardMapResponse Map(uint64_t epoch, const std::vector<std::string>& addresses, bool failed_over) {
  ShardMapResponse m;
  m.set_epoch(epoch);
  m.set_num_vshards(kVShards);
  m.set_replication(2);
  for (size_t i = 0; i < addresses.size(); ++i) {
    PodInfo* p = m.add_pods();
    p->set_pod_id(absl::StrCat("ps-", i));
    p->set_address(addresses[i]);
    p->set_state(failed_over && i == 0 ? PodInfo::LOST : PodInfo::LIVE);
  }
  for (uint32_t v = 0; v < kVShards; ++v) {
    m.add_owner(failed_over ? 1 : 0);
    Followers* f = m.add_followers();
    if (!failed_over) f->add_pods(1);
  }
  return m;
}

// Table "emb": zeros, SGD at learning rate 1, so a push of -1 adds 1.
TableSpec Counter() {
  TableSpec spec;
  spec.set_name("emb");
  spec.set_dim(kDim);
  spec.mutable_initializer()->set_kind(InitializerSpec::ZEROS);
  spec.mutable_optimizer()->set_kind(OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_learning_rate(1.0f);
  return spec;
}

// The primary: each push runs the test's hook (which may ship it to the follower), then
// gets the next queued answer (the last one repeats).
class DyingPrimary final : public ParameterServer::Service {
 public:
  DyingPrimary(std::function<void(const PushRequest&)> on_push, std::deque<grpc::Status> answers)
      : on_push_(std::move(on_push)), answers_(std::move(answers)) {}
  grpc::Status Describe(grpc::ServerContext*, const DescribeRequest*,
                        DescribeResponse* resp) override {
    *resp->add_tables()->mutable_spec() = Counter();
    resp->set_num_vshards(kVShards);
    resp->set_epoch(1);
    resp->set_owned_vshards(std::string(kVShards / 8, '\xff'));
    return grpc::Status::OK;
  }
  grpc::Status Push(grpc::ServerContext*, const PushRequest* req, PushResponse*) override {
    absl::MutexLock lock(&mu_);
    if (pushes_++ == 0) on_push_(*req);
    grpc::Status s = answers_.front();
    if (answers_.size() > 1) answers_.pop_front();
    return s;
  }
  int pushes() {
    absl::MutexLock lock(&mu_);
    return pushes_;
  }

 private:
  const std::function<void(const PushRequest&)> on_push_;
  absl::Mutex mu_;
  std::deque<grpc::Status> answers_ ABSL_GUARDED_BY(mu_);
  int pushes_ ABSL_GUARDED_BY(mu_) = 0;
};

struct Outcome {
  absl::Status push;
  std::vector<float> rows;
  ClientStats stats;
  int primary_pushes = 0;
};

// One push of -1 to ids 0..31 while ps-0 is the primary; ps-0 ships it to ps-1 (when
// `shipped`) and answers `answers`; the master's map names ps-1 the primary after ps-0's
// first answer. Returns the push's outcome and the rows read back from ps-1.
Outcome PushThroughFailover(bool shipped, std::deque<grpc::Status> answers) {
  PsServerOptions o;
  o.host = "127.0.0.1";
  auto follower = PsServer::Start(o, *ShardOwnership::Create(kVShards, 1, {}));
  EXPECT_TRUE(follower.ok()) << follower.status();
  CreateTableRequest create;
  *create.mutable_spec() = Counter();
  CreateTableResponse created;
  EXPECT_TRUE((*follower)->core().CreateTable(create, &created).ok());
  PsCore* follower_core = &(*follower)->core();

  FakeMaster master;
  int master_port = 0;
  auto master_server = Serve(&master, &master_port);
  std::vector<std::string> addresses(2);
  addresses[1] = absl::StrCat("127.0.0.1:", (*follower)->port());
  DyingPrimary primary(
      [&](const PushRequest& req) {
        if (shipped) {
          // The follower holds the record, key included: its replay applies it through the
          // one change path, as this push does (its vshards are not yet its own: the test
          // gives them to it for this one application).
          std::vector<uint32_t> all(kVShards);
          for (uint32_t v = 0; v < kVShards; ++v) all[v] = v;
          follower_core->SetOwnership(*ShardOwnership::Create(kVShards, 1, all));
          PushRequest copy = req;
          PushResponse resp;
          EXPECT_TRUE(follower_core->Push(copy, &resp).ok());
          EXPECT_FALSE(resp.duplicate());
          follower_core->SetOwnership(*ShardOwnership::Create(kVShards, 1, {}));
        }
        // The primary is gone; the master promotes its follower.
        std::vector<uint32_t> all(kVShards);
        for (uint32_t v = 0; v < kVShards; ++v) all[v] = v;
        follower_core->SetOwnership(*ShardOwnership::Create(kVShards, 2, all));
        master.Set(Map(2, addresses, /*failed_over=*/true));
      },
      std::move(answers));
  int primary_port = 0;
  auto primary_server = Serve(&primary, &primary_port);
  addresses[0] = absl::StrCat("127.0.0.1:", primary_port);
  master.Set(Map(1, addresses, /*failed_over=*/false));

  ClientOptions options;
  options.master = absl::StrCat("127.0.0.1:", master_port);
  options.num_vshards = kVShards;
  options.initial_backoff_ms = 1;
  options.max_backoff_ms = 20;
  options.map_refresh_ms = 1;
  auto client = PsClient::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  Outcome out;
  if (!client.ok()) return out;
  std::vector<int64_t> ids(32);
  for (int i = 0; i < 32; ++i) ids[i] = i;
  std::vector<float> grads(ids.size() * kDim, -1.0f);
  out.push = (*client)->Push({{"emb", ids, grads.data()}});
  out.rows.resize(ids.size() * kDim);
  absl::Status pulled = (*client)->Pull({{"emb", ids, out.rows.data()}});
  EXPECT_TRUE(pulled.ok()) << pulled;
  out.stats = (*client)->client_stats();
  out.primary_pushes = primary.pushes();
  return out;
}

const grpc::Status kUnavailable(grpc::StatusCode::UNAVAILABLE, "connection lost");

TEST(FailoverPushTest, ShippedPushIsAppliedOnceAtThePromotedFollower) {
  Outcome out = PushThroughFailover(/*shipped=*/true, {kUnavailable});
  ASSERT_TRUE(out.push.ok()) << out.push;
  for (float v : out.rows) ASSERT_EQ(v, 1.0f);  // once, not twice
  EXPECT_EQ(out.stats.duplicate_pushes, 1u);    // the follower knew the key
  EXPECT_GE(out.stats.reroutes, 1u);
  EXPECT_LT(out.primary_pushes, 10);  // it followed the map instead of using up its attempts
}

TEST(FailoverPushTest, UnshippedPushIsAppliedAtThePromotedFollower) {
  Outcome out = PushThroughFailover(/*shipped=*/false, {kUnavailable});
  ASSERT_TRUE(out.push.ok()) << out.push;
  for (float v : out.rows) ASSERT_EQ(v, 1.0f);
  EXPECT_EQ(out.stats.duplicate_pushes, 0u);
}

TEST(FailoverPushTest, DeposedPrimaryRefusingAfterAnUnknownFateKeepsTheKey) {
  // The primary answers UNAVAILABLE (it was cut off), then, deposed (or back without its
  // data), refuses with the wrong-shard detail: its refusal does not mean the follower
  // lacks the record, so the push goes to the follower under its key.
  Outcome out = PushThroughFailover(
      /*shipped=*/true,
      {kUnavailable, ToGrpcStatus(WrongShardError("vshard 0 is not this pod's", 2, 0))});
  ASSERT_TRUE(out.push.ok()) << out.push;
  for (float v : out.rows) ASSERT_EQ(v, 1.0f);
  EXPECT_EQ(out.stats.duplicate_pushes, 1u);
}

// A pod that answers every push UNAVAILABLE and runs the test's hook with the push's
// ordinal (1 for the first) before answering.
class DeadAddress final : public ParameterServer::Service {
 public:
  explicit DeadAddress(std::function<void(int)> on_push) : on_push_(std::move(on_push)) {}
  grpc::Status Describe(grpc::ServerContext*, const DescribeRequest*,
                        DescribeResponse* resp) override {
    *resp->add_tables()->mutable_spec() = Counter();
    resp->set_num_vshards(kVShards);
    resp->set_epoch(1);
    resp->set_owned_vshards(std::string(kVShards / 8, '\xff'));
    return grpc::Status::OK;
  }
  grpc::Status Push(grpc::ServerContext*, const PushRequest*, PushResponse*) override {
    int n;
    {
      absl::MutexLock lock(&mu_);
      n = ++pushes_;
    }
    on_push_(n);
    return kUnavailable;
  }
  int pushes() {
    absl::MutexLock lock(&mu_);
    return pushes_;
  }

 private:
  const std::function<void(int)> on_push_;
  absl::Mutex mu_;
  int pushes_ ABSL_GUARDED_BY(mu_) = 0;
};

// One pod ps-0 owning every vshard, at `address`.
ShardMapResponse OnePod(uint64_t epoch, const std::string& address) {
  ShardMapResponse m;
  m.set_epoch(epoch);
  m.set_num_vshards(kVShards);
  m.set_replication(2);
  PodInfo* p = m.add_pods();
  p->set_pod_id("ps-0");
  p->set_address(address);
  p->set_state(PodInfo::LIVE);
  for (uint32_t v = 0; v < kVShards; ++v) m.add_owner(0);
  return m;
}

TEST(FailoverPushTest, RetryFollowsThePodToItsNewAddressAfterTheMapMovedOn) {
  // A push routed at epoch 1 keeps failing at ps-0's address A. The client's refresh
  // brings epoch 2 (another change: ps-0 still at A), then ps-0 comes back at address B
  // (epoch 3). The retries must refresh again (the address they failed at is the newest
  // the client knows) and follow ps-0 to B, not stay at A until their attempts run out.
  PsServerOptions o;
  o.host = "127.0.0.1";
  std::vector<uint32_t> all(kVShards);
  for (uint32_t v = 0; v < kVShards; ++v) all[v] = v;
  auto restarted = PsServer::Start(o, *ShardOwnership::Create(kVShards, 3, all));
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  CreateTableRequest create;
  *create.mutable_spec() = Counter();
  CreateTableResponse created;
  ASSERT_TRUE((*restarted)->core().CreateTable(create, &created).ok());
  const std::string new_address = absl::StrCat("127.0.0.1:", (*restarted)->port());

  FakeMaster master;
  int master_port = 0;
  auto master_server = Serve(&master, &master_port);
  std::string old_address;
  DeadAddress dead([&](int n) {
    if (n == 1) master.Set(OnePod(2, old_address));  // the map moves on, ps-0 still at A
    if (n == 3) master.Set(OnePod(3, new_address));  // sent after the refresh to epoch 2
  });
  int dead_port = 0;
  auto dead_server = Serve(&dead, &dead_port);
  old_address = absl::StrCat("127.0.0.1:", dead_port);
  master.Set(OnePod(1, old_address));

  ClientOptions options;
  options.master = absl::StrCat("127.0.0.1:", master_port);
  options.num_vshards = kVShards;
  options.initial_backoff_ms = 1;
  options.max_backoff_ms = 5;
  options.map_refresh_ms = 1;
  options.max_attempts = 30;
  auto client = PsClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<int64_t> ids(32);
  for (int i = 0; i < 32; ++i) ids[i] = i;
  std::vector<float> grads(ids.size() * kDim, -1.0f);
  absl::Status pushed = (*client)->Push({{"emb", ids, grads.data()}});
  ASSERT_TRUE(pushed.ok()) << pushed;
  EXPECT_LT(dead.pushes(), 30);  // it left A instead of using up its attempts there
  std::vector<float> rows(ids.size() * kDim);
  ASSERT_TRUE((*client)->Pull({{"emb", ids, rows.data()}}).ok());
  for (float v : rows) ASSERT_EQ(v, 1.0f);
}

}  // namespace
}  // namespace ps
