// ps-chaos: a local cluster (ps-master + durable ps-server pods) trains a job through the
// master's task API with several C++ worker processes (test_worker train) while a seeded
// loop SIGKILLs pods, the master and workers (starting replacements at once) and runs
// drains and rebalances in the background. Then it checks, and prints one JSON line:
//  - the master: the job SUCCEEDED, no task failed, every record of every epoch trained
//    exactly once in its accounting (records done == records x epochs, and no task's
//    report accepted twice);
//  - every row, read back with paged pulls: each part of each record applied at least as
//    often as it was acknowledged and at most as often as it was pushed (tests/chaos_check.h),
//    and every shared row exactly the sum those counts imply (SGD, learning rate 1).
// Exit 0 when all of that holds, 1 otherwise (lost, duplicated or wrong rows, a task
// failed, the job did not finish), 2 for bad flags or a cluster that does not start.
//
// A task a killed worker held is retrained in full by another worker, so the records it
// had pushed before the kill are pushed again, under new keys: the pods apply them again
// (`reapplied` in the JSON, expected; `duplicated` counts only applications beyond what
// the journals say was pushed). Why the pods cannot de-duplicate those with push keys
// derived from (task, record, epoch): docs/operations.md, "Chaos test".
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/ps_client.h"
#include "common/base/status_macros.h"
#include "common/rpc/grpc_status.h"
#include "proto/master.grpc.pb.h"
#include "tests/chaos_check.h"
#include "tests/chaos_cluster.h"
#include "tests/chaos_journal.h"
#include "tests/chaos_workload.h"
#include "tests/process.h"

DEFINE_uint64(seed, 1, "Seed of the chaos loop's choices (what to kill, when, which moves).");
DEFINE_double(seconds, 30, "How long the chaos loop runs (it stops early if the job ends).");
DEFINE_int32(kills, 6,
             "SIGKILLs over the run, spread evenly: each picks a pod, the master or a worker "
             "at random, and starts its replacement at once.");
DEFINE_uint32(pods, 3, "ps-server pods (durable, each on its own data dir).");
DEFINE_uint32(workers, 3, "Worker processes training the job (test_worker train).");
DEFINE_string(durability, "process",
              "The pods' --durability: process or machine. (periodic acknowledges before the "
              "write, so a pod kill may lose up to --flush_ms of acknowledged pushes by "
              "design, and ps-chaos reports them as lost.)");
DEFINE_uint32(num_vshards, 64, "The cluster's vshards (a power of two).");
DEFINE_uint64(records, 0,
              "Records per epoch of the job (0: 100 per second of --seconds, so that the job "
              "outlasts the chaos loop on a quiet machine).");
DEFINE_uint32(epochs, 2, "Epochs of the job.");
DEFINE_uint64(records_per_task, 25, "The job's records_per_task.");
DEFINE_int32(record_pause_ms, 10, "Each worker's pause after each record's push.");
DEFINE_double(move_probability, 0.5,
              "Chance, at a random point of each pause between kills, of starting a drain or "
              "rebalance in the background (when none is running).");
DEFINE_int32(lease_ms, 3000, "The master's --lease_ms (pods and workers).");
DEFINE_uint32(replication, 1,
              "ps-master --replication: copies of each vshard (1: one; 2..--pods: a primary "
              "and followers, with killed pods' vshards failing over to them).");
DEFINE_double(finish_timeout_s, 300,
              "Longest wait for the job to finish after the chaos loop (a failure).");
DEFINE_string(master_binary, "", "ps-master (default: beside this program).");
DEFINE_string(server_binary, "", "ps-server (default: beside this program).");
DEFINE_string(worker_binary, "",
              "test_worker (default: ../tests/test_worker from this program's directory).");
DEFINE_string(dir, "", "Run directory (default: a fresh one under $TMPDIR, removed at the end).");
DEFINE_bool(keep_dir, false, "Keep the run directory (data dirs, logs, journals).");

namespace ps::chaos {
namespace {

constexpr char kJob[] = "chaos";

std::string Beside(const std::string& flag, const std::string& relative) {
  if (!flag.empty()) return flag;
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return (self.parent_path() / relative).lexically_normal().string();
}

// A master call with a deadline, retried (the master may be restarting) until `patience`.
template <typename Req, typename Resp>
absl::Status CallMaster(Master::Stub& stub,
                        grpc::Status (Master::Stub::*rpc)(grpc::ClientContext*, const Req&, Resp*),
                        const Req& req, Resp* resp, absl::Duration deadline,
                        absl::Duration patience) {
  const absl::Time give_up = absl::Now() + patience;
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    absl::Status s = FromGrpcStatus((stub.*rpc)(&ctx, req, resp));
    const bool retry = s.code() == absl::StatusCode::kUnavailable ||
                       s.code() == absl::StatusCode::kDeadlineExceeded ||
                       s.code() == absl::StatusCode::kAborted;
    if (!retry || absl::Now() >= give_up) return s;
    absl::SleepFor(absl::Milliseconds(200));
  }
}

// One drain or rebalance, run on its own thread so that kills land while it moves.
class MoveOp {
 public:
  MoveOp(std::shared_ptr<Master::Stub> stub, std::string pod) {
    thread_ = std::thread([this, stub, pod] {
      absl::Status s;
      uint32_t moved = 0;
      if (pod.empty()) {
        RebalanceResponse resp;
        s = CallMaster(*stub, &Master::Stub::Rebalance, RebalanceRequest(), &resp, absl::Minutes(5),
                       absl::ZeroDuration());
        moved = resp.moved_vshards();
      } else {
        DrainRequest req;
        req.set_pod_id(pod);
        DrainResponse resp;
        s = CallMaster(*stub, &Master::Stub::Drain, req, &resp, absl::Minutes(5),
                       absl::ZeroDuration());
        moved = resp.moved_vshards();
      }
      LOG(INFO) << (pod.empty() ? "rebalance" : "drain " + pod) << ": "
                << (s.ok() ? absl::StrCat(moved, " vshards moved") : s.ToString());
      moved_ = s.ok() ? moved : 0;
      ok_ = s.ok();
      done_ = true;
    });
  }
  ~MoveOp() { thread_.join(); }
  bool done() const { return done_; }
  bool ok() const { return ok_; }
  uint32_t moved() const { return moved_; }

 private:
  std::atomic<bool> done_{false}, ok_{false};
  std::atomic<uint32_t> moved_{0};
  std::thread thread_;
};

struct Counts {
  uint64_t pod_kills = 0, master_kills = 0, worker_kills = 0;
  uint64_t moves = 0, move_ops = 0, move_ops_failed = 0;
};

int Run() {
  if (FLAGS_pods < 1 || FLAGS_workers < 1 || FLAGS_epochs < 1 || FLAGS_epochs > 255 ||
      FLAGS_records_per_task < 1 || FLAGS_seconds <= 0 || FLAGS_kills < 0 ||
      FLAGS_num_vshards < 1 || (FLAGS_num_vshards & (FLAGS_num_vshards - 1)) != 0 ||
      FLAGS_replication < 1 || FLAGS_replication > FLAGS_pods) {
    LOG(ERROR) << "bad flags: need --pods, --workers, --records_per_task >= 1, --epochs in "
                  "1..255, --seconds > 0, --kills >= 0, --num_vshards a power of two, "
                  "--replication in 1..--pods";
    return 2;
  }
  const uint64_t records =
      FLAGS_records != 0 ? FLAGS_records : static_cast<uint64_t>(100 * FLAGS_seconds);
  if (records >= (uint64_t{1} << 30)) {
    LOG(ERROR) << "--records must be below 2^30 (the workload's witness ids)";
    return 2;
  }
  std::unique_ptr<integration::TempDir> tmp;  // removes the run directory unless kept
  std::string dir = FLAGS_dir;
  if (dir.empty()) {
    tmp = std::make_unique<integration::TempDir>("ps-chaos.");
    dir = tmp->path();
    if (FLAGS_keep_dir) {  // a directory of its own, left in place
      dir += "-kept";
      tmp.reset();
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (dir.empty() || ec) {
    LOG(ERROR) << "cannot create the run directory " << dir << ": " << ec.message();
    return 2;
  }
  LOG(INFO) << "run directory " << dir;

  ClusterOptions copt;
  copt.dir = dir;
  copt.master_binary = Beside(FLAGS_master_binary, "ps-master");
  copt.server_binary = Beside(FLAGS_server_binary, "ps-server");
  copt.worker_binary = Beside(FLAGS_worker_binary, "../tests/test_worker");
  copt.pods = FLAGS_pods;
  copt.num_vshards = FLAGS_num_vshards;
  copt.durability = FLAGS_durability;
  copt.lease_ms = FLAGS_lease_ms;
  copt.replication = FLAGS_replication;
  Cluster cluster(copt);
  auto fail_start = [&](const absl::Status& s) {
    LOG(ERROR) << "cluster start: " << s << "\n" << cluster.Logs();
    return 2;
  };
  if (absl::Status s = cluster.StartMaster(); !s.ok()) return fail_start(s);
  for (uint32_t i = 0; i < FLAGS_pods; ++i) {
    if (absl::Status s = cluster.StartPod(i); !s.ok()) return fail_start(s);
  }
  auto stub = std::shared_ptr<Master::Stub>(Master::NewStub(
      grpc::CreateChannel(cluster.master_address(), grpc::InsecureChannelCredentials())));
  const Workload workload(FLAGS_num_vshards);
  {
    ClientOptions options;
    options.master = cluster.master_address();
    auto client = PsClient::Connect(options);
    if (!client.ok()) return fail_start(client.status());
    TableSpec spec;
    spec.set_name(kTable);
    spec.set_dim(kDim);
    spec.mutable_initializer()->set_kind(InitializerSpec::ZEROS);
    spec.mutable_optimizer()->set_kind(OptimizerSpec::SGD);
    spec.mutable_optimizer()->set_learning_rate(1);
    if (absl::Status s = (*client)->CreateTable(spec); !s.ok()) return fail_start(s);
  }
  CreateJobRequest job;
  job.set_name(kJob);
  job.set_epochs(FLAGS_epochs);
  job.set_records_per_task(FLAGS_records_per_task);
  job.add_files()->set_path("chaos-records");
  job.mutable_files(0)->set_records(records);
  CreateJobResponse created;
  if (absl::Status s = CallMaster(*stub, &Master::Stub::CreateJob, job, &created, absl::Seconds(30),
                                  absl::Seconds(60));
      !s.ok()) {
    return fail_start(s);
  }
  LOG(INFO) << "job " << kJob << ": " << records << " records x " << FLAGS_epochs << " epochs, "
            << created.num_tasks() << " tasks";
  for (uint32_t w = 0; w < FLAGS_workers; ++w) {
    if (absl::Status s = cluster.StartWorker(w, 0, kJob, FLAGS_record_pause_ms); !s.ok()) {
      return fail_start(s);
    }
  }

  auto job_state = [&](absl::Duration patience) -> absl::StatusOr<JobInfo> {
    StatusResponse status;
    RETURN_IF_ERROR(CallMaster(*stub, &Master::Stub::Status, StatusRequest(), &status,
                               absl::Seconds(10), patience));
    for (const JobInfo& j : status.jobs()) {
      if (j.name() == kJob) return j;
    }
    return absl::NotFoundError("the master does not list the job");
  };

  // The chaos loop: --kills kills spread over --seconds, and moves in the background.
  std::mt19937_64 rng(FLAGS_seed);
  auto uniform = [&rng](uint64_t n) {
    return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng);
  };
  Counts counts;
  std::vector<bool> drained(FLAGS_pods, false);
  std::unique_ptr<MoveOp> move;
  auto collect_move = [&] {
    if (move == nullptr || !move->done()) return;
    counts.moves += move->moved();
    if (!move->ok()) ++counts.move_ops_failed;
    move.reset();
  };
  const absl::Time start = absl::Now();
  const absl::Duration step = absl::Seconds(FLAGS_seconds) / (FLAGS_kills + 1);
  bool job_ended = false;
  auto maybe_start_move = [&] {
    if (move != nullptr || uniform(1000) >= FLAGS_move_probability * 1000) return;
    std::vector<uint32_t> candidates;
    for (uint32_t i = 0; i < FLAGS_pods; ++i) {
      if (!drained[i]) candidates.push_back(i);
    }
    // Drain only while another pod would keep serving.
    if (uniform(2) == 0 && candidates.size() >= 2) {
      const uint32_t pod = candidates[uniform(candidates.size())];
      drained[pod] = true;  // also if it fails: the master may have recorded it
      LOG(INFO) << "chaos: drain " << cluster.PodId(pod);
      move = std::make_unique<MoveOp>(stub, cluster.PodId(pod));
    } else {
      LOG(INFO) << "chaos: rebalance";
      move = std::make_unique<MoveOp>(stub, "");
    }
    ++counts.move_ops;
  };
  for (int k = 0; k <= FLAGS_kills && !job_ended; ++k) {
    // A pause of half to one and a half steps (a move may start at a random point of it),
    // then a kill; until --seconds.
    const absl::Time now = absl::Now();
    const absl::Time until = std::min(start + absl::Seconds(FLAGS_seconds),
                                      now + step / 2 + step * (uniform(1000) / 1000.0));
    const absl::Time move_at = now + (until - now) * (uniform(1000) / 1000.0);
    bool move_considered = k == FLAGS_kills;
    while (absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(50));
      collect_move();
      if (!move_considered && absl::Now() >= move_at) {
        move_considered = true;
        maybe_start_move();
      }
    }
    auto state = job_state(absl::Seconds(30));
    if (state.ok() && state->state() != JobInfo::RUNNING) {
      job_ended = true;
      break;
    }
    if (k == FLAGS_kills) break;  // the last pause ends the loop
    const uint64_t kind = uniform(3);
    if (kind == 0) {
      const uint32_t pod = static_cast<uint32_t>(uniform(FLAGS_pods));
      LOG(INFO) << "chaos: SIGKILL " << cluster.PodId(pod);
      cluster.KillPod(pod);
      ++counts.pod_kills;
      // A new address: the master undrains a drained pod that comes back.
      drained[pod] = false;
      if (absl::Status s = cluster.StartPod(pod); !s.ok()) {
        LOG(ERROR) << "restart of " << cluster.PodId(pod) << ": " << s;
        return 1;
      }
    } else if (kind == 1) {
      LOG(INFO) << "chaos: SIGKILL ps-master";
      cluster.KillMaster();
      ++counts.master_kills;
      if (absl::Status s = cluster.StartMaster(); !s.ok()) {
        LOG(ERROR) << "restart of ps-master: " << s;
        return 1;
      }
    } else {
      const uint32_t slot = static_cast<uint32_t>(uniform(FLAGS_workers));
      // Half the replacements come back as the same worker (a new incarnation: the master
      // re-queues its task at once), half as a new one (its task waits for the lease).
      const uint64_t id = uniform(2) == 0 ? cluster.WorkerId(slot) : 0;
      LOG(INFO) << "chaos: SIGKILL worker " << slot << ", replacement "
                << (id != 0 ? absl::StrCat("as worker ", id) : std::string("with a new id"));
      cluster.KillWorker(slot);
      ++counts.worker_kills;
      if (absl::Status s = cluster.StartWorker(slot, id, kJob, FLAGS_record_pause_ms); !s.ok()) {
        LOG(ERROR) << "worker replacement: " << s;
        return 1;
      }
    }
  }
  const double chaos_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  move.reset();  // waits for a move in flight
  if (counts.move_ops > 0) collect_move();
  LOG(INFO) << "chaos loop over after " << chaos_seconds << " s; waiting for the job";

  // The end: the job finishes, the workers exit.
  const absl::Time finish_by = absl::Now() + absl::Seconds(FLAGS_finish_timeout_s);
  absl::StatusOr<JobInfo> info = job_state(absl::Seconds(60));
  while (info.ok() && info->state() == JobInfo::RUNNING && absl::Now() < finish_by) {
    absl::SleepFor(absl::Milliseconds(200));
    info = job_state(absl::Seconds(60));
  }
  bool workers_ok = true;
  for (uint32_t w = 0; w < cluster.workers(); ++w) {
    if (!cluster.WaitWorker(w, absl::Seconds(60))) workers_ok = false;
  }

  // Read every row the check needs, in pages.
  const std::vector<int64_t> ids = IdsToRead(workload, records, FLAGS_epochs);
  absl::flat_hash_map<int64_t, std::vector<float>> rows;
  absl::Status read = absl::OkStatus();
  {
    ClientOptions options;
    options.master = cluster.master_address();
    auto client = PsClient::Connect(options);
    read = client.status();
    constexpr size_t kPage = 4096;
    std::vector<float> page(kPage * kDim);
    for (size_t at = 0; read.ok() && at < ids.size(); at += kPage) {
      const size_t n = std::min(kPage, ids.size() - at);
      absl::Span<const int64_t> span(ids.data() + at, n);
      read = (*client)->Pull({{kTable, span, page.data()}}, /*read_only=*/true);
      for (size_t i = 0; read.ok() && i < n; ++i) {
        rows[span[i]].assign(page.begin() + i * kDim, page.begin() + (i + 1) * kDim);
      }
    }
  }
  auto journals = ReadJournals(dir);
  Verdict verdict;
  uint64_t accepted_twice = 0;
  if (journals.ok()) {
    verdict = Check(workload, *journals, records, FLAGS_epochs, rows);
    for (const auto& [task, r] : journals->tasks) accepted_twice += r.ok > 1 ? r.ok - 1 : 0;
  }
  const uint64_t records_expected = records * FLAGS_epochs;
  const uint64_t records_trained = info.ok() ? info->train_records_done() : 0;
  const bool succeeded = info.ok() && info->state() == JobInfo::SUCCEEDED;
  const uint64_t tasks_failed = info.ok() ? info->tasks_failed() : 0;
  const bool pass = succeeded && workers_ok && read.ok() && journals.ok() &&
                    records_trained == records_expected && tasks_failed == 0 && verdict.lost == 0 &&
                    verdict.duplicated == 0 && verdict.wrong_rows == 0 && accepted_twice == 0 &&
                    journals->bad_lines == 0;
  if (!info.ok()) LOG(ERROR) << "job status: " << info.status();
  if (!read.ok()) LOG(ERROR) << "final read: " << read;
  if (!journals.ok()) LOG(ERROR) << "journals: " << journals.status();
  for (const std::string& e : verdict.examples) LOG(ERROR) << e;
  if (!pass) {
    LOG(ERROR) << "FAILED: job " << (info.ok() ? JobInfo::State_Name(info->state()) : "?")
               << ", workers " << (workers_ok ? "exited" : "still running") << "\n"
               << cluster.Logs();
  }
  std::printf(
      "{\"seed\": %lu, \"seconds\": %.1f, \"chaos_seconds\": %.1f, \"durability\": \"%s\", "
      "\"replication\": %u, \"pods\": %u, \"workers\": %u, \"pod_kills\": %lu, "
      "\"master_kills\": %lu, \"worker_kills\": %lu, \"moves\": %lu, \"move_ops\": %lu, "
      "\"move_ops_failed\": %lu, "
      "\"task_attempts\": %lu, \"acked_pushes\": %lu, \"unknown_pushes\": %lu, "
      "\"parts_checked\": %lu, \"lost\": %lu, \"duplicated\": %lu, \"reapplied\": %lu, "
      "\"wrong_rows\": %lu, \"tasks_accepted_twice\": %lu, \"tasks_failed\": %lu, "
      "\"job_state\": \"%s\", \"records_expected\": %lu, \"records_trained\": %lu, "
      "\"pass\": %s}\n",
      static_cast<unsigned long>(FLAGS_seed), FLAGS_seconds, chaos_seconds,
      FLAGS_durability.c_str(), FLAGS_replication, FLAGS_pods, FLAGS_workers,
      static_cast<unsigned long>(counts.pod_kills), static_cast<unsigned long>(counts.master_kills),
      static_cast<unsigned long>(counts.worker_kills), static_cast<unsigned long>(counts.moves),
      static_cast<unsigned long>(counts.move_ops),
      static_cast<unsigned long>(counts.move_ops_failed),
      static_cast<unsigned long>(journals.ok() ? journals->attempts : 0),
      static_cast<unsigned long>(journals.ok() ? journals->acked_pushes : 0),
      static_cast<unsigned long>(journals.ok() ? journals->unknown_pushes : 0),
      static_cast<unsigned long>(verdict.parts_checked), static_cast<unsigned long>(verdict.lost),
      static_cast<unsigned long>(verdict.duplicated), static_cast<unsigned long>(verdict.reapplied),
      static_cast<unsigned long>(verdict.wrong_rows), static_cast<unsigned long>(accepted_twice),
      static_cast<unsigned long>(tasks_failed),
      info.ok() ? JobInfo::State_Name(info->state()).c_str() : "UNKNOWN",
      static_cast<unsigned long>(records_expected), static_cast<unsigned long>(records_trained),
      pass ? "true" : "false");
  std::fflush(stdout);
  if (tmp == nullptr) LOG(INFO) << "run directory kept: " << dir;
  return pass ? 0 : 1;
}

}  // namespace
}  // namespace ps::chaos

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "ps-chaos: SIGKILLs pods, the master and workers of a local cluster, and moves vshards, "
      "while a job trains known gradients; checks that the job succeeds with every record "
      "trained once and every row exact. Last line: one JSON object.");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  return ps::chaos::Run();
}
