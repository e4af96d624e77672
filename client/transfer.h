// Cluster-wide export and import in the portable format (docs/architecture.md, "Export
// format"), as ps-export and ps-import run them.
//
// Export asks every pod to write the rows of the vshards it owns into <dir>/part-<i> (a
// path on the pod's filesystem; pods sharing a file system, or volumes collected
// afterwards, make one export directory), then writes <dir>/export.json listing the parts.
// Import reads every part, checks every checksum first, creates the tables, and sends
// each row to the pod that owns its id in the target cluster (RouteHash, as the client
// routes), which installs it durably. The target may have any number of pods and any
// vshard count.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/rpc/transport_security.h"
#include "proto/export.pb.h"

namespace ps {

// Where the cluster is: the master (its shard map), or the pods' addresses (each pod's
// ownership is read from Describe; together they must own every vshard exactly once).
struct ClusterTarget {
  std::string master;
  std::vector<std::string> servers;
  // How long to wait for the master's map to have every owner live, or for pods to answer.
  int connect_timeout_ms = 30000;
  // TLS and the bearer token towards the master and the pods. Default: plain text.
  ChannelSecurity security;
};

struct Cluster {
  std::vector<std::string> pods;  // addresses
  // Per pod: reachable as far as the map says (LIVE or DRAINED; every pod of --servers).
  // The catalog is created on these only: the others learn it from the master.
  std::vector<bool> up;
  uint32_t num_vshards = 0;
  uint64_t epoch = 0;
  std::vector<uint32_t> owner;  // owner[v]: index into pods
  ChannelMaker channels;        // the target's security, files loaded
  // Set when read from a master: an import follows its map changes (a moved vshard, a
  // failover to the followers), reading it again with RefreshCluster.
  std::string master;
  int connect_timeout_ms = 30000;
};

// The pods and vshard map, or UNAVAILABLE (unreachable before the timeout),
// FAILED_PRECONDITION (pods disagree: vshard counts, a vshard owned twice or not at all).
absl::StatusOr<Cluster> DiscoverCluster(const ClusterTarget& target);

// The master's current map for a cluster read from it (`cluster.master` set; its
// channels are reused), as DiscoverCluster reads it; FAILED_PRECONDITION without a master.
absl::StatusOr<Cluster> RefreshCluster(const Cluster& cluster);

struct ExportClusterOptions {
  int timeout_ms = 3600 * 1000;  // per pod's export
  // A cursor an earlier export printed (ExportIndex.cursor): a delta, only the rows
  // changed since then and the ids deleted since then (docs/architecture.md, "Incremental
  // export"). Empty: a full export.
  std::string since;
};

// Exports every pod into <dir>/part-<i> and writes <dir>/export.json; returns the index,
// whose `cursor` is the --since of the next delta. `dir` is made absolute (pods resolve it
// themselves). ALREADY_EXISTS if dir holds an export.json; INVALID_ARGUMENT for a damaged
// cursor; FAILED_PRECONDITION when a pod's change journal no longer reaches back to the
// cursor (take a full export).
absl::StatusOr<ExportIndex> ExportCluster(const Cluster& cluster, const std::string& dir,
                                          const ExportClusterOptions& options = {});

struct ImportOptions {
  size_t batch_rows = 4096;  // rows per ImportRows request
  int inflight = 4;          // requests in flight (over all pods)
  // Read every file once and check its checksums, sizes and row counts before anything
  // is sent, so a damaged export installs nothing.
  bool verify_first = true;
  int deadline_ms = 30000;  // per attempt
  int max_attempts = 10;    // UNAVAILABLE, ABORTED, DEADLINE_EXCEEDED are retried
};

struct ImportResult {
  uint64_t rows = 0;       // table rows read
  uint64_t dense = 0;      // dense tensors read
  uint64_t installed = 0;  // rows + tensors installed
  uint64_t skipped = 0;    // already held at that step or later (e.g. a re-run)
  // Rows + tensors the pods refused as no valid state (ImportRowsResponse.invalid: an
  // older export's non-finite rows); the rest was installed. The first few, named.
  uint64_t invalid = 0;
  std::vector<std::string> invalid_rows;
  uint64_t deleted_ids = 0;  // a delta's deleted ids read
  uint64_t deleted = 0;      // rows the pods deleted (ids they did not hold count nothing)
  uint64_t parts = 0;
  double seconds = 0;
};

// Imports the export in `dir` (an export.json with parts, or a single part directory)
// into the cluster. Idempotent: running it again installs nothing new. Each request goes
// to the owner of its rows under the newest map the import knows; with a master
// (`cluster.master`), a request refused as a wrong shard, or retried for the third time,
// reads the map again (RefreshCluster) and goes to the rows' owners there: after a
// failover (R >= 2) to the promoted follower, which holds what the old primary installed
// (an install is only over an older step, so rows it holds are `skipped`: applied once). A delta
// (see ExportClusterOptions.since) applies on top of the export it follows: first every part's
// deleted ids are deleted, then the rows are installed (a row deleted and created again
// since the cursor then starts afresh). Every file is
// checked before anything is sent. Errors: DATA_LOSS (a damaged or truncated file),
// NOT_FOUND (a file or part the manifests name is missing), INVALID_ARGUMENT (not an export, parts
// that disagree on a table's spec), ALREADY_EXISTS (the target has the table with another spec), or
// the pods' errors.
absl::StatusOr<ImportResult> ImportCluster(const Cluster& cluster, const std::string& dir,
                                           const ImportOptions& options = {});

// Reads and checks one manifest (<part dir>/manifest.json).
absl::StatusOr<ExportManifest> ReadManifest(const std::string& part_dir);

}  // namespace ps
