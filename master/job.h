// Job: one job's tasks, cut at creation, and the derived state that dispatches them: the
// queue of TODO tasks and the unfinished tasks per phase (rules in job_dispatcher.h).
// Phase of a task: 2 * epoch for training, 2 * epoch + 1 for evaluation.
//
// A value type, not thread-safe: its owner (JobDispatcher) guards it. It changes memory only;
// the owner writes a task to the store before Apply-ing it.
#pragma once

#include <cstdint>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "proto/master.pb.h"
#include "proto/master_state.pb.h"

namespace ps {

// OK, or INVALID_ARGUMENT naming what is wrong with a CreateJob request: its name, epochs,
// records_per_task, files, or a task count outside [1, max_tasks].
absl::Status ValidateJobSpec(const CreateJobRequest& spec, uint64_t max_tasks);

class Job {
 public:
  // A new job from a validated spec: per epoch, its training files in order cut into ranges
  // of records_per_task, then that epoch's evaluation files likewise; every task TODO.
  static Job Create(const CreateJobRequest& spec);
  // A stored job: `record`, then each stored task through Restore, then Rebuild.
  explicit Job(JobRecord record);
  // Puts back a stored task; false (nothing changed) when its id is out of the job's range.
  bool Restore(Task task);
  // Derives the queue and the phase counts from the tasks. DATA_LOSS when a task is missing.
  absl::Status Rebuild();

  const JobRecord& record() const { return record_; }
  const std::vector<Task>& tasks() const { return tasks_; }
  // Every task finished (DONE or FAILED).
  bool done() const { return unfinished_ == 0; }
  // The task to hand out next, or null when there is none now: all are held or finished,
  // or the next one waits for an earlier phase to finish.
  const Task* Next() const;
  // Replaces the task with `t`'s id by `t`, keeping the queue and counts consistent.
  void Apply(const Task& t);
  JobInfo Describe() const;

  static bool Finished(const Task& t) {
    return t.state() == Task::DONE || t.state() == Task::FAILED;
  }
  static uint32_t PhaseOf(const Task& t) {
    return 2 * t.epoch() + (t.kind() == Task::EVAL ? 1 : 0);
  }

 private:
  JobRecord record_;
  std::vector<Task> tasks_;  // index = task id
  std::set<uint64_t> todo_;  // ascending: phase order, re-queued tasks first
  std::vector<uint64_t> unfinished_per_phase_;
  uint64_t unfinished_ = 0;
};

}  // namespace ps
