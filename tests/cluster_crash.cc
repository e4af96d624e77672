#include "tests/cluster_crash.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/routing/hash.h"
#include "tests/chaos_cluster.h"
#include "tests/exact_push_load.h"
#include "tests/process.h"
#include "tests/shard_map_watch.h"

namespace ps::integration {
namespace {

constexpr char kTable[] = "crash";

// One kill: when (the SIGKILL sent; the process reaped), which pod, the vshards it led
// then, and whether its disk went too.
struct Kill {
  absl::Time at;
  absl::Time dead_at;
  std::string pod;
  std::set<uint32_t> led;
  bool disk = false;
};

// Whether push `p` touches one of `vshards`.
bool Touches(const LoadPush& p, const std::set<uint32_t>& vshards, uint32_t num_vshards) {
  const uint64_t name = NameHash(kTable);
  if (vshards.count(VShardOf(RouteHash(name, p.marker), num_vshards)) > 0) return true;
  for (int64_t id : p.shared) {
    if (vshards.count(VShardOf(RouteHash(name, id), num_vshards)) > 0) return true;
  }
  return false;
}

// The longest time from a kill to the first acknowledgement of a push sent after the pod
// was gone (reaped) that touches a vshard the killed pod led: how long its vshards took
// pushes again. (A push sent between the signal and the death may still be answered by
// the dying pod within milliseconds: it says nothing about the failover.)
double MaxFailoverMs(const std::vector<Kill>& kills, const std::vector<LoadPush>& pushes,
                     uint32_t num_vshards) {
  double max_ms = 0;
  for (const Kill& k : kills) {
    if (k.led.empty()) continue;
    absl::Time first = absl::InfiniteFuture();
    for (const LoadPush& p : pushes) {
      if (p.acked && p.sent_at >= k.dead_at && p.done_at < first &&
          Touches(p, k.led, num_vshards)) {
        first = p.done_at;
      }
    }
    if (first != absl::InfiniteFuture()) {
      max_ms = std::max(max_ms, absl::ToDoubleMilliseconds(first - k.at));
    }
  }
  return max_ms;
}

}  // namespace

int RunClusterCrash(const ClusterCrashOptions& o) {
  auto dir = std::make_unique<TempDir>("ps-crash-test");
  if (dir->path().empty()) return 2;
  chaos::ClusterOptions co;
  co.dir = dir->path();
  co.master_binary = o.master_binary;
  co.server_binary = o.server_binary;
  co.pods = o.pods;
  co.num_vshards = o.num_vshards;
  co.durability = o.durability;
  co.lease_ms = o.lease_ms;
  co.replication = o.replication;
  if (o.ack_leader) co.master_flags = {"--replication_ack=leader"};
  co.server_flags = {absl::StrCat("--flush_ms=", o.flush_ms),
                     absl::StrCat("--materialize_ms=", o.materialize_ms)};
  co.server_flags.insert(co.server_flags.end(), o.server_flags.begin(), o.server_flags.end());
  auto cluster = std::make_unique<chaos::Cluster>(co);
  auto fail = [&](const std::string& why) {
    LOG(ERROR) << why << "\n" << cluster->Logs();
    std::fprintf(stderr, "run dir kept in %s.kept\n", dir->path().c_str());
    cluster.reset();
    std::filesystem::rename(dir->path(), dir->path() + ".kept");
    return 1;
  };
  if (absl::Status s = cluster->StartMaster(); !s.ok()) return fail(s.ToString());
  for (uint32_t i = 0; i < o.pods; ++i) {
    if (absl::Status s = cluster->StartPod(i); !s.ok()) return fail(s.ToString());
  }
  ShardMapWatch watch(cluster->master_address());
  auto ready =
      watch.WaitFor([&](const ShardMapResponse& m) { return FullyReplicated(m, o.replication); },
                    absl::Seconds(60), "every pod live");
  if (!ready.ok()) return fail(ready.status().ToString());

  ClientOptions client;
  client.master = cluster->master_address();
  client.num_vshards = o.num_vshards;
  // A retry budget that rides out a restart or a failover on a busy machine (minutes),
  // and short attempts, so that a push to a dead pod moves on soon.
  client.deadline_ms = 2000;
  client.max_attempts = 1000;
  client.max_reroutes = 5000;
  client.initial_backoff_ms = 10;
  client.max_backoff_ms = 200;
  client.map_refresh_ms = 20;
  {
    auto admin = PsClient::Connect(client);
    if (!admin.ok()) return fail(admin.status().ToString());
    if (absl::Status s = (*admin)->CreateTable(ExactLoadTable(kTable)); !s.ok()) {
      return fail(s.ToString());
    }
  }
  auto load = ExactPushLoad::Start(client, kTable, o.clients, o.seed);
  if (!load.ok()) return fail(load.status().ToString());

  // Kill times at random in the run; pods in turn.
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> when(0, o.seconds);
  std::vector<double> at(o.kills);
  for (double& t : at) t = when(rng);
  std::sort(at.begin(), at.end());
  const absl::Time start = absl::Now();
  std::vector<Kill> kills;
  int disks_lost = 0;
  // A periodic pod's crash loses the unwritten tail of its log: at R >= 2 a loss of a copy,
  // as a disk's is (the vshards it leads alone would lose acknowledged pushes).
  const bool periodic = o.durability == "periodic";
  const bool crash_loses_tail = periodic && o.replication >= 2;
  auto kill_and_restart = [&](uint32_t i, bool disk) -> absl::Status {
    if (disk || crash_loses_tail) {
      // Never take a last copy: wait for re-replication to give every vshard R again.
      auto healed = watch.WaitFor(
          [&](const ShardMapResponse& m) { return FullyReplicated(m, o.replication); },
          absl::Seconds(o.heal_timeout_s), absl::StrCat(o.replication, " copies of every vshard"));
      if (!healed.ok()) return healed.status();
    }
    auto before = watch.Fetch();
    if (!before.ok()) return before.status();
    Kill k;
    k.pod = cluster->PodId(i);
    const std::vector<uint32_t> led = OwnedVShards(*before, k.pod);
    k.led.insert(led.begin(), led.end());
    k.disk = disk;
    k.at = absl::Now();
    cluster->KillPod(i);
    k.dead_at = absl::Now();
    if (disk) {
      cluster->LosePodData(i);
      ++disks_lost;
    }
    kills.push_back(k);
    LOG(INFO) << "killed " << k.pod << " (led " << k.led.size() << " vshards)"
              << (disk ? ", data dir deleted" : "");
    if (disk || o.restart_in_place) {
      // Back at once at its address (within its lease), as a StatefulSet pod restarted in
      // place. With an empty data dir (a lost volume), or with a periodic log that lost its
      // tail, the master learns from its registration that its copies are gone or short
      // and fails its vshards over without waiting for the lease.
      RETURN_IF_ERROR(cluster->StartPod(i, /*same_port=*/true));
      const bool copies_lost = (disk || periodic) && o.replication >= 2;
      return watch
          .WaitFor(
              [&](const ShardMapResponse& m) {
                return PodState(m, k.pod) == PodInfo::LIVE &&
                       (!copies_lost || OwnedVShards(m, k.pod).empty());
              },
              absl::Seconds(60),
              absl::StrCat(k.pod, " live again", copies_lost ? ", leading nothing" : ""))
          .status();
    }
    // The master sees it go (its lease runs out; with R >= 2 its vshards fail over), then
    // it comes back at a new address.
    auto gone = watch.WaitFor(
        [&](const ShardMapResponse& m) { return PodState(m, k.pod) == PodInfo::LOST; },
        absl::Seconds(60), absl::StrCat(k.pod, " lost"));
    if (!gone.ok()) return gone.status();
    RETURN_IF_ERROR(cluster->StartPod(i));
    auto back = watch.WaitFor(
        [&](const ShardMapResponse& m) { return PodState(m, k.pod) == PodInfo::LIVE; },
        absl::Seconds(60), absl::StrCat(k.pod, " live again"));
    return back.status();
  };
  for (int n = 0; n < o.kills; ++n) {
    absl::SleepFor(start + absl::Seconds(at[n]) - absl::Now());
    if (absl::Status s = kill_and_restart(n % o.pods, o.lose_disk); !s.ok()) {
      (*load)->Stop();
      return fail(absl::StrCat("kill ", n + 1, ": ", s.ToString()));
    }
  }
  absl::SleepFor(start + absl::Seconds(o.seconds) - absl::Now());
  (*load)->Stop();
  // One more kill (no disk loss) before the check: what was acknowledged last survives it.
  if (absl::Status s = kill_and_restart(o.kills % o.pods, false); !s.ok()) {
    return fail(absl::StrCat("last kill: ", s.ToString()));
  }
  const std::vector<LoadPush> pushes = (*load)->pushes();
  auto checker = PsClient::Connect(client);
  if (!checker.ok()) return fail(checker.status().ToString());
  absl::StatusOr<LoadCheck> check = CheckPushLoad(**checker, kTable, pushes);
  if (!check.ok()) return fail(absl::StrCat("final read: ", check.status().ToString()));
  auto final_map = watch.Fetch();
  const uint64_t failovers = final_map.ok() ? final_map->failovers() : 0;
  for (const LoadPush& p : pushes) {
    if (!p.acked) LOG(ERROR) << "push " << p.marker << " failed: " << p.error;
  }
  if (!check->problems.empty())
    LOG(ERROR) << "lost, duplicated or mismatched:\n" << check->problems;
  // Periodic durability may lose what was acknowledged within --flush_ms of a kill, with
  // one copy; at R >= 2 the other copy holds it, unless pushes were acknowledged on the
  // primary alone (ack leader: a lost pod part of a push shows as a lost marker or as a
  // shared row short of the markers' sum; nothing may be applied twice or torn).
  const bool loss_allowed = (periodic && o.replication < 2) || o.ack_leader;
  const bool pass = check->failed == 0 && check->duplicated == 0 && check->torn == 0 &&
                    (o.ack_leader || check->shared_mismatches == 0) &&
                    (loss_allowed || check->lost == 0);
  const double max_failover_ms = MaxFailoverMs(kills, pushes, o.num_vshards);
  if (!pass || o.keep_dir) {
    cluster.reset();
    std::fprintf(stderr, "run dir kept in %s.kept\n", dir->path().c_str());
    std::filesystem::rename(dir->path(), dir->path() + ".kept");
  }
  std::printf(
      "{\"durability\": \"%s\", \"replication\": %u, \"replication_ack\": \"%s\", "
      "\"pods\": %u, \"kills\": %zu, "
      "\"disks_lost\": %d, \"failovers\": %lu, \"max_failover_ms\": %.0f, \"lease_ms\": %d, "
      "\"seconds\": %.1f, \"clients\": %d, \"acked_pushes\": %lu, \"failed_pushes\": %lu, "
      "\"lost\": %lu, \"duplicated\": %lu, \"torn_rows\": %lu, \"shared_row_mismatches\": %lu, "
      "\"pass\": %s}\n",
      o.durability.c_str(), o.replication, o.ack_leader ? "leader" : "all", o.pods, kills.size(),
      disks_lost, static_cast<unsigned long>(failovers), max_failover_ms, o.lease_ms, o.seconds,
      o.clients, static_cast<unsigned long>(check->acked),
      static_cast<unsigned long>(check->failed), static_cast<unsigned long>(check->lost),
      static_cast<unsigned long>(check->duplicated), static_cast<unsigned long>(check->torn),
      static_cast<unsigned long>(check->shared_mismatches), pass ? "true" : "false");
  return pass ? 0 : 1;
}

}  // namespace ps::integration
