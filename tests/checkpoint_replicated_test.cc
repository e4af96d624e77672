// A cluster checkpoint at R = 2, restored (ps-master --checkpoint_dir, Master.Checkpoint;
// docs/architecture.md "Cluster checkpoints"): ps-master and two durable pods as processes,
// each the follower of the other's vshards, a push load running while the checkpoint is
// taken. The whole cluster is then stopped and started again on the checkpoint's copies
// (the master's store and each pod's database), at the same addresses.
//
// The pods' copies are cut one after the other while pushes flow, so a follower's copy of
// a vshard is cut at another moment than its primary's. The checkpoint keeps each vshard's
// primary's copy only (master/checkpoints.h): the restored map has empty ack sets, and
// re-replication refills the followers from the primaries. Checked here: the restored map
// names the same primaries and no followers; once refilled, the restored rows are a cut of
// the load (every push acknowledged before the checkpoint began applied once, none sent
// after it ended, none twice, the shared rows between those bounds); and the two copies of
// each vshard hold the same rows, bit for bit: ps-0's rows are read from ps-0, then ps-0 is
// SIGKILLed and the same rows are read from its follower ps-1 (a read_only pull falls back
// to it; the master's lease is a minute, so no failover happens meanwhile). Replicas that
// differ would make a later failover serve other rows than the primary did (before the fix,
// 66 of 379 rows of ps-0's vshards differed, the follower ahead). Nothing is asserted on
// timing.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/grpc_status.h"
#include "gtest/gtest.h"
#include "proto/master.grpc.pb.h"
#include "tests/chaos_cluster.h"
#include "tests/exact_push_load.h"
#include "tests/process.h"
#include "tests/replicated_pair.h"
#include "tests/shard_map_watch.h"

namespace ps::integration {
namespace {

constexpr char kTable[] = "ckpt";
constexpr uint32_t kVShards = 16;
// Rows pushed once before the load: ids kBulkBase.. (above the load's markers).
constexpr int64_t kBulkBase = int64_t{1} << 40;
constexpr int64_t kBulkRows = 200'000;
constexpr size_t kBulkPage = 8192;

// Replaces `to` by a copy of `from` (a checkpoint's directory).
void CopyDir(const std::string& from, const std::string& to) {
  std::error_code ec;
  std::filesystem::remove_all(to, ec);
  ASSERT_FALSE(ec) << to << ": " << ec.message();
  std::filesystem::copy(from, to, std::filesystem::copy_options::recursive, ec);
  ASSERT_FALSE(ec) << from << " -> " << to << ": " << ec.message();
}

TEST(CheckpointReplicatedTest, RestoredReplicasHoldThePrimarysCheckpointedRows) {
  TempDir dir("ps-ckpt-r2");
  ASSERT_FALSE(dir.path().empty());
  // No failover when ps-0 is killed at the end.
  chaos::ClusterOptions co = ReplicatedPairOptions(dir.path(), kVShards, /*lease_ms=*/60'000);
  const std::string checkpoints = dir.path() + "/checkpoints";
  co.master_flags = {"--checkpoint_dir=" + checkpoints, "--replication_max_lag_ms=60000"};
  co.server_flags = {"--checkpoint_root=" + checkpoints};
  chaos::Cluster cluster(co);
  // ps-0 is restarted in place once both are up, so that it knows ps-1's address.
  auto before = StartReplicatedPair(cluster, /*restart_ps0=*/true);
  ASSERT_TRUE(before.ok()) << before.status() << cluster.Logs();
  ShardMapWatch watch(cluster.master_address());

  ClientOptions client = PairClientOptions(cluster, kVShards);
  {
    auto admin = PsClient::Connect(client);
    ASSERT_TRUE(admin.ok()) << admin.status();
    ASSERT_TRUE((*admin)->CreateTable(ExactLoadTable(kTable)).ok());
    // Rows enough that dropping a vshard's rows takes a while at restore (see the file
    // comment): each pushed once (value 1) before the load starts.
    std::vector<int64_t> page;
    const std::vector<float> grads(kBulkPage * kLoadDim, -1.0f);
    for (int64_t id = kBulkBase; id < kBulkBase + kBulkRows; ++id) {
      page.push_back(id);
      if (page.size() < kBulkPage && id + 1 < kBulkBase + kBulkRows) continue;
      absl::Status s = (*admin)->Push({{kTable, page, grads.data(), 1.0f}});
      ASSERT_TRUE(s.ok()) << s << cluster.Logs();
      page.clear();
    }
  }
  auto load = ExactPushLoad::Start(client, kTable, /*threads=*/3, /*seed=*/9);
  ASSERT_TRUE(load.ok()) << load.status();
  ASSERT_TRUE(WaitForAcks(**load, 100)) << cluster.Logs();

  // The checkpoint, taken while the load pushes.
  auto master = Master::NewStub(
      grpc::CreateChannel(cluster.master_address(), grpc::InsecureChannelCredentials()));
  CheckpointResponse cp;
  const absl::Time checkpoint_start = absl::Now();
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    absl::Status s = FromGrpcStatus(master->Checkpoint(&ctx, CheckpointRequest(), &cp));
    ASSERT_TRUE(s.ok()) << s << cluster.Logs();
  }
  const absl::Time checkpoint_end = absl::Now();
  ASSERT_EQ(cp.checkpoint().pods_size(), 2);
  ASSERT_TRUE(WaitForAcks(**load, 50)) << cluster.Logs();
  (*load)->Stop();
  const std::vector<LoadPush> pushes = (*load)->pushes();
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < 64; ++id) ids.push_back(id);  // the load's shared rows
  for (const LoadPush& p : pushes) ids.push_back(p.marker);
  for (int64_t id = kBulkBase; id < kBulkBase + kBulkRows; ++id) ids.push_back(id);

  // The whole cluster restored from the checkpoint, at the same addresses.
  for (uint32_t i = 0; i < co.pods; ++i) cluster.KillPod(i);
  cluster.KillMaster();
  CopyDir(cp.checkpoint().dir() + "/master", cluster.MasterDataDir());
  for (uint32_t i = 0; i < co.pods; ++i) {
    CopyDir(absl::StrCat(cp.checkpoint().dir(), "/", cluster.PodId(i)), cluster.PodDataDir(i));
  }
  if (HasFatalFailure()) return;
  ASSERT_TRUE(cluster.StartMaster().ok()) << cluster.Logs();
  {
    // The restored map: the same primaries, no followers.
    auto map = watch.Fetch();
    ASSERT_TRUE(map.ok()) << map.status() << cluster.Logs();
    EXPECT_GT(map->epoch(), before->epoch());
    for (const std::string& pod : {"ps-0", "ps-1"}) {
      EXPECT_EQ(OwnedVShards(*map, pod), OwnedVShards(*before, pod)) << pod;
    }
    for (int v = 0; v < map->followers_size(); ++v) {
      EXPECT_EQ(map->followers(v).pods_size(), 0) << "vshard " << v;
    }
  }
  const absl::Time restart = absl::Now();
  for (uint32_t i = 0; i < co.pods; ++i) {
    ASSERT_TRUE(cluster.StartPod(i, /*same_port=*/true).ok()) << cluster.Logs();
  }
  auto restored = WaitPairReplicated(watch);
  ASSERT_TRUE(restored.ok()) << restored.status() << cluster.Logs();
  // A figure for docs/architecture.md, not an assertion.
  std::cout << "restored and re-replicated " << kVShards << " vshards in "
            << absl::ToDoubleSeconds(absl::Now() - restart) << " s\n";
  // The follower restarted on its disk (within its lease: it stays the follower) reads
  // what it stored, not only what it holds in memory.
  cluster.KillPod(1);
  ASSERT_TRUE(cluster.StartPod(1, /*same_port=*/true).ok()) << cluster.Logs();
  restored = WaitPairReplicated(watch);
  ASSERT_TRUE(restored.ok()) << restored.status() << cluster.Logs();
  const std::vector<uint32_t> led = OwnedVShards(*restored, "ps-0");
  const std::vector<int64_t> of_ps0 = RowsOfVShards(ids, kTable, kVShards, led);
  ASSERT_FALSE(of_ps0.empty());

  auto reader = PsClient::Connect(client);
  ASSERT_TRUE(reader.ok()) << reader.status();

  // The restored rows, read at the primaries, are a cut of the load taken during the
  // checkpoint. (Each pod's copy is cut at its own moment, so a push that straddles the
  // checkpoint may be in one pod's copy and not the other's: only bounds are exact.)
  {
    std::vector<int64_t> all;
    for (const LoadPush& p : pushes) all.push_back(p.marker);
    for (int64_t id = 0; id < 64; ++id) all.push_back(id);
    std::vector<float> values(all.size() * kLoadDim);
    absl::Status s = (*reader)->Pull({{kTable, all, values.data()}}, /*read_only=*/true);
    ASSERT_TRUE(s.ok()) << s << cluster.Logs();
    std::map<int64_t, int64_t> low, high;  // per shared row: pushes certainly / maybe in it
    size_t wrong = 0;
    std::string problems;
    for (size_t i = 0; i < pushes.size(); ++i) {
      const LoadPush& p = pushes[i];
      const float* row = &values[i * kLoadDim];
      const bool before_cut = p.acked && p.done_at < checkpoint_start;
      const bool after_cut = p.sent_at > checkpoint_end;
      const bool ok = std::all_of(row, row + kLoadDim, [&](float x) { return x == row[0]; }) &&
                      (row[0] == 0 || row[0] == 1) && !(before_cut && row[0] != 1) &&
                      !(after_cut && row[0] != 0);
      if (!ok && ++wrong <= 5) {
        absl::StrAppend(&problems, "push ", p.marker >> 32, "/", p.marker & 0xffffffff,
                        (before_cut  ? " (acknowledged before the checkpoint)"
                         : after_cut ? " (sent after the checkpoint)"
                                     : ""),
                        ": marker ", row[0], "\n");
      }
      for (int64_t id : p.shared) {
        low[id] += before_cut ? 1 : 0;
        high[id] += p.sent_at < checkpoint_end ? 1 : 0;
      }
    }
    for (int64_t id = 0; id < 64; ++id) {
      const float* row = &values[(pushes.size() + id) * kLoadDim];
      for (int d = 0; d < kLoadDim; ++d) {
        if ((row[d] < low[id] || row[d] > high[id]) && ++wrong <= 10) {
          absl::StrAppend(&problems, "shared row ", id, "[", d, "] = ", row[d], ", not in [",
                          low[id], ", ", high[id], "]\n");
        }
      }
    }
    std::vector<int64_t> bulk;
    for (int64_t id = kBulkBase; id < kBulkBase + kBulkRows; ++id) bulk.push_back(id);
    std::vector<float> bulk_values(bulk.size() * kLoadDim);
    s = (*reader)->Pull({{kTable, bulk, bulk_values.data()}}, /*read_only=*/true);
    ASSERT_TRUE(s.ok()) << s << cluster.Logs();
    for (size_t i = 0; i < bulk_values.size(); ++i) {
      if (bulk_values[i] != 1 && ++wrong <= 15) {
        absl::StrAppend(&problems, "row ", bulk[i / kLoadDim],
                        " (pushed once before the load) = ", bulk_values[i], "\n");
      }
    }
    EXPECT_EQ(wrong, 0u) << "the restored rows are not a cut of the load:\n" << problems;
  }

  // ps-0's rows at ps-0, then at its follower ps-1.
  std::vector<float> primary(of_ps0.size() * kLoadDim), follower(of_ps0.size() * kLoadDim);
  absl::Status read = (*reader)->Pull({{kTable, of_ps0, primary.data()}}, /*read_only=*/true);
  ASSERT_TRUE(read.ok()) << read << cluster.Logs();
  EXPECT_EQ((*reader)->client_stats().read_fallbacks, 0u);
  cluster.KillPod(0);
  read = (*reader)->Pull({{kTable, of_ps0, follower.data()}}, /*read_only=*/true);
  ASSERT_TRUE(read.ok()) << read << cluster.Logs();
  EXPECT_GT((*reader)->client_stats().read_fallbacks, 0u);
  auto after = watch.Fetch();
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_EQ(OwnedVShards(*after, "ps-0"), led) << "a failover: the reads were not the follower's";
  size_t differ = 0;
  std::string examples;
  for (size_t i = 0; i < of_ps0.size(); ++i) {
    const float* a = &primary[i * kLoadDim];
    const float* b = &follower[i * kLoadDim];
    if (std::equal(a, a + kLoadDim, b)) continue;
    if (++differ <= 5) {
      absl::StrAppend(&examples, "row ", of_ps0[i], ": primary ", a[0], ", follower ", b[0], "\n");
    }
  }
  EXPECT_EQ(differ, 0u) << "of " << of_ps0.size() << " rows of ps-0's vshards:\n" << examples;
  if (HasFailure()) KeepRunDir(cluster, dir.path());
}

}  // namespace
}  // namespace ps::integration
