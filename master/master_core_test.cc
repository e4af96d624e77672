// MasterCore as a state machine: a fake clock drives leases, and "restart" is destroying
// the core and opening the same RocksDB directory again.
#include "master/master_core.h"

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

constexpr absl::Duration kLease = absl::Seconds(1);

// Stands in for the pods: records what the master asks, fails where told to.
class FakePodControl final : public PodControl {
 public:
  absl::Status ApplyAssignment(const std::string& address, const Assignment& req) override {
    absl::MutexLock lock(&mu);
    assignments[address] = req;
    return absl::OkStatus();
  }
  absl::Status MigrateBegin(const std::string& address, const MigrateBeginRequest& req,
                            MigrateBeginResponse* resp) override {
    absl::MutexLock lock(&mu);
    begun.push_back(address);
    return absl::OkStatus();
  }
  absl::Status Checkpoint(const std::string& address, const PodCheckpointRequest& req,
                          PodCheckpointResponse* resp) override {
    absl::MutexLock lock(&mu);
    checkpoints.push_back(req.dir());
    return absl::OkStatus();
  }
  absl::Status MigrateImport(const std::string& address, const MigrateImportRequest& req,
                             MigrateImportResponse* resp) override {
    absl::MutexLock lock(&mu);
    imports.push_back(req);
    if (!fail_import.ok()) return fail_import;
    resp->set_rows(10 * req.vshards_size());
    resp->set_final_ms(1);
    return absl::OkStatus();
  }

  absl::Mutex mu;
  std::map<std::string, Assignment> assignments;
  std::vector<std::string> begun;
  std::vector<MigrateImportRequest> imports;
  std::vector<std::string> checkpoints;
  absl::Status fail_import;
};

class MasterCoreTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string templ = std::filesystem::temp_directory_path() / "master_core_test.XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    Reopen();
  }
  void TearDown() override {
    core_.reset();
    std::filesystem::remove_all(dir_);
    std::filesystem::remove_all(dir_ + "-checkpoints");
  }

  MasterOptions Options() {
    MasterOptions o;
    o.data_dir = dir_;
    o.num_vshards = 16;
    o.num_ps = 2;
    o.lease = kLease;
    o.max_task_failures = 2;
    o.clock = [this] { return now_; };
    o.pod_control = pods_;
    o.vshards_per_move = 2;
    o.checkpoint_dir = dir_ + "-checkpoints";
    o.retention_interval = absl::ZeroDuration();  // the test calls EnforceRetention
    o.job_retention = absl::Hours(1);
    o.max_finished_jobs = 3;
    o.worker_retention = absl::Minutes(10);
    return o;
  }

  // Simulates a master restart: the old core is gone before the new one opens the dir.
  void Reopen() {
    core_.reset();
    auto core = MasterCore::Open(Options());
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = *std::move(core);
  }

  RegisterWorkerResponse AddWorker(uint64_t id = 0) {
    RegisterWorkerRequest req;
    req.set_worker_id(id);
    RegisterWorkerResponse resp;
    EXPECT_TRUE(core_->RegisterWorker(req, &resp).ok());
    return resp;
  }

  // A job: one training file of 10 records and (optionally) one eval file of 5, 4 records
  // per task: 3 training tasks and 2 eval tasks per epoch.
  void MakeJob(const std::string& name, uint32_t epochs, bool eval) {
    CreateJobRequest req;
    req.set_name(name);
    auto* f = req.add_files();
    f->set_path("train.rec");
    f->set_records(10);
    if (eval) {
      auto* e = req.add_eval_files();
      e->set_path("eval.rec");
      e->set_records(5);
    }
    req.set_epochs(epochs);
    req.set_records_per_task(4);
    CreateJobResponse resp;
    ASSERT_TRUE(core_->CreateJob(req, &resp).ok());
    EXPECT_TRUE(resp.created());
    EXPECT_EQ(resp.num_tasks(), epochs * (eval ? 5u : 3u));
  }

  absl::StatusOr<GetTaskResponse> Get(const RegisterWorkerResponse& w, const std::string& job) {
    GetTaskRequest req;
    req.set_worker_id(w.worker_id());
    req.set_incarnation(w.incarnation());
    req.set_job(job);
    GetTaskResponse resp;
    absl::Status s = core_->GetTask(req, &resp);
    if (!s.ok()) return s;
    return resp;
  }

  absl::Status Report(const RegisterWorkerResponse& w, const Task& t, bool ok,
                      ReportTaskResponse* resp = nullptr) {
    ReportTaskRequest req;
    req.set_worker_id(w.worker_id());
    req.set_incarnation(w.incarnation());
    req.set_job(t.job());
    req.set_task_id(t.task_id());
    req.set_ok(ok);
    req.set_records(t.end_record() - t.first_record());
    if (!ok) req.set_error("boom");
    (*req.mutable_table_pushes())["emb"] = 2;
    ReportTaskResponse ignored;
    return core_->ReportTask(req, resp != nullptr ? resp : &ignored);
  }

  StatusResponse GetStatus() {
    StatusResponse s;
    EXPECT_TRUE(core_->Status(StatusRequest(), &s).ok());
    return s;
  }

  void AddPod(const std::string& id) {
    RegisterPodRequest reg;
    reg.set_pod_id(id);
    reg.set_address(id + ":1");
    RegisterPodResponse resp;
    ASSERT_TRUE(core_->RegisterPod(reg, &resp).ok());
  }
  std::map<std::string, int> Counts() {
    ShardMapResponse map;
    EXPECT_TRUE(core_->GetShardMap(GetShardMapRequest(), &map).ok());
    std::map<std::string, int> counts;
    for (uint32_t o : map.owner()) counts[map.pods(o).pod_id()]++;
    return counts;
  }

  std::shared_ptr<FakePodControl> pods_ = std::make_shared<FakePodControl>();
  std::string dir_;
  absl::Time now_ = absl::FromUnixSeconds(1'000'000);
  std::unique_ptr<MasterCore> core_;
};

TEST_F(MasterCoreTest, ImpossibleVShardCountsAreRefused) {
  MasterOptions o = Options();
  o.num_vshards = 100;
  core_.reset();
  auto bad = MasterCore::Open(o);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("100"), std::string::npos) << bad.status();
  // num_ps only shapes a new cluster: a later start with another keeps the stored map.
  o = Options();
  o.num_ps = 4;
  {
    auto other = MasterCore::Open(o);
    ASSERT_TRUE(other.ok()) << other.status();
    ShardMapResponse map;
    ASSERT_TRUE((*other)->GetShardMap(GetShardMapRequest(), &map).ok());
    EXPECT_EQ(map.pods_size(), 2);
  }
  Reopen();
  RegisterPodRequest req;
  req.set_pod_id("ps-0");
  req.set_address("h:1");
  req.set_num_vshards(32);
  RegisterPodResponse resp;
  absl::Status s = core_->RegisterPod(req, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("32"), std::string::npos) << s;
}

TEST_F(MasterCoreTest, PodsGetStaticRangesBackAtNewAddresses) {
  RegisterPodRequest req;
  req.set_pod_id("ps-1");
  req.set_address("h:1");
  req.set_num_vshards(16);
  RegisterPodResponse first;
  ASSERT_TRUE(core_->RegisterPod(req, &first).ok());
  const auto& a = first.assignment();
  EXPECT_EQ(std::vector<uint32_t>(a.owned_vshards().begin(), a.owned_vshards().end()),
            (std::vector<uint32_t>{8, 9, 10, 11, 12, 13, 14, 15}));
  const uint64_t epoch = a.epoch();

  // Same address again: same epoch. Another address while the lease is live: refused.
  RegisterPodResponse again;
  ASSERT_TRUE(core_->RegisterPod(req, &again).ok());
  EXPECT_EQ(again.assignment().epoch(), epoch);
  req.set_address("h:2");
  EXPECT_EQ(core_->RegisterPod(req, &again).code(), absl::StatusCode::kAlreadyExists);

  // The lease runs out: the pod is LOST; a restarted pod may take the identity.
  now_ += kLease + absl::Milliseconds(1);
  ASSERT_TRUE(core_->ExpireLeases().ok());
  StatusResponse st = GetStatus();
  ASSERT_EQ(st.pods_size(), 2);
  EXPECT_EQ(st.pods(0).state(), PodInfo::NEVER_REGISTERED);
  EXPECT_EQ(st.pods(1).state(), PodInfo::LOST);
  Reopen();  // and the master restarts meanwhile
  ASSERT_TRUE(core_->RegisterPod(req, &again).code() == absl::StatusCode::kAlreadyExists);
  now_ += kLease + absl::Milliseconds(1);
  again.Clear();
  ASSERT_TRUE(core_->RegisterPod(req, &again).ok());
  EXPECT_EQ(again.assignment().epoch(), epoch + 1);
  EXPECT_EQ(again.assignment().owned_vshards_size(), 8);

  ShardMapResponse map;
  ASSERT_TRUE(core_->GetShardMap(GetShardMapRequest(), &map).ok());
  EXPECT_EQ(map.epoch(), epoch + 1);
  ASSERT_EQ(map.owner_size(), 16);
  EXPECT_EQ(map.pods(map.owner(15)).address(), "h:2");
  EXPECT_EQ(map.pods(map.owner(0)).pod_id(), "ps-0");

  PodHeartbeatRequest hb;
  hb.set_pod_id("ps-1");
  hb.set_address("h:1");
  PodHeartbeatResponse hb_resp;
  EXPECT_EQ(core_->PodHeartbeat(hb, &hb_resp).code(), absl::StatusCode::kFailedPrecondition);
  hb.set_pod_id("ps-9");
  EXPECT_EQ(core_->PodHeartbeat(hb, &hb_resp).code(), absl::StatusCode::kNotFound);
}

TEST_F(MasterCoreTest, CatalogIsIdempotentAndDurable) {
  CreateTableRequest req;
  req.mutable_spec()->set_name("emb");
  req.mutable_spec()->set_dim(8);
  CreateTableResponse resp;
  ASSERT_TRUE(core_->CreateTable(req, &resp).ok());
  EXPECT_TRUE(resp.created());
  Reopen();
  ASSERT_TRUE(core_->CreateTable(req, &resp).ok());
  EXPECT_FALSE(resp.created());
  req.mutable_spec()->set_dim(16);
  EXPECT_EQ(core_->CreateTable(req, &resp).code(), absl::StatusCode::kAlreadyExists);
  req.mutable_spec()->set_dim(0);
  EXPECT_EQ(core_->CreateTable(req, &resp).code(), absl::StatusCode::kInvalidArgument);
  ListTablesResponse list;
  ASSERT_TRUE(core_->ListTables(ListTablesRequest(), &list).ok());
  ASSERT_EQ(list.tables_size(), 1);
  EXPECT_EQ(list.tables(0).dim(), 8u);
  EXPECT_EQ(list.catalog_version(), 1u);
  EXPECT_TRUE(list.tables(0).optimizer().has_learning_rate());  // stored normalized
}

TEST_F(MasterCoreTest, EvalTasksFollowTheirEpochsTraining) {
  MakeJob("j", 2, /*eval=*/true);
  std::vector<RegisterWorkerResponse> workers;
  for (int i = 0; i < 4; ++i) workers.push_back(AddWorker());
  std::vector<std::string> order;
  uint64_t train_records = 0;
  while (true) {
    // Each worker (one task at a time) takes what is available, then all finish theirs:
    // a worker answered WAIT marks a phase barrier.
    std::vector<std::pair<size_t, Task>> taken;
    for (size_t i = 0; i < workers.size(); ++i) {
      auto r = Get(workers[i], "j");
      ASSERT_TRUE(r.ok()) << r.status();
      if (r->result() != GetTaskResponse::TASK) break;
      taken.push_back({i, r->task()});
    }
    if (taken.empty()) break;
    std::string phase;
    for (const auto& [i, t] : taken) {
      absl::StrAppend(&phase, Task::Kind_Name(t.kind()), t.epoch(), " ");
      if (t.kind() == Task::TRAIN) train_records += t.end_record() - t.first_record();
      ASSERT_TRUE(Report(workers[i], t, true).ok());
    }
    order.push_back(phase);
  }
  const auto& w = workers[0];
  EXPECT_EQ(order, (std::vector<std::string>{"TRAIN0 TRAIN0 TRAIN0 ", "EVAL0 EVAL0 ",
                                             "TRAIN1 TRAIN1 TRAIN1 ", "EVAL1 EVAL1 "}));
  EXPECT_EQ(train_records, 20u);
  auto r = Get(w, "j");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->result(), GetTaskResponse::DONE);
  StatusResponse st = GetStatus();
  ASSERT_EQ(st.jobs_size(), 1);
  EXPECT_EQ(st.jobs(0).state(), JobInfo::SUCCEEDED);
  EXPECT_EQ(st.jobs(0).train_records_done(), 20u);
  EXPECT_EQ(st.jobs(0).train_records_total(), 20u);
  EXPECT_EQ(st.jobs(0).eval_records_done(), 10u);
  EXPECT_EQ(st.records_trained(), 20u);
  ASSERT_EQ(st.tables_size(), 1);
  EXPECT_EQ(st.tables(0).version(), 20u);  // 10 tasks x 2 pushes
}

TEST_F(MasterCoreTest, RepeatedFailuresMarkTheTaskFailedNotDropped) {
  MakeJob("j", 1, /*eval=*/false);
  auto w = AddWorker();
  auto t0 = Get(w, "j");
  ASSERT_TRUE(t0.ok());
  ASSERT_TRUE(Report(w, t0->task(), false).ok());
  // The failed task goes back to the front of the queue with its attempt count.
  auto again = Get(w, "j");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->task().task_id(), t0->task().task_id());
  EXPECT_EQ(again->task().attempt(), 2u);
  ASSERT_TRUE(Report(w, again->task(), false).ok());  // second failure: FAILED (max 2)
  for (int i = 0; i < 2; ++i) {
    auto t = Get(w, "j");
    ASSERT_TRUE(t.ok());
    ASSERT_EQ(t->result(), GetTaskResponse::TASK);
    EXPECT_NE(t->task().task_id(), t0->task().task_id());
    ReportTaskResponse resp;
    ASSERT_TRUE(Report(w, t->task(), true, &resp).ok());
    EXPECT_EQ(resp.job_done(), i == 1);
  }
  Reopen();
  StatusResponse st = GetStatus();
  EXPECT_EQ(st.jobs(0).state(), JobInfo::FAILED);
  EXPECT_EQ(st.jobs(0).tasks_failed(), 1u);
  EXPECT_EQ(st.jobs(0).tasks_done(), 2u);
  ASSERT_EQ(st.failed_tasks_size(), 1);
  EXPECT_EQ(st.failed_tasks(0).last_error(), "boom");
  EXPECT_EQ(st.failed_tasks(0).failures(), 2u);
}

TEST_F(MasterCoreTest, LostWorkersTaskIsRerunByAnother) {
  MakeJob("j", 1, /*eval=*/false);
  auto a = AddWorker();
  auto b = AddWorker();
  EXPECT_NE(a.worker_id(), b.worker_id());
  auto ta = Get(a, "j");
  ASSERT_TRUE(ta.ok());
  // b keeps its lease alive; a falls silent.
  now_ += kLease / 2;
  WorkerHeartbeatRequest hb;
  hb.set_worker_id(b.worker_id());
  hb.set_incarnation(b.incarnation());
  WorkerHeartbeatResponse hb_resp;
  ASSERT_TRUE(core_->WorkerHeartbeat(hb, &hb_resp).ok());
  now_ += kLease / 2 + absl::Milliseconds(1);
  ASSERT_TRUE(core_->ExpireLeases().ok());
  StatusResponse st = GetStatus();
  EXPECT_EQ(st.workers(0).state(), WorkerInfo::LOST);
  EXPECT_EQ(st.workers(1).state(), WorkerInfo::LIVE);
  EXPECT_EQ(st.jobs(0).tasks_doing(), 0u);

  std::map<uint64_t, int> done;  // task id -> times accepted as done
  while (true) {
    auto t = Get(b, "j");
    ASSERT_TRUE(t.ok());
    if (t->result() != GetTaskResponse::TASK) break;
    if (t->task().task_id() == ta->task().task_id()) {
      EXPECT_EQ(t->task().attempt(), 2u);
    }
    ASSERT_TRUE(Report(b, t->task(), true).ok());
    ++done[t->task().task_id()];
  }
  EXPECT_EQ(done, (std::map<uint64_t, int>{{0, 1}, {1, 1}, {2, 1}}));
  // The lost worker's late report and heartbeat are refused; it must register again.
  absl::Status late = Report(a, ta->task(), true);
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  hb.set_worker_id(a.worker_id());
  hb.set_incarnation(a.incarnation());
  EXPECT_EQ(core_->WorkerHeartbeat(hb, &hb_resp).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(GetStatus().jobs(0).train_records_done(), 10u);
}

TEST_F(MasterCoreTest, RestartMidJobLosesAndDuplicatesNothing) {
  MakeJob("j", 2, /*eval=*/false);
  auto a = AddWorker();
  auto b = AddWorker();
  auto t1 = Get(a, "j");
  auto t2 = Get(b, "j");
  ASSERT_TRUE(t1.ok() && t2.ok());
  ASSERT_TRUE(Report(a, t1->task(), true).ok());
  Reopen();
  // After the restart: a's report was kept (a retry is recognized), b still holds its task.
  ReportTaskResponse resp;
  ASSERT_TRUE(Report(a, t1->task(), true, &resp).ok());
  EXPECT_TRUE(resp.duplicate());
  StatusResponse st = GetStatus();
  EXPECT_EQ(st.jobs(0).tasks_done(), 1u);
  EXPECT_EQ(st.jobs(0).tasks_doing(), 1u);
  ASSERT_TRUE(Report(b, t2->task(), true).ok());
  // A worker restarting under its id gets a new incarnation; its held task is re-queued.
  auto t3 = Get(a, "j");
  ASSERT_TRUE(t3.ok());
  ASSERT_EQ(t3->result(), GetTaskResponse::TASK);
  Reopen();
  auto a2 = AddWorker(a.worker_id());
  EXPECT_EQ(a2.incarnation(), a.incarnation() + 1);
  EXPECT_EQ(Report(a, t3->task(), true).code(), absl::StatusCode::kFailedPrecondition);
  uint64_t records = 20 - 8;  // t1 and t2 were 4 records each
  while (true) {
    auto t = Get(a2, "j");
    ASSERT_TRUE(t.ok());
    if (t->result() == GetTaskResponse::DONE) break;
    ASSERT_EQ(t->result(), GetTaskResponse::TASK);
    records -= t->task().end_record() - t->task().first_record();
    ASSERT_TRUE(Report(a2, t->task(), true).ok());
    if (t->task().task_id() == 1) Reopen();  // and once more in the middle
  }
  EXPECT_EQ(records, 0u);
  st = GetStatus();
  EXPECT_EQ(st.jobs(0).state(), JobInfo::SUCCEEDED);
  EXPECT_EQ(st.jobs(0).tasks_done(), 6u);
  EXPECT_EQ(st.jobs(0).train_records_done(), 20u);
}

TEST_F(MasterCoreTest, BadRequestsGetSpecificCodes) {
  MakeJob("j", 1, false);
  auto a = AddWorker();
  auto b = AddWorker();
  EXPECT_EQ(Get(a, "nope").status().code(), absl::StatusCode::kNotFound);
  auto t = Get(a, "j");
  ASSERT_TRUE(t.ok());
  absl::Status s = Report(b, t->task(), true);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("by worker " + std::to_string(a.worker_id())), std::string::npos) << s;
  Task unknown = t->task();
  unknown.set_job("nope");
  EXPECT_EQ(Report(a, unknown, true).code(), absl::StatusCode::kNotFound);
  RegisterWorkerResponse ghost;
  ghost.set_worker_id(999);
  ghost.set_incarnation(1);
  EXPECT_EQ(Get(ghost, "j").status().code(), absl::StatusCode::kNotFound);
  ghost.set_worker_id(a.worker_id());
  ghost.set_incarnation(7);
  EXPECT_EQ(Get(ghost, "j").status().code(), absl::StatusCode::kFailedPrecondition);

  CreateJobRequest job;
  job.set_name("j");
  job.set_epochs(1);
  job.set_records_per_task(4);
  job.add_files()->set_path("other");
  job.mutable_files(0)->set_records(3);
  CreateJobResponse job_resp;
  EXPECT_EQ(core_->CreateJob(job, &job_resp).code(), absl::StatusCode::kAlreadyExists);
  job.set_name("k");
  job.set_epochs(0);
  EXPECT_EQ(core_->CreateJob(job, &job_resp).code(), absl::StatusCode::kInvalidArgument);

  LeaveWorkerRequest leave;
  leave.set_worker_id(a.worker_id());
  leave.set_incarnation(a.incarnation());
  LeaveWorkerResponse leave_resp;
  ASSERT_TRUE(core_->LeaveWorker(leave, &leave_resp).ok());
  EXPECT_EQ(leave_resp.requeued_tasks(), 1u);
  auto again = Get(b, "j");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->task().task_id(), t->task().task_id());
  EXPECT_EQ(again->task().failures(), 0u);  // leaving is not a failure
}

TEST_F(MasterCoreTest, DrainAndRebalanceMoveVShards) {
  DrainResponse drain;
  DrainRequest req;
  req.set_pod_id("ps-7");
  EXPECT_EQ(core_->Drain(req, &drain).code(), absl::StatusCode::kNotFound);
  req.set_pod_id("ps-0");
  // No other live pod to take ps-0's vshards.
  EXPECT_EQ(core_->Drain(req, &drain).code(), absl::StatusCode::kFailedPrecondition);
  AddPod("ps-0");
  AddPod("ps-1");
  RebalanceResponse rebalance;
  ASSERT_TRUE(core_->Rebalance(RebalanceRequest(), &rebalance).ok());  // already balanced
  EXPECT_EQ(rebalance.moved_vshards(), 0u);
  // A third pod joins (the cluster grows past --num_ps); rebalance moves vshards onto it.
  AddPod("ps-2");
  ShardMapResponse before;
  ASSERT_TRUE(core_->GetShardMap(GetShardMapRequest(), &before).ok());
  ASSERT_TRUE(core_->Rebalance(RebalanceRequest(), &rebalance).ok());
  EXPECT_EQ(rebalance.moved_vshards(), 5u);  // 16 over 3: 6, 5, 5
  EXPECT_GT(rebalance.epoch(), before.epoch());
  auto counts = Counts();
  EXPECT_EQ(counts["ps-2"], 5);
  EXPECT_EQ(counts["ps-0"] + counts["ps-1"], 11);
  EXPECT_LE(std::abs(counts["ps-0"] - counts["ps-1"]), 1);
  // Moves of at most 2 vshards; each import came from the source's address.
  ASSERT_EQ(pods_->imports.size(), 3u);
  for (const auto& imp : pods_->imports) EXPECT_LE(imp.vshards_size(), 2);
  // The destination was told it owns its vshards at the final epoch.
  EXPECT_EQ(pods_->assignments["ps-2:1"].owned_size(), 5);
  EXPECT_EQ(pods_->assignments["ps-2:1"].moving_in_size(), 0);
  EXPECT_EQ(pods_->assignments["ps-2:1"].epoch(), rebalance.epoch());

  // Drain ps-2: everything goes back; it shows DRAINED and gets nothing from a rebalance.
  req.set_pod_id("ps-2");
  ASSERT_TRUE(core_->Drain(req, &drain).ok());
  EXPECT_EQ(drain.moved_vshards(), 5u);
  counts = Counts();
  EXPECT_EQ(counts.count("ps-2"), 0u);
  StatusResponse status;
  ASSERT_TRUE(core_->Status(StatusRequest(), &status).ok());
  bool drained = false;
  for (const PodInfo& p : status.pods())
    drained |= p.pod_id() == "ps-2" && p.state() == PodInfo::DRAINED;
  EXPECT_TRUE(drained);
  EXPECT_TRUE(status.operation().done());
  EXPECT_EQ(status.operation().kind(), "drain ps-2");
  ASSERT_TRUE(core_->Rebalance(RebalanceRequest(), &rebalance).ok());
  EXPECT_EQ(Counts().count("ps-2"), 0u);
  // The drained state survives a master restart.
  Reopen();
  ASSERT_TRUE(core_->Status(StatusRequest(), &status).ok());
  drained = false;
  for (const PodInfo& p : status.pods())
    drained |= p.pod_id() == "ps-2" && p.state() == PodInfo::DRAINED;
  EXPECT_TRUE(drained);
}

TEST_F(MasterCoreTest, FailedMoveIsAbortedAndTheSourceKeepsItsVShards) {
  AddPod("ps-0");
  AddPod("ps-1");
  const auto before = Counts();
  pods_->fail_import = absl::UnavailableError("destination died");
  auto moved = core_->MoveVShards("ps-0", "ps-1", {0, 1});
  EXPECT_EQ(moved.status().code(), absl::StatusCode::kUnavailable) << moved.status();
  EXPECT_EQ(Counts(), before);
  // Both pods were told: no move in their assignments any more.
  EXPECT_EQ(pods_->assignments["ps-0:1"].moving_out_size(), 0);
  EXPECT_EQ(pods_->assignments["ps-0:1"].owned_size(), 8);
  EXPECT_EQ(pods_->assignments["ps-1:1"].moving_in_size(), 0);
  StatusResponse status;
  ASSERT_TRUE(core_->Status(StatusRequest(), &status).ok());
  ASSERT_GE(status.moves_size(), 1);
  EXPECT_EQ(status.moves(0).state(), MoveInfo::ABORTED);
  // Vshards the source does not own, or a dead destination, are refused up front.
  pods_->fail_import = absl::OkStatus();
  EXPECT_EQ(core_->MoveVShards("ps-1", "ps-0", {0}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  now_ += 2 * kLease;  // both leases expire
  EXPECT_EQ(core_->MoveVShards("ps-0", "ps-1", {0}).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(MasterCoreTest, MoveRecordedByADeadMasterIsAbortedOnRestart) {
  AddPod("ps-0");
  AddPod("ps-1");
  const auto before = Counts();
  ShardMapResponse map;
  ASSERT_TRUE(core_->GetShardMap(GetShardMapRequest(), &map).ok());
  // A master that died mid-move left its record (and the epoch it bumped) behind.
  core_.reset();
  {
    auto store = MasterStore::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    MoveRecord move;
    move.set_move_id(7);
    move.add_vshards(3);
    move.set_source("ps-0");
    move.set_destination("ps-1");
    StoreBatch batch;
    batch.Put("move/00000000000000000007", move);
    ASSERT_TRUE((*store)->Write(batch).ok());
  }
  Reopen();
  EXPECT_EQ(Counts(), before);  // ps-0 still owns vshard 3
  ShardMapResponse after;
  ASSERT_TRUE(core_->GetShardMap(GetShardMapRequest(), &after).ok());
  EXPECT_GT(after.epoch(), map.epoch());  // pods drop the move's state
  EXPECT_EQ(after.moves_size(), 0);
  // No pod is told it is receiving or sending anything.
  RegisterPodRequest reg;
  reg.set_pod_id("ps-1");
  reg.set_address("ps-1:1");
  RegisterPodResponse resp;
  ASSERT_TRUE(core_->RegisterPod(reg, &resp).ok());
  EXPECT_EQ(resp.assignment().moving_in_size(), 0);
  StatusResponse status;
  ASSERT_TRUE(core_->Status(StatusRequest(), &status).ok());
  ASSERT_EQ(status.moves_size(), 1);
  EXPECT_EQ(status.moves(0).state(), MoveInfo::ABORTED);
  // And a new move works after it.
  ASSERT_TRUE(core_->MoveVShards("ps-0", "ps-1", {3}).ok());
  EXPECT_EQ(Counts()["ps-1"], before.at("ps-1") + 1);
}

TEST_F(MasterCoreTest, ClusterCheckpointCopiesEveryOwnerAndTheMaster) {
  CheckpointResponse cp;
  // ps-0 and ps-1 own vshards but never registered: nothing to copy them from.
  EXPECT_EQ(core_->Checkpoint(CheckpointRequest(), &cp).code(), absl::StatusCode::kUnavailable);
  AddPod("ps-0");
  AddPod("ps-1");
  AddPod("ps-2");  // owns nothing: not part of the checkpoint
  absl::Status s = core_->Checkpoint(CheckpointRequest(), &cp);
  ASSERT_TRUE(s.ok()) << s;
  const CheckpointInfo& info = cp.checkpoint();
  EXPECT_EQ(info.pods_size(), 2);
  EXPECT_EQ(pods_->checkpoints,
            (std::vector<std::string>{info.dir() + "/ps-0", info.dir() + "/ps-1"}));
  // The master's copy opens as a master with the same state.
  const uint64_t id = info.checkpoint_id();
  core_.reset();
  {
    MasterOptions o = Options();
    o.data_dir = info.dir() + "/master";
    auto copy = MasterCore::Open(o);
    ASSERT_TRUE(copy.ok()) << copy.status();
    StatusResponse status;
    ASSERT_TRUE((*copy)->Status(StatusRequest(), &status).ok());
    EXPECT_EQ(status.pods_size(), 3);
    EXPECT_EQ(status.last_checkpoint().checkpoint_id(), id);
  }
  Reopen();
  StatusResponse status;
  ASSERT_TRUE(core_->Status(StatusRequest(), &status).ok());
  EXPECT_EQ(status.last_checkpoint().checkpoint_id(), id);
  ASSERT_TRUE(core_->Checkpoint(CheckpointRequest(), &cp).ok());
  EXPECT_EQ(cp.checkpoint().checkpoint_id(), id + 1);
}

// At R = 2 the pods' copies are cut one after another while pushes flow, so a checkpoint
// keeps each vshard's primary's copy only: the master's copy of the map names the same
// primaries, no followers, at a newer epoch (the live map keeps its followers), and
// re-replication refills the followers from the primaries after a restore.
TEST_F(MasterCoreTest, ReplicatedCheckpointKeepsThePrimariesCopiesOnly) {
  core_.reset();
  std::filesystem::remove_all(dir_);  // a new cluster: R is fixed for the data dir
  MasterOptions o = Options();
  o.replication = 2;
  o.rereplicate_interval = absl::ZeroDuration();  // rounds run when the test says
  auto core = MasterCore::Open(o);
  ASSERT_TRUE(core.ok()) << core.status();
  core_ = *std::move(core);
  AddPod("ps-0");
  AddPod("ps-1");
  auto map = [&] {
    ShardMapResponse m;
    EXPECT_TRUE(core_->GetShardMap(GetShardMapRequest(), &m).ok());
    return m;
  };
  auto followers = [](const ShardMapResponse& m) {
    int n = 0;
    for (const Followers& f : m.followers()) n += f.pods_size();
    return n;
  };
  const ShardMapResponse live = map();
  ASSERT_EQ(followers(live), 16);
  CheckpointResponse cp;
  absl::Status s = core_->Checkpoint(CheckpointRequest(), &cp);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(pods_->checkpoints, (std::vector<std::string>{cp.checkpoint().dir() + "/ps-0",
                                                          cp.checkpoint().dir() + "/ps-1"}));
  EXPECT_EQ(map().epoch(), live.epoch());
  EXPECT_EQ(followers(map()), 16);

  core_.reset();
  o.data_dir = cp.checkpoint().dir() + "/master";
  core = MasterCore::Open(o);
  ASSERT_TRUE(core.ok()) << core.status();
  core_ = *std::move(core);
  const ShardMapResponse restored = map();
  EXPECT_EQ(restored.epoch(), live.epoch() + 1);
  EXPECT_EQ(std::vector<uint32_t>(restored.owner().begin(), restored.owner().end()),
            std::vector<uint32_t>(live.owner().begin(), live.owner().end()));
  EXPECT_EQ(followers(restored), 0);
  ASSERT_TRUE(core_->Rereplicate().ok());
  const ShardMapResponse refilled = map();
  EXPECT_EQ(followers(refilled), 16);
  for (int v = 0; v < 16; ++v) {
    ASSERT_EQ(refilled.followers(v).pods_size(), 1);
    EXPECT_NE(refilled.followers(v).pods(0), refilled.owner(v)) << "vshard " << v;
  }
}

TEST_F(MasterCoreTest, AutoRebalanceSpreadsVShardsOntoANewPod) {
  core_.reset();
  MasterOptions o = Options();
  o.auto_rebalance = true;
  auto core = MasterCore::Open(o);
  ASSERT_TRUE(core.ok()) << core.status();
  core_ = *std::move(core);
  AddPod("ps-0");
  AddPod("ps-1");  // the initial pods own their ranges: nothing to do
  AddPod("ps-2");
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Counts()["ps-2"] != 5 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(Counts()["ps-2"], 5);
}

TEST_F(MasterCoreTest, LeavingPodIsLostAtOnceAndItsSuccessorWelcome) {
  RegisterPodRequest req;
  req.set_pod_id("ps-0");
  req.set_address("h:1");
  RegisterPodResponse resp;
  ASSERT_TRUE(core_->RegisterPod(req, &resp).ok());
  LeavePodRequest leave;
  leave.set_pod_id("ps-0");
  leave.set_address("h:9");
  LeavePodResponse left;
  EXPECT_EQ(core_->LeavePod(leave, &left).code(), absl::StatusCode::kFailedPrecondition);
  leave.set_pod_id("ps-7");
  EXPECT_EQ(core_->LeavePod(leave, &left).code(), absl::StatusCode::kNotFound);
  leave.set_pod_id("ps-0");
  leave.set_address("h:1");
  ASSERT_TRUE(core_->LeavePod(leave, &left).ok());
  // LOST at once, without waiting for the lease; not counted as a lease loss.
  ASSERT_TRUE(core_->ExpireLeases().ok());
  EXPECT_EQ(GetStatus().pods(0).state(), PodInfo::LOST);
  EXPECT_EQ(core_->pod_lease_losses(), 0u);
  // Its successor at another address is accepted at once and keeps the vshards.
  req.set_address("h:2");
  resp.Clear();
  ASSERT_TRUE(core_->RegisterPod(req, &resp).ok());
  EXPECT_EQ(resp.assignment().owned_vshards_size(), 8);
  // A lease that runs out is a loss.
  now_ += kLease + absl::Milliseconds(1);
  ASSERT_TRUE(core_->ExpireLeases().ok());
  EXPECT_EQ(core_->pod_lease_losses(), 1u);
  RegisterWorkerResponse w = AddWorker();
  now_ += kLease + absl::Milliseconds(1);
  ASSERT_TRUE(core_->ExpireLeases().ok());
  EXPECT_EQ(core_->worker_lease_losses(), 1u);
}

// The request (records_per_task = 2^63, files of 2^64-1 and 1 records) hung the
// master under its lock, growing without bound: now refused at once, and the master
// answers everything else as before.
TEST_F(MasterCoreTest, AnOverflowingJobIsRefusedAtOnce) {
  CreateJobRequest req;
  req.set_name("wrap");
  req.set_epochs(1);
  req.set_records_per_task(uint64_t{1} << 63);
  req.add_files()->set_path("a");
  req.mutable_files(0)->set_records(UINT64_MAX);
  req.add_files()->set_path("b");
  req.mutable_files(1)->set_records(1);
  CreateJobResponse resp;
  EXPECT_EQ(core_->CreateJob(req, &resp).code(), absl::StatusCode::kInvalidArgument);
  // Beyond the documented limit of tasks: refused, naming it.
  req.set_records_per_task(1);
  req.mutable_files(0)->set_records(Options().max_tasks_per_job + 1);
  req.mutable_files()->RemoveLast();
  absl::Status s = core_->CreateJob(req, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("1000000"), std::string::npos) << s;
  EXPECT_EQ(GetStatus().jobs_size(), 0);
  MakeJob("j", 1, /*eval=*/false);
  EXPECT_EQ(GetStatus().jobs_size(), 1);
}

// A GetTask whose answer was lost is retried: the worker gets the same task (same attempt),
// nothing is stranded DOING, and the job finishes.
TEST_F(MasterCoreTest, GetTaskIsIdempotentSoALostAnswerStrandsNothing) {
  MakeJob("j", 1, /*eval=*/false);
  auto w = AddWorker();
  auto first = Get(w, "j");
  ASSERT_TRUE(first.ok() && first->result() == GetTaskResponse::TASK);
  auto retry = Get(w, "j");  // the first answer never arrived
  ASSERT_TRUE(retry.ok() && retry->result() == GetTaskResponse::TASK);
  EXPECT_EQ(retry->task().task_id(), first->task().task_id());
  EXPECT_EQ(retry->task().attempt(), 1u);
  EXPECT_EQ(GetStatus().jobs(0).tasks_doing(), 1u);
  Reopen();  // also across a master restart
  retry = Get(w, "j");
  ASSERT_TRUE(retry.ok() && retry->result() == GetTaskResponse::TASK);
  EXPECT_EQ(retry->task().task_id(), first->task().task_id());

  std::map<uint64_t, int> done;
  for (int i = 0; i < 10; ++i) {
    auto t = Get(w, "j");
    ASSERT_TRUE(t.ok()) << t.status();
    if (t->result() == GetTaskResponse::DONE) break;
    ASSERT_EQ(t->result(), GetTaskResponse::TASK);  // never WAIT: nothing is stranded
    EXPECT_EQ(t->task().attempt(), 1u);
    ASSERT_TRUE(Report(w, t->task(), true).ok());
    ++done[t->task().task_id()];
  }
  EXPECT_EQ(done, (std::map<uint64_t, int>{{0, 1}, {1, 1}, {2, 1}}));
  StatusResponse st = GetStatus();
  EXPECT_EQ(st.jobs(0).state(), JobInfo::SUCCEEDED);
  EXPECT_EQ(st.jobs(0).train_records_done(), 10u);
  EXPECT_EQ(st.doing_tasks_size(), 0);
}

// A worker that asks for a task of another job is not working on the one it holds: that
// task goes back to the queue (a failure), for another worker to take.
TEST_F(MasterCoreTest, AWorkerAskingForAnotherJobGivesUpWhatItHolds) {
  MakeJob("a", 1, /*eval=*/false);
  MakeJob("b", 1, /*eval=*/false);
  auto w = AddWorker();
  auto ta = Get(w, "a");
  ASSERT_TRUE(ta.ok() && ta->result() == GetTaskResponse::TASK);
  auto tb = Get(w, "b");
  ASSERT_TRUE(tb.ok() && tb->result() == GetTaskResponse::TASK);
  EXPECT_EQ(tb->task().job(), "b");
  StatusResponse st = GetStatus();
  ASSERT_EQ(st.doing_tasks_size(), 1);
  EXPECT_EQ(st.doing_tasks(0).job(), "b");
  EXPECT_EQ(st.workers(0).tasks_doing(), 1u);
  EXPECT_EQ(Report(w, ta->task(), true).code(), absl::StatusCode::kFailedPrecondition);
  auto other = AddWorker();
  auto again = Get(other, "a");
  ASSERT_TRUE(again.ok() && again->result() == GetTaskResponse::TASK);
  EXPECT_EQ(again->task().task_id(), ta->task().task_id());
  EXPECT_EQ(again->task().attempt(), 2u);
  EXPECT_EQ(again->task().failures(), 1u);
  EXPECT_NE(again->task().last_error().find("asked for a task of job b"), std::string::npos)
      << again->task().last_error();
}

// Finished jobs are deleted, tasks and all, beyond max_finished_jobs (3 here) and
// job_retention (1 h) after they finished; the totals in status never go back, a running
// job is never touched, and a deleted name can be used again.
TEST_F(MasterCoreTest, RetentionDeletesFinishedJobsAndKeepsTheTotals) {
  auto w = AddWorker();
  const auto finish = [&](const std::string& job) {
    for (;;) {
      auto t = Get(w, job);
      ASSERT_TRUE(t.ok()) << t.status();
      if (t->result() == GetTaskResponse::DONE) return;
      ASSERT_TRUE(Report(w, t->task(), true).ok());
    }
  };
  for (int i = 0; i < 5; ++i) {
    MakeJob(absl::StrCat("j", i), 1, /*eval=*/false);
    finish(absl::StrCat("j", i));
    now_ += absl::Minutes(1);  // j0 finished first
    WorkerHeartbeatRequest hb;
    hb.set_worker_id(w.worker_id());
    hb.set_incarnation(w.incarnation());
    WorkerHeartbeatResponse hb_resp;
    ASSERT_TRUE(core_->WorkerHeartbeat(hb, &hb_resp).ok());
  }
  MakeJob("running", 1, /*eval=*/false);
  StatusResponse st = GetStatus();
  ASSERT_EQ(st.jobs_size(), 6);
  EXPECT_EQ(st.tasks_done(), 15u);
  EXPECT_EQ(st.records_trained(), 50u);
  EXPECT_GT(st.jobs(0).finished_unix_ms(), 0);
  EXPECT_EQ(st.retention().max_finished_jobs(), 3u);

  ASSERT_TRUE(core_->EnforceRetention().ok());
  st = GetStatus();
  std::vector<std::string> names;
  for (const JobInfo& j : st.jobs()) names.push_back(j.name());
  EXPECT_EQ(names, (std::vector<std::string>{"j2", "j3", "j4", "running"}));  // the newest 3
  EXPECT_EQ(st.tasks_done(), 15u);
  EXPECT_EQ(st.records_trained(), 50u);
  Reopen();  // deleted for good; the totals are stored
  st = GetStatus();
  EXPECT_EQ(st.jobs_size(), 4);
  EXPECT_EQ(st.tasks_done(), 15u);

  now_ += absl::Minutes(57);  // j2 finished 1 h ago; j3 and j4 later
  ASSERT_TRUE(core_->EnforceRetention().ok());
  names.clear();
  st = GetStatus();
  for (const JobInfo& j : st.jobs()) names.push_back(j.name());
  EXPECT_EQ(names, (std::vector<std::string>{"j3", "j4", "running"}));
  now_ += absl::Hours(2);
  ASSERT_TRUE(core_->EnforceRetention().ok());
  names.clear();
  st = GetStatus();
  for (const JobInfo& j : st.jobs()) names.push_back(j.name());
  EXPECT_EQ(names, (std::vector<std::string>{"running"}));
  EXPECT_EQ(GetStatus().records_trained(), 50u);

  // The name is free again: a new job, cut anew.
  CreateJobRequest req;
  req.set_name("j0");
  req.set_epochs(1);
  req.set_records_per_task(1);
  req.add_files()->set_path("other");
  req.mutable_files(0)->set_records(2);
  CreateJobResponse resp;
  ASSERT_TRUE(core_->CreateJob(req, &resp).ok());
  EXPECT_TRUE(resp.created());
  EXPECT_EQ(resp.num_tasks(), 2u);
  // Nothing of the deleted jobs is left in the store.
  core_.reset();
  auto store = MasterStore::Open(dir_);
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<std::string> keys;
  ASSERT_TRUE((*store)
                  ->Scan("",
                         [&](absl::string_view key, absl::string_view) {
                           if (absl::StartsWith(key, "task/") || absl::StartsWith(key, "job/")) {
                             keys.push_back(std::string(key.substr(0, key.rfind('/'))));
                           }
                           return absl::OkStatus();
                         })
                  .ok());
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{"job", "task/j0", "task/running"}));
}

TEST_F(MasterCoreTest, DeleteJobRefusesARunningJobUnlessForced) {
  MakeJob("j", 1, /*eval=*/false);
  auto w = AddWorker();
  auto t = Get(w, "j");
  ASSERT_TRUE(t.ok() && t->result() == GetTaskResponse::TASK);
  DeleteJobRequest del;
  del.set_name("j");
  DeleteJobResponse deleted;
  absl::Status s = core_->DeleteJob(del, &deleted);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("3 of 3 tasks unfinished"), std::string::npos) << s;
  del.set_force(true);
  ASSERT_TRUE(core_->DeleteJob(del, &deleted).ok());
  EXPECT_EQ(deleted.job().name(), "j");
  EXPECT_EQ(deleted.job().state(), JobInfo::RUNNING);
  EXPECT_EQ(deleted.job().tasks_doing(), 1u);
  // Its worker's report and next GetTask: NOT_FOUND; it holds nothing any more.
  EXPECT_EQ(Report(w, t->task(), true).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Get(w, "j").status().code(), absl::StatusCode::kNotFound);
  StatusResponse st = GetStatus();
  EXPECT_EQ(st.jobs_size(), 0);
  EXPECT_EQ(st.workers(0).tasks_doing(), 0u);
  EXPECT_EQ(st.doing_tasks_size(), 0);
  EXPECT_EQ(core_->DeleteJob(del, &deleted).code(), absl::StatusCode::kNotFound);
  // Recreated under the same name, the worker takes its first task.
  Reopen();
  MakeJob("j", 1, /*eval=*/false);
  auto fresh = Get(w, "j");
  ASSERT_TRUE(fresh.ok() && fresh->result() == GetTaskResponse::TASK);
  EXPECT_EQ(fresh->task().task_id(), 0u);
  EXPECT_EQ(fresh->task().attempt(), 1u);
}

// Workers that left or lost their lease are forgotten worker_retention (10 min) later;
// one that registers again with its old id gets a new id, never (old id, incarnation 1).
TEST_F(MasterCoreTest, LeftAndLostWorkersAreForgottenAndTheirIdsNotReused) {
  auto left = AddWorker();
  auto lost = AddWorker();
  LeaveWorkerRequest leave;
  leave.set_worker_id(left.worker_id());
  leave.set_incarnation(left.incarnation());
  LeaveWorkerResponse leave_resp;
  ASSERT_TRUE(core_->LeaveWorker(leave, &leave_resp).ok());
  now_ += kLease + absl::Milliseconds(1);
  ASSERT_TRUE(core_->ExpireLeases().ok());  // `lost` is LOST now
  auto live = AddWorker();
  now_ += absl::Minutes(9);
  WorkerHeartbeatRequest hb;
  hb.set_worker_id(live.worker_id());
  hb.set_incarnation(live.incarnation());
  WorkerHeartbeatResponse hb_resp;
  ASSERT_TRUE(core_->WorkerHeartbeat(hb, &hb_resp).ok());
  ASSERT_TRUE(core_->EnforceRetention().ok());
  EXPECT_EQ(GetStatus().workers_size(), 3);  // not yet
  now_ += absl::Minutes(1) + absl::Milliseconds(1);
  ASSERT_TRUE(core_->WorkerHeartbeat(hb, &hb_resp).ok());
  ASSERT_TRUE(core_->EnforceRetention().ok());
  StatusResponse st = GetStatus();
  ASSERT_EQ(st.workers_size(), 1);
  EXPECT_EQ(st.workers(0).worker_id(), live.worker_id());
  Reopen();
  EXPECT_EQ(GetStatus().workers_size(), 1);
  // The forgotten ids come back as new ones.
  auto again = AddWorker(lost.worker_id());
  EXPECT_GT(again.worker_id(), live.worker_id());
  EXPECT_EQ(again.incarnation(), 1u);
  // A live worker re-registering keeps its id (a new incarnation).
  auto live2 = AddWorker(live.worker_id());
  EXPECT_EQ(live2.worker_id(), live.worker_id());
  EXPECT_EQ(live2.incarnation(), 2u);
  // Ids are the master's to give: one never issued (near 2^64, which would wrap the next
  // id onto one in use) gets the next new id too.
  auto picked = AddWorker(UINT64_MAX - 1);
  EXPECT_EQ(picked.worker_id(), again.worker_id() + 1);
  EXPECT_EQ(AddWorker().worker_id(), again.worker_id() + 2);
}

// R = 2 over three pods (ps-i leads vshards [16i/3 ..], followed by the next pod of the
// ring), on a fresh data dir: rounds of re-replication run when the test says.
class ReplicatedMasterCoreTest : public MasterCoreTest {
 protected:
  void SetUp() override {
    MasterCoreTest::SetUp();
    core_.reset();
    std::filesystem::remove_all(dir_);
    MasterOptions o = Options();
    o.num_ps = 3;
    o.replication = 2;
    o.rereplicate_interval = absl::ZeroDuration();
    auto core = MasterCore::Open(o);
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = *std::move(core);
  }
  // Vshard -> its pods (primary first), as the map says.
  std::vector<std::vector<std::string>> Copies() {
    ShardMapResponse map;
    EXPECT_TRUE(core_->GetShardMap(GetShardMapRequest(), &map).ok());
    std::vector<std::vector<std::string>> out(map.owner_size());
    for (int v = 0; v < map.owner_size(); ++v) {
      out[v].push_back(map.pods(map.owner(v)).pod_id());
      for (uint32_t f : map.followers(v).pods()) out[v].push_back(map.pods(f).pod_id());
    }
    return out;
  }
};

// A follower that registers is told to its live primaries at once (they stream to its
// address), not at their next heartbeat, a third of a lease later.
TEST_F(ReplicatedMasterCoreTest, APrimaryLearnsItsFollowersAddressWhenItRegisters) {
  AddPod("ps-0");
  {
    absl::MutexLock lock(&pods_->mu);
    pods_->assignments.clear();
  }
  AddPod("ps-1");  // follows ps-0's vshards
  // Told from the master's notifier thread, after the registration's answer: waited for
  // (the bound only keeps a broken build from hanging).
  absl::MutexLock lock(&pods_->mu);
  pods_->mu.AwaitWithTimeout(absl::Condition(
                                 +[](FakePodControl* p) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                   return p->assignments.count("ps-0:1") > 0;
                                 },
                                 pods_.get()),
                             absl::Seconds(60));
  auto told = pods_->assignments.find("ps-0:1");
  ASSERT_NE(told, pods_->assignments.end()) << "ps-0 was not told that its follower registered";
  std::map<std::string, std::string> followers;
  for (const ReplicaPeer& p : told->second.replication().followers()) {
    followers[p.pod_id()] = p.address();
  }
  EXPECT_EQ(followers["ps-1"], "ps-1:1");
  // ps-2 never registered: nobody streams from it, so nobody was told it at ps-1's start.
  EXPECT_EQ(pods_->assignments.count("ps-2:1"), 0u);
}

// Pods started in turn: ps-2 has not registered when re-replication runs, so ps-1's
// vshards (followed by ps-2) get a copy on ps-0; the round then trims ps-2, which is not
// live, from their ack sets. When ps-2 registers, no vshard has more than R copies.
TEST_F(ReplicatedMasterCoreTest, ACopyMadeForAFollowerNotYetStartedLeavesRCopies) {
  AddPod("ps-0");
  AddPod("ps-1");
  ASSERT_TRUE(core_->Rereplicate().ok());
  EXPECT_GT(core_->rereplication_stats().copies, 0u);
  AddPod("ps-2");
  ASSERT_TRUE(core_->Rereplicate().ok());
  for (const auto& pods : Copies()) {
    std::set<std::string> distinct(pods.begin(), pods.end());
    EXPECT_EQ(distinct.size(), pods.size());
    EXPECT_EQ(pods.size(), 2u) << "vshard of " << pods[0] << " has " << pods.size() << " copies";
  }
  EXPECT_GT(core_->ack_set_removals_surplus(), 0u);
}

}  // namespace
}  // namespace ps
