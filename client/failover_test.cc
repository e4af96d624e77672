// Writes whose fate is unknown when their primary goes (R = 2): a sparse push, a dense push
// and a ps-transfer import are sent again to the follower the master promoted, and
// applied there once, whether or not the dead primary's record had reached it. A push
// keeps its key (the follower holds the old primary's records with their keys, so it
// answers `duplicate`); an import installs whole rows at their steps, only over older
// ones, so what the follower holds already is `skipped`. The primary is a scripted pod
// that, like a replicated primary, ships the write to its follower (here: the follower's
// core applies it, under its key, as replay does) before it fails to answer; the follower
// is a real pod.
#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <deque>
#include <filesystem>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "client/ps_client.h"
#include "client/test_fakes.h"
#include "client/transfer.h"
#include "common/rpc/grpc_status.h"
#include "gtest/gtest.h"
#include "proto/master.grpc.pb.h"
#include "proto/ps.grpc.pb.h"
#include "proto/wrong_shard.h"
#include "ps/ps_server.h"

namespace ps {
namespace {

using testing_fakes::FakeMaster;
using testing_fakes::Serve;

constexpr uint32_t kVShards = 16;
constexpr int kDim = 4;
constexpr int kDense = 6;  // floats of dense tensor "w"

TableSpec Counter() { return testing_fakes::CounterTable("emb", kDim); }
DenseSpec CounterW() { return testing_fakes::CounterDense("w", kDense); }

std::vector<uint32_t> AllVShards() {
  std::vector<uint32_t> all(kVShards);
  for (uint32_t v = 0; v < kVShards; ++v) all[v] = v;
  return all;
}

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

// A write the primary received, as the follower's replay would apply it to its core.
using Replay = std::function<absl::Status(PsCore&)>;

// The primary: each write (push, dense push, import) runs the test's hook with it the
// first time (which may ship it to the follower), then gets the next queued answer (the
// last one repeats). It accepts the catalog's creations.
class DyingPrimary final : public ParameterServer::Service {
 public:
  DyingPrimary(std::function<void(const Replay&)> on_write, std::deque<grpc::Status> answers)
      : on_write_(std::move(on_write)), answers_(std::move(answers)), transfer_(this) {}
  grpc::Service* transfer() { return &transfer_; }

  grpc::Status Describe(grpc::ServerContext*, const DescribeRequest*,
                        DescribeResponse* resp) override {
    testing_fakes::DescribeAll(kVShards, Counter(), CounterW(), resp);
    return grpc::Status::OK;
  }
  grpc::Status CreateTable(grpc::ServerContext*, const CreateTableRequest*,
                           CreateTableResponse*) override {
    return grpc::Status::OK;
  }
  grpc::Status CreateDense(grpc::ServerContext*, const CreateDenseRequest*,
                           CreateDenseResponse*) override {
    return grpc::Status::OK;
  }
  grpc::Status Push(grpc::ServerContext*, const PushRequest* req, PushResponse*) override {
    return Write([req = *req](PsCore& core) {
      PushResponse resp;
      absl::Status s = core.Push(req, &resp);
      if (s.ok() && resp.duplicate()) return absl::InternalError("shipped twice");
      return s;
    });
  }
  grpc::Status PushDense(grpc::ServerContext*, const DensePushRequest* req,
                         PushResponse*) override {
    return Write([req = *req](PsCore& core) {
      PushResponse resp;
      absl::Status s = core.PushDense(req, &resp);
      if (s.ok() && resp.duplicate()) return absl::InternalError("shipped twice");
      return s;
    });
  }
  // Writes received (every attempt).
  int writes() {
    absl::MutexLock lock(&mu_);
    return writes_;
  }

 private:
  class Transfer final : public PodTransfer::Service {
   public:
    explicit Transfer(DyingPrimary* primary) : primary_(primary) {}
    grpc::Status ImportRows(grpc::ServerContext*, const ImportRowsRequest* req,
                            ImportRowsResponse*) override {
      return primary_->Write([req = *req](PsCore& core) {
        ImportRowsResponse resp;
        absl::Notification done;
        absl::Status result;
        core.ImportRows(req, &resp, [&](absl::Status s) {
          result = s;
          done.Notify();
        });
        done.WaitForNotification();
        return result;
      });
    }

   private:
    DyingPrimary* const primary_;
  };

  grpc::Status Write(Replay replay) {
    absl::MutexLock lock(&mu_);
    if (writes_++ == 0) on_write_(replay);
    grpc::Status s = answers_.front();
    if (answers_.size() > 1) answers_.pop_front();
    return s;
  }

  const std::function<void(const Replay&)> on_write_;
  absl::Mutex mu_;
  std::deque<grpc::Status> answers_ ABSL_GUARDED_BY(mu_);
  int writes_ ABSL_GUARDED_BY(mu_) = 0;
  Transfer transfer_;
};

// ps-0 (scripted, dying) and ps-1 (a real in-memory pod holding the catalog) under a fake
// master whose map names ps-0 the primary until ps-0's first write, then ps-1.
class FailoverCluster {
 public:
  FailoverCluster(bool shipped, std::deque<grpc::Status> answers)
      : primary_([this, shipped](const Replay& replay) { FailOver(shipped, replay); },
                 std::move(answers)) {
    PsServerOptions o;
    o.host = "127.0.0.1";
    auto follower = PsServer::Start(o, *ShardOwnership::Create(kVShards, 1, {}));
    EXPECT_TRUE(follower.ok()) << follower.status();
    follower_ = *std::move(follower);
    CreateTableRequest table;
    *table.mutable_spec() = Counter();
    CreateTableResponse table_resp;
    EXPECT_TRUE(follower_->core().CreateTable(table, &table_resp).ok());
    CreateDenseRequest dense;
    *dense.mutable_spec() = CounterW();
    CreateDenseResponse dense_resp;
    EXPECT_TRUE(follower_->core().CreateDense(dense, &dense_resp).ok());

    master_server_ = Serve({&master_}, &master_port_);
    primary_server_ = Serve({&primary_, primary_.transfer()}, &primary_port_);
    addresses_ = {absl::StrCat("127.0.0.1:", primary_port_),
                  absl::StrCat("127.0.0.1:", follower_->port())};
    master_.Set(Map(1, addresses_, /*failed_over=*/false));
  }

  std::string master() const { return absl::StrCat("127.0.0.1:", master_port_); }
  int primary_writes() { return primary_.writes(); }

  // A client of the cluster that retries and refreshes quickly.
  std::unique_ptr<PsClient> Client() {
    ClientOptions options;
    options.master = master();
    options.num_vshards = kVShards;
    options.initial_backoff_ms = 1;
    options.max_backoff_ms = 20;
    options.map_refresh_ms = 1;
    auto client = PsClient::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

 private:
  // The primary's first write: shipped to the follower (when `shipped`), then the primary
  // is gone and the master promotes its follower.
  void FailOver(bool shipped, const Replay& replay) {
    PsCore& core = follower_->core();
    if (shipped) {
      // The follower holds the record, key included: its replay applies it through the
      // one change path, as this write does (its vshards are not yet its own: the test
      // gives them to it for this one application).
      core.SetOwnership(*ShardOwnership::Create(kVShards, 1, AllVShards()));
      absl::Status s = replay(core);
      EXPECT_TRUE(s.ok()) << s;
      core.SetOwnership(*ShardOwnership::Create(kVShards, 1, {}));
    }
    core.SetOwnership(*ShardOwnership::Create(kVShards, 2, AllVShards()));
    master_.Set(Map(2, addresses_, /*failed_over=*/true));
  }

  std::unique_ptr<PsServer> follower_;
  FakeMaster master_;
  DyingPrimary primary_;
  int master_port_ = 0, primary_port_ = 0;
  std::unique_ptr<grpc::Server> master_server_, primary_server_;
  std::vector<std::string> addresses_;
};

struct Outcome {
  absl::Status push;
  std::vector<float> rows;
  ClientStats stats;
  int primary_pushes = 0;
};

// A write of -1 (`write`) while ps-0 is the primary; ps-0 ships it to ps-1 (when
// `shipped`) and answers `answers`; the master's map names ps-1 the primary after ps-0's
// first answer. Returns the write's outcome and what `read` reads back (from ps-1).
Outcome WriteThroughFailover(
    bool shipped, std::deque<grpc::Status> answers,
    const std::function<absl::Status(PsClient&)>& write,
    const std::function<absl::Status(PsClient&, std::vector<float>*)>& read) {
  FailoverCluster cluster(shipped, std::move(answers));
  auto client = cluster.Client();
  Outcome out;
  if (client == nullptr) return out;
  out.push = write(*client);
  absl::Status s = read(*client, &out.rows);
  EXPECT_TRUE(s.ok()) << s;
  out.stats = client->client_stats();
  out.primary_pushes = cluster.primary_writes();
  return out;
}

// A push of -1 to ids 0..31 of "emb", through the failover; those rows read back.
Outcome PushThroughFailover(bool shipped, std::deque<grpc::Status> answers) {
  std::vector<int64_t> ids(32);
  for (int i = 0; i < 32; ++i) ids[i] = i;
  std::vector<float> grads(ids.size() * kDim, -1.0f);
  return WriteThroughFailover(
      shipped, std::move(answers),
      [&](PsClient& c) {
        return c.Push({{"emb", ids, grads.data()}});
      },
      [&](PsClient& c, std::vector<float>* rows) {
        rows->resize(ids.size() * kDim);
        return c.Pull({{"emb", ids, rows->data()}});
      });
}

TEST(FailoverPushTest, ARefusalThatSaysNotAppliedGivesTheReroutedPushANewKey) {
  // The primary refuses the push as a fenced pod does (UNAVAILABLE with the NotApplied
  // detail: it neither applied nor is applying it), then as not its own any more. Its fate
  // is known, so the re-routed push goes under a new key: the new owner's followers may
  // hold the old key for another part of the call. (The test's primary ships the push
  // anyway, so the follower holds the old key: a new key shows as a second application.)
  Outcome out = PushThroughFailover(
      /*shipped=*/true,
      {ToGrpcStatus(NotAppliedError(absl::UnavailableError("vshard 0 is moving; retry"))),
       ToGrpcStatus(WrongShardError("vshard 0 is not this pod's", 2, 0))});
  ASSERT_TRUE(out.push.ok()) << out.push;
  EXPECT_EQ(out.stats.duplicate_pushes, 0u);  // a new key, not the one the follower holds
  for (float v : out.rows) ASSERT_EQ(v, 2.0f);
}

// A dense push of -1 to every element of "w", through the failover; "w" read back.
Outcome PushDenseThroughFailover(bool shipped, std::deque<grpc::Status> answers) {
  std::vector<float> grads(kDense, -1.0f);
  return WriteThroughFailover(
      shipped, std::move(answers),
      [&](PsClient& c) { return c.PushDense({"w"}, {grads.data()}, 1.0f); },
      [&](PsClient& c, std::vector<float>* w) {
        w->resize(kDense);
        return c.PullDense({"w"}, {w->data()});
      });
}

const grpc::Status kUnavailable(grpc::StatusCode::UNAVAILABLE, "connection lost");

// The same three cases for a sparse push (the parameter false) and a dense one (true).
class FailoverWriteTest : public testing::TestWithParam<bool> {
 protected:
  Outcome PushThrough(bool shipped, std::deque<grpc::Status> answers) {
    return GetParam() ? PushDenseThroughFailover(shipped, std::move(answers))
                      : PushThroughFailover(shipped, std::move(answers));
  }
};

TEST_P(FailoverWriteTest, ShippedPushIsAppliedOnceAtThePromotedFollower) {
  Outcome out = PushThrough(/*shipped=*/true, {kUnavailable});
  ASSERT_TRUE(out.push.ok()) << out.push;
  for (float v : out.rows) ASSERT_EQ(v, 1.0f);  // once, not twice
  // The follower knew the key: a sparse part goes again as one piece per vshard
  // (PushKey.piece), each answered "duplicate".
  EXPECT_GE(out.stats.duplicate_pushes, 1u);
  EXPECT_GE(out.stats.reroutes, 1u);
  EXPECT_LT(out.primary_pushes, 10);  // it followed the map instead of using up its attempts
}

TEST_P(FailoverWriteTest, UnshippedPushIsAppliedAtThePromotedFollower) {
  Outcome out = PushThrough(/*shipped=*/false, {kUnavailable});
  ASSERT_TRUE(out.push.ok()) << out.push;
  for (float v : out.rows) ASSERT_EQ(v, 1.0f);
  EXPECT_EQ(out.stats.duplicate_pushes, 0u);
  EXPECT_LT(out.primary_pushes, 10);
}

TEST_P(FailoverWriteTest, DeposedPrimaryRefusingAfterAnUnknownFateKeepsTheKey) {
  // The primary answers UNAVAILABLE (it was cut off), then, deposed (or back without its
  // data), refuses with the wrong-shard detail: its refusal does not mean the follower
  // lacks the record, so the push goes to the follower under its key.
  Outcome out = PushThrough(
      /*shipped=*/true,
      {kUnavailable, ToGrpcStatus(WrongShardError("vshard 0 is not this pod's", 2, 0))});
  ASSERT_TRUE(out.push.ok()) << out.push;
  for (float v : out.rows) ASSERT_EQ(v, 1.0f);
  EXPECT_GE(out.stats.duplicate_pushes, 1u);  // one per re-routed piece (sparse)
}

INSTANTIATE_TEST_SUITE_P(SparseAndDense, FailoverWriteTest, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& p) {
                           return p.param ? "Dense" : "Sparse";
                         });

TEST(FailoverPushTest, ANotAppliedRefusalAfterAnUnknownFateGivesANewKey) {
  // The first attempt's fate is unknown (the pod was killed, say); the pod, back and still
  // the owner, then refuses it saying it neither applied nor is applying it (a fence), then
  // as not its own any more: the fate is known after all, so the re-routed push goes under
  // a new key. Kept, the key names every part the re-route splits the call into, and a pod
  // that applied one part answered another "duplicate" (migration_test ScaleOutThenDrain
  // at R = 2 lost pushes so). (As above, the test's primary ships the push anyway: a new
  // key shows as a second application.)
  Outcome out = PushThroughFailover(
      /*shipped=*/true,
      {kUnavailable,
       ToGrpcStatus(NotAppliedError(absl::UnavailableError("vshard 0 is moving; retry"))),
       ToGrpcStatus(WrongShardError("vshard 0 is not this pod's", 2, 0))});
  ASSERT_TRUE(out.push.ok()) << out.push;
  EXPECT_EQ(out.stats.duplicate_pushes, 0u);
  for (float v : out.rows) ASSERT_EQ(v, 2.0f);
}

// ps-transfer import through the failover: an export of "emb" (ids 0..31, each pushed -1
// three times: value 3 at step 3) and "w" (the same), imported into the cluster.
void ImportThroughFailover(bool shipped) {
  char tmpl[] = "/tmp/failover_test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  {
    // The source: one in-memory pod.
    PsServerOptions o;
    o.host = "127.0.0.1";
    o.export_root = "/tmp";
    auto source = PsServer::Start(o, *ShardOwnership::Create(kVShards, 1, AllVShards()));
    ASSERT_TRUE(source.ok()) << source.status();
    ClientOptions co;
    co.servers = {absl::StrCat("127.0.0.1:", (*source)->port())};
    co.num_vshards = kVShards;
    auto client = PsClient::Connect(co);
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_TRUE((*client)->CreateTable(Counter()).ok());
    ASSERT_TRUE((*client)->CreateDense(CounterW()).ok());
    std::vector<int64_t> ids(32);
    for (int i = 0; i < 32; ++i) ids[i] = i;
    std::vector<float> grads(ids.size() * kDim, -1.0f);
    for (int round = 0; round < 3; ++round) {
      ASSERT_TRUE((*client)->Push({{"emb", ids, grads.data()}}).ok());
      ASSERT_TRUE((*client)->PushDense({"w"}, {grads.data()}, 1.0f).ok());
    }
    ClusterTarget target;
    target.servers = co.servers;
    auto cluster = DiscoverCluster(target);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    auto exported = ExportCluster(*cluster, dir + "/export");
    ASSERT_TRUE(exported.ok()) << exported.status();
  }

  FailoverCluster cluster(shipped, {kUnavailable});
  ClusterTarget target;
  target.master = cluster.master();
  target.connect_timeout_ms = 10000;
  auto discovered = DiscoverCluster(target);
  ASSERT_TRUE(discovered.ok()) << discovered.status();
  ImportOptions options;
  options.inflight = 1;  // one request at a time: the first is the one the primary drops
  auto imported = ImportCluster(*discovered, dir + "/export", options);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->rows, 32u);
  EXPECT_EQ(imported->dense, 1u);
  // What the follower held already (shipped) is skipped, the rest installed: each once.
  EXPECT_EQ(imported->installed + imported->skipped, 33u);
  if (!shipped) EXPECT_EQ(imported->skipped, 0u);
  EXPECT_LT(cluster.primary_writes(), 10);  // it followed the map

  auto client = cluster.Client();
  ASSERT_NE(client, nullptr);
  std::vector<int64_t> ids(32);
  for (int i = 0; i < 32; ++i) ids[i] = i;
  std::vector<float> rows(ids.size() * kDim), w(kDense);
  ASSERT_TRUE(client->Pull({{"emb", ids, rows.data()}}).ok());
  ASSERT_TRUE(client->PullDense({"w"}, {w.data()}).ok());
  for (float v : rows) ASSERT_EQ(v, 3.0f);
  for (float v : w) ASSERT_EQ(v, 3.0f);
  std::filesystem::remove_all(dir);
}

TEST(FailoverImportTest, ShippedImportIsInstalledOnceAtThePromotedFollower) {
  ImportThroughFailover(/*shipped=*/true);
}

TEST(FailoverImportTest, UnshippedImportIsInstalledAtThePromotedFollower) {
  ImportThroughFailover(/*shipped=*/false);
}

// A pod that answers every push UNAVAILABLE and runs the test's hook with the push's
// ordinal (1 for the first) before answering.
class DeadAddress final : public ParameterServer::Service {
 public:
  explicit DeadAddress(std::function<void(int)> on_push) : on_push_(std::move(on_push)) {}
  grpc::Status Describe(grpc::ServerContext*, const DescribeRequest*,
                        DescribeResponse* resp) override {
    testing_fakes::DescribeAll(kVShards, Counter(), DenseSpec(), resp);
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
  auto restarted = PsServer::Start(o, *ShardOwnership::Create(kVShards, 3, AllVShards()));
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  CreateTableRequest create;
  *create.mutable_spec() = Counter();
  CreateTableResponse created;
  ASSERT_TRUE((*restarted)->core().CreateTable(create, &created).ok());
  const std::string new_address = absl::StrCat("127.0.0.1:", (*restarted)->port());

  FakeMaster master;
  int master_port = 0;
  auto master_server = Serve({&master}, &master_port);
  std::string old_address;
  DeadAddress dead([&](int n) {
    if (n == 1) master.Set(OnePod(2, old_address));  // the map moves on, ps-0 still at A
    if (n == 3) master.Set(OnePod(3, new_address));  // sent after the refresh to epoch 2
  });
  int dead_port = 0;
  auto dead_server = Serve({&dead}, &dead_port);
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
