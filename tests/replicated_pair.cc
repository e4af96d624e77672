#include "tests/replicated_pair.h"

#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/routing/hash.h"
#include "gtest/gtest.h"
#include "tests/cluster_test_fixture.h"

#if !defined(PS_MASTER_BINARY) || !defined(PS_SERVER_BINARY)
#error "PS_MASTER_BINARY and PS_SERVER_BINARY must be defined"
#endif

namespace ps::integration {

chaos::ClusterOptions ReplicatedPairOptions(const std::string& dir, uint32_t num_vshards,
                                            int lease_ms) {
  chaos::ClusterOptions co;
  co.dir = dir;
  co.master_binary = BinaryPath("PS_MASTER_BINARY", PS_MASTER_BINARY);
  co.server_binary = BinaryPath("PS_SERVER_BINARY", PS_SERVER_BINARY);
  co.pods = 2;
  co.num_vshards = num_vshards;
  co.lease_ms = lease_ms;
  co.replication = 2;
  return co;
}

absl::StatusOr<ShardMapResponse> WaitPairReplicated(const ShardMapWatch& watch) {
  return watch.WaitFor(
      [](const ShardMapResponse& m) {
        return FullyReplicated(m, 2) && !OwnedVShards(m, "ps-0").empty();
      },
      absl::Seconds(60), "both pods live, each vshard on both, ps-0 leading some");
}

absl::StatusOr<ShardMapResponse> StartReplicatedPair(chaos::Cluster& cluster, bool restart_ps0) {
  absl::Status s = cluster.StartMaster();
  for (uint32_t i = 0; i < 2 && s.ok(); ++i) s = cluster.StartPod(i);
  if (!s.ok()) return s;
  ShardMapWatch watch(cluster.master_address());
  absl::StatusOr<ShardMapResponse> map =
      watch.WaitFor([](const ShardMapResponse& m) { return FullyReplicated(m, 2); },
                    absl::Seconds(60), "both pods live, each vshard on both");
  if (!map.ok() || !restart_ps0) return map;
  cluster.KillPod(0);
  s = cluster.StartPod(0, /*same_port=*/true);
  if (!s.ok()) return s;
  return WaitPairReplicated(watch);
}

ClientOptions PairClientOptions(const chaos::Cluster& cluster, uint32_t num_vshards) {
  ClientOptions o;
  o.master = cluster.master_address();
  o.num_vshards = num_vshards;
  o.deadline_ms = 2000;
  o.max_attempts = 100;
  o.initial_backoff_ms = 10;
  o.max_backoff_ms = 200;
  return o;
}

float KnownValue(int64_t id, int d) { return static_cast<float>(id * 10 + d); }

KnownRows MakeKnownRows(int64_t n) {
  KnownRows rows;
  for (int64_t id = 1; id <= n; ++id) {
    rows.ids.push_back(id);
    for (int d = 0; d < kLoadDim; ++d) rows.grads.push_back(-KnownValue(id, d));
  }
  return rows;
}

std::string KnownRowsMismatch(const std::vector<int64_t>& ids, const std::vector<float>& values) {
  if (values.size() != ids.size() * kLoadDim) {
    return absl::StrCat(values.size(), " values for ", ids.size(), " rows of ", kLoadDim);
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int d = 0; d < kLoadDim; ++d) {
      const float v = values[i * kLoadDim + d];
      if (v != KnownValue(ids[i], d)) {
        return absl::StrCat("row ", ids[i], "[", d, "] = ", v, ", not ", KnownValue(ids[i], d));
      }
    }
  }
  return "";
}

std::vector<int64_t> RowsOfVShards(const std::vector<int64_t>& ids, const std::string& table,
                                   uint32_t num_vshards, const std::vector<uint32_t>& vshards) {
  const uint64_t name = NameHash(table);
  const std::set<uint32_t> wanted(vshards.begin(), vshards.end());
  std::vector<int64_t> out;
  for (int64_t id : ids) {
    if (wanted.count(VShardOf(RouteHash(name, id), num_vshards)) > 0) out.push_back(id);
  }
  return out;
}

bool WaitForAcks(const ExactPushLoad& load, uint64_t n) {
  const uint64_t target = load.acked() + n;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (load.acked() < target && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  return load.acked() >= target;
}

void KeepRunDir(chaos::Cluster& cluster, const std::string& dir, const std::string& why) {
  ADD_FAILURE() << why << (why.empty() ? "" : "\n") << cluster.Logs() << "\nrun dir kept in " << dir
                << ".kept";
  std::error_code ec;
  std::filesystem::rename(dir, dir + ".kept", ec);
}

}  // namespace ps::integration
