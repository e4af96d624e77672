// ps-master: the cluster's master. Flags are read here only and turned into options.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>

#include <cstdio>
#include <thread>

#include "embedding/binary_init.h"
#include "embedding/shutdown_signal.h"
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
DEFINE_int64(lease_ms, 10000,
             "Pods and workers that send no heartbeat for this long are LOST; a lost worker's "
             "tasks go back to the queue.");
DEFINE_uint32(max_task_failures, 3,
              "A task that fails this many times (failed reports plus lost workers) is marked "
              "failed and reported in status and in its job's result.");
DEFINE_int32(threads, 4, "Threads that run master requests.");
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

namespace {

int Main() {
  if (FLAGS_data_dir.empty() || FLAGS_lease_ms < 1 || FLAGS_threads < 1) {
    LOG(ERROR) << "--data_dir is required, --lease_ms and --threads must be >= 1";
    return 2;
  }
  ps::MasterServerOptions options;
  options.host = FLAGS_host;
  options.port = FLAGS_port;
  options.threads = FLAGS_threads;
  options.core.data_dir = FLAGS_data_dir;
  options.core.num_vshards = FLAGS_num_vshards;
  options.core.num_ps = FLAGS_num_ps;
  options.core.lease = absl::Milliseconds(FLAGS_lease_ms);
  options.core.max_task_failures = FLAGS_max_task_failures;
  options.core.vshards_per_move = FLAGS_vshards_per_move;
  options.core.fence_rows = FLAGS_fence_rows;
  options.core.checkpoint_dir = FLAGS_checkpoint_dir;
  options.core.auto_rebalance = FLAGS_auto_rebalance;

  // SIGTERM/SIGINT are taken by a thread that runs the graceful shutdown.
  ps::ShutdownSignal shutdown_signal;

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
  ps::WritePortFile(FLAGS_port_file, (*server)->port());
  shutdown_signal.OnSignal([&](int) { (*server)->Shutdown(FLAGS_shutdown_grace_ms); });
  (*server)->Wait();
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
