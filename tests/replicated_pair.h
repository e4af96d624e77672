// The R = 2 cluster of the multi-process replication tests (follower_read_test,
// split_brain_test, checkpoint_replicated_test, transfer_replicated_test): ps-master and
// two durable pods ps-0 and ps-1 as processes on loopback (chaos::Cluster), each the
// follower of the other's vshards; the client options those tests share, the known rows
// they push and read back exactly, and the wait for a push load's acknowledgements.
//
// Usage:
//   chaos::ClusterOptions co = ReplicatedPairOptions(dir.path(), kVShards, /*lease_ms=*/60'000);
//   chaos::Cluster cluster(co);
//   auto map = StartReplicatedPair(cluster, /*restart_ps0=*/true);
//   ASSERT_TRUE(map.ok()) << map.status() << cluster.Logs();
//   ...
//   if (HasFailure()) KeepRunDir(cluster, dir.path());
//
// Not thread-safe: call from the test's main thread, as chaos::Cluster requires.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/ps_client.h"
#include "proto/master.pb.h"
#include "tests/chaos_cluster.h"
#include "tests/exact_push_load.h"
#include "tests/shard_map_watch.h"

namespace ps::integration {

// An R = 2 cluster of pods ps-0 and ps-1 in `dir` (which must exist) with `num_vshards`
// vshards and ps-master --lease_ms=`lease_ms`, run with this build's ps-master and
// ps-server (or $PS_MASTER_BINARY, $PS_SERVER_BINARY). Add flags to the result's
// master_flags and server_flags before making the cluster.
chaos::ClusterOptions ReplicatedPairOptions(const std::string& dir, uint32_t num_vshards,
                                            int lease_ms);

// Waits (up to a minute) until both pods are live, every vshard on both, and ps-0 leads
// some: that map, or DEADLINE_EXCEEDED.
absl::StatusOr<ShardMapResponse> WaitPairReplicated(const ShardMapWatch& watch);

// Starts the master and both pods of `cluster` (made with ReplicatedPairOptions) and waits
// (up to a minute) until both are live with every vshard on both. With `restart_ps0`,
// ps-0 is then SIGKILLed, restarted in place (same port, within its lease: it keeps its
// vshards) and waited for again (WaitPairReplicated): registering again, it is told ps-1's
// address at once, which a test with a long lease would otherwise count on the master's
// notice of ps-1's registration for (the next heartbeat is a third of the lease away).
// Returns the last map seen; the first error otherwise.
absl::StatusOr<ShardMapResponse> StartReplicatedPair(chaos::Cluster& cluster, bool restart_ps0);

// The client options these tests start from: `cluster`'s master, `num_vshards`, a 2 s
// deadline, up to 100 attempts with a backoff of 10 to 200 ms.
ClientOptions PairClientOptions(const chaos::Cluster& cluster, uint32_t num_vshards);

// Rows 1..n of a table made with ExactLoadTable (SGD, lr 1, zero rows), with the gradients
// that, pushed once, leave element d of row id at KnownValue(id, d).
struct KnownRows {
  std::vector<int64_t> ids;
  std::vector<float> grads;  // kLoadDim a row, row after row
};
KnownRows MakeKnownRows(int64_t n);
float KnownValue(int64_t id, int d);  // id * 10 + d
// Empty if `values` (kLoadDim floats a row, in the order of `ids`) are the known rows'
// values; else which element is first wrong, and how.
std::string KnownRowsMismatch(const std::vector<int64_t>& ids, const std::vector<float>& values);

// The ids among `ids` of `table` whose vshard (of `num_vshards`) is in `vshards`, in order.
std::vector<int64_t> RowsOfVShards(const std::vector<int64_t>& ids, const std::string& table,
                                   uint32_t num_vshards, const std::vector<uint32_t>& vshards);

// Waits up to a minute until `load` has `n` more acknowledged pushes than at the call;
// whether it has.
bool WaitForAcks(const ExactPushLoad& load, uint64_t n);

// For a failed test: adds a failure that gives `why`, `cluster`'s logs and where its run
// directory `dir` is kept (renamed to `dir`.kept, which the test's TempDir leaves).
void KeepRunDir(chaos::Cluster& cluster, const std::string& dir, const std::string& why = "");

}  // namespace ps::integration
