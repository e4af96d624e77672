// Cluster export and import (client/transfer.h) against in-process pods on loopback:
// an export of a 2-pod cluster imported into a 3-pod cluster of another vshard count is
// bit-exact (weights, optimizer slots and per-row steps); an import is idempotent; a
// damaged or incomplete export is refused before anything is sent; retryable errors are
// retried, the others are not. Faults come from FlakyPod, a stand-in that forwards the
// calls transfer.cc makes to a real pod and fails those it is told to. Incremental: a
// delta export since a full export's cursor, imported on top of that full export, gives
// the rows a new full export gives (weights, slots, steps), across a restart of a pod.
#include "client/transfer.h"

#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/ps_client.h"
#include "client/test_fakes.h"
#include "gtest/gtest.h"
#include "proto/export_file.h"
#include "proto/ps.grpc.pb.h"
#include "ps/ps_server.h"

namespace ps {
namespace {

namespace fs = std::filesystem;
using testing_fakes::AdamSpec;
using testing_fakes::BitEqual;

constexpr int kRows = 500;  // ids per table

std::vector<int64_t> Ids() {
  std::vector<int64_t> ids;
  for (int i = 0; i < kRows; ++i) ids.push_back(int64_t{i} * 7919 - 100000);
  return ids;
}

// A pod's stand-in: forwards the calls transfer.cc makes (Describe, CreateTable,
// CreateDense, Export, ImportRows) to a real pod, counting each, except that the next
// calls of a method told to fail answer the given codes without reaching the pod.
class FlakyPod {
 public:
  explicit FlakyPod(const std::string& pod)
      : ps_(this, grpc::CreateChannel(pod, grpc::InsecureChannelCredentials())),
        transfer_(this, grpc::CreateChannel(pod, grpc::InsecureChannelCredentials())) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&ps_);
    builder.RegisterService(&transfer_);
    server_ = builder.BuildAndStart();
  }
  ~FlakyPod() { server_->Shutdown(); }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  // The next calls of `method` answer `codes`, in order.
  void FailNext(const std::string& method, std::vector<grpc::StatusCode> codes) {
    absl::MutexLock lock(&mu_);
    auto& q = failures_[method];
    q.insert(q.end(), codes.begin(), codes.end());
  }
  // Calls of `method` received (failed or forwarded).
  int calls(const std::string& method) {
    absl::MutexLock lock(&mu_);
    return calls_[method];
  }
  // Calls that change the pod: creations and row imports.
  int writes() { return calls("CreateTable") + calls("CreateDense") + calls("ImportRows"); }

 private:
  // Counts the call; its injected failure, or the pod's answer to forward(ctx).
  template <typename Forward>
  grpc::Status Call(const std::string& method, Forward forward) {
    {
      absl::MutexLock lock(&mu_);
      ++calls_[method];
      auto& q = failures_[method];
      if (!q.empty()) {
        const grpc::StatusCode code = q.front();
        q.pop_front();
        return grpc::Status(code, "injected by FlakyPod");
      }
    }
    grpc::ClientContext ctx;
    return forward(&ctx);
  }

  class Ps final : public ParameterServer::Service {
   public:
    Ps(FlakyPod* owner, std::shared_ptr<grpc::Channel> pod)
        : owner_(owner), stub_(ParameterServer::NewStub(pod)) {}
    grpc::Status Describe(grpc::ServerContext*, const DescribeRequest* req,
                          DescribeResponse* resp) override {
      return owner_->Call(
          "Describe", [&](grpc::ClientContext* ctx) { return stub_->Describe(ctx, *req, resp); });
    }
    grpc::Status CreateTable(grpc::ServerContext*, const CreateTableRequest* req,
                             CreateTableResponse* resp) override {
      return owner_->Call("CreateTable", [&](grpc::ClientContext* ctx) {
        return stub_->CreateTable(ctx, *req, resp);
      });
    }
    grpc::Status CreateDense(grpc::ServerContext*, const CreateDenseRequest* req,
                             CreateDenseResponse* resp) override {
      return owner_->Call("CreateDense", [&](grpc::ClientContext* ctx) {
        return stub_->CreateDense(ctx, *req, resp);
      });
    }

   private:
    FlakyPod* const owner_;
    std::unique_ptr<ParameterServer::Stub> stub_;
  };

  class Transfer final : public PodTransfer::Service {
   public:
    Transfer(FlakyPod* owner, std::shared_ptr<grpc::Channel> pod)
        : owner_(owner), stub_(PodTransfer::NewStub(pod)) {}
    grpc::Status Export(grpc::ServerContext*, const ExportRequest* req,
                        ExportResponse* resp) override {
      return owner_->Call("Export",
                          [&](grpc::ClientContext* ctx) { return stub_->Export(ctx, *req, resp); });
    }
    grpc::Status ImportRows(grpc::ServerContext*, const ImportRowsRequest* req,
                            ImportRowsResponse* resp) override {
      return owner_->Call("ImportRows", [&](grpc::ClientContext* ctx) {
        return stub_->ImportRows(ctx, *req, resp);
      });
    }

   private:
    FlakyPod* const owner_;
    std::unique_ptr<PodTransfer::Stub> stub_;
  };

  absl::Mutex mu_;
  std::map<std::string, std::deque<grpc::StatusCode>> failures_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> calls_ ABSL_GUARDED_BY(mu_);
  Ps ps_;
  Transfer transfer_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// In-memory pods of one static map.
struct Pods {
  std::vector<std::unique_ptr<PsServer>> servers;
  std::vector<std::string> addresses;
  uint32_t vshards = 0;
};

// Rows of both tables and the dense tensor, as pulled.
using Snapshot = testing_fakes::TransferSnapshot;

class TransferTest : public testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/transfer_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { fs::remove_all(root_); }

  // In-memory pods, or with `data_dir`, durable pods in <data_dir>-<i>.
  static Pods StartPods(int n, uint32_t vshards, const std::string& data_dir = "") {
    Pods pods;
    pods.vshards = vshards;
    for (int i = 0; i < n; ++i) {
      PsServerOptions o;
      o.host = "127.0.0.1";
      if (!data_dir.empty()) o.core.storage.db.dir = absl::StrCat(data_dir, "-", i);
      o.export_root = "/tmp";  // the tests export into /tmp/transfer_test.*/
      auto own = ShardOwnership::FromStaticShard(absl::StrCat(i, "/", n), vshards);
      EXPECT_TRUE(own.ok()) << own.status();
      auto server = PsServer::Start(o, *own);
      EXPECT_TRUE(server.ok()) << server.status();
      if (!server.ok()) return pods;
      pods.addresses.push_back(absl::StrCat("127.0.0.1:", (*server)->port()));
      pods.servers.push_back(*std::move(server));
    }
    return pods;
  }

  static std::unique_ptr<PsClient> Connect(const Pods& pods, uint64_t worker_id) {
    ClientOptions o;
    o.servers = pods.addresses;
    o.num_vshards = pods.vshards;
    o.worker_id = worker_id;
    auto c = PsClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  static absl::StatusOr<Cluster> Discover(const std::vector<std::string>& servers) {
    ClusterTarget target;
    target.servers = servers;
    target.connect_timeout_ms = 5000;
    return DiscoverCluster(target);
  }

  // Creates the tables and trains them: every id is pulled (so every row exists), then
  // rounds of pushes to random subsets, so rows reach different steps.
  static void CreateAndTrain(PsClient& c) {
    testing_fakes::CreateTransferTables(c);
    Pull(c);
    Train(c, 1, 3);
  }

  // Identical pushes for a given seed.
  static void Train(PsClient& c, uint32_t seed, int rounds) {
    testing_fakes::TrainTransferTables(c, Ids(), seed, rounds);
  }

  static Snapshot Pull(PsClient& c) { return testing_fakes::PullTransferTables(c, Ids()); }

  static void ExpectSame(const Snapshot& a, const Snapshot& b) {
    EXPECT_TRUE(testing_fakes::BitEqual(a, b));
  }

  // The tables a pod has (none: nothing was created there).
  static int Tables(const std::string& pod) {
    auto stub =
        ParameterServer::NewStub(grpc::CreateChannel(pod, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    DescribeResponse d;
    EXPECT_TRUE(stub->Describe(&ctx, DescribeRequest(), &d).ok());
    return d.tables_size() + d.dense_size();
  }

  // An export of a trained 1-pod cluster into root_/<name>.
  std::string ExportOnePod(const std::string& name) {
    Pods src = StartPods(1, 16);
    auto client = Connect(src, 1);
    if (client == nullptr) return "";
    CreateAndTrain(*client);
    auto cluster = Discover(src.addresses);
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    if (!cluster.ok()) return "";
    const std::string dir = root_ + "/" + name;
    auto index = ExportCluster(*cluster, dir);
    EXPECT_TRUE(index.ok()) << index.status();
    return dir;
  }

  // Every table row of a full export: (table, id) -> (step, weights and slots).
  static std::map<std::pair<std::string, int64_t>, std::pair<uint64_t, std::vector<float>>>
  ExportedRows(const std::string& dir) {
    std::map<std::pair<std::string, int64_t>, std::pair<uint64_t, std::vector<float>>> rows;
    for (const auto& part : fs::directory_iterator(dir)) {
      if (!part.is_directory()) continue;
      auto m = ReadManifest(part.path());
      EXPECT_TRUE(m.ok()) << m.status();
      if (!m.ok()) continue;
      for (const ExportTableInfo& t : m->tables()) {
        const size_t floats = t.dim() + t.slot_floats();
        for (const ExportFileInfo& f : t.files()) {
          auto r = ExportFileReader::Open((part.path() / f.name()).string());
          EXPECT_TRUE(r.ok()) << r.status();
          if (!r.ok()) continue;
          ExportBlock b;
          while (true) {
            auto more = (*r)->Next(&b);
            EXPECT_TRUE(more.ok()) << more.status();
            if (!more.ok() || !*more) break;
            for (size_t i = 0; i < b.ids.size(); ++i) {
              rows[{t.spec().name(), b.ids[i]}] = {
                  b.steps[i], std::vector<float>(b.values.begin() + i * floats,
                                                 b.values.begin() + (i + 1) * floats)};
            }
          }
        }
      }
    }
    return rows;
  }

  std::string root_;
};

TEST_F(TransferTest, ADeltaImportedOnItsFullExportEqualsANewFullExport) {
  const std::string data = root_ + "/src";
  Pods src = StartPods(2, 32, data);
  auto a = Connect(src, 1);
  ASSERT_NE(a, nullptr);
  CreateAndTrain(*a);
  if (HasFatalFailure()) return;
  auto from = Discover(src.addresses);
  ASSERT_TRUE(from.ok()) << from.status();
  auto full = ExportCluster(*from, root_ + "/e0");
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_EQ(ParseExportCursor(full->cursor())->size(), 2u) << full->cursor();

  // Changes to a few rows (and new ones), then pod 1 restarts: the cursor still holds.
  std::vector<int64_t> few = {Ids()[3], Ids()[70], Ids()[400], 123456789, -5};
  std::vector<float> ga(few.size() * 8, 0.5f), gf(few.size() * 4, -0.25f);
  ASSERT_TRUE(a->Push({{"emb/adam", few, ga.data()}, {"ftrl", few, gf.data()}}).ok());
  // Two rows of each table deleted (as eviction deletes them, on the pod that owns them);
  // one comes back at once, at a lower step than the full export holds.
  const std::vector<int64_t> gone = {Ids()[10], Ids()[11]};
  for (const std::string table : {"emb/adam", "ftrl"}) {
    for (int64_t id : gone) {
      int owners = 0;
      for (auto& server : src.servers) {
        const absl::Status s = server->core().DeleteRows(table, {id});
        if (s.code() == absl::StatusCode::kFailedPrecondition) continue;  // not its vshard
        ASSERT_TRUE(s.ok()) << s;
        ++owners;
      }
      ASSERT_EQ(owners, 1);
    }
  }
  const std::vector<int64_t> back = {Ids()[11]};
  ASSERT_TRUE(a->Push({{"emb/adam", back, ga.data()}, {"ftrl", back, gf.data()}}).ok());
  a.reset();
  src.servers[1].reset();
  PsServerOptions o;
  o.host = "127.0.0.1";
  o.export_root = "/tmp";
  o.core.storage.db.dir = data + "-1";
  auto own = ShardOwnership::FromStaticShard("1/2", 32);
  ASSERT_TRUE(own.ok());
  auto restarted = PsServer::Start(o, *own);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  src.servers[1] = *std::move(restarted);
  src.addresses[1] = absl::StrCat("127.0.0.1:", src.servers[1]->port());
  a = Connect(src, 1);
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->Push({{"emb/adam", few, ga.data()}, {"ftrl", few, gf.data()}}).ok());

  from = Discover(src.addresses);
  ASSERT_TRUE(from.ok()) << from.status();
  ExportClusterOptions since;
  since.since = full->cursor();
  auto delta = ExportCluster(*from, root_ + "/d1", since);
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_EQ(delta->since(), full->cursor());
  uint64_t delta_rows = 0, deleted = 0;
  for (const auto& p : delta->parts()) {
    EXPECT_FALSE(p.whole()) << p.dir();
    delta_rows += p.rows();
    deleted += p.deleted();
  }
  EXPECT_EQ(delta_rows, 2 * few.size() + 2);  // the rows that changed (or came back)
  EXPECT_EQ(deleted, 2 * gone.size());
  auto full1 = ExportCluster(*from, root_ + "/e1");
  ASSERT_TRUE(full1.ok()) << full1.status();

  // Into a cluster of another shape: the full export, then the delta.
  Pods dst = StartPods(3, 64);
  auto to = Discover(dst.addresses);
  ASSERT_TRUE(to.ok()) << to.status();
  ASSERT_TRUE(ImportCluster(*to, root_ + "/e0").ok());
  auto applied = ImportCluster(*to, root_ + "/d1");
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_EQ(applied->rows, delta_rows);
  EXPECT_EQ(applied->deleted_ids, deleted);
  auto copy = ExportCluster(*to, root_ + "/copy");
  ASSERT_TRUE(copy.ok()) << copy.status();
  const auto expected = ExportedRows(root_ + "/e1");
  EXPECT_EQ(expected.count({"ftrl", 123456789}), 1u);  // a row the delta created
  EXPECT_EQ(ExportedRows(root_ + "/copy"), expected);
  ExpectSame(Pull(*Connect(dst, 2)), Pull(*a));

  // In-memory pods keep no journal: their delta is whole, and names no position.
  auto whole = ExportCluster(*to, root_ + "/d2", since);
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (const auto& p : whole->parts()) EXPECT_TRUE(p.whole());
  EXPECT_EQ(whole->cursor(), "v1:");
  // A cursor that is none is refused before any pod is asked.
  since.since = "last tuesday";
  EXPECT_EQ(ExportCluster(*from, root_ + "/d3", since).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(TransferTest, ExportImportsIntoAClusterOfAnotherSizeBitExact) {
  Pods src = StartPods(2, 64);
  auto a = Connect(src, 1);
  ASSERT_NE(a, nullptr);
  CreateAndTrain(*a);
  if (HasFatalFailure()) return;
  const Snapshot before = Pull(*a);

  auto from = Discover(src.addresses);
  ASSERT_TRUE(from.ok()) << from.status();
  EXPECT_EQ(from->num_vshards, 64u);
  const std::string dir = root_ + "/export";
  auto index = ExportCluster(*from, dir);
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ(index->parts_size(), 2);
  EXPECT_EQ(index->num_vshards(), 64u);
  uint64_t exported = 0, dense = 0;
  for (const auto& p : index->parts()) {
    EXPECT_GT(p.rows(), 0u) << "each pod holds rows";
    exported += p.rows();
    dense += p.dense();
    auto manifest = ReadManifest(dir + "/" + p.dir());
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    EXPECT_EQ(manifest->num_vshards(), 64u);
  }
  EXPECT_EQ(exported, uint64_t{2 * kRows});  // every row of both tables, once
  EXPECT_EQ(dense, 1u);
  // A second export into the same directory is refused.
  EXPECT_EQ(ExportCluster(*from, dir).status().code(), absl::StatusCode::kAlreadyExists);

  Pods dst = StartPods(3, 128);
  auto to = Discover(dst.addresses);
  ASSERT_TRUE(to.ok()) << to.status();
  ImportOptions options;
  options.batch_rows = 64;  // several requests per pod
  auto imported = ImportCluster(*to, dir, options);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->parts, 2u);
  EXPECT_EQ(imported->rows, exported);
  EXPECT_EQ(imported->dense, 1u);
  EXPECT_EQ(imported->installed, exported + 1);
  EXPECT_EQ(imported->skipped, 0u);

  auto b = Connect(dst, 2);
  ASSERT_NE(b, nullptr);
  ExpectSame(Pull(*b), before);
  // The same pushes on both clusters: equal results need the slots and steps too.
  Train(*a, 2, 2);
  Train(*b, 2, 2);
  if (HasFatalFailure()) return;
  const Snapshot after_a = Pull(*a);
  EXPECT_FALSE(BitEqual(after_a.adam, before.adam));
  ExpectSame(Pull(*b), after_a);

  // Importing again installs nothing: every row and the tensor are at a later step.
  auto again = ImportCluster(*to, dir, options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->installed, 0u);
  EXPECT_EQ(again->skipped, exported + 1);
  ExpectSame(Pull(*b), after_a);

  // One part alone is an import too: into a single pod of 16 vshards.
  Pods one = StartPods(1, 16);
  auto single = Discover(one.addresses);
  ASSERT_TRUE(single.ok()) << single.status();
  auto part = ImportCluster(*single, dir + "/" + index->parts(1).dir());
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(part->parts, 1u);
  EXPECT_EQ(part->rows, index->parts(1).rows());
  EXPECT_EQ(part->installed, index->parts(1).rows() + index->parts(1).dense());
}

TEST_F(TransferTest, DiscoverRefusesAnIncompleteOrAmbiguousTarget) {
  Pods pods = StartPods(2, 32);
  auto only_one = Discover({pods.addresses[0]});  // nobody owns the second half
  EXPECT_EQ(only_one.status().code(), absl::StatusCode::kFailedPrecondition) << only_one.status();
  auto twice = Discover({pods.addresses[0], pods.addresses[1], pods.addresses[0]});
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kFailedPrecondition) << twice.status();
  Pods other = StartPods(1, 64);
  auto mixed = Discover({pods.addresses[0], other.addresses[0]});
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kFailedPrecondition) << mixed.status();
  ClusterTarget both;
  both.master = "127.0.0.1:1";
  both.servers = pods.addresses;
  EXPECT_EQ(DiscoverCluster(both).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DiscoverCluster(ClusterTarget()).status().code(), absl::StatusCode::kInvalidArgument);
}

// Damaged and incomplete exports are found by the check that reads every file first
// (ImportOptions::verify_first): the import fails and the target receives no call that
// changes it. Damage is DATA_LOSS; a file or part that is missing altogether is NOT_FOUND.
TEST_F(TransferTest, RefusesADamagedOrIncompleteExportBeforeSendingAnything) {
  const std::string good = ExportOnePod("good");
  ASSERT_FALSE(good.empty());
  const std::string table_file = "/part-0/table-0000-00000.psx";
  const std::string dense_file = "/part-0/dense-0000.psx";
  ASSERT_TRUE(fs::exists(good + table_file));
  ASSERT_TRUE(fs::exists(good + dense_file));

  // A copy of the export with one change.
  int copies = 0;
  auto damaged = [&](const std::function<void(const std::string& dir)>& change) {
    const std::string dir = absl::StrCat(root_, "/copy-", copies++);
    fs::copy(good, dir, fs::copy_options::recursive);
    change(dir);
    return dir;
  };
  auto flip_middle_byte = [](const std::string& file) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const std::streamoff at = f.tellg() / 2;
    f.seekg(at);
    const char c = static_cast<char>(f.get());
    f.seekp(at);
    f.put(static_cast<char>(c ^ 0x01));
  };
  auto cut = [](const std::string& file, uintmax_t bytes) {
    fs::resize_file(file, fs::file_size(file) - bytes);
  };
  const struct {
    std::string what;
    std::string dir;
    absl::StatusCode code;
  } cases[] = {
      {"a flipped byte in a table file",
       damaged([&](const std::string& d) { flip_middle_byte(d + table_file); }),
       absl::StatusCode::kDataLoss},
      {"a flipped byte in the dense file",
       damaged([&](const std::string& d) { flip_middle_byte(d + dense_file); }),
       absl::StatusCode::kDataLoss},
      // The end block (16 bytes) missing: the file was cut short at a block boundary.
      {"a table file without its end block",
       damaged([&](const std::string& d) { cut(d + table_file, 16); }),
       absl::StatusCode::kDataLoss},
      {"a table file cut mid-block",
       damaged([&](const std::string& d) { cut(d + table_file, 100); }),
       absl::StatusCode::kDataLoss},
      {"a missing table file", damaged([&](const std::string& d) { fs::remove(d + table_file); }),
       absl::StatusCode::kNotFound},
      {"a missing part", damaged([&](const std::string& d) { fs::remove_all(d + "/part-0"); }),
       absl::StatusCode::kNotFound},
      {"a damaged manifest", damaged([&](const std::string& d) {
         std::ofstream(d + "/part-0/manifest.json", std::ios::trunc) << "{ not json";
       }),
       absl::StatusCode::kDataLoss},
  };

  Pods dst = StartPods(2, 32);
  FlakyPod p0(dst.addresses[0]), p1(dst.addresses[1]);
  auto to = Discover({p0.address(), p1.address()});
  ASSERT_TRUE(to.ok()) << to.status();
  for (const auto& c : cases) {
    auto result = ImportCluster(*to, c.dir);
    EXPECT_EQ(result.status().code(), c.code) << c.what << ": " << result.status();
  }
  EXPECT_EQ(p0.writes() + p1.writes(), 0);
  EXPECT_EQ(Tables(dst.addresses[0]) + Tables(dst.addresses[1]), 0);

  // The intact export goes through the same stand-ins.
  auto result = ImportCluster(*to, good);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->installed, uint64_t{2 * kRows + 1});
}

TEST_F(TransferTest, RefusesWhatIsNotAnExportOrDisagreesWithTheTarget) {
  const std::string good = ExportOnePod("good");
  ASSERT_FALSE(good.empty());
  Pods dst = StartPods(1, 16);
  auto to = Discover(dst.addresses);
  ASSERT_TRUE(to.ok()) << to.status();

  fs::create_directories(root_ + "/empty");
  EXPECT_EQ(ImportCluster(*to, root_ + "/empty").status().code(), absl::StatusCode::kNotFound);

  auto manifest_says = [&](const std::string& name, const std::string& json) {
    fs::create_directories(root_ + "/" + name);
    std::ofstream(root_ + "/" + name + "/manifest.json") << json;
    return ReadManifest(root_ + "/" + name).status().code();
  };
  EXPECT_EQ(manifest_says("other", R"({"format": "other", "version": 1})"),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(manifest_says("newer", R"({"format": "ps-export", "version": 2})"),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(manifest_says("garbage", "]"), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(ReadManifest(good + "/part-0").ok());

  // The target already has a table of that name with another spec.
  auto client = Connect(dst, 1);
  ASSERT_NE(client, nullptr);
  TableSpec other = AdamSpec();
  other.set_dim(16);
  ASSERT_TRUE(client->CreateTable(other).ok());
  EXPECT_EQ(ImportCluster(*to, good).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(TransferTest, RetriesRetryableErrors) {
  Pods src = StartPods(1, 16);
  auto a = Connect(src, 1);
  ASSERT_NE(a, nullptr);
  CreateAndTrain(*a);
  if (HasFatalFailure()) return;
  const Snapshot before = Pull(*a);

  // The export: the pod's first answer is UNAVAILABLE (another export running, say).
  FlakyPod source(src.addresses[0]);
  auto from = Discover({source.address()});
  ASSERT_TRUE(from.ok()) << from.status();
  source.FailNext("Export", {grpc::StatusCode::UNAVAILABLE});
  const std::string dir = root_ + "/export";
  auto index = ExportCluster(*from, dir);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(source.calls("Export"), 2);

  // The import: creations and row batches fail with each retryable code first.
  Pods dst = StartPods(2, 32);
  FlakyPod p0(dst.addresses[0]), p1(dst.addresses[1]);
  auto to = Discover({p0.address(), p1.address()});
  ASSERT_TRUE(to.ok()) << to.status();
  p0.FailNext("CreateTable", {grpc::StatusCode::UNAVAILABLE});
  p1.FailNext("CreateDense", {grpc::StatusCode::DEADLINE_EXCEEDED});
  p0.FailNext("ImportRows", {grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::ABORTED,
                             grpc::StatusCode::DEADLINE_EXCEEDED});
  p1.FailNext("ImportRows", {grpc::StatusCode::ABORTED});
  ImportOptions options;
  options.batch_rows = 100;
  auto imported = ImportCluster(*to, dir, options);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->installed, uint64_t{2 * kRows + 1});
  EXPECT_EQ(p0.calls("CreateTable"), 2 + 1);  // two tables, one retried
  EXPECT_EQ(p1.calls("CreateDense"), 1 + 1);
  const int batches = p0.calls("ImportRows") - 3 + p1.calls("ImportRows") - 1;
  // Per table and pod, ceil(rows / 100) batches; the tensor one more.
  EXPECT_GE(batches, 2 * kRows / 100 + 1);

  auto b = Connect(dst, 2);
  ASSERT_NE(b, nullptr);
  ExpectSame(Pull(*b), before);
}

TEST_F(TransferTest, OtherErrorsAndExhaustedAttemptsFail) {
  const std::string dir = ExportOnePod("export");
  ASSERT_FALSE(dir.empty());
  Pods dst = StartPods(1, 16);
  FlakyPod pod(dst.addresses[0]);
  auto to = Discover({pod.address()});
  ASSERT_TRUE(to.ok()) << to.status();
  ImportOptions options;
  options.inflight = 1;
  options.batch_rows = 100;
  options.max_attempts = 3;

  // Not retryable: the first error ends the import; nothing queued after it is sent.
  pod.FailNext("ImportRows", {grpc::StatusCode::INVALID_ARGUMENT});
  auto refused = ImportCluster(*to, dir, options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("ImportRows on " + pod.address()), std::string::npos)
      << refused.status();
  EXPECT_EQ(pod.calls("ImportRows"), 1);

  // Retryable, but failing every attempt.
  pod.FailNext("ImportRows", {grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::UNAVAILABLE,
                              grpc::StatusCode::UNAVAILABLE});
  auto unavailable = ImportCluster(*to, dir, options);
  EXPECT_EQ(unavailable.status().code(), absl::StatusCode::kUnavailable) << unavailable.status();
  EXPECT_EQ(pod.calls("ImportRows"), 1 + 3);
}

}  // namespace
}  // namespace ps
