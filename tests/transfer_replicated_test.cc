// Export and import (ps-transfer --master) between two replicated clusters (R = 2, each a
// ps-master and two durable pods, every vshard on both pods), real processes on loopback.
// Known rows pushed to the source are exported (each row once: a pod writes only the
// vshards it leads, not those it follows) and imported into the target, whose primaries
// ship them to their followers. Then every row is exact at the target's primaries, and
// again at ps-0's follower once ps-0 is SIGKILLed (a read_only pull falls back to it; the
// target's lease is a minute, so no failover happens meanwhile). Nothing is asserted on
// timing.
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/chaos_cluster.h"
#include "tests/cluster_test_fixture.h"
#include "tests/exact_push_load.h"
#include "tests/process.h"
#include "tests/replicated_pair.h"
#include "tests/shard_map_watch.h"

#if !defined(PS_TRANSFER_BINARY)
#error "PS_TRANSFER_BINARY must be defined"
#endif

namespace ps::integration {
namespace {

constexpr char kTable[] = "moved";
constexpr uint32_t kVShards = 16;
constexpr int64_t kRows = 300;

// ps-transfer with `args`; its exit code (negative: did not run or finish), output in *out.
int RunTransfer(const std::vector<std::string>& args, const std::string& log, std::string* out) {
  std::vector<std::string> argv = {BinaryPath("PS_TRANSFER_BINARY", PS_TRANSFER_BINARY)};
  argv.insert(argv.end(), args.begin(), args.end());
  auto child = ChildProcess::Start(argv, log);
  if (!child.ok()) return -1;
  if (!(*child)->WaitExit(absl::Seconds(60))) return -2;
  *out = FileTail(log, 8000);
  const std::string d = (*child)->Describe();
  const size_t at = d.find("exited with code ");
  return at == std::string::npos ? -3 : std::atoi(d.c_str() + at + 17);
}

// An R = 2 cluster of two pods under `dir`, both live with every vshard on both, and each
// primary streaming to its follower's address; its pods export under `export_root`.
std::unique_ptr<chaos::Cluster> StartReplicated(const std::string& dir,
                                                const std::string& export_root) {
  std::filesystem::create_directories(dir);
  // No failover when a pod is killed at the end.
  chaos::ClusterOptions co = ReplicatedPairOptions(dir, kVShards, /*lease_ms=*/60'000);
  co.master_flags = {"--replication_max_lag_ms=60000"};
  co.server_flags = {"--export_root=" + export_root};
  auto cluster = std::make_unique<chaos::Cluster>(co);
  auto ready = StartReplicatedPair(*cluster, /*restart_ps0=*/true);
  EXPECT_TRUE(ready.ok()) << ready.status() << cluster->Logs();
  return cluster;
}

TEST(TransferReplicatedTest, ExportOfAReplicatedClusterImportsIntoOneWithBothCopiesExact) {
  TempDir dir("ps-transfer-r2");
  ASSERT_FALSE(dir.path().empty());
  auto src = StartReplicated(dir.path() + "/src", dir.path());
  auto dst = StartReplicated(dir.path() + "/dst", dir.path());
  if (HasFailure()) return;

  const KnownRows known = MakeKnownRows(kRows);
  const std::vector<int64_t>& ids = known.ids;
  {
    auto client = PsClient::Connect(PairClientOptions(*src, kVShards));
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_TRUE((*client)->CreateTable(ExactLoadTable(kTable)).ok());
    absl::Status pushed = (*client)->Push({{kTable, ids, known.grads.data()}});
    ASSERT_TRUE(pushed.ok()) << pushed << src->Logs();
  }
  const std::string export_dir = dir.path() + "/export";
  std::string out;
  ASSERT_EQ(RunTransfer({"--master=" + src->master_address(), "--dir=" + export_dir, "export"},
                        dir.path() + "/export.log", &out),
            0)
      << out << src->Logs();
  // Each row once: the followers' copies are not exported.
  EXPECT_NE(out.find(absl::StrCat("\"rows\":", kRows, ",")), std::string::npos) << out;
  ASSERT_EQ(RunTransfer({"--master=" + dst->master_address(), "--dir=" + export_dir, "import"},
                        dir.path() + "/import.log", &out),
            0)
      << out << dst->Logs();

  auto reader = PsClient::Connect(PairClientOptions(*dst, kVShards));
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto expect_rows = [&](const char* where) {
    std::vector<float> rows(ids.size() * kLoadDim, -1.0f);
    absl::Status read = (*reader)->Pull({{kTable, ids, rows.data()}}, /*read_only=*/true);
    ASSERT_TRUE(read.ok()) << where << ": " << read << dst->Logs();
    EXPECT_EQ(KnownRowsMismatch(ids, rows), "") << where;
  };
  expect_rows("at the primaries");
  EXPECT_EQ((*reader)->client_stats().read_fallbacks, 0u);
  ShardMapWatch watch(dst->master_address());
  auto before = watch.Fetch();
  ASSERT_TRUE(before.ok()) << before.status();
  dst->KillPod(0);
  expect_rows("ps-0's rows at its follower");
  EXPECT_GT((*reader)->client_stats().read_fallbacks, 0u);
  auto after = watch.Fetch();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(OwnedVShards(*after, "ps-0"), OwnedVShards(*before, "ps-0"))
      << "a failover: the reads were not the follower's";
}

}  // namespace
}  // namespace ps::integration
