// ps-transfer: export a cluster's tables to a portable directory, or import one into a
// cluster of any size (docs/operations.md, "Export and import").
// Exit codes: 0 done, 1 failed (the message names the code and the reason), 2 bad usage.
#include <gflags/gflags.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "client/security_flags.h"
#include "client/transfer.h"
#include "common/base/binary_init.h"

DEFINE_string(master, "", "The master's address, HOST:PORT: pods and vshard map from it.");
DEFINE_string(servers, "",
              "Instead of --master: every pod's HOST:PORT, comma-separated; their ownership "
              "(Describe) must cover every vshard exactly once.");
DEFINE_string(dir, "",
              "The export directory (required). Export: made on the pods' "
              "filesystems as DIR/part-<i>, plus DIR/export.json here.");
DEFINE_string(since, "",
              "Export: a delta. The cursor an earlier export printed (\"cursor\" in its "
              "last line and in DIR/export.json): write only the rows changed since that "
              "export, and the ids deleted since then. A pod the cursor does not know (new, "
              "lost its disk) writes all its rows; a cursor older than a pod's change journal "
              "keeps (--change_journal_mb on the pods) is refused: take a full export.");
DEFINE_int32(connect_timeout_ms, 30000, "How long to wait for the pods or the master's map.");
DEFINE_int32(export_timeout_ms, 3600000, "Deadline of each pod's export.");
DEFINE_int32(batch_rows, 4096, "Import: rows per ImportRows request.");
DEFINE_int32(inflight, 4, "Import: requests in flight.");
DEFINE_bool(verify_first, true,
            "Import: check every file's checksums before sending anything, so a damaged "
            "export installs nothing.");

namespace {

constexpr char kUsage[] =
    "ps-transfer: portable export and import of a parameter-server cluster.\n"
    "Usage: ps-transfer (--master=HOST:PORT | --servers=H:P,H:P,...) --dir=DIR export|import\n"
    "  export  every pod writes the rows it owns (weights, optimizer state, steps) and its\n"
    "          dense tensors into DIR/part-<i>; then DIR/export.json lists the parts.\n"
    "          Prints a cursor; --since=CURSOR exports only what changed after it (a delta)\n"
    "  import  reads DIR, checks it, creates the tables, and sends every row to the pod\n"
    "          owning it now; idempotent (a re-run installs nothing new). A delta applies\n"
    "          on top of the export it follows: its deleted ids first, then its rows\n"
    "The last line printed is one JSON object with the outcome.";

}  // namespace

int main(int argc, char** argv) {
  ps::InitBinary(&argc, &argv, kUsage, __FILE__);
  if (argc != 2 || FLAGS_dir.empty() || FLAGS_master.empty() == FLAGS_servers.empty()) {
    std::fprintf(stderr, "%s\n", kUsage);
    return 2;
  }
  const std::string command = argv[1];
  if (command != "export" && command != "import") {
    std::fprintf(stderr, "unknown command '%s'\n%s\n", command.c_str(), kUsage);
    return 2;
  }
  if (command == "import" && !FLAGS_since.empty()) {
    std::fprintf(stderr, "--since is for export (a delta's import needs no cursor)\n%s\n", kUsage);
    return 2;
  }
  ps::ClusterTarget target;
  target.master = FLAGS_master;
  if (!FLAGS_servers.empty()) {
    target.servers = absl::StrSplit(FLAGS_servers, ',', absl::SkipEmpty());
  }
  target.connect_timeout_ms = FLAGS_connect_timeout_ms;
  absl::StatusOr<ps::ChannelSecurity> security = ps::ChannelSecurityFromFlags();
  if (!security.ok()) {
    std::fprintf(stderr, "ps-transfer: %s\n", security.status().ToString().c_str());
    return 2;
  }
  target.security = *std::move(security);
  auto cluster = ps::DiscoverCluster(target);
  if (!cluster.ok()) {
    std::fprintf(stderr, "ps-transfer: %s\n", cluster.status().ToString().c_str());
    return 1;
  }
  if (command == "export") {
    ps::ExportClusterOptions options;
    options.timeout_ms = FLAGS_export_timeout_ms;
    options.since = FLAGS_since;
    auto index = ps::ExportCluster(*cluster, FLAGS_dir, options);
    if (!index.ok()) {
      std::fprintf(stderr, "ps-transfer export: %s\n", index.status().ToString().c_str());
      return 1;
    }
    uint64_t rows = 0, dense = 0, deleted = 0;
    int whole = 0;
    for (const auto& p : index->parts()) {
      rows += p.rows();
      dense += p.dense();
      deleted += p.deleted();
      if (p.whole()) {
        ++whole;
        std::fprintf(stderr,
                     "ps-transfer export: part %s (pod %s) is written whole: its pod is not in "
                     "the cursor (a new pod or a lost disk); rows deleted there since the "
                     "cursor are not listed\n",
                     p.dir().c_str(), p.pod().c_str());
      }
    }
    // The cursor is made of hex digits, digits, '.', ',' and "v1:": no JSON escaping needed.
    std::printf(
        "{\"command\":\"export\",\"parts\":%d,\"rows\":%llu,\"dense\":%llu,\"deleted\":%llu,"
        "\"delta\":%s,\"whole_parts\":%d,\"cursor\":\"%s\"}\n",
        index->parts_size(), static_cast<unsigned long long>(rows),
        static_cast<unsigned long long>(dense), static_cast<unsigned long long>(deleted),
        FLAGS_since.empty() ? "false" : "true", whole, index->cursor().c_str());
    return 0;
  }
  ps::ImportOptions options;
  options.batch_rows = static_cast<size_t>(std::max(1, FLAGS_batch_rows));
  options.inflight = FLAGS_inflight;
  options.verify_first = FLAGS_verify_first;
  auto result = ps::ImportCluster(*cluster, FLAGS_dir, options);
  if (!result.ok()) {
    std::fprintf(stderr, "ps-transfer import: %s\n", result.status().ToString().c_str());
    return 1;
  }
  for (const std::string& r : result->invalid_rows) {
    std::fprintf(stderr, "ps-transfer import: not installed (no valid state): %s\n", r.c_str());
  }
  if (result->invalid > result->invalid_rows.size()) {
    std::fprintf(stderr,
                 "ps-transfer import: %llu rows not installed in all (see the pods' logs)\n",
                 static_cast<unsigned long long>(result->invalid));
  }
  std::printf(
      "{\"command\":\"import\",\"parts\":%llu,\"rows\":%llu,\"dense\":%llu,\"installed\":%llu,"
      "\"skipped\":%llu,\"invalid\":%llu,\"deleted_ids\":%llu,\"deleted\":%llu,"
      "\"seconds\":%.3f}\n",
      static_cast<unsigned long long>(result->parts), static_cast<unsigned long long>(result->rows),
      static_cast<unsigned long long>(result->dense),
      static_cast<unsigned long long>(result->installed),
      static_cast<unsigned long long>(result->skipped),
      static_cast<unsigned long long>(result->invalid),
      static_cast<unsigned long long>(result->deleted_ids),
      static_cast<unsigned long long>(result->deleted), result->seconds);
  return 0;
}
