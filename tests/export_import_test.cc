// Portable export and import between clusters of different shapes (real processes on
// loopback): a 2-pod cluster of 64 vshards trains Adam and FTRL tables and an Adam dense
// tensor; ps-transfer exports it and imports it into a fresh 3-pod cluster of 128
// vshards. Every row must then be bit-exact, and an identical further push must give
// bit-exact identical results on both clusters, which proves optimizer slots and per-row
// steps moved too. The imported rows survive a SIGKILL of a target pod. Incremental:
// `ps-transfer export --since=CURSOR` after a SIGKILL of a source pod writes only what
// changed, its import on top of the full export gives the source's rows (also from a
// cursor the pod's change journal has since merged into a larger range), and a cursor
// older than a pod's change journal is refused.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/ps_client.h"
#include "client/test_fakes.h"
#include "gtest/gtest.h"
#include "proto/export.pb.h"
#include "proto/export_file.h"
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
using testing_fakes::BitEqual;
using testing_fakes::CreateTransferTables;
using testing_fakes::FtrlSpec;

constexpr int kRows = 3000;

// Runs ps-transfer; returns its exit code and puts its output in *out.
int RunTransfer(const std::vector<std::string>& args, const std::string& log, std::string* out) {
  std::vector<std::string> argv = {PS_TRANSFER_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  auto child = ChildProcess::Start(argv, log);
  if (!child.ok()) return -1;
  if (!(*child)->WaitExit(absl::Seconds(60))) return -2;
  *out = integration::FileTail(log, 8000);
  const std::string d = (*child)->Describe();
  const size_t at = d.find("exited with code ");
  return at == std::string::npos ? -3 : std::atoi(d.c_str() + at + 17);
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

  // Flags every pod gets on top of the defaults (from the next Start on).
  void AddFlag(std::string flag) { extra_.push_back(std::move(flag)); }

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
    argv.insert(argv.end(), extra_.begin(), extra_.end());
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

  // SIGKILLs pod i and starts it again on its disk.
  absl::Status Restart(size_t i) {
    Kill(i);
    return Start(i);
  }

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

  // Runs `ps-transfer VERB` on this cluster with --dir=`dir` (and --since=`since` if
  // given), its log in a file of its own; returns its exit code and puts its output in *out.
  int Transfer(const std::string& verb, const std::string& dir, std::string* out,
               const std::string& since = "") {
    std::vector<std::string> args = {"--servers=" + Servers(), "--dir=" + dir};
    if (!since.empty()) args.push_back("--since=" + since);
    args.push_back(verb);
    return RunTransfer(args, absl::StrCat(root_, "/", name_, "-transfer-", ++transfers_, ".log"),
                       out);
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
  std::vector<std::string> extra_;
  int transfers_ = 0;
};

// The number after "key": in the last JSON line of a tool's output (0 if absent).
uint64_t JsonNumber(const std::string& out, const std::string& key) {
  const size_t at = out.rfind("\"" + key + "\":");
  return at == std::string::npos ? 0
                                 : std::strtoull(out.c_str() + at + key.size() + 3, nullptr, 10);
}

// The string after "key": in the last JSON line of a tool's output ("" if absent).
std::string JsonString(const std::string& out, const std::string& key) {
  const size_t at = out.rfind("\"" + key + "\":\"");
  if (at == std::string::npos) return "";
  const size_t from = at + key.size() + 4;
  return out.substr(from, out.find('"', from) - from);
}

std::vector<int64_t> Ids() {
  std::vector<int64_t> ids;
  for (int i = 0; i < kRows; ++i) ids.push_back(int64_t{i} * 7919 - 1000000);
  return ids;
}

// Every row of Ids() and the dense tensor.
using Snapshot = testing_fakes::TransferSnapshot;
Snapshot Pull(PsClient& c) { return testing_fakes::PullTransferTables(c, Ids()); }

// Rounds of pushes over Ids(), the same for a given seed.
void Train(PsClient& c, uint32_t seed, int rounds) {
  testing_fakes::TrainTransferTables(c, Ids(), seed, rounds);
}

// Starts `src`, connects worker 1 to it (*a), creates both tables and the dense tensor and
// trains them `rounds` rounds from `seed`.
void StartTrained(Cluster& src, uint32_t seed, int rounds, std::unique_ptr<PsClient>* a) {
  ASSERT_TRUE(src.StartAll().ok()) << src.Logs();
  auto c = src.Connect(1);
  ASSERT_TRUE(c.ok()) << c.status();
  *a = *std::move(c);
  CreateTransferTables(**a);
  Train(**a, seed, rounds);
}

// Imports the full export <tmp>/full, then the delta <tmp>/delta, into a fresh 1-pod
// cluster `dst` (started here) and pulls everything from it into *imported.
void ImportFullThenDelta(const std::string& tmp, Cluster& dst, Snapshot* imported) {
  ASSERT_TRUE(dst.StartAll().ok()) << dst.Logs();
  std::string out;
  for (const char* dir : {"/full", "/delta"}) {
    ASSERT_EQ(dst.Transfer("import", tmp + dir, &out), 0) << out << dst.Logs();
  }
  auto b = dst.Connect(3);
  ASSERT_TRUE(b.ok()) << b.status();
  *imported = Pull(**b);
}

// Each test in a run directory of its own.
class ExportImportTest : public testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(tmp_.path().empty()) << "mkdtemp failed"; }

  // The delta tests' start: `src` started and trained (StartTrained, seed 1, 2 rounds;
  // the client in *a), then exported whole into <run dir>/full: its output in *out, its
  // cursor (which must be one) in *cursor.
  void StartTrainedAndExportFull(Cluster& src, std::unique_ptr<PsClient>* a, std::string* out,
                                 std::string* cursor) {
    StartTrained(src, 1, 2, a);
    if (HasFatalFailure()) return;
    ASSERT_EQ(src.Transfer("export", tmp_.path() + "/full", out), 0) << *out << src.Logs();
    *cursor = JsonString(*out, "cursor");
    ASSERT_EQ(cursor->rfind("v1:", 0), 0u) << *out;
  }

  integration::TempDir tmp_{std::string("export_import.") +
                            testing::UnitTest::GetInstance()->current_test_info()->name()};
};

TEST_F(ExportImportTest, TwoPodsToThreePodsBitExact) {
  Cluster src(tmp_.path(), "src", 2, 64);
  std::unique_ptr<PsClient> a;
  StartTrained(src, 1, 4, &a);
  if (HasFatalFailure()) return;
  const Snapshot before = Pull(*a);

  const std::string dir = tmp_.path() + "/export";
  std::string out;
  ASSERT_EQ(src.Transfer("export", dir, &out), 0) << out << src.Logs();
  // Rows that were only pulled (never pushed) hold their initial value and are not stored,
  // so a durable pod exports the pushed rows: nearly all of them here.
  const uint64_t exported = JsonNumber(out, "rows");
  EXPECT_GT(exported, uint64_t{2 * kRows * 9 / 10}) << out;
  // A second export into the same directory is refused.
  EXPECT_EQ(src.Transfer("export", dir, &out), 1) << out;

  Cluster dst(tmp_.path(), "dst", 3, 128);
  ASSERT_TRUE(dst.StartAll().ok()) << dst.Logs();
  ASSERT_EQ(dst.Transfer("import", dir, &out), 0) << out << dst.Logs();
  EXPECT_EQ(JsonNumber(out, "installed"), exported + 1) << out;  // + the dense tensor

  auto b = dst.Connect(2);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(BitEqual(Pull(**b), before));

  // The same pushes on both clusters: equal results need the slots and steps too.
  Train(*a, 2, 2);
  Train(**b, 2, 2);
  if (HasFatalFailure()) return;
  const Snapshot after_a = Pull(*a);
  EXPECT_FALSE(BitEqual(after_a.adam, before.adam));
  EXPECT_TRUE(BitEqual(Pull(**b), after_a));

  // Importing again installs nothing: every row is already at a later step.
  ASSERT_EQ(dst.Transfer("import", dir, &out), 0) << out;
  EXPECT_NE(out.find("\"installed\":0,"), std::string::npos) << out;

  // The installs and later pushes are durable: SIGKILL every target pod and restart it.
  b->reset();
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(dst.Restart(i).ok()) << dst.Logs();
  auto b2 = dst.Connect(3);
  ASSERT_TRUE(b2.ok()) << b2.status();
  EXPECT_TRUE(BitEqual(Pull(**b2), after_a));
}

TEST_F(ExportImportTest, DamagedExportInstallsNothing) {
  Cluster src(tmp_.path(), "src", 1, 16);
  std::unique_ptr<PsClient> a;
  StartTrained(src, 5, 1, &a);
  if (HasFatalFailure()) return;
  const std::string dir = tmp_.path() + "/export";
  std::string out;
  ASSERT_EQ(src.Transfer("export", dir, &out), 0) << out;
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

  Cluster dst(tmp_.path(), "dst", 2, 32);
  ASSERT_TRUE(dst.StartAll().ok()) << dst.Logs();
  EXPECT_EQ(dst.Transfer("import", dir, &out), 1);
  EXPECT_NE(out.find("DATA_LOSS"), std::string::npos) << out;
  auto b = dst.Connect(2);
  ASSERT_TRUE(b.ok()) << b.status();
  auto stats = (*b)->Stats();
  ASSERT_TRUE(stats.ok());
  for (const StatsResponse& s : *stats) EXPECT_EQ(s.rows(), 0u);  // nothing installed
}

// Rewrites a table file of an export as an older version could have written it: record
// id's float k (weights, then slots) becomes v for each {id, {k, v}} of `bad`, and the
// part's manifest is updated to match (bytes, checksum).
void Poison(const std::string& part, const std::string& file,
            const std::map<int64_t, std::pair<size_t, float>>& bad) {
  const std::string path = part + "/" + file;
  auto reader = ExportFileReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const uint32_t dim = (*reader)->dim(), slots = (*reader)->slot_floats();
  const std::string spec = (*reader)->spec_bytes();
  std::vector<int64_t> ids;
  std::vector<uint64_t> steps;
  std::vector<float> values;
  ExportBlock block;
  for (;;) {
    auto more = (*reader)->Next(&block);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    ids.insert(ids.end(), block.ids.begin(), block.ids.end());
    steps.insert(steps.end(), block.steps.begin(), block.steps.end());
    values.insert(values.end(), block.values.begin(), block.values.end());
  }
  reader->reset();
  ASSERT_EQ(std::remove(path.c_str()), 0);
  auto writer = ExportFileWriter::Create(path, ExportKind::kTableRows, spec, dim, slots);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (size_t i = 0; i < ids.size(); ++i) {
    float* v = values.data() + i * (dim + slots);
    if (auto it = bad.find(ids[i]); it != bad.end()) v[it->second.first] = it->second.second;
    ASSERT_TRUE((*writer)->Add(ids[i], steps[i], v, v + dim).ok());
  }
  auto summary = (*writer)->Finish();
  ASSERT_TRUE(summary.ok()) << summary.status();
  std::ifstream in(part + "/manifest.json");
  std::stringstream json;
  json << in.rdbuf();
  ExportManifest manifest;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json.str(), &manifest).ok());
  for (ExportTableInfo& t : *manifest.mutable_tables()) {
    for (ExportFileInfo& f : *t.mutable_files()) {
      if (f.name() != file) continue;
      f.set_bytes(summary->bytes);
      f.set_crc32c(summary->crc32c);
    }
  }
  std::string out;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(manifest, &out).ok());
  std::ofstream(part + "/manifest.json", std::ios::trunc) << out;
}

// Issue 15, item 3: an import refused a whole batch for one non-finite row, good rows
// included. An export made before updates saturated may hold such rows (here written into
// the export's files): ps-transfer import installs every other row, skips those, counts
// them ("invalid") and names them.
TEST_F(ExportImportTest, RowsNoUpdateCouldLeaveAreSkippedAndNamed) {
  Cluster src(tmp_.path(), "src", 1, 16);
  ASSERT_TRUE(src.StartAll().ok()) << src.Logs();
  auto a = src.Connect(1);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE((*a)->CreateTable(FtrlSpec()).ok());
  const std::vector<int64_t> ids = Ids();
  std::vector<float> grads(ids.size() * 4, 0.25f);
  ASSERT_TRUE((*a)->Push({{"ftrl", ids, grads.data()}}).ok());
  std::vector<float> before(ids.size() * 4);
  ASSERT_TRUE((*a)->Pull({{"ftrl", ids, before.data()}}).ok());
  const std::string dir = tmp_.path() + "/export";
  std::string out;
  ASSERT_EQ(src.Transfer("export", dir, &out), 0) << out << src.Logs();
  ASSERT_EQ(JsonNumber(out, "rows"), ids.size()) << out;
  // A dim-4 FTRL row is 4 weights, then z (4), then n (4): a NaN z, a negative n, a
  // weight beyond ±1e15.
  const std::map<int64_t, std::pair<size_t, float>> bad = {
      {ids[10], {4, std::nanf("")}}, {ids[20], {9, -1.0f}}, {ids[30], {2, 1e20f}}};
  Poison(dir + "/part-0", "table-0000-00000.psx", bad);
  if (HasFatalFailure()) return;

  Cluster dst(tmp_.path(), "dst", 2, 32);
  ASSERT_TRUE(dst.StartAll().ok()) << dst.Logs();
  ASSERT_EQ(dst.Transfer("import", dir, &out), 0) << out << dst.Logs();
  EXPECT_EQ(JsonNumber(out, "invalid"), 3u) << out;
  EXPECT_EQ(JsonNumber(out, "installed"), ids.size() - 3) << out;
  for (const std::string& named :
       {absl::StrCat("table 'ftrl' id ", ids[10], ": slot0[0] = nan"),
        absl::StrCat("table 'ftrl' id ", ids[20], ": slot1[1] = -1 is a negative accumulator"),
        absl::StrCat("table 'ftrl' id ", ids[30], ": weight[2] = 1e+20")}) {
    EXPECT_NE(out.find(named), std::string::npos) << named << "\n" << out;
  }
  auto b = dst.Connect(2);
  ASSERT_TRUE(b.ok()) << b.status();
  std::vector<float> after(ids.size() * 4);
  ASSERT_TRUE((*b)->Pull({{"ftrl", ids, after.data()}}).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    for (size_t j = 0; j < 4; ++j) {
      ASSERT_TRUE(std::isfinite(after[i * 4 + j])) << ids[i];
      if (bad.count(ids[i]) == 0) {
        ASSERT_EQ(after[i * 4 + j], before[i * 4 + j]) << ids[i];
      }
    }
  }
}

TEST_F(ExportImportTest, DeltaSinceACursorAfterAKillAppliesOnTheFullExport) {
  Cluster src(tmp_.path(), "src", 2, 32);
  std::unique_ptr<PsClient> a;
  std::string out, cursor;
  StartTrainedAndExportFull(src, &a, &out, &cursor);
  if (HasFatalFailure()) return;
  const uint64_t full_rows = JsonNumber(out, "rows");

  // A few rows change; pod 0 is killed and restarts from its disk.
  const std::vector<int64_t> few = {Ids()[1], Ids()[500], Ids()[2999], 77777777};
  std::vector<float> ga(few.size() * 8, 0.5f), gf(few.size() * 4, 0.5f);
  ASSERT_TRUE(a->Push({{"emb/adam", few, ga.data()}, {"ftrl", few, gf.data()}}).ok());
  a.reset();
  ASSERT_TRUE(src.Restart(0).ok()) << src.Logs();
  auto a2 = src.Connect(2);
  ASSERT_TRUE(a2.ok()) << a2.status();
  const Snapshot expected = Pull(**a2);

  ASSERT_EQ(src.Transfer("export", tmp_.path() + "/delta", &out, cursor), 0) << out << src.Logs();
  EXPECT_EQ(JsonNumber(out, "rows"), 2 * few.size()) << out;  // both tables' changed rows
  EXPECT_EQ(JsonNumber(out, "whole_parts"), 0u) << out;
  EXPECT_LT(JsonNumber(out, "rows"), full_rows);
  EXPECT_NE(JsonString(out, "cursor"), cursor) << out;

  Cluster dst(tmp_.path(), "dst", 1, 16);
  Snapshot imported;
  ImportFullThenDelta(tmp_.path(), dst, &imported);
  if (HasFatalFailure()) return;
  EXPECT_TRUE(BitEqual(imported, expected));
  // --since belongs to export.
  EXPECT_EQ(dst.Transfer("import", tmp_.path() + "/delta", &out, cursor), 2);
}

// The pod's journal keeps only its newest round as written and merges the others: the
// full export's cursor then lies inside a merged range, and after a SIGKILL its delta
// names more rows than changed (that range's), yet imported on the full export it gives
// the source's rows bit for bit.
TEST_F(ExportImportTest, DeltaFromACursorInsideAMergedJournalRangeAfterAKill) {
  Cluster src(tmp_.path(), "src", 1, 16);
  src.AddFlag("--change_journal_keep_rounds=1");
  src.AddFlag("--change_journal_merge_kb=0");
  src.AddFlag("--materialize_ms=600000");  // rounds only at exports: the journal's are known
  std::unique_ptr<PsClient> a;
  std::string out, cursor;
  StartTrainedAndExportFull(src, &a, &out, &cursor);
  if (HasFatalFailure()) return;

  // The full export wrote the training as one round (the cursor's). Three rounds of a few
  // changed rows follow, one per export: the second merges the cursor's round and the
  // first into one range (the newest round stays as written).
  std::set<int64_t> changed;
  for (int r = 0; r < 3; ++r) {
    const std::vector<int64_t> few = {Ids()[r], Ids()[100 + r], 88888800 + r};
    changed.insert(few.begin(), few.end());
    std::vector<float> ga(few.size() * 8, 0.5f), gf(few.size() * 4, 0.5f);
    ASSERT_TRUE(a->Push({{"emb/adam", few, ga.data()}, {"ftrl", few, gf.data()}}).ok());
    ASSERT_EQ(src.Transfer("export", tmp_.path() + "/mid-" + std::to_string(r), &out), 0)
        << out << src.Logs();
  }
  a.reset();
  ASSERT_TRUE(src.Restart(0).ok()) << src.Logs();
  auto a2 = src.Connect(2);
  ASSERT_TRUE(a2.ok()) << a2.status();
  const std::vector<int64_t> last = {Ids()[7], 99999999};  // in the restarted pod's log only
  changed.insert(last.begin(), last.end());
  std::vector<float> ga(last.size() * 8, 0.25f), gf(last.size() * 4, 0.25f);
  ASSERT_TRUE((*a2)->Push({{"emb/adam", last, ga.data()}, {"ftrl", last, gf.data()}}).ok());
  const Snapshot expected = Pull(**a2);

  ASSERT_EQ(src.Transfer("export", tmp_.path() + "/delta", &out, cursor), 0) << out << src.Logs();
  EXPECT_EQ(JsonNumber(out, "whole_parts"), 0u) << out;
  // More than the changed rows of both tables: the merged range's too.
  EXPECT_GT(JsonNumber(out, "rows"), 2 * changed.size()) << out;

  Cluster dst(tmp_.path(), "dst", 1, 16);
  Snapshot imported;
  ImportFullThenDelta(tmp_.path(), dst, &imported);
  if (HasFatalFailure()) return;
  EXPECT_TRUE(BitEqual(imported, expected));
}

TEST_F(ExportImportTest, ACursorOlderThanTheChangeJournalIsRefused) {
  Cluster src(tmp_.path(), "src", 1, 16);
  src.AddFlag("--change_journal_mb=0");  // keeps the newest round only
  ASSERT_TRUE(src.StartAll().ok()) << src.Logs();
  auto a = src.Connect(1);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE((*a)->CreateTable(FtrlSpec()).ok());
  std::vector<int64_t> ids = Ids();
  std::vector<float> g(ids.size() * 4, 0.25f);
  ASSERT_TRUE((*a)->Push({{"ftrl", ids, g.data()}}).ok());
  std::string out;
  ASSERT_EQ(src.Transfer("export", tmp_.path() + "/e0", &out), 0) << out;
  const std::string old = JsonString(out, "cursor");
  ASSERT_TRUE((*a)->Push({{"ftrl", ids, g.data()}}).ok());
  ASSERT_EQ(src.Transfer("export", tmp_.path() + "/e1", &out), 0) << out;
  EXPECT_EQ(src.Transfer("export", tmp_.path() + "/d", &out, old), 1);
  EXPECT_NE(out.find("FAILED_PRECONDITION"), std::string::npos) << out;
  EXPECT_NE(out.find("take a full export"), std::string::npos) << out;
}

}  // namespace
}  // namespace ps
