// ps-server: one parameter-server pod. Flags are read here only and turned into options.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>

#include <fstream>
#include <thread>

#include "embedding/binary_init.h"
#include "ps/ps_server.h"

DEFINE_string(host, "0.0.0.0", "Address to listen on (0.0.0.0: all interfaces).");
DEFINE_int32(port, 50051, "gRPC port; 0 lets the kernel pick a free one (see --port_file).");
DEFINE_string(port_file, "",
              "If set, the bound port is written to this file once serving (for tests and "
              "launchers that start the server with --port=0).");
DEFINE_int32(threads, 2,
             "Threads that execute pull/push work. Pulls and pushes are memory-bound: use "
             "about one per core the pod is given.");
DEFINE_uint64(inline_request_bytes, 1024,
              "Pulls and pushes whose request is at most this many bytes run on gRPC's "
              "thread instead of the work pool (saves a thread hand-off); 0: never.");
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
DEFINE_int32(shutdown_grace_ms, 5000,
             "On SIGTERM/SIGINT: stop accepting, let calls in flight finish for this long.");

namespace {

int Main() {
  ps::PsServerOptions options;
  options.host = FLAGS_host;
  options.port = FLAGS_port;
  options.threads = FLAGS_threads;
  options.inline_request_bytes = FLAGS_inline_request_bytes;
  options.max_message_bytes = FLAGS_max_message_mb << 20;
  options.memory_quota_bytes = int64_t{FLAGS_memory_quota_mb} << 20;
  options.core.max_batch_rows = FLAGS_max_batch_rows;
  options.core.table.num_stripes = FLAGS_table_stripes;
  if (FLAGS_threads < 1 || FLAGS_max_message_mb < 1 || FLAGS_max_message_mb > 2047 ||
      FLAGS_memory_quota_mb < FLAGS_max_message_mb) {
    LOG(ERROR) << "--threads must be >= 1, --max_message_mb in [1, 2047] and "
                  "--memory_quota_mb >= --max_message_mb";
    return 2;
  }

  absl::StatusOr<ps::ShardOwnership> ownership =
      FLAGS_shard.empty() ? ps::ShardOwnership::Create(FLAGS_num_vshards, 0, {})
                          : ps::ShardOwnership::FromStaticShard(FLAGS_shard, FLAGS_num_vshards);
  if (!ownership.ok()) {
    LOG(ERROR) << "bad shard flags: " << ownership.status();
    return 2;
  }
  if (FLAGS_shard.empty()) *ownership = ps::ShardOwnership::All(FLAGS_num_vshards);

  // SIGTERM/SIGINT are taken by a thread that runs the graceful shutdown.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = ps::PsServer::Start(options, *std::move(ownership));
  if (!server.ok()) {
    LOG(ERROR) << "ps-server failed to start: " << server.status();
    return 1;
  }
  LOG(INFO) << "ps-server serving on " << FLAGS_host << ":" << (*server)->port() << ", owning "
            << (*server)->core().ownership()->owned_count() << " of " << FLAGS_num_vshards
            << " vshards, " << FLAGS_threads << " work threads";
  if (!FLAGS_port_file.empty()) {
    const std::string tmp = FLAGS_port_file + ".tmp";
    std::ofstream(tmp) << (*server)->port() << "\n";
    std::rename(tmp.c_str(), FLAGS_port_file.c_str());
  }

  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    LOG(INFO) << "signal " << sig << ": shutting down (grace " << FLAGS_shutdown_grace_ms << " ms)";
    (*server)->Shutdown(FLAGS_shutdown_grace_ms);
  });
  (*server)->Wait();
  signal_thread.join();
  LOG(INFO) << "ps-server stopped";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ps::InitBinary(&argc, &argv,
                 "ps-server: a parameter-server pod holding embedding tables and dense tensors.\n"
                 "Usage: ps-server --port=50051 [--shard=I/N --num_vshards=256]",
                 __FILE__);
  return Main();
}
