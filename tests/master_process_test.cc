// Integration tests of ps-master as a real process on loopback, with this test process
// acting as the workers through the Master API: a master SIGKILLed and restarted mid-job
// loses and duplicates no task, a vanished worker's task (in-process, or a test_worker
// process SIGKILLed mid-task) is re-run by another once its lease expires (every record
// counted exactly once), bad input gets the documented codes,
// a ps-server started with --master registers and serves what the master assigns, and
// ps-admin prints the cluster (tables and JSON) and fails cleanly on an unreachable master.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/ps_client.h"
#include "common/rpc/grpc_status.h"
#include "gtest/gtest.h"
#include "proto/master.grpc.pb.h"
#include "proto/ps.grpc.pb.h"
#include "tests/cluster_test_fixture.h"
#include "tests/process.h"

#if !defined(PS_MASTER_BINARY) || !defined(PS_SERVER_BINARY) || !defined(PS_ADMIN_BINARY) || \
    !defined(PS_TEST_WORKER_BINARY)
#error "PS_MASTER_BINARY, PS_SERVER_BINARY, PS_ADMIN_BINARY, PS_TEST_WORKER_BINARY must be defined"
#endif

namespace ps {
namespace {

using integration::ChildProcess;

using integration::BinaryPath;

constexpr uint32_t kVShards = 64;

class MasterProcessTest : public integration::ClusterProcessTest {
 protected:
  MasterProcessTest()
      : ClusterProcessTest("master_process_test.", BinaryPath("PS_MASTER_BINARY", PS_MASTER_BINARY),
                           BinaryPath("PS_SERVER_BINARY", PS_SERVER_BINARY)) {}

  // Starts ps-master on data dir `db` (with `extra` flags) and connects the stub to it.
  void StartMaster(int lease_ms, uint32_t num_ps = 2, const std::string& db = "master-db",
                   const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {BinaryPath("PS_MASTER_BINARY", PS_MASTER_BINARY),
                                     "--data_dir=" + Path(db),
                                     absl::StrCat("--num_vshards=", kVShards),
                                     absl::StrCat("--num_ps=", num_ps),
                                     absl::StrCat("--lease_ms=", lease_ms),
                                     "--max_task_failures=3",
                                     "--shutdown_grace_ms=200"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto port = StartServer("master", argv);
    ASSERT_TRUE(port.ok()) << port.status();
    master_port_ = *port;
    master_address_ = absl::StrCat("127.0.0.1:", *port);
    master_ =
        Master::NewStub(grpc::CreateChannel(master_address_, grpc::InsecureChannelCredentials()));
  }

  template <typename Req, typename Resp>
  absl::StatusOr<Resp> Call(grpc::Status (Master::Stub::*rpc)(grpc::ClientContext*, const Req&,
                                                              Resp*),
                            const Req& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    Resp resp;
    absl::Status s = FromGrpcStatus((master_.get()->*rpc)(&ctx, req, &resp));
    if (!s.ok()) return s;
    return resp;
  }

  RegisterWorkerResponse AddWorker() {
    auto w = Call(&Master::Stub::RegisterWorker, RegisterWorkerRequest());
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? *w : RegisterWorkerResponse();
  }

  void CreateJob(const std::string& name, uint32_t epochs, uint32_t files, uint64_t records,
                 uint64_t per_task, bool eval) {
    CreateJobRequest req;
    req.set_name(name);
    for (uint32_t f = 0; f < files; ++f) {
      DataFile* file = req.add_files();
      file->set_path(absl::StrCat("part-", f));
      file->set_records(records);
    }
    if (eval) {
      req.add_eval_files()->set_path("eval");
      req.mutable_eval_files(0)->set_records(per_task);
    }
    req.set_epochs(epochs);
    req.set_records_per_task(per_task);
    auto resp = Call(&Master::Stub::CreateJob, req);
    ASSERT_TRUE(resp.ok()) << resp.status();
    ASSERT_TRUE(resp->created());
  }

  absl::StatusOr<GetTaskResponse> GetTask(const RegisterWorkerResponse& w, const std::string& job) {
    GetTaskRequest req;
    req.set_worker_id(w.worker_id());
    req.set_incarnation(w.incarnation());
    req.set_job(job);
    return Call(&Master::Stub::GetTask, req);
  }

  // Takes and reports every task of `job` with worker `w`; false if it does not finish.
  bool Finish(const RegisterWorkerResponse& w, const std::string& job) {
    for (int i = 0; i < 1000; ++i) {
      auto t = GetTask(w, job);
      if (!t.ok() || t->result() == GetTaskResponse::WAIT) return false;
      if (t->result() == GetTaskResponse::DONE) return true;
      if (!Report(w, t->task()).ok()) return false;
    }
    return false;
  }

  absl::StatusOr<ReportTaskResponse> Report(const RegisterWorkerResponse& w, const Task& t) {
    ReportTaskRequest req;
    req.set_worker_id(w.worker_id());
    req.set_incarnation(w.incarnation());
    req.set_job(t.job());
    req.set_task_id(t.task_id());
    req.set_ok(true);
    req.set_records(t.end_record() - t.first_record());
    return Call(&Master::Stub::ReportTask, req);
  }

  // Runs ps-admin with `args`; returns its exit description and fills *out with its output.
  std::string RunAdmin(const std::vector<std::string>& args, std::string* out) {
    static int runs = 0;
    const std::string log = Path(absl::StrCat("admin-", runs++, ".out"));
    std::vector<std::string> argv = {BinaryPath("PS_ADMIN_BINARY", PS_ADMIN_BINARY)};
    argv.insert(argv.end(), args.begin(), args.end());
    auto child = ChildProcess::Start(argv, log);
    if (!child.ok()) return child.status().ToString();
    if (!(*child)->WaitExit(absl::Seconds(20))) return "still running";
    *out = integration::FileTail(log, 1 << 20);
    const std::string d = (*child)->Describe();
    return d.substr(d.find(' ', 4) + 1);  // drop "pid N "
  }

  // The body of ClientConnectsThroughTheMasterAndPodsRecover at ps-master --replication.
  void RunClientConnectsThroughTheMasterAndPodsRecover(uint32_t replication);
};

TEST_F(MasterProcessTest, MasterKilledMidJobLosesAndDuplicatesNoTask) {
  StartMaster(/*lease_ms=*/5000);
  // 4 files x 25 records, 10 per task: 12 training tasks per epoch, plus one eval task.
  CreateJob("job", /*epochs=*/2, /*files=*/4, /*records=*/25, /*per_task=*/10, /*eval=*/true);
  std::vector<RegisterWorkerResponse> workers = {AddWorker(), AddWorker()};
  std::map<uint64_t, int> accepted;         // task id -> accepted (non-duplicate) reports
  std::map<std::string, uint64_t> records;  // kind+epoch -> records
  int kills = 0;
  bool done = false;
  Task last_reported;
  RegisterWorkerResponse last_reporter;
  for (int round = 0; !done && round < 200; ++round) {
    // Both workers take a task, then both report: so the master dies with tasks in flight.
    std::vector<std::pair<size_t, Task>> held;
    for (size_t w = 0; w < workers.size(); ++w) {
      auto t = GetTask(workers[w], "job");
      ASSERT_TRUE(t.ok()) << t.status();
      if (t->result() == GetTaskResponse::DONE) done = true;
      if (t->result() == GetTaskResponse::TASK) held.push_back({w, t->task()});
    }
    if (round == 3 || round == 9) {
      children_["master"]->Kill();  // SIGKILL with tasks held and unreported
      ++kills;
      StartMaster(5000);
      if (round == 9) {
        // A report whose answer was lost is retried: recognized, not counted twice.
        auto again = Report(last_reporter, last_reported);
        ASSERT_TRUE(again.ok()) << again.status();
        EXPECT_TRUE(again->duplicate());
      }
    }
    for (const auto& [w, t] : held) {
      auto r = Report(workers[w], t);
      ASSERT_TRUE(r.ok()) << "task " << t.task_id() << ": " << r.status();
      ASSERT_FALSE(r->duplicate());
      ++accepted[t.task_id()];
      records[absl::StrCat(Task::Kind_Name(t.kind()), t.epoch())] +=
          t.end_record() - t.first_record();
      last_reported = t;
      last_reporter = workers[w];
    }
  }
  ASSERT_TRUE(done);
  EXPECT_EQ(kills, 2);
  ASSERT_EQ(accepted.size(), 26u);
  for (const auto& [id, n] : accepted) EXPECT_EQ(n, 1) << "task " << id;
  EXPECT_EQ(records, (std::map<std::string, uint64_t>{
                         {"TRAIN0", 100}, {"EVAL0", 10}, {"TRAIN1", 100}, {"EVAL1", 10}}));
  auto status = Call(&Master::Stub::Status, StatusRequest());
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->jobs_size(), 1);
  EXPECT_EQ(status->jobs(0).state(), JobInfo::SUCCEEDED);
  EXPECT_EQ(status->jobs(0).tasks_done(), 26u);
  EXPECT_EQ(status->jobs(0).train_records_done(), 200u);
  EXPECT_EQ(status->jobs(0).eval_records_done(), 20u);
}

TEST_F(MasterProcessTest, VanishedWorkersTaskIsRerunAfterItsLeaseExpires) {
  // The lease must outlast any stall of this test's own thread between two calls of
  // `alive` on a busy machine (a 300 ms lease expired `alive` too at load 13).
  constexpr int kLeaseMs = 2000;
  StartMaster(kLeaseMs);
  CreateJob("job", /*epochs=*/1, /*files=*/2, /*records=*/30, /*per_task=*/10, /*eval=*/false);
  RegisterWorkerResponse gone = AddWorker(), alive = AddWorker();
  auto lost_task = GetTask(gone, "job");
  ASSERT_TRUE(lost_task.ok() && lost_task->result() == GetTaskResponse::TASK);
  // `gone` never calls again. `alive` works through the job, heartbeating while it waits.
  std::map<std::string, std::vector<int>> seen;  // file -> times each record was trained
  const absl::Time start = absl::Now();
  bool waited = false;
  while (absl::Now() - start < absl::Seconds(60)) {
    auto t = GetTask(alive, "job");
    ASSERT_TRUE(t.ok()) << t.status();
    if (t->result() == GetTaskResponse::DONE) break;
    if (t->result() == GetTaskResponse::WAIT) {
      waited = true;
      absl::SleepFor(absl::Milliseconds(50));
      continue;
    }
    const Task& task = t->task();
    if (task.task_id() == lost_task->task().task_id()) {
      EXPECT_EQ(task.attempt(), 2u);
      EXPECT_EQ(task.failures(), 1u);
      EXPECT_GE(absl::Now() - start, absl::Milliseconds(kLeaseMs));
    }
    auto& counts = seen[task.file()];
    counts.resize(30, 0);
    for (uint64_t r = task.first_record(); r < task.end_record(); ++r) ++counts[r];
    auto r = Report(alive, task);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  EXPECT_TRUE(waited);  // the last task was held by the silent worker for a while
  ASSERT_EQ(seen.size(), 2u);
  for (const auto& [file, counts] : seen) {
    for (size_t r = 0; r < counts.size(); ++r) {
      EXPECT_EQ(counts[r], 1) << file << " record " << r;
    }
  }
  // The silent worker's late result is refused, and it shows as LOST.
  auto late = Report(gone, lost_task->task());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition) << late.status();
  auto status = Call(&Master::Stub::Status, StatusRequest());
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(status->workers_size(), 2);
  EXPECT_EQ(status->workers(0).state(), WorkerInfo::LOST);
  EXPECT_EQ(status->jobs(0).state(), JobInfo::SUCCEEDED);
  EXPECT_EQ(status->jobs(0).train_records_done(), 60u);
}

TEST_F(MasterProcessTest, SigkilledWorkerProcessesTaskIsRerunByAnother) {
  // Long enough that neither the worker's heartbeats nor this thread's calls miss it on a
  // busy machine.
  constexpr int kLeaseMs = 2000;
  StartMaster(kLeaseMs);
  CreateJob("job", /*epochs=*/1, /*files=*/3, /*records=*/20, /*per_task=*/10, /*eval=*/false);
  const std::string log = Path("worker.log");
  auto worker = ChildProcess::Start(
      {BinaryPath("PS_TEST_WORKER_BINARY", PS_TEST_WORKER_BINARY), master_address_, "job"}, log);
  ASSERT_TRUE(worker.ok()) << worker.status();
  // Wait until it holds a task, keep it heartbeating past a lease, then SIGKILL it.
  uint64_t killed_task = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (;;) {
    unsigned long w = 0, t = 0;
    bool found = false;  // its line "worker W task T", among the worker's log lines
    for (absl::string_view line : absl::StrSplit(integration::FileTail(log), '\n')) {
      found = found || std::sscanf(std::string(line).c_str(), "worker %lu task %lu", &w, &t) == 2;
    }
    if (found) {
      killed_task = t;
      break;
    }
    ASSERT_TRUE((*worker)->Running()) << integration::FileTail(log);
    ASSERT_LT(absl::Now(), deadline) << "the worker took no task";
    absl::SleepFor(absl::Milliseconds(10));
  }
  absl::SleepFor(absl::Milliseconds(kLeaseMs + 500));  // longer than a lease: heartbeats keep it
  auto before = Call(&Master::Stub::Status, StatusRequest());
  ASSERT_TRUE(before.ok());
  ASSERT_EQ(before->doing_tasks_size(), 1);
  EXPECT_EQ(before->doing_tasks(0).task_id(), killed_task);
  (*worker)->Kill();

  RegisterWorkerResponse other = AddWorker();
  std::map<std::string, std::vector<int>> seen;  // file -> times each record was trained
  bool rerun = false;
  for (const absl::Time end = absl::Now() + absl::Seconds(60); absl::Now() < end;) {
    auto t = GetTask(other, "job");
    ASSERT_TRUE(t.ok()) << t.status();
    if (t->result() == GetTaskResponse::DONE) break;
    if (t->result() == GetTaskResponse::WAIT) {
      absl::SleepFor(absl::Milliseconds(50));
      continue;
    }
    if (t->task().task_id() == killed_task) {
      rerun = true;
      EXPECT_EQ(t->task().attempt(), 2u);
    }
    auto& counts = seen[t->task().file()];
    counts.resize(20, 0);
    for (uint64_t r = t->task().first_record(); r < t->task().end_record(); ++r) ++counts[r];
    ASSERT_TRUE(Report(other, t->task()).ok());
  }
  EXPECT_TRUE(rerun);
  ASSERT_EQ(seen.size(), 3u);
  for (const auto& [file, counts] : seen) {
    for (size_t r = 0; r < counts.size(); ++r) EXPECT_EQ(counts[r], 1) << file << " record " << r;
  }
  auto status = Call(&Master::Stub::Status, StatusRequest());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->jobs(0).state(), JobInfo::SUCCEEDED);
  EXPECT_EQ(status->jobs(0).train_records_done(), 60u);
}

TEST_F(MasterProcessTest, BadInputGetsClearCodes) {
  StartMaster(/*lease_ms=*/2000);
  CreateJob("job", 1, 1, 10, 5, false);
  RegisterWorkerResponse a = AddWorker(), b = AddWorker();
  EXPECT_EQ(GetTask(a, "no-such-job").status().code(), absl::StatusCode::kNotFound);
  auto t = GetTask(a, "job");
  ASSERT_TRUE(t.ok());
  auto stolen = Report(b, t->task());
  EXPECT_EQ(stolen.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(stolen.status().message(), "not held by worker"))
      << stolen.status();

  RegisterPodRequest pod;
  pod.set_pod_id("ps-0");
  pod.set_address("127.0.0.1:1111");
  ASSERT_TRUE(Call(&Master::Stub::RegisterPod, pod).ok());
  pod.set_address("127.0.0.1:2222");
  auto dup = Call(&Master::Stub::RegisterPod, pod);
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(absl::StrContains(dup.status().message(), "127.0.0.1:1111")) << dup.status();
  pod.set_pod_id("ps-1");
  pod.set_num_vshards(100);
  auto bad = Call(&Master::Stub::RegisterPod, pod);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "100")) << bad.status();

  // An impossible vshard count stops the master at start, with exit code 2 and the value.
  auto child =
      ChildProcess::Start({BinaryPath("PS_MASTER_BINARY", PS_MASTER_BINARY),
                           "--data_dir=" + Path("other-db"), "--num_vshards=100", "--port=0"},
                          Path("bad-master.log"));
  ASSERT_TRUE(child.ok());
  ASSERT_TRUE((*child)->WaitExit(absl::Seconds(10)));
  EXPECT_TRUE(absl::EndsWith((*child)->Describe(), "exited with code 2"));
  EXPECT_TRUE(absl::StrContains(integration::FileTail(Path("bad-master.log")),
                                "num_vshards = 100 must be a power of two"));
}

// The case: a GetTask whose answer was lost (the worker's deadline passed) is
// retried. It used to hand out the next task, leaving the first DOING for a worker that
// heartbeats on, so the job never finished; now the retry gets the same task.
TEST_F(MasterProcessTest, ARetriedGetTaskGetsTheSameTaskAndTheJobFinishes) {
  StartMaster(/*lease_ms=*/2000);
  CreateJob("job", /*epochs=*/1, /*files=*/1, /*records=*/30, /*per_task=*/10, /*eval=*/false);
  RegisterWorkerResponse w = AddWorker();
  auto lost = GetTask(w, "job");  // its answer "never arrived"
  ASSERT_TRUE(lost.ok() && lost->result() == GetTaskResponse::TASK);
  std::map<uint64_t, int> done;
  for (int i = 0; i < 10; ++i) {
    auto t = GetTask(w, "job");
    ASSERT_TRUE(t.ok()) << t.status();
    if (t->result() == GetTaskResponse::DONE) break;
    ASSERT_EQ(t->result(), GetTaskResponse::TASK) << "a task was stranded";
    if (i == 0) {
      EXPECT_EQ(t->task().task_id(), lost->task().task_id());
      EXPECT_EQ(t->task().attempt(), lost->task().attempt());
    }
    ASSERT_TRUE(Report(w, t->task()).ok());
    ++done[t->task().task_id()];
  }
  EXPECT_EQ(done, (std::map<uint64_t, int>{{0, 1}, {1, 1}, {2, 1}}));
  auto status = Call(&Master::Stub::Status, StatusRequest());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->jobs(0).state(), JobInfo::SUCCEEDED);
  EXPECT_EQ(status->jobs(0).train_records_done(), 30u);
}

// ps-admin jobs lists the jobs with the retention that deletes them; delete-job deletes a
// finished job, refuses a running one without --force; and the master's own retention
// (--max_finished_jobs=1 here) deletes the older of two finished jobs by itself.
TEST_F(MasterProcessTest, PsAdminListsAndDeletesJobsAndRetentionRuns) {
  // Retention runs every min(lease, 10 s): here every 10 s.
  StartMaster(/*lease_ms=*/10000, 2, "master-db",
              {"--max_finished_jobs=1", "--job_retention_s=86400"});
  CreateJob("first", 1, 1, 10, 5, false);
  CreateJob("running", 1, 1, 10, 5, false);
  RegisterWorkerResponse w = AddWorker(), other = AddWorker();
  ASSERT_TRUE(Finish(w, "first"));
  ASSERT_TRUE(GetTask(other, "running").ok());
  std::string out;
  EXPECT_EQ(RunAdmin({"--master=" + master_address_, "jobs"}, &out), "exited with code 0");
  EXPECT_TRUE(absl::StrContains(out, "first")) << out;
  EXPECT_TRUE(absl::StrContains(out, "SUCCEEDED")) << out;
  EXPECT_TRUE(absl::StrContains(out, "RUNNING")) << out;
  EXPECT_TRUE(absl::StrContains(out, "finished jobs kept 86400 s, at most 1")) << out;

  // A second job finishes: retention deletes "first" (the older) by itself.
  CreateJob("second", 1, 1, 10, 5, false);
  ASSERT_TRUE(Finish(w, "second"));
  std::vector<std::string> names;
  for (const absl::Time end = absl::Now() + absl::Seconds(30); absl::Now() < end;) {
    for (const RegisterWorkerResponse& alive : {w, other}) {  // the workers heartbeat
      WorkerHeartbeatRequest hb;
      hb.set_worker_id(alive.worker_id());
      hb.set_incarnation(alive.incarnation());
      ASSERT_TRUE(Call(&Master::Stub::WorkerHeartbeat, hb).ok());
    }
    auto status = Call(&Master::Stub::Status, StatusRequest());
    ASSERT_TRUE(status.ok()) << status.status();
    names.clear();
    for (const JobInfo& j : status->jobs()) names.push_back(j.name());
    if (names.size() == 2) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(names, (std::vector<std::string>{"running", "second"}));

  EXPECT_EQ(RunAdmin({"--master=" + master_address_, "delete-job", "running"}, &out),
            "exited with code 1");
  EXPECT_TRUE(absl::StrContains(out, "FAILED_PRECONDITION")) << out;
  EXPECT_TRUE(absl::StrContains(out, "--force")) << out;
  EXPECT_EQ(RunAdmin({"--master=" + master_address_, "delete-job", "second"}, &out),
            "exited with code 0");
  EXPECT_TRUE(absl::StrContains(out, "job second deleted (was SUCCEEDED: 2/2 tasks done")) << out;
  EXPECT_EQ(RunAdmin({"--master=" + master_address_, "--force", "delete-job", "running"}, &out),
            "exited with code 0");
  EXPECT_EQ(RunAdmin({"--master=" + master_address_, "delete-job", "running"}, &out),
            "exited with code 1");
  EXPECT_TRUE(absl::StrContains(out, "NOT_FOUND")) << out;
  EXPECT_EQ(RunAdmin({"--master=" + master_address_, "delete-job"}, &out), "exited with code 2");

  EXPECT_EQ(RunAdmin({"--master=" + master_address_, "--json", "jobs"}, &out),
            "exited with code 0");
  StatusResponse parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out, &parsed).ok()) << out;
  EXPECT_EQ(parsed.jobs_size(), 0);
  EXPECT_EQ(parsed.tasks_done(), 4u);  // deleted jobs' work still counts
  EXPECT_EQ(parsed.retention().max_finished_jobs(), 1u);
  // The worker of the deleted running job is told so, and the name is free again.
  auto gone = GetTask(other, "running");
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound) << gone.status();
  CreateJob("running", 1, 1, 10, 5, false);
}

// DeleteJob is an admin call: a worker's token is refused (PERMISSION_DENIED), the admin
// token (ps-admin --admin_token_file) deletes.
TEST_F(MasterProcessTest, DeleteJobNeedsTheAdminRole) {
  const std::string worker_token = Path("worker.token"), admin_token = Path("admin.token");
  ASSERT_TRUE(std::ofstream(worker_token) << "w-secret\n");
  ASSERT_TRUE(std::ofstream(admin_token) << "a-secret\n");
  StartMaster(/*lease_ms=*/5000, 2, "master-db",
              {"--auth_token_file=" + worker_token, "--admin_token_file=" + admin_token});
  const auto call = [&](const std::string& token, const auto& rpc, const auto& req, auto* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    ctx.AddMetadata("authorization", "Bearer " + token);
    return FromGrpcStatus((master_.get()->*rpc)(&ctx, req, resp));
  };
  CreateJobRequest job;
  job.set_name("j");
  job.set_epochs(1);
  job.set_records_per_task(5);
  job.add_files()->set_path("f");
  job.mutable_files(0)->set_records(10);
  CreateJobResponse created;
  ASSERT_TRUE(call("w-secret", &Master::Stub::CreateJob, job, &created).ok());
  DeleteJobRequest del;
  del.set_name("j");
  DeleteJobResponse deleted;
  absl::Status s = call("w-secret", &Master::Stub::DeleteJob, del, &deleted);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  std::string out;
  EXPECT_EQ(RunAdmin({"--master=" + master_address_, "--auth_token_file=" + worker_token, "--force",
                      "delete-job", "j"},
                     &out),
            "exited with code 1");
  EXPECT_TRUE(absl::StrContains(out, "PERMISSION_DENIED")) << out;
  EXPECT_EQ(RunAdmin({"--master=" + master_address_, "--admin_token_file=" + admin_token, "--force",
                      "delete-job", "j"},
                     &out),
            "exited with code 0");
  EXPECT_TRUE(absl::StrContains(out, "job j deleted")) << out;
}

TEST_F(MasterProcessTest, PsServerRegistersServesItsVShardsAndComesBackAtANewAddress) {
  StartMaster(/*lease_ms=*/1000);  // heartbeats every 333 ms keep it on a busy machine
  CreateTableRequest table;
  table.mutable_spec()->set_name("emb");
  table.mutable_spec()->set_dim(4);
  ASSERT_TRUE(Call(&Master::Stub::CreateTable, table).ok());
  const std::vector<std::string> pod_argv = {
      BinaryPath("PS_SERVER_BINARY", PS_SERVER_BINARY), "--master=" + master_address_,
      "--pod_id=ps-1", absl::StrCat("--num_vshards=", kVShards), "--shutdown_grace_ms=200"};

  // Waits until the master lists ps-1 LIVE at 127.0.0.1:port and the pod owns what the
  // master says, at the master's epoch; returns that epoch.
  auto await_pod = [&](int port) -> uint64_t {
    auto stub = ParameterServer::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    std::string last;
    while (absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
      auto map = Call(&Master::Stub::GetShardMap, GetShardMapRequest());
      if (!map.ok()) continue;
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
      DescribeResponse d;
      if (!stub->Describe(&ctx, DescribeRequest(), &d).ok()) continue;
      const PodInfo& p = map->pods(1);
      last = absl::StrCat(p.ShortDebugString(), " map epoch ", map->epoch(), " pod epoch ",
                          d.epoch(), " tables ", d.tables_size());
      if (p.pod_id() != "ps-1" || p.state() != PodInfo::LIVE ||
          p.address() != absl::StrCat("127.0.0.1:", port) || d.epoch() != map->epoch() ||
          d.tables_size() != 1) {
        continue;
      }
      // Ownership: exactly vshards 32..63 (the static range of ps-1 of 2).
      for (uint32_t v = 0; v < kVShards; ++v) {
        const bool owned = (d.owned_vshards()[v / 8] >> (v % 8)) & 1;
        EXPECT_EQ(owned, v >= kVShards / 2) << "vshard " << v;
        EXPECT_EQ(map->owner(v), v >= kVShards / 2 ? 1u : 0u) << "vshard " << v;
      }
      EXPECT_EQ(d.tables(0).spec().name(), "emb");  // learned from the master's catalog
      return map->epoch();
    }
    ADD_FAILURE() << "pod on port " << port << " not registered in time; last: " << last;
    return 0;
  };

  auto port = StartServer("ps-1", pod_argv);
  ASSERT_TRUE(port.ok()) << port.status();
  const uint64_t epoch = await_pod(*port);
  ASSERT_GT(epoch, 0u);

  // SIGKILL and restart under the same identity on a new port: once the old lease expires
  // it gets its vshards back at the new address, under a new epoch.
  children_["ps-1"]->Kill();
  auto port2 = StartServer("ps-1", pod_argv);
  ASSERT_TRUE(port2.ok()) << port2.status();
  ASSERT_NE(*port2, *port);
  EXPECT_EQ(await_pod(*port2), epoch + 1);
}

TEST_F(MasterProcessTest, PsAdminPrintsStatusAndJsonAndFailsCleanly) {
  StartMaster(/*lease_ms=*/2000);
  CreateJob("job", 1, 1, 10, 5, false);
  AddWorker();
  std::string out;
  EXPECT_EQ(RunAdmin({"--master=" + master_address_, "status"}, &out), "exited with code 0");
  EXPECT_TRUE(absl::StrContains(out, "ps-0")) << out;
  EXPECT_TRUE(absl::StrContains(out, "NEVER_REGISTERED")) << out;
  EXPECT_TRUE(absl::StrContains(out, "RUNNING")) << out;

  EXPECT_EQ(RunAdmin({"--master=" + master_address_, "--json", "status"}, &out),
            "exited with code 0");
  StatusResponse parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out, &parsed).ok()) << out;
  EXPECT_EQ(parsed.num_vshards(), kVShards);
  EXPECT_EQ(parsed.pods_size(), 2);
  ASSERT_EQ(parsed.jobs_size(), 1);
  EXPECT_EQ(parsed.jobs(0).tasks_total(), 2u);

  EXPECT_EQ(RunAdmin({"--master=" + master_address_, "shards"}, &out), "exited with code 0");
  EXPECT_TRUE(absl::StrContains(out, "32-63")) << out;
  EXPECT_EQ(RunAdmin({"--master=" + master_address_, "drain", "ps-0"}, &out), "exited with code 1");
  EXPECT_TRUE(absl::StrContains(out, "FAILED_PRECONDITION")) << out;

  // Nothing listens on port 1: exit 1 with a message naming the master, quickly.
  const absl::Time start = absl::Now();
  EXPECT_EQ(RunAdmin({"--master=127.0.0.1:1", "--timeout_ms=500", "status"}, &out),
            "exited with code 1");
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(absl::StrContains(out, "cannot reach the master at 127.0.0.1:1")) << out;
  EXPECT_EQ(RunAdmin({"--master=" + master_address_, "frobnicate"}, &out), "exited with code 2");
  EXPECT_EQ(RunAdmin({"status"}, &out), "exited with code 2");
}

}  // namespace
}  // namespace ps

namespace ps {
namespace {

// A C++ client given only the master's address finds both pods and the vshard map, and
// pushes and pulls through them exactly; a durable pod SIGKILLed and restarted with its
// identity and data dir serves its rows again. `replication` is the master's
// --replication: at 2 each pod also follows the other's vshards (acknowledged pushes are
// on both) and ps-0's vshards fail over to ps-1 if its lease runs out first.
void MasterProcessTest::RunClientConnectsThroughTheMasterAndPodsRecover(uint32_t replication) {
  StartMaster(/*lease_ms=*/2000, /*num_ps=*/2, "master-db",
              {absl::StrCat("--replication=", replication)});
  if (HasFatalFailure()) return;
  std::vector<std::vector<std::string>> pods;
  for (int i = 0; i < 2; ++i) {
    pods.push_back({BinaryPath("PS_SERVER_BINARY", PS_SERVER_BINARY), "--master=" + master_address_,
                    absl::StrCat("--pod_id=ps-", i), absl::StrCat("--num_vshards=", kVShards),
                    "--data_dir=" + Path(absl::StrCat("ps-", i, "-data")),
                    "--shutdown_grace_ms=200"});
    ASSERT_TRUE(StartServer(absl::StrCat("ps-", i), pods.back()).ok());
  }
  ClientOptions options;
  options.master = master_address_;
  auto client = PsClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  TableSpec spec;
  spec.set_name("emb");
  spec.set_dim(2);
  spec.mutable_optimizer()->set_kind(OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_learning_rate(1);
  ASSERT_TRUE((*client)->CreateTable(spec).ok());
  std::vector<int64_t> ids(200);
  for (int i = 0; i < 200; ++i) ids[i] = i * 7919;
  std::vector<float> grads(ids.size() * 2, -1.0f);
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE((*client)->Push({{"emb", ids, grads.data()}}).ok());
  }
  auto stats = (*client)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(stats->size(), 2u);
  EXPECT_GT((*stats)[0].pushed_rows(), 0u);  // the ids spread over both pods
  EXPECT_GT((*stats)[1].pushed_rows(), 0u);

  // ps-0 is SIGKILLed and restarted on its data dir (at a new port: the client, which
  // does not follow map changes yet, reconnects through the master).
  children_["ps-0"]->Kill();
  ASSERT_TRUE(StartServer("ps-0", pods[0]).ok());
  client = PsClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<float> rows(ids.size() * 2);
  ASSERT_TRUE((*client)->Pull({{"emb", ids, rows.data()}}).ok());
  for (size_t i = 0; i < rows.size(); ++i) ASSERT_EQ(rows[i], 3.0f) << "element " << i;
}

TEST_F(MasterProcessTest, ClientConnectsThroughTheMasterAndPodsRecover) {
  RunClientConnectsThroughTheMasterAndPodsRecover(1);
}

TEST_F(MasterProcessTest, ClientConnectsThroughTheMasterAndPodsRecoverReplicated) {
  RunClientConnectsThroughTheMasterAndPodsRecover(2);
}

}  // namespace
}  // namespace ps
