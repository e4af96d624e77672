#include "master/job.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

// One training file of 10 records and one eval file of 5, 4 records per task: per epoch
// tasks TRAIN [0,4) [4,8) [8,10), EVAL [0,4) [4,5).
CreateJobRequest Spec(uint32_t epochs) {
  CreateJobRequest req;
  req.set_name("j");
  auto* f = req.add_files();
  f->set_path("train.rec");
  f->set_records(10);
  auto* e = req.add_eval_files();
  e->set_path("eval.rec");
  e->set_records(5);
  req.set_epochs(epochs);
  req.set_records_per_task(4);
  return req;
}

Task With(Task t, Task::State state) {
  t.set_state(state);
  return t;
}

constexpr uint64_t kMax = UINT64_MAX;

absl::StatusCode Code(const CreateJobRequest& req, uint64_t max_tasks) {
  return ValidateJobSpec(req, max_tasks).status().code();
}

Job Create(const CreateJobRequest& req) {
  absl::StatusOr<Job> job = Job::Create(req, 1000, /*created_unix_ms=*/5);
  EXPECT_TRUE(job.ok()) << job.status();
  return *std::move(job);
}

TEST(JobTest, SpecsAreCheckedBeforeAnythingIsCut) {
  auto shape = ValidateJobSpec(Spec(2), 10);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->tasks, 10u);
  EXPECT_EQ(shape->train_records, 20u);
  EXPECT_EQ(shape->eval_records, 10u);
  EXPECT_EQ(Code(Spec(3), 10), absl::StatusCode::kInvalidArgument);  // 15
  CreateJobRequest bad = Spec(1);
  bad.mutable_eval_files(0)->clear_path();
  absl::Status s = ValidateJobSpec(bad, 10).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("evaluation file 0"), std::string::npos) << s;
  bad = Spec(1);
  bad.set_records_per_task(0);
  EXPECT_EQ(Code(bad, 10), absl::StatusCode::kInvalidArgument);
  bad = Spec(1);
  bad.mutable_files(0)->set_records(0);
  bad.mutable_eval_files(0)->set_records(0);
  EXPECT_EQ(Code(bad, 10), absl::StatusCode::kInvalidArgument);  // no task at all
}

// The request: records_per_task = 2^63 and files of 2^64-1 and 1 records. The task
// count used to wrap to 1 and pass; the cutting loop then wrapped and never ended.
TEST(JobTest, TheWrappingJobIsRefusedAtOnce) {
  CreateJobRequest req;
  req.set_name("wrap");
  req.set_epochs(1);
  req.set_records_per_task(uint64_t{1} << 63);
  req.add_files()->set_path("a");
  req.mutable_files(0)->set_records(UINT64_MAX);
  req.add_files()->set_path("b");
  req.mutable_files(1)->set_records(1);
  absl::Status s = ValidateJobSpec(req, 10'000'000).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "beyond 2^64 - 1")) << s;
  EXPECT_EQ(Job::Create(req, 10'000'000, 0).status().code(), absl::StatusCode::kInvalidArgument);

  // Alone, the big file is two tasks, and cutting it ends: [0, 2^63), [2^63, 2^64-1).
  req.mutable_files()->RemoveLast();
  Job job = Create(req);
  ASSERT_EQ(job.tasks().size(), 2u);
  EXPECT_EQ(job.tasks()[0].end_record(), uint64_t{1} << 63);
  EXPECT_EQ(job.tasks()[1].first_record(), uint64_t{1} << 63);
  EXPECT_EQ(job.tasks()[1].end_record(), UINT64_MAX);
  EXPECT_EQ(job.Describe().train_records_total(), UINT64_MAX);
}

TEST(JobTest, EveryCountAndSumIsBounded) {
  // Tasks of one file beyond any limit (2^64-1 records, one per task).
  CreateJobRequest req;
  req.set_name("big");
  req.set_epochs(1);
  req.set_records_per_task(1);
  req.add_files()->set_path("a");
  req.mutable_files(0)->set_records(UINT64_MAX);
  EXPECT_EQ(Code(req, 1'000'000), absl::StatusCode::kInvalidArgument);
  // Tasks summed over files: each within the limit, together beyond it.
  req.mutable_files(0)->set_records(600'000);
  req.add_files()->set_path("b");
  req.mutable_files(1)->set_records(600'000);
  absl::Status s = ValidateJobSpec(req, 1'000'000).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "more than 1000000 tasks")) << s;
  // Tasks times epochs: 2 per epoch over 2^32-1 epochs, and a product that wraps 2^64.
  req.mutable_files(0)->set_records(1);
  req.mutable_files(1)->set_records(1);
  req.set_epochs(UINT32_MAX);
  EXPECT_EQ(Code(req, 1'000'000), absl::StatusCode::kInvalidArgument);
  req.set_records_per_task(1);
  req.mutable_files(0)->set_records(uint64_t{1} << 33);
  req.mutable_files(1)->set_records(uint64_t{1} << 33);
  EXPECT_EQ(Code(req, kMax), absl::StatusCode::kInvalidArgument);  // 2^34 * (2^32-1) tasks
  // Records summed over files, and times epochs, beyond 2^64-1 (few tasks).
  req.set_epochs(1);
  req.set_records_per_task(uint64_t{1} << 62);
  req.mutable_files(0)->set_records(uint64_t{3} << 62);
  req.mutable_files(1)->set_records(uint64_t{1} << 62);
  EXPECT_EQ(Code(req, kMax), absl::StatusCode::kInvalidArgument);
  req.mutable_files(1)->set_records(1);
  EXPECT_TRUE(ValidateJobSpec(req, kMax).ok());
  req.set_epochs(2);
  EXPECT_EQ(Code(req, kMax), absl::StatusCode::kInvalidArgument);
  // Evaluation files count too.
  req = Spec(1);
  req.mutable_eval_files(0)->set_records(UINT64_MAX);
  req.set_records_per_task(1);
  EXPECT_EQ(Code(req, kMax), absl::StatusCode::kInvalidArgument);
}

TEST(JobTest, TheRequestItselfIsBounded) {
  CreateJobRequest req = Spec(1);
  req.mutable_files(0)->set_path(std::string(kMaxJobPathBytes, 'p'));
  EXPECT_TRUE(ValidateJobSpec(req, 100).ok());
  req.mutable_files(0)->set_path(std::string(kMaxJobPathBytes + 1, 'p'));
  absl::Status s = ValidateJobSpec(req, 100).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "4097 bytes")) << s;
  EXPECT_LT(s.message().size(), 300u);  // the request's text is not echoed whole

  req = Spec(1);
  for (int i = 0; i < kMaxJobFiles; ++i) req.add_eval_files()->set_path("e");
  EXPECT_EQ(Code(req, kMax), absl::StatusCode::kInvalidArgument);  // 100,001 eval files

  // Every task holds its path: 70,000 tasks of a 4096-byte path is beyond 256 MiB.
  req = Spec(1);
  req.clear_eval_files();
  req.mutable_files(0)->set_path(std::string(kMaxJobPathBytes, 'p'));
  req.set_records_per_task(1);
  req.mutable_files(0)->set_records(60'000);
  EXPECT_TRUE(ValidateJobSpec(req, kMax).ok());
  req.mutable_files(0)->set_records(70'000);
  s = ValidateJobSpec(req, kMax).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "bytes of paths")) << s;

  req = Spec(1);
  req.set_name(std::string(129, 'n'));
  EXPECT_EQ(Code(req, kMax), absl::StatusCode::kInvalidArgument);
}

TEST(JobTest, TasksAreCutPerEpochAndHandedOutInPhases) {
  Job job = Create(Spec(2));
  ASSERT_EQ(job.tasks().size(), 10u);
  EXPECT_EQ(job.record().num_tasks(), 10u);
  EXPECT_EQ(job.tasks()[2].end_record(), 10u);
  EXPECT_EQ(job.tasks()[3].kind(), Task::EVAL);
  EXPECT_EQ(job.tasks()[5].epoch(), 1u);
  // The three training tasks of epoch 0 first; the eval tasks wait for all of them.
  for (uint64_t id = 0; id < 3; ++id) {
    ASSERT_NE(job.Next(), nullptr);
    EXPECT_EQ(job.Next()->task_id(), id);
    job.Apply(With(*job.Next(), Task::DOING));
  }
  EXPECT_EQ(job.Next(), nullptr);  // WAIT
  job.Apply(With(job.tasks()[0], Task::DONE));
  job.Apply(With(job.tasks()[1], Task::FAILED));
  EXPECT_EQ(job.Next(), nullptr);
  // A re-queued task goes back to the front.
  job.Apply(With(job.tasks()[2], Task::TODO));
  ASSERT_NE(job.Next(), nullptr);
  EXPECT_EQ(job.Next()->task_id(), 2u);
  job.Apply(With(job.tasks()[2], Task::DONE));
  ASSERT_NE(job.Next(), nullptr);
  EXPECT_EQ(job.Next()->task_id(), 3u);  // epoch 0's evaluation
  EXPECT_EQ(job.Describe().current_epoch(), 0u);
  for (uint64_t id = 3; id < 10; ++id) job.Apply(With(job.tasks()[id], Task::DONE));
  EXPECT_TRUE(job.done());
  EXPECT_EQ(job.Describe().state(), JobInfo::FAILED);  // task 1
  EXPECT_EQ(job.Describe().tasks_done(), 9u);
}

// Describe's counts are kept by Apply (no walk over the tasks): they match a count made
// from the tasks at every step.
TEST(JobTest, CountsFollowEveryChange) {
  Job job = Create(Spec(2));
  const auto check = [&job] {
    JobInfo counted;
    uint64_t train = 0, eval = 0;
    for (const Task& t : job.tasks()) {
      if (t.state() == Task::TODO) counted.set_tasks_todo(counted.tasks_todo() + 1);
      if (t.state() == Task::DOING) counted.set_tasks_doing(counted.tasks_doing() + 1);
      if (t.state() == Task::DONE) {
        counted.set_tasks_done(counted.tasks_done() + 1);
        (t.kind() == Task::TRAIN ? train : eval) += t.records_done();
      }
      if (t.state() == Task::FAILED) counted.set_tasks_failed(counted.tasks_failed() + 1);
    }
    const JobInfo info = job.Describe();
    EXPECT_EQ(info.tasks_todo(), counted.tasks_todo());
    EXPECT_EQ(info.tasks_doing(), counted.tasks_doing());
    EXPECT_EQ(info.tasks_done(), counted.tasks_done());
    EXPECT_EQ(info.tasks_failed(), counted.tasks_failed());
    EXPECT_EQ(info.train_records_done(), train);
    EXPECT_EQ(info.eval_records_done(), eval);
    EXPECT_EQ(job.doing().size(), counted.tasks_doing());
    EXPECT_EQ(job.failed().size(), counted.tasks_failed());
  };
  check();
  EXPECT_EQ(job.Describe().train_records_total(), 20u);
  EXPECT_EQ(job.Describe().created_unix_ms(), 5);
  for (uint64_t id = 0; id < job.tasks().size(); ++id) {
    Task t = job.tasks()[id];
    job.Apply(With(t, Task::DOING));
    check();
    if (id == 4) {
      job.Apply(With(t, Task::TODO));  // re-queued, then done by another
      check();
    }
    t.set_records_done(t.end_record() - t.first_record());
    job.Apply(With(t, id == 7 ? Task::FAILED : Task::DONE));
    check();
    EXPECT_EQ(job.Describe().current_epoch(), id < 4 ? 0u : (id < 9 ? 1u : 2u)) << id;
  }
  const JobInfo info = job.Describe();
  EXPECT_EQ(info.train_records_done(), 20u - 2u);  // task 7: TRAIN [8,10) of epoch 1 failed
  EXPECT_EQ(info.eval_records_done(), 10u);
  EXPECT_EQ(info.state(), JobInfo::FAILED);
}

TEST(JobTest, AStoredJobIsRebuiltOrRefused) {
  Job created = Create(Spec(1));
  Job restored(created.record());
  for (const Task& t : created.tasks()) {
    ASSERT_TRUE(restored.Restore(t.task_id() == 0 ? With(t, Task::DONE) : t));
  }
  Task stray = created.tasks()[0];
  stray.set_task_id(99);
  EXPECT_FALSE(restored.Restore(stray));
  ASSERT_TRUE(restored.Rebuild().ok());
  ASSERT_NE(restored.Next(), nullptr);
  EXPECT_EQ(restored.Next()->task_id(), 1u);

  Job missing(created.record());
  ASSERT_TRUE(missing.Restore(created.tasks()[0]));
  EXPECT_EQ(missing.Rebuild().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace ps
