// libFuzzer harness: the master's job creation (issue 15). Each input is a serialized
// CreateJobRequest, as the master receives it off the wire; it is created on a
// JobDispatcher over the in-memory store the master's tests use, with a small task limit.
// An oracle recomputes in 128-bit arithmetic whether the request is valid and how many
// tasks it makes, and checks what was created:
// - CreateJob answers INVALID_ARGUMENT exactly when the oracle refuses the request, and
//   never hangs or allocates beyond the limit (the old code's cutting loop wrapped);
// - a created job has the oracle's task count, and its tasks cover every file's records
//   once per epoch, in ranges of at most records_per_task, training before evaluation;
// - creating it again is idempotent; a small job runs to SUCCEEDED through GetTask and
//   ReportTask with every training record counted once.
// Any mismatch aborts (a crash for libFuzzer).
//
// Seed corpus (tests/fuzz/corpus/create_job/): serialized requests made from text protos
// with protoc, from the repository root, e.g.
//   echo 'name: "j" epochs: 2 records_per_task: 4 files { path: "a" records: 10 }
//         eval_files { path: "e" records: 5 }' |
//     protoc --encode=ps.CreateJobRequest -I. proto/master.proto \
//     > tests/fuzz/corpus/create_job/small_eval
// (the seeds' text is listed in tests/fuzz/master.cmake).
#include <glog/logging.h>
#include <google/protobuf/stubs/logging.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "embedding/spec.h"
#include "master/counters_record.h"
#include "master/job.h"
#include "master/job_dispatcher.h"
#include "master/keys.h"
#include "master/memory_store_for_test.h"
#include "proto/master.pb.h"

namespace {

using u128 = unsigned __int128;

constexpr uint64_t kMaxTasks = 4096;  // small: the fuzzer explores the limits quickly
constexpr uint64_t kRunTasks = 256;   // jobs up to this size are also run to their end

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_create_job: %s\n", what);
    std::abort();
  }
}

struct Expected {
  bool valid = false;
  u128 tasks = 0;
  u128 train_records = 0;
};

// The rules of ValidateJobSpec (master/job.h), computed independently without overflow.
Expected Oracle(const ps::CreateJobRequest& req) {
  Expected e;
  if (!ps::ValidateName(req.name()).ok() || req.epochs() < 1 || req.records_per_task() < 1 ||
      req.files_size() == 0 || req.files_size() > ps::kMaxJobFiles ||
      req.eval_files_size() > ps::kMaxJobFiles) {
    return e;
  }
  const u128 per_task = req.records_per_task();
  u128 tasks = 0, train = 0, eval = 0, path_bytes = 0;
  for (const auto* list : {&req.files(), &req.eval_files()}) {
    for (const ps::DataFile& f : *list) {
      if (f.path().empty() || f.path().size() > ps::kMaxJobPathBytes) return e;
      const u128 n = (u128{f.records()} + per_task - 1) / per_task;
      tasks += n;
      path_bytes += n * f.path().size();
      (list == &req.files() ? train : eval) += f.records();
    }
  }
  const u128 epochs = req.epochs();
  e.tasks = tasks * epochs;
  e.train_records = train * epochs;
  e.valid = e.tasks >= 1 && e.tasks <= kMaxTasks &&
            path_bytes * epochs <= ps::kMaxJobTaskPathBytes && train * epochs <= UINT64_MAX &&
            eval * epochs <= UINT64_MAX;
  return e;
}

// Every file's records once per epoch, in order, training then evaluation.
void CheckCut(const ps::CreateJobRequest& req, const ps::Job& job) {
  size_t i = 0;
  const auto& tasks = job.tasks();
  for (uint32_t epoch = 0; epoch < req.epochs(); ++epoch) {
    for (const auto* list : {&req.files(), &req.eval_files()}) {
      const auto kind = list == &req.files() ? ps::Task::TRAIN : ps::Task::EVAL;
      for (const ps::DataFile& f : *list) {
        for (uint64_t next = 0; next < f.records();) {
          Check(i < tasks.size(), "fewer tasks than records");
          const ps::Task& t = tasks[i];
          Check(t.task_id() == i && t.epoch() == epoch && t.kind() == kind &&
                    t.file() == f.path() && t.first_record() == next &&
                    t.end_record() > t.first_record() && t.end_record() <= f.records() &&
                    t.end_record() - t.first_record() <= req.records_per_task() &&
                    t.state() == ps::Task::TODO,
                "a task does not continue its file's records");
          next = t.end_record();
          ++i;
        }
      }
    }
  }
  Check(i == tasks.size(), "more tasks than records");
}

// Runs the job to its end with one worker; every training record is counted once.
void Run(ps::JobDispatcher& jobs, const ps::CreateJobRequest& req, const Expected& e) {
  ps::RegisterWorkerResponse w;
  Check(jobs.RegisterWorker(ps::RegisterWorkerRequest(), &w).ok(), "RegisterWorker failed");
  for (u128 n = 0; n <= e.tasks; ++n) {
    ps::GetTaskRequest get;
    get.set_worker_id(w.worker_id());
    get.set_incarnation(w.incarnation());
    get.set_job(req.name());
    ps::GetTaskResponse task;
    Check(jobs.GetTask(get, &task).ok(), "GetTask failed");
    if (task.result() == ps::GetTaskResponse::DONE) break;
    Check(task.result() == ps::GetTaskResponse::TASK, "a lone worker was told to WAIT");
    ps::GetTaskResponse again;  // a retry gets the same task
    Check(jobs.GetTask(get, &again).ok() && again.task().task_id() == task.task().task_id(),
          "GetTask is not idempotent");
    ps::ReportTaskRequest report;
    report.set_worker_id(w.worker_id());
    report.set_incarnation(w.incarnation());
    report.set_job(req.name());
    report.set_task_id(task.task().task_id());
    report.set_ok(true);
    report.set_records(task.task().end_record() - task.task().first_record());
    ps::ReportTaskResponse done;
    Check(jobs.ReportTask(report, &done).ok(), "ReportTask failed");
  }
  ps::StatusResponse status;
  jobs.Describe(absl::Now(), &status);
  Check(status.jobs_size() == 1 && status.jobs(0).state() == ps::JobInfo::SUCCEEDED &&
            status.jobs(0).tasks_done() == e.tasks &&
            status.jobs(0).train_records_done() == e.train_records,
        "the job did not finish with every record once");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  FLAGS_minloglevel = google::GLOG_ERROR;  // no line per job created
  google::protobuf::SetLogHandler([](auto, auto, auto, const std::string&) {});  // bad UTF-8
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ps::CreateJobRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  const Expected e = Oracle(req);

  ps::MasterOptions options;
  options.max_tasks_per_job = kMaxTasks;
  options.retention_interval = absl::ZeroDuration();
  ps::MemoryStore store;
  {
    ps::Counters first;  // as a new cluster starts (cluster_config.cc)
    first.set_next_worker_id(1);
    ps::StoreBatch batch;
    batch.Put(std::string(ps::keys::kCounters), first);
    Check(store.Write(batch).ok(), "store write failed");
  }
  ps::CountersRecord counters(&store);
  ps::JobDispatcher jobs(options, &store, &counters);
  Check(counters.Load().ok() && jobs.Load(absl::Now()).ok(), "Load failed");

  ps::CreateJobResponse resp;
  const absl::Status s = jobs.CreateJob(req, &resp);
  Check(s.ok() == e.valid, e.valid ? "a valid job was refused" : "an invalid job was created");
  if (!s.ok()) {
    Check(s.code() == absl::StatusCode::kInvalidArgument, "refused with another code");
    return 0;
  }
  Check(resp.created() && resp.num_tasks() == e.tasks, "wrong task count");
  auto job = ps::Job::Create(req, kMaxTasks, 0);
  Check(job.ok(), "Job::Create refused what CreateJob created");
  CheckCut(req, *job);
  ps::CreateJobResponse again;
  Check(jobs.CreateJob(req, &again).ok() && !again.created(), "creation is not idempotent");
  if (e.tasks <= kRunTasks) Run(jobs, req, e);
  return 0;
}
