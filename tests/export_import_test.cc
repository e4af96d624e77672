// Portable export and import between clusters of different shapes (real processes on
// loopback): a 2-pod cluster of 64 vshards trains Adam and FTRL tables and an Adam dense
// tensor; ps-transfer exports it and imports it into a fresh 3-pod cluster of 128
// vshards. Every row must then be bit-exact, and an identical further push must give
// bit-exact identical results on both clusters, which proves optimizer slots and per-row
// steps moved too. The imported rows survive a SIGKILL of a target pod.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/ps_client.h"
#include "gtest/gtest.h"
#include "tests/process.h"

#ifndef PS_SERVER_BINARY
#error "PS_SERVER_BINARY must be defined"
#endif
#ifndef PS_TRANSFER_BINARY
#error "PS_TRANSFER_BINARY must be defined"
#endif

namespace ps {
namespace {

using integration::ChildProcess;

constexpr int kRows = 3000;

TableSpec AdamSpec() {
  TableSpec t;
  t.set_name("emb/adam");
  t.set_dim(8);
  t.mutable_initializer()->set_kind(InitializerSpec::NORMAL);
  t.mutable_initializer()->set_stddev(0.1f);
  t.mutable_initializer()->set_seed(3);
  t.mutable_optimizer()->set_kind(OptimizerSpec::ADAM);
  t.mutable_optimizer()->set_learning_rate(0.01f);
  return t;
}

TableSpec FtrlSpec() {
  TableSpec t;
  t.set_name("ftrl");
  t.set_dim(4);
  t.mutable_optimizer()->set_kind(OptimizerSpec::FTRL);
  t.mutable_optimizer()->set_learning_rate(0.05f);
  t.mutable_optimizer()->set_ftrl_l1(0.001f);
  return t;
}

DenseSpec DenseW() {
  DenseSpec d;
  d.set_name("mlp/w");
  d.add_shape(3);
  d.add_shape(5);
  d.mutable_initializer()->set_kind(InitializerSpec::UNIFORM);
  d.mutable_initializer()->set_low(-1);
  d.mutable_initializer()->set_high(1);
  d.mutable_optimizer()->set_kind(OptimizerSpec::ADAM);
  return d;
}

// A cluster of n durable pods with a static map of `vshards`.
class Cluster {
 public:
  Cluster(std::string root, std::string name, size_t n, uint32_t vshards)
      : root_(std::move(root)), name_(std::move(name)), n_(n), vshards_(vshards) {
    pods_.resize(n);
    ports_.resize(n);
  }
  ~Cluster() {
    for (auto& p : pods_) {
      if (p != nullptr) p->Stop();
    }
  }

  std::string File(size_t i, const char* what) const {
    return absl::StrCat(root_, "/", name_, "-", i, what);
  }

  absl::Status Start(size_t i) {
    pods_[i].reset();
    unlink(File(i, ".port").c_str());
    std::vector<std::string> argv = {PS_SERVER_BINARY,
                                     "--host=127.0.0.1",
                                     "--port=0",
                                     absl::StrCat("--port_file=", File(i, ".port")),
                                     absl::StrCat("--shard=", i, "/", n_),
                                     absl::StrCat("--num_vshards=", vshards_),
                                     absl::StrCat("--data_dir=", File(i, ".db")),
                                     absl::StrCat("--export_root=", root_),
                                     "--materialize_ms=300",
                                     "--shutdown_grace_ms=1000"};
    auto child = ChildProcess::Start(argv, File(i, ".log"));
    if (!child.ok()) return child.status();
    pods_[i] = std::move(child).value();
    auto port = integration::WaitForPortFile(File(i, ".port"), *pods_[i], absl::Seconds(30));
    if (!port.ok()) return port.status();
    ports_[i] = *port;
    return absl::OkStatus();
  }

  absl::Status StartAll() {
    for (size_t i = 0; i < n_; ++i) {
      if (absl::Status s = Start(i); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  void Kill(size_t i) { pods_[i]->Kill(); }

  std::string Servers() const {
    std::vector<std::string> a;
    for (int p : ports_) a.push_back(absl::StrCat("127.0.0.1:", p));
    return absl::StrJoin(a, ",");
  }

  absl::StatusOr<std::unique_ptr<PsClient>> Connect(uint64_t worker_id) const {
    ClientOptions o;
    for (int p : ports_) o.servers.push_back(absl::StrCat("127.0.0.1:", p));
    o.num_vshards = vshards_;
    o.worker_id = worker_id;
    return PsClient::Connect(o);
  }

  std::string Logs() const {
    std::string out;
    for (size_t i = 0; i < n_; ++i) {
      absl::StrAppend(&out, "---- ", name_, "-", i, ":\n", integration::FileTail(File(i, ".log")));
    }
    return out;
  }

 private:
  std::string root_, name_;
  size_t n_;
  uint32_t vshards_;
  std::vector<std::unique_ptr<ChildProcess>> pods_;
  std::vector<int> ports_;
};

// Runs ps-transfer; returns its exit code and puts its output in *out.
int RunTransfer(const std::vector<std::string>& args, const std::string& log, std::string* out) {
  std::vector<std::string> argv = {PS_TRANSFER_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  auto child = ChildProcess::Start(argv, log);
  if (!child.ok()) return -1;
  if (!(*child)->WaitExit(absl::Seconds(60))) return -2;
  *out = integration::FileTail(log, 2000);
  const std::string d = (*child)->Describe();
  const size_t at = d.find("exited with code ");
  return at == std::string::npos ? -3 : std::atoi(d.c_str() + at + 17);
}

// The number after "key": in the last JSON line of a tool's output (0 if absent).
uint64_t JsonNumber(const std::string& out, const std::string& key) {
  const size_t at = out.rfind("\"" + key + "\":");
  return at == std::string::npos ? 0
                                 : std::strtoull(out.c_str() + at + key.size() + 3, nullptr, 10);
}

std::vector<int64_t> Ids() {
  std::vector<int64_t> ids;
  for (int i = 0; i < kRows; ++i) ids.push_back(int64_t{i} * 7919 - 1000000);
  return ids;
}

// Pulls every id of both tables and the dense tensor, as raw floats.
struct Snapshot {
  std::vector<float> adam, ftrl, dense;
};
Snapshot Pull(PsClient& c) {
  const std::vector<int64_t> ids = Ids();
  Snapshot s;
  s.adam.resize(ids.size() * 8);
  s.ftrl.resize(ids.size() * 4);
  s.dense.resize(15);
  EXPECT_TRUE(c.Pull({{"emb/adam", ids, s.adam.data()}, {"ftrl", ids, s.ftrl.data()}}).ok());
  EXPECT_TRUE(c.PullDense({"mlp/w"}, {s.dense.data()}).ok());
  return s;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One round of pushes over a subset of the ids, the same for a given seed.
void Train(PsClient& c, uint32_t seed, int rounds) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g;
  const std::vector<int64_t> all = Ids();
  for (int r = 0; r < rounds; ++r) {
    std::vector<int64_t> ids;
    for (int64_t id : all) {
      if (rng() % 3 != 0) ids.push_back(id);  // rows get different step counts
    }
    std::vector<float> ga(ids.size() * 8), gf(ids.size() * 4), gd(15);
    for (float& x : ga) x = g(rng);
    for (float& x : gf) x = g(rng);
    for (float& x : gd) x = g(rng);
    ASSERT_TRUE(c.Push({{"emb/adam", ids, ga.data()}, {"ftrl", ids, gf.data()}}).ok());
    ASSERT_TRUE(c.PushDense({"mlp/w"}, {gd.data()}).ok());
  }
}

TEST(ExportImportTest, TwoPodsToThreePodsBitExact) {
  integration::TempDir tmp("export_import_test");
  ASSERT_FALSE(tmp.path().empty());
  Cluster src(tmp.path(), "src", 2, 64);
  ASSERT_TRUE(src.StartAll().ok()) << src.Logs();
  auto a = src.Connect(1);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE((*a)->CreateTable(AdamSpec()).ok());
  ASSERT_TRUE((*a)->CreateTable(FtrlSpec()).ok());
  ASSERT_TRUE((*a)->CreateDense(DenseW()).ok());
  Train(**a, 1, 4);
  if (HasFatalFailure()) return;
  const Snapshot before = Pull(**a);

  const std::string dir = tmp.path() + "/export";
  std::string out;
  ASSERT_EQ(RunTransfer({"--servers=" + src.Servers(), "--dir=" + dir, "export"},
                        tmp.path() + "/export.log", &out),
            0)
      << out << src.Logs();
  // Rows that were only pulled (never pushed) hold their initial value and are not stored,
  // so a durable pod exports the pushed rows: nearly all of them here.
  const uint64_t exported = JsonNumber(out, "rows");
  EXPECT_GT(exported, uint64_t{2 * kRows * 9 / 10}) << out;
  // A second export into the same directory is refused.
  EXPECT_EQ(RunTransfer({"--servers=" + src.Servers(), "--dir=" + dir, "export"},
                        tmp.path() + "/export2.log", &out),
            1)
      << out;

  Cluster dst(tmp.path(), "dst", 3, 128);
  ASSERT_TRUE(dst.StartAll().ok()) << dst.Logs();
  ASSERT_EQ(RunTransfer({"--servers=" + dst.Servers(), "--dir=" + dir, "import"},
                        tmp.path() + "/import.log", &out),
            0)
      << out << dst.Logs();
  EXPECT_EQ(JsonNumber(out, "installed"), exported + 1) << out;  // + the dense tensor

  auto b = dst.Connect(2);
  ASSERT_TRUE(b.ok()) << b.status();
  const Snapshot imported = Pull(**b);
  EXPECT_TRUE(BitEqual(imported.adam, before.adam));
  EXPECT_TRUE(BitEqual(imported.ftrl, before.ftrl));
  EXPECT_TRUE(BitEqual(imported.dense, before.dense));

  // The same pushes on both clusters: equal results need the slots and steps too.
  Train(**a, 2, 2);
  Train(**b, 2, 2);
  if (HasFatalFailure()) return;
  const Snapshot after_a = Pull(**a);
  const Snapshot after_b = Pull(**b);
  EXPECT_FALSE(BitEqual(after_a.adam, before.adam));
  EXPECT_TRUE(BitEqual(after_a.adam, after_b.adam));
  EXPECT_TRUE(BitEqual(after_a.ftrl, after_b.ftrl));
  EXPECT_TRUE(BitEqual(after_a.dense, after_b.dense));

  // Importing again installs nothing: every row is already at a later step.
  ASSERT_EQ(RunTransfer({"--servers=" + dst.Servers(), "--dir=" + dir, "import"},
                        tmp.path() + "/import2.log", &out),
            0)
      << out;
  EXPECT_NE(out.find("\"installed\":0,"), std::string::npos) << out;

  // The installs and later pushes are durable: SIGKILL every target pod and restart it.
  b->reset();
  for (size_t i = 0; i < 3; ++i) {
    dst.Kill(i);
    ASSERT_TRUE(dst.Start(i).ok()) << dst.Logs();
  }
  auto b2 = dst.Connect(3);
  ASSERT_TRUE(b2.ok()) << b2.status();
  const Snapshot recovered = Pull(**b2);
  EXPECT_TRUE(BitEqual(recovered.adam, after_a.adam));
  EXPECT_TRUE(BitEqual(recovered.ftrl, after_a.ftrl));
  EXPECT_TRUE(BitEqual(recovered.dense, after_a.dense));
}

TEST(ExportImportTest, DamagedExportInstallsNothing) {
  integration::TempDir tmp("export_import_damaged");
  ASSERT_FALSE(tmp.path().empty());
  Cluster src(tmp.path(), "src", 1, 16);
  ASSERT_TRUE(src.StartAll().ok()) << src.Logs();
  auto a = src.Connect(1);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE((*a)->CreateTable(AdamSpec()).ok());
  ASSERT_TRUE((*a)->CreateTable(FtrlSpec()).ok());
  ASSERT_TRUE((*a)->CreateDense(DenseW()).ok());
  Train(**a, 5, 1);
  const std::string dir = tmp.path() + "/export";
  std::string out;
  ASSERT_EQ(RunTransfer({"--servers=" + src.Servers(), "--dir=" + dir, "export"},
                        tmp.path() + "/export.log", &out),
            0)
      << out;
  // Flip one byte in the middle of the first table file.
  const std::string file = dir + "/part-0/table-0000-00000.psx";
  FILE* f = std::fopen(file.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  std::fseek(f, 0, SEEK_END);
  const long size = std::ftell(f);
  std::fseek(f, size / 2, SEEK_SET);
  const int c = std::fgetc(f);
  std::fseek(f, size / 2, SEEK_SET);
  std::fputc(c ^ 0x01, f);
  std::fclose(f);

  Cluster dst(tmp.path(), "dst", 2, 32);
  ASSERT_TRUE(dst.StartAll().ok()) << dst.Logs();
  EXPECT_EQ(RunTransfer({"--servers=" + dst.Servers(), "--dir=" + dir, "import"},
                        tmp.path() + "/import.log", &out),
            1);
  EXPECT_NE(out.find("DATA_LOSS"), std::string::npos) << out;
  auto b = dst.Connect(2);
  ASSERT_TRUE(b.ok()) << b.status();
  auto stats = (*b)->Stats();
  ASSERT_TRUE(stats.ok());
  for (const StatsResponse& s : *stats) EXPECT_EQ(s.rows(), 0u);  // nothing installed
}

}  // namespace
}  // namespace ps
