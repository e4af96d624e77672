// Job: one job's tasks, cut at creation, and the derived state that dispatches and
// describes them: the queue of TODO tasks, the unfinished tasks per phase, the tasks DOING
// and FAILED, and counts per state (rules in job_dispatcher.h). Phase of a task: 2 * epoch
// for training, 2 * epoch + 1 for evaluation.
//
// Every count is kept up to date by Apply, so Describe costs O(1) whatever the job's size.
//
// A value type, not thread-safe: its owner (JobDispatcher) guards it. It changes memory
// only; the owner writes a task to the store before Apply-ing it.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/master.pb.h"
#include "proto/master_state.pb.h"

namespace ps {

// Limits of a job, so that creating one takes bounded time and memory. The task count is
// bounded by MasterOptions.max_tasks_per_job.
inline constexpr int kMaxJobFiles = 100'000;      // in each list (training, evaluation)
inline constexpr size_t kMaxJobPathBytes = 4096;  // one file's path
// The paths of all tasks together (every task holds its file's path): 256 MiB.
inline constexpr uint64_t kMaxJobTaskPathBytes = uint64_t{256} << 20;

// What a valid CreateJob request makes, over all epochs.
struct JobShape {
  uint64_t tasks = 0;
  uint64_t train_records = 0;
  uint64_t eval_records = 0;
};

// The shape of the job `spec` defines, or INVALID_ARGUMENT naming what is wrong: its name,
// epochs, records_per_task, the files (count, paths), a task count outside [1, max_tasks],
// paths beyond kMaxJobTaskPathBytes, or record sums beyond 2^64 - 1. Every count and sum
// is computed without overflow, in O(files): nothing proportional to the records or the
// tasks is done or allocated.
absl::StatusOr<JobShape> ValidateJobSpec(const CreateJobRequest& spec, uint64_t max_tasks);

class Job {
 public:
  // A new job, created at `created_unix_ms`: per epoch, its training files in order cut
  // into ranges of records_per_task, then that epoch's evaluation files likewise; every
  // task TODO. ValidateJobSpec's error when `spec` is invalid (checked before anything is
  // allocated). O(tasks): call it without holding a lock other calls need.
  static absl::StatusOr<Job> Create(const CreateJobRequest& spec, uint64_t max_tasks,
                                    int64_t created_unix_ms);
  // A stored job: `record`, then each stored task through Restore, then Rebuild.
  explicit Job(JobRecord record) : Job(std::move(record), /*stored=*/true) {}
  // Puts back a stored task; false (nothing changed) when its id is out of the job's range.
  bool Restore(Task task);
  // Derives the queue, the sets and the counts from the tasks. DATA_LOSS when a task is
  // missing.
  absl::Status Rebuild();

  const JobRecord& record() const { return *record_; }
  // The record, shared: stays valid (unchanged) after the job changes or is gone.
  std::shared_ptr<const JobRecord> shared_record() const { return record_; }
  // Replaces the record (e.g. with its finish time set), once the caller stored it.
  void set_record(JobRecord record);
  const std::vector<Task>& tasks() const { return tasks_; }
  // Tasks not finished (neither DONE nor FAILED).
  uint64_t unfinished() const { return unfinished_; }
  // Every task finished.
  bool done() const { return unfinished_ == 0; }
  // The task to hand out next, or null when there is none now: all are held or finished,
  // or the next one waits for an earlier phase to finish.
  const Task* Next() const;
  // Replaces the task with `t`'s id by `t`, keeping the queue, sets and counts consistent.
  void Apply(const Task& t);
  // The job's state and counts. O(1).
  JobInfo Describe() const;
  // Ids of the tasks now DOING / FAILED, ascending.
  const std::set<uint64_t>& doing() const { return doing_; }
  const std::set<uint64_t>& failed() const { return failed_; }

  static bool Finished(const Task& t) {
    return t.state() == Task::DONE || t.state() == Task::FAILED;
  }
  static uint64_t PhaseOf(const Task& t) {
    return 2 * uint64_t{t.epoch()} + (t.kind() == Task::EVAL ? 1 : 0);
  }

 private:
  Job(JobRecord record, bool stored);
  // Adds (+1) or removes (-1) `t` from the sets and counts.
  void Count(const Task& t, int sign);

  std::shared_ptr<const JobRecord> record_;
  uint64_t train_records_total_ = 0;  // records of the training files over all epochs
  std::vector<Task> tasks_;           // index = task id
  std::set<uint64_t> todo_;           // ascending: phase order, re-queued tasks first
  std::set<uint64_t> doing_;
  std::set<uint64_t> failed_;
  std::vector<uint64_t> unfinished_per_phase_;
  uint64_t first_unfinished_phase_ = 0;  // phases below it have no unfinished task
  uint64_t unfinished_ = 0;
  uint64_t done_ = 0;
  uint64_t train_records_done_ = 0;
  uint64_t eval_records_done_ = 0;
};

}  // namespace ps
