#include "master/job.h"

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

TEST(JobTest, SpecsAreCheckedBeforeAnythingIsCut) {
  EXPECT_TRUE(ValidateJobSpec(Spec(2), 10).ok());
  EXPECT_EQ(ValidateJobSpec(Spec(3), 10).code(), absl::StatusCode::kInvalidArgument);  // 15
  CreateJobRequest bad = Spec(1);
  bad.mutable_eval_files(0)->clear_path();
  absl::Status s = ValidateJobSpec(bad, 10);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("evaluation file 0"), std::string::npos) << s;
  bad = Spec(1);
  bad.set_records_per_task(0);
  EXPECT_EQ(ValidateJobSpec(bad, 10).code(), absl::StatusCode::kInvalidArgument);
}

TEST(JobTest, TasksAreCutPerEpochAndHandedOutInPhases) {
  Job job = Job::Create(Spec(2));
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

TEST(JobTest, AStoredJobIsRebuiltOrRefused) {
  Job created = Job::Create(Spec(1));
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
