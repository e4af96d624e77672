// ps-master: the cluster's master. Flags are read here only and turned into options.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/binary_init.h"
#include "common/base/shutdown_signal.h"
#include "common/routing/vshards.h"
#include "master/master_server.h"

DEFINE_string(host, "0.0.0.0", "Address to listen on (0.0.0.0: all interfaces).");
DEFINE_int32(port, 50050, "gRPC port; 0 lets the kernel pick a free one (see --port_file).");
DEFINE_string(port_file, "",
              "If set, the bound port is written to this file once serving (for tests and "
              "launchers that start the master with --port=0).");
DEFINE_string(data_dir, "",
              "Directory of the master's RocksDB (required). Everything the master knows lives "
              "there: restart it with the same directory to resume.");
DEFINE_uint32(num_vshards, 256,
              "Virtual shards in the cluster (power of two, the pods' --num_vshards). Fixed "
              "when the data dir is first used.");
DEFINE_uint32(num_ps, 1,
              "Initial PS pods of a new cluster: vshards start assigned to ps-0..ps-(N-1) in "
              "contiguous ranges, as `ps-server --shard=i/N` would own them. Ignored once the "
              "data dir exists: more pods join by registering and get vshards from "
              "`ps-admin rebalance`; `ps-admin drain` empties one.");
DEFINE_uint32(replication, 1,
              "Copies of each vshard (1..8, at most --num_ps): a primary and replication-1 "
              "followers on other pods, which hold every acknowledged push, so losing a pod "
              "and its volume loses nothing; when a primary's lease runs out a follower takes "
              "over. 1: one copy, on the owner's volume. Fixed when the data dir is first used.");
DEFINE_string(replication_ack, "all",
              "With --replication >= 2, when a push is acknowledged: 'all' once the primary "
              "and every live follower hold it (durably, in each pod's --durability mode); "
              "'leader' once the primary does (faster, but a push acknowledged just before "
              "the primary's loss may be lost).");
DEFINE_int64(lease_ms, 10000,
             "Pods and workers that send no heartbeat for this long are LOST; a lost worker's "
             "tasks go back to the queue.");
DEFINE_uint32(max_task_failures, 3,
              "A task that fails this many times (failed reports plus lost workers) is marked "
              "failed and reported in status and in its job's result.");
DEFINE_int32(threads, 4, "Threads that run master requests.");
DEFINE_uint64(max_tasks_per_job, 1000000,
              "A job of more tasks (all epochs together) is refused at creation "
              "(INVALID_ARGUMENT): a million tasks take ~0.5 GB of the master's memory. "
              "Raise records_per_task rather than this.");
DEFINE_int64(job_retention_s, 7 * 24 * 3600,
             "Finished jobs (every task done or failed) are deleted, tasks and all, this many "
             "seconds after they finished (ps-admin delete-job deletes one at once). 0: no "
             "time limit.");
DEFINE_uint32(max_finished_jobs, 100,
              "At most this many finished jobs are kept; beyond, the oldest finished are "
              "deleted. 0: no limit.");
DEFINE_int64(worker_retention_s, 3600,
             "Workers that left or lost their lease are forgotten this many seconds later "
             "(status stops listing them). 0: kept forever.");
DEFINE_uint32(vshards_per_move, 4,
              "Vshards copied (and fenced) together by one live move of drain/rebalance.");
DEFINE_string(checkpoint_dir, "",
              "Directory for cluster checkpoints (ps-admin checkpoint): ckpt-<id>/<pod id> on "
              "each pod's filesystem, ckpt-<id>/master here. Empty: checkpoints are refused.");
DEFINE_bool(auto_rebalance, false,
            "Rebalance by itself when a pod that owns nothing registers (a new pod id, or a "
            "drained pod started again), as `ps-admin rebalance` would.");
DEFINE_uint32(fence_rows, 2000,
              "A move's catch-up rounds stop, and its brief fence starts, once a round has "
              "at most this many changed rows.");
DEFINE_int32(shutdown_grace_ms, 2000,
             "On SIGTERM/SIGINT: stop accepting, let calls in flight finish for this long.");
DEFINE_int32(metrics_port, -1,
             "Prometheus metrics over HTTP (GET /metrics, /healthz) on this port of --host; "
             "0 picks a free one (see --metrics_port_file); -1: off.");
DEFINE_string(metrics_port_file, "", "If set, the bound metrics port is written there.");
DEFINE_string(tls_cert, "", "PEM certificate chain: serve TLS (with --tls_key).");
DEFINE_string(tls_key, "", "PEM private key of --tls_cert.");
DEFINE_string(tls_ca, "",
              "PEM CA bundle. Set: clients (pods, workers, ps-admin) must present a certificate "
              "it signed (mutual TLS).");
DEFINE_string(pod_tls_ca, "",
              "PEM CA bundle to verify the pods' certificates when the master calls them "
              "(vshard moves; default: --tls_ca). Set either to reach TLS pods; the master then "
              "presents --tls_cert to pods that require mutual TLS.");
DEFINE_int32(tls_reload_s, 60,
             "The TLS files are read again this often: replaced certificates (a renewed "
             "Secret) serve new connections without a restart. 0: read once at start.");
DEFINE_string(auth_token_file, "",
              "File holding the workers' token (surrounding whitespace trimmed). Set: the "
              "worker calls (RegisterWorker, WorkerHeartbeat, GetTask, ReportTask, LeaveWorker, "
              "CreateJob, GetShardMap, CreateTable, ListTables, Status) must carry "
              "`authorization: Bearer <token>` (or the admin token), else UNAUTHENTICATED; "
              "health stays open. Without an admin credential this token also allows the admin "
              "calls, as before roles existed, and the master sends it to the pods.");
DEFINE_string(admin_token_file, "",
              "File holding the admin token (pods' and operators'). Set: Drain, Rebalance, "
              "Checkpoint, DeleteJob and the pods' RegisterPod, PodHeartbeat and LeavePod "
              "need it (a worker token gets PERMISSION_DENIED), and the master presents it "
              "to the pods (assignments, moves, checkpoints are admin calls there).");
DEFINE_string(admin_identities, "",
              "Comma-separated client-certificate names (common name or subject alternative "
              "name) that hold the admin role under mutual TLS (needs --tls_ca), e.g. "
              "ps-server,ps-admin: the pods' and ps-admin's certificates.");
DEFINE_bool(check_flags, false,
            "Parse and validate the flags, print the resulting configuration and exit 0 (2 on "
            "a bad flag) without opening the data dir, files or ports.");

namespace {

int Main() {
  if (FLAGS_data_dir.empty() || FLAGS_lease_ms < 1 || FLAGS_threads < 1) {
    LOG(ERROR) << "--data_dir is required, --lease_ms and --threads must be >= 1";
    return 2;
  }
  if (FLAGS_max_tasks_per_job < 1 || FLAGS_job_retention_s < 0 || FLAGS_worker_retention_s < 0) {
    LOG(ERROR) << "--max_tasks_per_job must be >= 1, --job_retention_s and "
                  "--worker_retention_s >= 0";
    return 2;
  }
  if (FLAGS_metrics_port < -1 || FLAGS_metrics_port > 65535 || FLAGS_port < 0 ||
      FLAGS_port > 65535) {
    LOG(ERROR) << "--port must be in [0, 65535] and --metrics_port in [-1, 65535]";
    return 2;
  }
  if (FLAGS_tls_reload_s < 0 || FLAGS_tls_cert.empty() != FLAGS_tls_key.empty() ||
      (!FLAGS_tls_ca.empty() && FLAGS_tls_cert.empty())) {
    LOG(ERROR) << "--tls_cert and --tls_key go together, --tls_ca needs them, and "
                  "--tls_reload_s must be >= 0";
    return 2;
  }
  if (!FLAGS_admin_identities.empty() && FLAGS_tls_ca.empty()) {
    LOG(ERROR) << "--admin_identities names client certificates: it needs mutual TLS (--tls_ca)";
    return 2;
  }
  if (FLAGS_check_flags) {
    // The rest is checked by MasterCore::Open, which a check does not run.
    if (absl::Status s = ps::CheckNumVShards(FLAGS_num_vshards); !s.ok() || FLAGS_num_ps < 1) {
      LOG(ERROR) << (s.ok() ? "" : absl::StrCat(s.message(), "; ")) << "num_ps = " << FLAGS_num_ps
                 << " must be at least 1";
      return 2;
    }
    std::printf(
        "ps-master flags ok: port %d, metrics port %d, data in %s, %u vshards, %u pods, "
        "tls %s%s, worker token %s, admin %s\n",
        FLAGS_port, FLAGS_metrics_port, FLAGS_data_dir.c_str(), FLAGS_num_vshards, FLAGS_num_ps,
        FLAGS_tls_cert.empty() ? "off" : "on", FLAGS_tls_ca.empty() ? "" : " (mutual)",
        FLAGS_auth_token_file.empty() ? "off" : "on",
        FLAGS_admin_token_file.empty() && FLAGS_admin_identities.empty() ? "off" : "on");
    return 0;
  }
  // Nothing the master writes (its database, checkpoints) is readable by other users.
  ps::RestrictUmask();
  absl::StatusOr<std::string> token = ps::ReadAuthTokenFile(FLAGS_auth_token_file);
  if (!token.ok()) {
    LOG(ERROR) << "bad --auth_token_file: " << token.status();
    return 2;
  }
  absl::StatusOr<std::string> admin = ps::ReadAuthTokenFile(FLAGS_admin_token_file);
  if (!admin.ok()) {
    LOG(ERROR) << "bad --admin_token_file: " << admin.status();
    return 2;
  }
  if (!token->empty() && *token == *admin) {
    LOG(ERROR) << "--auth_token_file and --admin_token_file hold the same token: workers would "
                  "hold the admin role";
    return 2;
  }
  ps::MasterServerOptions options;
  options.security.cert_file = FLAGS_tls_cert;
  options.security.key_file = FLAGS_tls_key;
  options.security.ca_file = FLAGS_tls_ca;
  options.security.auth_token = *token;
  options.security.admin_token = *admin;
  options.security.admin_identities =
      absl::StrSplit(FLAGS_admin_identities, ',', absl::SkipWhitespace());
  options.security.reload_interval_s = FLAGS_tls_reload_s;
  options.metrics_enabled = FLAGS_metrics_port >= 0;
  options.metrics.host = FLAGS_host;
  options.metrics.port = std::max(0, FLAGS_metrics_port);
  options.host = FLAGS_host;
  options.port = FLAGS_port;
  options.threads = FLAGS_threads;
  options.core.data_dir = FLAGS_data_dir;
  options.core.num_vshards = FLAGS_num_vshards;
  options.core.num_ps = FLAGS_num_ps;
  options.core.lease = absl::Milliseconds(FLAGS_lease_ms);
  options.core.replication = FLAGS_replication;
  if (FLAGS_replication_ack != "all" && FLAGS_replication_ack != "leader") {
    LOG(ERROR) << "--replication_ack must be 'all' or 'leader', not '" << FLAGS_replication_ack
               << "'";
    return 2;
  }
  options.core.replication_ack_leader = FLAGS_replication_ack == "leader";
  options.core.max_task_failures = FLAGS_max_task_failures;
  options.core.vshards_per_move = FLAGS_vshards_per_move;
  options.core.fence_rows = FLAGS_fence_rows;
  options.core.checkpoint_dir = FLAGS_checkpoint_dir;
  options.core.auto_rebalance = FLAGS_auto_rebalance;
  options.core.max_tasks_per_job = FLAGS_max_tasks_per_job;
  options.core.job_retention = absl::Seconds(FLAGS_job_retention_s);
  options.core.max_finished_jobs = FLAGS_max_finished_jobs;
  options.core.worker_retention = absl::Seconds(FLAGS_worker_retention_s);
  // Retention runs as often as leases are checked, at most every 10 s: O(jobs + workers).
  options.core.retention_interval = std::min(absl::Seconds(10), options.core.lease);
  // Re-replication rounds every lease (and at each registration or failover): a follower
  // dropped at a lease loss is replaced about a lease later.
  options.core.rereplicate_interval = options.core.lease;
  // SIGTERM/SIGINT are taken by a thread that runs the graceful shutdown.
  ps::ShutdownSignal shutdown_signal;
  // After ShutdownSignal: loading credentials starts gRPC's threads.
  ps::GrpcPodControlOptions pod_control;
  ps::ChannelSecurity to_pods;
  to_pods.ca_file = FLAGS_pod_tls_ca.empty() ? FLAGS_tls_ca : FLAGS_pod_tls_ca;
  if (!to_pods.ca_file.empty()) {
    to_pods.cert_file = FLAGS_tls_cert;
    to_pods.key_file = FLAGS_tls_key;
  }
  // Assignments, moves and checkpoints are admin calls on the pods.
  to_pods.auth_token = admin->empty() ? *token : *admin;
  to_pods.reload_interval_s = FLAGS_tls_reload_s;
  absl::StatusOr<ps::ChannelMaker> channels = ps::ChannelMaker::Create(to_pods);
  if (!channels.ok()) {
    LOG(ERROR) << "bad TLS files for calls to pods: " << channels.status();
    return 2;
  }
  pod_control.channels = *std::move(channels);
  options.core.pod_control = ps::NewGrpcPodControl(pod_control);

  auto server = ps::MasterServer::Start(options);
  if (!server.ok()) {
    LOG(ERROR) << "ps-master failed to start: " << server.status();
    const auto code = server.status().code();
    return code == absl::StatusCode::kInvalidArgument ||
                   code == absl::StatusCode::kFailedPrecondition
               ? 2
               : 1;
  }
  LOG(INFO) << "ps-master serving on " << FLAGS_host << ":" << (*server)->port() << ", data dir "
            << FLAGS_data_dir << ", lease " << FLAGS_lease_ms << " ms";
  if ((*server)->metrics_port() > 0) {
    LOG(INFO) << "metrics on http://" << FLAGS_host << ":" << (*server)->metrics_port()
              << "/metrics";
    ps::WritePortFile(FLAGS_metrics_port_file, (*server)->metrics_port());
  }
  ps::WritePortFile(FLAGS_port_file, (*server)->port());
  shutdown_signal.OnSignal([&](int) { (*server)->Shutdown(FLAGS_shutdown_grace_ms); });
  (*server)->Wait();
  shutdown_signal.Join();
  LOG(INFO) << "ps-master stopped";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ps::InitBinary(&argc, &argv,
                 "ps-master: the cluster master (shard map, catalog, workers, task dispatcher).\n"
                 "Usage: ps-master --data_dir=DIR [--port=50050 --num_ps=N --num_vshards=256]",
                 __FILE__);
  return Main();
}
