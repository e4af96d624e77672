// ps-admin: the operator's command line against the master's admin API.
// Exit codes: 0 success, 1 the master could not be reached or refused the command,
// 2 bad usage.
#include <gflags/gflags.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/admin_format.h"
#include "client/security_flags.h"
#include "common/base/binary_init.h"
#include "common/rpc/transport_security.h"
#include "proto/master.grpc.pb.h"
#include "proto/ps.grpc.pb.h"

DEFINE_string(master, "", "The master's address, HOST:PORT (required).");
DEFINE_bool(json, false,
            "Print the master's answer as JSON (the protobuf JSON mapping of the response "
            "message, one object) instead of tables: for scripts.");
DEFINE_int32(timeout_ms, 3000,
             "Deadline of each call to the master; an unreachable master fails after it.");
DEFINE_bool(force, false, "delete-job: delete the job even while it is RUNNING.");
DEFINE_int32(move_timeout_ms, 1800000,
             "Deadline of drain and rebalance, which return once their vshard moves are done "
             "(progress shows in `status` meanwhile).");

namespace {

constexpr char kUsage[] =
    "ps-admin: operate a cluster through its master.\n"
    "Usage: ps-admin --master=HOST:PORT [--json] COMMAND\n"
    "Commands:\n"
    "  status      cluster at a glance: pods, workers, jobs, failed tasks; with replication,\n"
    "              failovers, ack-set removals, under-replicated vshards, followers' lag\n"
    "  shards      the shard map: epoch and each pod's vshards; with replication, each\n"
    "              vshard's primary, followers (its ack set) and how far they are behind\n"
    "  tables      the table catalog with each table's version (pushes), and per table the\n"
    "              rows, admitted, pending admission, dropped gradients and evicted rows\n"
    "              summed over the live pods\n"
    "  workers     registered workers, their incarnations, states and leases\n"
    "  tasks       job progress, tasks in progress and failed tasks\n"
    "  jobs        every job the master keeps: state, progress, when created and finished,\n"
    "              and when retention deletes it (ps-master --job_retention_s and\n"
    "              --max_finished_jobs)\n"
    "  delete-job NAME  delete a finished job, tasks and all (its name is free again); a\n"
    "              RUNNING job only with --force (its workers then get NOT_FOUND)\n"
    "  drain POD   move POD's vshards to the other live pods (live migration); returns when\n"
    "              done, POD then owns nothing (DRAINED) and can be removed\n"
    "  rebalance   spread vshards evenly over the live, not drained pods (e.g. after a pod\n"
    "              joined); returns when done. `status` shows progress meanwhile\n"
    "  checkpoint  every pod's state and the master's into <--checkpoint_dir>/ckpt-<id>\n"
    "Exit codes: 0 done, 1 master unreachable or command refused, 2 bad usage.";

int Usage(const std::string& why) {
  std::fprintf(stderr, "ps-admin: %s\n\n%s\n", why.c_str(), kUsage);
  return 2;
}

// One master connection; calls are synchronous, each with --timeout_ms.
class Admin {
 public:
  Admin(const std::string& address, const ps::ChannelMaker& channels)
      : address_(address), stub_(ps::Master::NewStub(channels.Make(address))) {}

  // Calls `rpc`; on failure prints why (naming the master) and returns false.
  template <typename Req, typename Resp>
  bool Call(const char* what,
            grpc::Status (ps::Master::Stub::*rpc)(grpc::ClientContext*, const Req&, Resp*),
            const Req& req, Resp* resp, int timeout_ms = 0) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(timeout_ms > 0 ? timeout_ms : FLAGS_timeout_ms));
    grpc::Status s = (stub_.get()->*rpc)(&ctx, req, resp);
    if (s.ok()) return true;
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
        s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      std::fprintf(stderr, "ps-admin: cannot reach the master at %s within %d ms: %s\n",
                   address_.c_str(), FLAGS_timeout_ms, s.error_message().c_str());
    } else {
      std::fprintf(stderr, "ps-admin: %s refused by the master at %s: %s: %s\n", what,
                   address_.c_str(), StatusCodeName(s.error_code()).c_str(),
                   s.error_message().c_str());
    }
    return false;
  }

 private:
  static std::string StatusCodeName(grpc::StatusCode code) {
    std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
    return name.empty() ? "UNKNOWN" : name;
  }

  std::string address_;
  std::unique_ptr<ps::Master::Stub> stub_;
};

// Each live pod's own Stats (rows, memory, request counts), asked of the pod directly, one
// call per pod with the usual deadline. A pod that does not answer is left out: its row
// shows only what the master knows.
ps::PodStats CollectPodStats(const ps::StatusResponse& s, const ps::ChannelMaker& channels) {
  ps::PodStats stats;
  for (const ps::PodInfo& p : s.pods()) {
    if (p.state() != ps::PodInfo::LIVE || p.address().empty()) continue;
    auto stub = ps::ParameterServer::NewStub(channels.Make(p.address()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(FLAGS_timeout_ms));
    ps::StatsResponse st;
    if (stub->Stats(&ctx, ps::StatsRequest(), &st).ok()) stats[p.pod_id()] = st;
  }
  return stats;
}

// Each live pod's tables (Describe: rows and lifecycle counters), summed per table, one
// call per pod with the usual deadline. A pod that does not answer is left out (the
// output says over how many pods the sums run).
ps::TableTotals CollectTableTotals(const ps::StatusResponse& s, const ps::ChannelMaker& channels) {
  ps::TableTotals totals;
  for (const ps::PodInfo& p : s.pods()) {
    if (p.state() != ps::PodInfo::LIVE || p.address().empty()) continue;
    auto stub = ps::ParameterServer::NewStub(channels.Make(p.address()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(FLAGS_timeout_ms));
    ps::DescribeResponse d;
    if (stub->Describe(&ctx, ps::DescribeRequest(), &d).ok()) ps::AddTableTotals(d, &totals);
  }
  return totals;
}

// Prints `msg` as JSON (--json) or as the text `format` makes of it.
template <typename Msg>
int Print(const Msg& msg, const std::function<std::string()>& format) {
  if (FLAGS_json) {
    std::string json;
    google::protobuf::util::JsonPrintOptions options;
    options.always_print_primitive_fields = true;
    options.preserve_proto_field_names = true;
    if (!google::protobuf::util::MessageToJsonString(msg, &json, options).ok()) return 1;
    std::printf("%s\n", json.c_str());
  } else {
    std::printf("%s", format().c_str());
  }
  return 0;
}

int Main(const std::vector<std::string>& args) {
  if (FLAGS_master.empty()) return Usage("--master=HOST:PORT is required");
  if (args.empty()) return Usage("no command given");
  if (FLAGS_timeout_ms < 1) return Usage("--timeout_ms must be >= 1");
  const std::string& cmd = args[0];
  const bool named = cmd == "drain" || cmd == "delete-job";
  const size_t want_args = named ? 2 : 1;
  static const char* const kCommands[] = {"status", "shards",    "tables",    "workers",
                                          "tasks",  "drain",     "rebalance", "checkpoint",
                                          "jobs",   "delete-job"};
  if (std::find(std::begin(kCommands), std::end(kCommands), cmd) == std::end(kCommands)) {
    return Usage("unknown command '" + cmd + "'");
  }
  if (args.size() != want_args) {
    return Usage(cmd == "drain"        ? "drain takes one pod id, e.g. `drain ps-2`"
                 : cmd == "delete-job" ? "delete-job takes one job name, e.g. `delete-job ctr`"
                                       : "'" + cmd + "' takes no arguments");
  }
  absl::StatusOr<ps::ChannelSecurity> security = ps::ChannelSecurityFromFlags();
  if (!security.ok()) return Usage(std::string(security.status().message()));
  absl::StatusOr<ps::ChannelMaker> channels = ps::ChannelMaker::Create(*security);
  if (!channels.ok()) return Usage(std::string(channels.status().message()));
  Admin admin(FLAGS_master, *channels);
  using ps::Master;
  if (cmd == "status" || cmd == "workers" || cmd == "tasks" || cmd == "jobs") {
    ps::StatusResponse s;
    if (!admin.Call("status", &Master::Stub::Status, ps::StatusRequest(), &s)) return 1;
    return Print(s, [&] {
      return cmd == "status"    ? ps::FormatStatus(s, CollectPodStats(s, *channels))
             : cmd == "workers" ? ps::FormatWorkers(s)
             : cmd == "jobs"    ? ps::FormatJobList(s)
                                : ps::FormatTasks(s);
    });
  }
  if (cmd == "delete-job") {
    ps::DeleteJobRequest req;
    req.set_name(args[1]);
    req.set_force(FLAGS_force);
    ps::DeleteJobResponse r;
    // Removing a large job's task records takes a while: the moves' deadline.
    if (!admin.Call("delete-job", &Master::Stub::DeleteJob, req, &r, FLAGS_move_timeout_ms)) {
      return 1;
    }
    return Print(r, [&] { return ps::FormatDeletedJob(r); });
  }
  if (cmd == "shards") {
    ps::ShardMapResponse m;
    if (!admin.Call("shards", &Master::Stub::GetShardMap, ps::GetShardMapRequest(), &m)) return 1;
    return Print(m, [&] { return ps::FormatShards(m); });
  }
  if (cmd == "tables") {
    ps::ListTablesResponse t;
    ps::StatusResponse s;
    if (!admin.Call("tables", &Master::Stub::ListTables, ps::ListTablesRequest(), &t)) return 1;
    if (!FLAGS_json && !admin.Call("status", &Master::Stub::Status, ps::StatusRequest(), &s)) {
      return 1;
    }
    return Print(t, [&] { return ps::FormatTables(t, s, CollectTableTotals(s, *channels)); });
  }
  if (cmd == "drain") {
    ps::DrainRequest req;
    req.set_pod_id(args[1]);
    ps::DrainResponse r;
    if (!admin.Call("drain", &Master::Stub::Drain, req, &r, FLAGS_move_timeout_ms)) return 1;
    return Print(r, [&] {
      return "pod " + args[1] + " drained (" + std::to_string(r.moved_vshards()) +
             " vshards moved); it owns no vshards and can be removed; shard map epoch " +
             std::to_string(r.epoch()) + "\n";
    });
  }
  if (cmd == "rebalance") {
    ps::RebalanceResponse r;
    if (!admin.Call("rebalance", &Master::Stub::Rebalance, ps::RebalanceRequest(), &r,
                    FLAGS_move_timeout_ms)) {
      return 1;
    }
    return Print(r, [&] {
      return "balanced (" + std::to_string(r.moved_vshards()) +
             " vshards moved); shard map epoch " + std::to_string(r.epoch()) + "\n";
    });
  }
  ps::CheckpointResponse r;
  if (!admin.Call("checkpoint", &Master::Stub::Checkpoint, ps::CheckpointRequest(), &r,
                  FLAGS_move_timeout_ms)) {
    return 1;
  }
  return Print(r, [&] {
    return "checkpoint " + std::to_string(r.checkpoint().checkpoint_id()) + " in " +
           r.checkpoint().dir() + " (" + std::to_string(r.checkpoint().pods_size()) +
           " pods, epoch " + std::to_string(r.checkpoint().epoch()) + ")\n";
  });
}

}  // namespace

// gflags exits with 1 on an unknown flag; ps-admin promises 2 for bad usage, so check first.
bool KnownFlag(std::string arg) {
  arg = arg.substr(arg.find_first_not_of('-'));
  arg = arg.substr(0, arg.find('='));
  if (arg == "help" || arg == "h") return true;
  gflags::CommandLineFlagInfo info;
  if (gflags::GetCommandLineFlagInfo(arg.c_str(), &info)) return true;
  return arg.rfind("no", 0) == 0 && gflags::GetCommandLineFlagInfo(arg.substr(2).c_str(), &info) &&
         info.type == "bool";
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() > 1 && arg[0] == '-' && arg.find_first_not_of('-') != std::string::npos &&
        !KnownFlag(arg)) {
      return Usage("unknown flag " + arg);
    }
  }
  ps::InitBinary(&argc, &argv, kUsage, __FILE__);
  std::vector<std::string> args(argv + 1, argv + argc);
  return Main(args);
}
