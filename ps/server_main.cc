// ps-server: one parameter-server pod. Flags are read here only and turned into options.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/binary_init.h"
#include "common/base/shutdown_signal.h"
#include "common/routing/shard_ownership.h"
#include "common/rpc/transport_security.h"
#include "ps/master_agent.h"
#include "ps/ps_server.h"
#include "ps/storage/durable_log.h"
#include "ps/storage/pod_storage.h"

DEFINE_string(host, "0.0.0.0", "Address to listen on (0.0.0.0: all interfaces).");
DEFINE_int32(port, 50051, "gRPC port; 0 lets the kernel pick a free one (see --port_file).");
DEFINE_string(port_file, "",
              "If set, the bound port is written to this file once serving (for tests and "
              "launchers that start the server with --port=0).");
DEFINE_int32(threads, 2,
             "Threads that execute pull/push work. Pulls and pushes are memory-bound: use "
             "about one per core the pod is given.");
DEFINE_int64(inline_request_bytes, -1,
             "Pulls and pushes whose request is at most this many bytes run on gRPC's "
             "thread instead of the --threads pool (saves a thread hand-off); 0: never. "
             "-1 (default): every call for a pod in memory only (it never waits), 1024 "
             "for a pod with --data_dir (its calls may wait on disk).");
DEFINE_int32(max_message_mb, 256, "Largest gRPC request or response, in MiB.");
DEFINE_int32(memory_quota_mb, 2048,
             "Memory gRPC may hold in request/response buffers; above it the pod stops "
             "reading new requests until calls in flight finish (backpressure).");
DEFINE_uint64(max_batch_rows, 1 << 20,
              "Most rows one pull or push may carry, summed over its tables; larger ones "
              "are refused with INVALID_ARGUMENT.");
DEFINE_uint32(num_vshards, 256,
              "Virtual shards in the cluster (power of two, the same on every pod and "
              "client). Rows route by hash(table, id) mod num_vshards.");
DEFINE_string(shard, "",
              "Static map: 'I/N' makes this pod the I-th of N, owning the contiguous range "
              "of vshards [I*V/N, (I+1)*V/N). Empty: this pod owns every vshard.");
DEFINE_int32(table_stripes, 256, "Lock stripes per embedding table (power of two).");
DEFINE_int32(eviction_interval_ms, 1000,
             "Feature eviction (tables created with a TTL or max_rows): every this many ms a "
             "pass over every such table deletes the rows past their TTL and, over max_rows, "
             "the least frequently or recently updated ones. Between passes a table past its "
             "max_rows is checked every 10 ms and evicted at once, so this mostly sets how "
             "late a TTL is applied. In [10, 86400000].");
DEFINE_string(data_dir, "",
              "Directory of the pod's RocksDB database (its volume). Set: every table, row, "
              "optimizer state and push key is durable there and recovered at start. A "
              "missing or empty directory starts a new pod; one holding anything else is "
              "refused. Empty: state lives in memory only and is lost when the process ends.");
DEFINE_string(durability, "process",
              "With --data_dir, what an acknowledged push survives. process: kill -9 of the "
              "pod (acknowledged once in the OS page cache). machine: power loss "
              "(acknowledged once fsynced; concurrent pushes share an fsync). periodic: "
              "acknowledged at once, written and fsynced every --flush_ms, so a crash loses "
              "at most the last --flush_ms of acknowledged pushes (at ps-master "
              "--replication >= 2 their followers hold them; a vshard with no follower in its "
              "ack set has its pushes acknowledged once fsynced instead). A process-mode pod "
              "whose machine went down (another boot id) reports its log tail lost.");
DEFINE_int32(flush_ms, 100, "--durability=periodic: most milliseconds of pushes a crash loses.");
DEFINE_int32(max_log_mb, 1024,
             "With --data_dir: MB of push log not yet materialized beyond which pushes wait "
             "for materialization, so a restart never replays more than about this much (about "
             "2 s of reading here). 0: no bound.");
DEFINE_int32(materialize_ms, 1000,
             "With --data_dir: how often changed rows are written to the database and the "
             "push log truncated. Recovery replays about this much of the log.");
DEFINE_int32(replicated_materialize_factor, 4,
             "With --data_dir and a master replicating (--replication >= 2): materialization "
             "rounds run every this many --materialize_ms, since each pod then writes R times "
             "the rows (its followed vshards too). A crashed pod replays up to that much more "
             "log at restart (a clean stop materializes first), while its vshards have "
             "copies on other pods. Whatever the interval, a round starts once the log holds "
             "half of --max_log_mb. 1: rounds as without replication.");
DEFINE_int64(change_journal_mb, 1024,
             "With --data_dir: MB of change journal kept (about 13 bytes per changed row per "
             "materialization round): which rows changed when, for incremental exports "
             "(ps-transfer export --since). An export asking for a cursor older than what is "
             "kept is refused (take a full export). Older rounds are merged first (each id "
             "once; see --change_journal_keep_rounds), so it holds far more history than "
             "rounds x changed rows. 0: keep only the newest round.");
DEFINE_int32(change_journal_keep_rounds, 8,
             "With --data_dir: newest materialization rounds the change journal keeps as "
             "written; older ones are merged into entries that list each changed id once. "
             "An export --since a cursor of a kept round writes exactly the rows changed "
             "since; one from a merged range also the other ids of that range.");
DEFINE_int64(change_journal_merge_kb, 4096,
             "With --data_dir: KB of older rounds the change journal merges at once (at "
             "least; also at least as much as its last merged entry holds, unless it is over "
             "--change_journal_mb). 0: merge as soon as there are two.");
DEFINE_double(
    memory_budget_mb, 0,
    "With --data_dir: MB of table rows kept in memory (fractions allowed); colder rows are evicted "
    "(CLOCK) after each materialization and read back from the database when "
    "touched; stored rows then load lazily at start. 0: every row stays in memory.");
DEFINE_bool(lazy_start, false,
            "With --data_dir: serve as soon as the push log is read; its updates are applied "
            "to each row when the row is first read back, and the rows load in the background "
            "(a request for a row not loaded yet reads it from the database and gets its "
            "recovered value). Implied by --memory_budget_mb (which replays the log first).");
DEFINE_int64(lazy_start_rows, 2000000,
             "With --data_dir and without --lazy_start: start lazily anyway (as --lazy_start) "
             "when the database holds at least this many rows (RocksDB's estimate); an eager "
             "start loads about 150k 64-dim rows per second here. 0: never.");
DEFINE_string(master, "",
              "The master's HOST:PORT. If set, the pod registers as --pod_id and owns the "
              "vshards the master assigns (--shard must then be empty). Empty: standalone.");
DEFINE_string(pod_id, "", "This pod's stable identity with --master, e.g. ps-0.");
DEFINE_string(advertise_address, "",
              "HOST:PORT the master tells clients for this pod. Empty: --host:port, with the "
              "host name in place of 0.0.0.0.");
DEFINE_int32(shutdown_grace_ms, 5000,
             "On SIGTERM/SIGINT: stop accepting, let calls in flight finish for this long.");
DEFINE_int32(metrics_port, -1,
             "Prometheus metrics over HTTP (GET /metrics, /healthz) on this port of --host; "
             "0 picks a free one (see --metrics_port_file); -1: off.");
DEFINE_string(metrics_port_file, "", "If set, the bound metrics port is written there.");
DEFINE_string(tls_cert, "",
              "PEM certificate chain: serve TLS (with --tls_key). Also the pod's client "
              "certificate towards a master that requires one.");
DEFINE_string(tls_key, "", "PEM private key of --tls_cert.");
DEFINE_string(tls_ca, "",
              "PEM CA bundle. Set: clients must present a certificate it signed (mutual TLS), "
              "and the master's certificate is verified against it.");
DEFINE_string(master_tls_ca, "",
              "PEM CA bundle to verify the master's certificate, and other pods' during a "
              "vshard move (default: --tls_ca). Set either to reach them over TLS.");
DEFINE_int32(tls_reload_s, 60,
             "The TLS files are read again this often: replaced certificates (a renewed "
             "Secret) serve new connections without a restart. 0: read once at start.");
DEFINE_string(auth_token_file, "",
              "File holding the workers' token (surrounding whitespace trimmed). Set: pulls, "
              "pushes, Describe, Stats and table creation must carry `authorization: Bearer "
              "<token>` (or the admin token), else UNAUTHENTICATED; health stays open. "
              "Without an admin credential this token also allows pod control, as before "
              "roles existed, and the pod sends it to the master and other pods.");
DEFINE_string(admin_token_file, "",
              "File holding the admin token (the master's and operators'). Set: pod control "
              "(ApplyAssignment, MigrateBegin/Export/Import, Checkpoint, Export, ImportRows) "
              "needs it (a worker token gets PERMISSION_DENIED), and the pod presents it to the "
              "master (RegisterPod, PodHeartbeat, LeavePod are admin calls there) and to other "
              "pods during a move.");
DEFINE_string(admin_identities, "",
              "Comma-separated client-certificate names (common name or subject alternative "
              "name) that hold the admin role under mutual TLS (needs --tls_ca), e.g. "
              "ps-server,ps-admin: the master's and ps-admin's certificates.");
DEFINE_string(checkpoint_root, "",
              "Directory under which Checkpoint may write (the master's cluster checkpoints "
              "name <its --checkpoint_dir>/ckpt-<id>/<pod id>: put that under this root). A "
              "relative checkpoint path is taken under it; '..' and symbolic links that lead "
              "out of it are refused. Empty: checkpoints are refused. Best on the data dir's "
              "filesystem (the copy is then made of hard links).");
DEFINE_string(export_root, "",
              "Directory under which PodTransfer.Export (ps-transfer export) may write, with "
              "the rules of --checkpoint_root. Empty: exports are refused.");
DEFINE_bool(check_flags, false,
            "Parse and validate the flags, print the resulting configuration and exit 0 (2 on "
            "a bad flag) without opening the data dir, files or ports.");

namespace {

// How ps-server exits: 0 after a graceful shutdown (or a --check_flags run), 1 if the
// server cannot start, kBadConfiguration for a bad flag or a master agent that cannot start.
constexpr int kBadConfiguration = 2;

int BadFlags(const absl::Status& status) {
  LOG(ERROR) << status.message();
  return kBadConfiguration;
}

// Each *FromFlags function below turns one group of flags into the options it configures.
// A bad value is INVALID_ARGUMENT whose message is the line logged before ps-server exits
// with kBadConfiguration. main() calls them in a fixed order; with several bad flags, the
// first group's is the one logged.

// --data_dir, --durability, --flush_ms, --max_log_mb, --materialize_ms,
// --replicated_materialize_factor,
// --change_journal_mb, --change_journal_keep_rounds, --change_journal_merge_kb,
// --memory_budget_mb, --lazy_start, --lazy_start_rows.
absl::StatusOr<ps::PodStorageOptions> StorageOptionsFromFlags() {
  ps::PodStorageOptions storage;
  storage.db.dir = FLAGS_data_dir;
  storage.materialize_ms = FLAGS_materialize_ms;
  if (FLAGS_replicated_materialize_factor < 1 || FLAGS_replicated_materialize_factor > 1000) {
    return absl::InvalidArgumentError("--replicated_materialize_factor must be in [1, 1000]");
  }
  storage.replicated_materialize_ms =
      int(std::min<int64_t>(int64_t{FLAGS_materialize_ms} * FLAGS_replicated_materialize_factor,
                            std::numeric_limits<int>::max()));
  storage.log.max_log_bytes = uint64_t(std::max(FLAGS_max_log_mb, 0)) << 20;
  storage.log.flush_ms = FLAGS_flush_ms;
  if (FLAGS_change_journal_mb < 0 || FLAGS_change_journal_mb > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError("--change_journal_mb must be in [0, 2^30]");
  }
  storage.journal.max_bytes = uint64_t(FLAGS_change_journal_mb) << 20;
  if (FLAGS_change_journal_keep_rounds < 0 || FLAGS_change_journal_merge_kb < 0 ||
      FLAGS_change_journal_merge_kb > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        "--change_journal_keep_rounds must be >= 0 and --change_journal_merge_kb in [0, 2^30]");
  }
  storage.journal.keep_rounds = static_cast<uint32_t>(FLAGS_change_journal_keep_rounds);
  storage.journal.merge_min_bytes = uint64_t(FLAGS_change_journal_merge_kb) << 10;
  if (FLAGS_memory_budget_mb < 0 || (FLAGS_memory_budget_mb > 0 && FLAGS_data_dir.empty())) {
    return absl::InvalidArgumentError("--memory_budget_mb must be >= 0 and needs --data_dir");
  }
  storage.memory_budget_bytes = static_cast<uint64_t>(FLAGS_memory_budget_mb * 1024 * 1024);
  storage.lazy_start = FLAGS_lazy_start;
  storage.lazy_replay = FLAGS_lazy_start;
  storage.lazy_start_rows = static_cast<uint64_t>(std::max<int64_t>(FLAGS_lazy_start_rows, 0));
  absl::StatusOr<ps::Durability> durability = ps::ParseDurability(FLAGS_durability);
  if (!durability.ok() || FLAGS_flush_ms < 1 || FLAGS_materialize_ms < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad durability flags: ", durability.ok() ? "--flush_ms and --materialize_ms must be >= 1"
                                                  : durability.status().ToString()));
  }
  storage.log.durability = *durability;
  return storage;
}

// The pod's work and its limits: --threads, --max_message_mb, --memory_quota_mb,
// --max_batch_rows, --table_stripes, --eviction_interval_ms. Sets those fields of *options.
absl::Status WorkOptionsFromFlags(ps::PsServerOptions* options) {
  if (FLAGS_eviction_interval_ms < 10 || FLAGS_eviction_interval_ms > 86400000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--eviction_interval_ms must be in [10, 86400000] (10 ms to a day); got ",
                     FLAGS_eviction_interval_ms));
  }
  if (FLAGS_threads < 1 || FLAGS_max_message_mb < 1 || FLAGS_max_message_mb > 2047 ||
      FLAGS_memory_quota_mb < FLAGS_max_message_mb) {
    return absl::InvalidArgumentError(
        "--threads must be >= 1, --max_message_mb in [1, 2047] and "
        "--memory_quota_mb >= --max_message_mb");
  }
  options->threads = FLAGS_threads;
  options->max_message_bytes = FLAGS_max_message_mb << 20;
  options->memory_quota_bytes = int64_t{FLAGS_memory_quota_mb} << 20;
  options->core.max_batch_rows = FLAGS_max_batch_rows;
  options->core.table.num_stripes = FLAGS_table_stripes;
  options->core.eviction_interval_ms = FLAGS_eviction_interval_ms;
  return absl::OkStatus();
}

// The vshards the pod owns at start: --shard, --num_vshards, --master (with --pod_id).
// Under a master the pod owns nothing until the master assigns its vshards.
absl::StatusOr<ps::ShardOwnership> OwnershipFromFlags() {
  if (!FLAGS_master.empty() && (FLAGS_pod_id.empty() || !FLAGS_shard.empty())) {
    return absl::InvalidArgumentError("--master needs --pod_id and excludes --shard");
  }
  absl::StatusOr<ps::ShardOwnership> ownership =
      FLAGS_shard.empty() ? ps::ShardOwnership::Create(FLAGS_num_vshards, 0, {})
                          : ps::ShardOwnership::FromStaticShard(FLAGS_shard, FLAGS_num_vshards);
  if (!ownership.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad shard flags: ", ownership.status().ToString()));
  }
  if (FLAGS_shard.empty() && FLAGS_master.empty()) {
    *ownership = ps::ShardOwnership::All(FLAGS_num_vshards);
  }
  return ownership;
}

// Where and how the pod serves: --host, --port, --inline_request_bytes, --metrics_port,
// readiness at start (under a master, once registered), and the directories requests may
// name (--checkpoint_root, --export_root). Sets those fields of *options.
absl::Status EndpointOptionsFromFlags(ps::PsServerOptions* options) {
  if (FLAGS_inline_request_bytes < -1) {
    return absl::InvalidArgumentError(
        "--inline_request_bytes must be -1 (by durability), 0 (never) or a size");
  }
  if (FLAGS_metrics_port < -1 || FLAGS_metrics_port > 65535 || FLAGS_port < 0 ||
      FLAGS_port > 65535) {
    return absl::InvalidArgumentError(
        "--port must be in [0, 65535] and --metrics_port in [-1, 65535]");
  }
  options->host = FLAGS_host;
  options->port = FLAGS_port;
  options->inline_request_bytes = FLAGS_inline_request_bytes;
  options->metrics_enabled = FLAGS_metrics_port >= 0;
  options->metrics.host = FLAGS_host;
  options->metrics.port = std::max(0, FLAGS_metrics_port);
  options->start_ready = FLAGS_master.empty();
  // Roots are absolute: a relative one would move with the working directory.
  for (const auto& [flag, value] :
       {std::pair<const char*, const std::string&>{"checkpoint_root", FLAGS_checkpoint_root},
        {"export_root", FLAGS_export_root}}) {
    if (!value.empty() && value.front() != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " must be an absolute path; got '", value, "'"));
    }
  }
  options->checkpoint_root = FLAGS_checkpoint_root;
  options->export_root = FLAGS_export_root;
  return absl::OkStatus();
}

// The TLS flags' combinations, checked before --check_flags reports; the files are read by
// SecurityFromFlags and the server.
absl::Status CheckTlsFlags() {
  if (FLAGS_tls_reload_s < 0 || FLAGS_tls_cert.empty() != FLAGS_tls_key.empty() ||
      (!FLAGS_tls_ca.empty() && FLAGS_tls_cert.empty())) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together, --tls_ca needs them, and "
        "--tls_reload_s must be >= 0");
  }
  if (!FLAGS_admin_identities.empty() && FLAGS_tls_ca.empty()) {
    return absl::InvalidArgumentError(
        "--admin_identities names client certificates: it needs mutual TLS (--tls_ca)");
  }
  return absl::OkStatus();
}

// --check_flags: the configuration the flags describe, on stdout.
void PrintCheckedFlags() {
  std::printf(
      "ps-server flags ok: port %d, metrics port %d, %s, %s, tls %s%s, worker token %s, admin "
      "%s, checkpoint root %s, export root %s\n",
      FLAGS_port, FLAGS_metrics_port,
      FLAGS_master.empty() ? "standalone" : ("master " + FLAGS_master).c_str(),
      FLAGS_data_dir.empty() ? "in memory" : ("data in " + FLAGS_data_dir).c_str(),
      FLAGS_tls_cert.empty() ? "off" : "on", FLAGS_tls_ca.empty() ? "" : " (mutual)",
      FLAGS_auth_token_file.empty() ? "off" : "on",
      FLAGS_admin_token_file.empty() && FLAGS_admin_identities.empty() ? "off" : "on",
      FLAGS_checkpoint_root.empty() ? "none" : FLAGS_checkpoint_root.c_str(),
      FLAGS_export_root.empty() ? "none" : FLAGS_export_root.c_str());
}

// Transport security both ways, with the token read from its file.
struct Security {
  ps::ServerSecurity incoming;  // of the calls this pod serves
  // Of the calls this pod makes (to the master, and to other pods during a move):
  // verified against --master_tls_ca or --tls_ca, with this pod's certificate for mutual TLS.
  ps::ChannelSecurity outgoing;
};

// A token file flag's token (read here: NOT_FOUND / INVALID_ARGUMENT as ReadAuthTokenFile
// says, in the logged line); "" when the flag is empty.
absl::StatusOr<std::string> TokenFromFlag(const char* flag, const std::string& path) {
  absl::StatusOr<std::string> token = ps::ReadAuthTokenFile(path);
  if (!token.ok()) {
    return absl::Status(token.status().code(),
                        absl::StrCat("bad --", flag, ": ", token.status().ToString()));
  }
  return token;
}

// --tls_cert, --tls_key, --tls_ca, --master_tls_ca, --tls_reload_s, --auth_token_file,
// --admin_token_file, --admin_identities.
absl::StatusOr<Security> SecurityFromFlags() {
  absl::StatusOr<std::string> token = TokenFromFlag("auth_token_file", FLAGS_auth_token_file);
  if (!token.ok()) return token.status();
  absl::StatusOr<std::string> admin = TokenFromFlag("admin_token_file", FLAGS_admin_token_file);
  if (!admin.ok()) return admin.status();
  if (!token->empty() && *token == *admin) {
    return absl::InvalidArgumentError(
        "--auth_token_file and --admin_token_file hold the same token: workers would hold "
        "the admin role");
  }
  Security security;
  security.incoming.cert_file = FLAGS_tls_cert;
  security.incoming.key_file = FLAGS_tls_key;
  security.incoming.ca_file = FLAGS_tls_ca;
  security.incoming.auth_token = *token;
  security.incoming.admin_token = *admin;
  security.incoming.admin_identities =
      absl::StrSplit(FLAGS_admin_identities, ',', absl::SkipWhitespace());
  security.incoming.reload_interval_s = FLAGS_tls_reload_s;
  security.outgoing.ca_file = FLAGS_master_tls_ca.empty() ? FLAGS_tls_ca : FLAGS_master_tls_ca;
  if (!security.outgoing.ca_file.empty()) {
    security.outgoing.cert_file = FLAGS_tls_cert;
    security.outgoing.key_file = FLAGS_tls_key;
  }
  // The pod's own calls (register, heartbeat, leave at the master; MigrateExport at a
  // move's source) are admin calls: it presents the admin token when it has one.
  security.outgoing.auth_token = admin->empty() ? *token : *admin;
  security.outgoing.reload_interval_s = FLAGS_tls_reload_s;
  return security;
}

// --master, --pod_id, --advertise_address, --num_vshards. An empty address is filled in
// once the port is bound (DefaultAdvertiseAddress).
ps::MasterAgentOptions MasterAgentOptionsFromFlags(const ps::ChannelSecurity& security) {
  ps::MasterAgentOptions agent;
  agent.master = FLAGS_master;
  agent.pod_id = FLAGS_pod_id;
  agent.address = FLAGS_advertise_address;
  agent.num_vshards = FLAGS_num_vshards;
  agent.security = security;
  return agent;
}

// What the running pod does beside serving: the files its bound ports are written to, the
// master it registers with (if any), and the grace calls in flight get on a signal.
struct RunOptions {
  std::string port_file;
  std::string metrics_port_file;
  std::optional<ps::MasterAgentOptions> agent;
  int shutdown_grace_ms = 5000;
};

// Mirrors the master agent's registration into the server's readiness, checking every
// 100 ms on its own thread until stopped. `agent` and `server` must outlive it.
class ReadinessFollower {
 public:
  ReadinessFollower(const ps::MasterAgent* agent, ps::PsServer* server, std::string pod_id)
      : thread_([this, agent, server, pod_id = std::move(pod_id)] {
          bool ready = false;
          for (;;) {
            if (agent->registered() != ready) {
              ready = !ready;
              server->SetReady(ready);
              LOG(INFO) << "pod " << pod_id << (ready ? " ready" : " not ready");
            }
            absl::MutexLock lock(&mu_);
            if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(100))) {
              return;
            }
          }
        }) {}
  ~ReadinessFollower() {
    Stop();
    thread_.join();
  }
  // Ends the checks: the thread finishes the one under way, if any, and exits.
  // Thread-safe.
  void Stop() {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }

 private:
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: it uses the members above
};

// Starts the server and (under a master) the agent, serves until SIGTERM/SIGINT, then
// shuts down gracefully. Returns the process's exit status.
int Serve(const ps::PsServerOptions& options, ps::ShardOwnership ownership, const RunOptions& run) {
  // SIGTERM/SIGINT are taken by a thread that runs the graceful shutdown.
  ps::ShutdownSignal shutdown_signal;

  const uint32_t num_vshards = ownership.num_vshards();
  auto started = ps::PsServer::Start(options, std::move(ownership));
  if (!started.ok()) {
    LOG(ERROR) << "ps-server failed to start: " << started.status();
    return 1;
  }
  std::unique_ptr<ps::PsServer> server = *std::move(started);
  const std::string& data_dir = options.core.storage.db.dir;
  LOG(INFO) << "ps-server serving on " << options.host << ":" << server->port() << ", owning "
            << server->core().ownership()->owned_count() << " of " << num_vshards << " vshards, "
            << options.threads << " work threads, "
            << (data_dir.empty() ? std::string("in memory only (no --data_dir)")
                                 : "data in " + data_dir + ", durability " +
                                       ps::DurabilityName(options.core.storage.log.durability));
  std::unique_ptr<ps::MasterAgent> agent;
  if (run.agent.has_value()) {
    ps::MasterAgentOptions agent_options = *run.agent;
    if (agent_options.address.empty()) {
      agent_options.address = ps::DefaultAdvertiseAddress(options.host, server->port());
    }
    auto agent_started = ps::MasterAgent::Start(agent_options, &server->core());
    if (!agent_started.ok()) {
      LOG(ERROR) << "cannot start the master agent: " << agent_started.status();
      return kBadConfiguration;
    }
    agent = *std::move(agent_started);
  }
  if (server->metrics_port() > 0) {
    LOG(INFO) << "metrics on http://" << options.host << ":" << server->metrics_port()
              << "/metrics";
    ps::WritePortFile(run.metrics_port_file, server->metrics_port());
  }
  ps::WritePortFile(run.port_file, server->port());

  // Readiness follows the registration with the master.
  std::optional<ReadinessFollower> readiness;
  if (agent != nullptr) readiness.emplace(agent.get(), server.get(), run.agent->pod_id);

  // SIGTERM: not ready, stop accepting (calls in flight finish, so every acknowledged push
  // is in the log), deregister from the master, then flush the rows (destruction) and exit.
  shutdown_signal.OnSignal([&](int) {
    if (readiness.has_value()) readiness->Stop();
    server->Shutdown(run.shutdown_grace_ms);
  });
  server->Wait();
  shutdown_signal.Join();  // the signal's callback has returned
  readiness.reset();
  if (agent != nullptr) (void)agent->Leave();
  agent.reset();
  server.reset();
  LOG(INFO) << "ps-server stopped";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ps::InitBinary(&argc, &argv,
                 "ps-server: a parameter-server pod holding embedding tables and dense tensors.\n"
                 "Usage: ps-server --port=50051 [--data_dir=DIR --durability=process] "
                 "[--shard=I/N --num_vshards=256]",
                 __FILE__);
  // The flags, group by group (a bad one is logged and ends the process).
  ps::PsServerOptions options;
  absl::StatusOr<ps::PodStorageOptions> storage = StorageOptionsFromFlags();
  if (!storage.ok()) return BadFlags(storage.status());
  options.core.storage = *std::move(storage);
  if (absl::Status s = WorkOptionsFromFlags(&options); !s.ok()) return BadFlags(s);
  absl::StatusOr<ps::ShardOwnership> ownership = OwnershipFromFlags();
  if (!ownership.ok()) return BadFlags(ownership.status());
  if (absl::Status s = EndpointOptionsFromFlags(&options); !s.ok()) return BadFlags(s);
  if (absl::Status s = CheckTlsFlags(); !s.ok()) return BadFlags(s);
  if (FLAGS_check_flags) {
    PrintCheckedFlags();
    return 0;
  }
  // Everything the pod writes (its database, push log, checkpoints, exports) is readable
  // by its user and group only: no file or directory it creates is open to other users.
  ps::RestrictUmask();
  absl::StatusOr<Security> security = SecurityFromFlags();
  if (!security.ok()) return BadFlags(security.status());
  options.security = security->incoming;
  options.peer_security = security->outgoing;
  RunOptions run;
  run.port_file = FLAGS_port_file;
  run.metrics_port_file = FLAGS_metrics_port_file;
  run.shutdown_grace_ms = FLAGS_shutdown_grace_ms;
  if (!FLAGS_master.empty()) run.agent = MasterAgentOptionsFromFlags(security->outgoing);
  return Serve(options, *std::move(ownership), run);
}
