#include "master/job.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/base/status_macros.h"
#include "embedding/spec.h"

namespace ps {
namespace {

using Files = google::protobuf::RepeatedPtrField<DataFile>;

// A request's text in an error message: at most 64 characters of it.
std::string Shown(absl::string_view s) {
  return s.size() <= 64 ? std::string(s) : absl::StrCat(s.substr(0, 64), "...");
}

// Per epoch, one list of files: tasks, records and the bytes of the tasks' paths.
struct ListSums {
  uint64_t tasks = 0;
  uint64_t records = 0;
  uint64_t path_bytes = 0;
};

// Sums `files` (the list named `what`) for records_per_task `per_task` >= 1. Fails as soon
// as the tasks exceed `max_tasks` or the records 2^64 - 1, so nothing here can overflow.
absl::StatusOr<ListSums> SumFiles(const CreateJobRequest& req, const Files& files,
                                  absl::string_view what, uint64_t max_tasks) {
  if (files.size() > kMaxJobFiles) {
    return absl::InvalidArgumentError(absl::StrCat("job ", req.name(), " has ", files.size(), " ",
                                                   what, " files; at most ", kMaxJobFiles));
  }
  const uint64_t per_task = req.records_per_task();
  ListSums sums;
  for (int i = 0; i < files.size(); ++i) {
    const DataFile& f = files[i];
    if (f.path().empty() || f.path().size() > kMaxJobPathBytes) {
      return absl::InvalidArgumentError(absl::StrCat("job ", req.name(), ": ", what, " file ", i,
                                                     " has a path of ", f.path().size(),
                                                     " bytes; it must have 1..", kMaxJobPathBytes));
    }
    const uint64_t tasks = f.records() / per_task + (f.records() % per_task != 0 ? 1 : 0);
    uint64_t path_bytes = 0;
    if (__builtin_add_overflow(sums.tasks, tasks, &sums.tasks) || sums.tasks > max_tasks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job ", req.name(), " would have more than ", max_tasks, " tasks (the limit) in its ",
          what, " files of one epoch (at ", what, " file ", i, " '", Shown(f.path()), "' of ",
          f.records(), " records, ", per_task, " per task); raise records_per_task"));
    }
    if (__builtin_add_overflow(sums.records, f.records(), &sums.records)) {
      return absl::InvalidArgumentError(absl::StrCat("job ", req.name(), ": the records of its ",
                                                     what, " files add up beyond 2^64 - 1 (at ",
                                                     what, " file ", i, ")"));
    }
    // tasks <= max_tasks; an overflow of the product is beyond any limit too.
    if (__builtin_mul_overflow(tasks, f.path().size(), &path_bytes) ||
        __builtin_add_overflow(sums.path_bytes, path_bytes, &sums.path_bytes)) {
      sums.path_bytes = UINT64_MAX;
    }
  }
  return sums;
}

void AppendTasks(const CreateJobRequest& spec, const Files& files, Task::Kind kind, uint32_t epoch,
                 std::vector<Task>* out) {
  const uint64_t per_task = spec.records_per_task();
  for (const DataFile& f : files) {
    // first < records, so records - first never wraps and every step makes progress.
    for (uint64_t first = 0; first < f.records();) {
      const uint64_t n = std::min(f.records() - first, per_task);
      Task t;
      t.set_job(spec.name());
      t.set_task_id(out->size());
      t.set_file(f.path());
      t.set_first_record(first);
      t.set_end_record(first + n);
      t.set_kind(kind);
      t.set_epoch(epoch);
      t.set_state(Task::TODO);
      out->push_back(std::move(t));
      first += n;
    }
  }
}

// Records of `files` times `epochs`, saturating (a stored job was validated when created).
uint64_t RecordsOver(const Files& files, uint32_t epochs) {
  uint64_t sum = 0, total = 0;
  for (const DataFile& f : files) {
    if (__builtin_add_overflow(sum, f.records(), &sum)) return UINT64_MAX;
  }
  return __builtin_mul_overflow(sum, uint64_t{epochs}, &total) ? UINT64_MAX : total;
}

}  // namespace

absl::StatusOr<JobShape> ValidateJobSpec(const CreateJobRequest& req, uint64_t max_tasks) {
  RETURN_IF_ERROR(ValidateName(req.name()));
  if (req.epochs() < 1 || req.records_per_task() < 1 || req.files_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", req.name(), " needs epochs >= 1 (got ", req.epochs(),
                     "), records_per_task >= 1 (got ", req.records_per_task(),
                     ") and at least one file (got ", req.files_size(), ")"));
  }
  ASSIGN_OR_RETURN(const ListSums train, SumFiles(req, req.files(), "training", max_tasks));
  ASSIGN_OR_RETURN(const ListSums eval, SumFiles(req, req.eval_files(), "evaluation", max_tasks));
  const uint64_t epochs = req.epochs();
  JobShape shape;
  uint64_t per_epoch = 0;
  if (__builtin_add_overflow(train.tasks, eval.tasks, &per_epoch) ||
      __builtin_mul_overflow(per_epoch, epochs, &shape.tasks) || per_epoch == 0 ||
      shape.tasks > max_tasks) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", req.name(), " would have ", train.tasks, " + ", eval.tasks,
                     " tasks per epoch over ", epochs, " epochs; it must have between 1 and ",
                     max_tasks, " tasks (the limit; raise records_per_task)"));
  }
  uint64_t path_bytes = 0;
  if (__builtin_add_overflow(train.path_bytes, eval.path_bytes, &path_bytes) ||
      __builtin_mul_overflow(path_bytes, epochs, &path_bytes) ||
      path_bytes > kMaxJobTaskPathBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", req.name(), ": its ", shape.tasks, " tasks would hold more than ",
                     kMaxJobTaskPathBytes,
                     " bytes of paths (each task names its file); use shorter paths "
                     "or raise records_per_task"));
  }
  if (__builtin_mul_overflow(train.records, epochs, &shape.train_records) ||
      __builtin_mul_overflow(eval.records, epochs, &shape.eval_records)) {
    return absl::InvalidArgumentError(absl::StrCat("job ", req.name(), ": its records over ",
                                                   epochs, " epochs add up beyond 2^64 - 1"));
  }
  return shape;
}

absl::StatusOr<Job> Job::Create(const CreateJobRequest& spec, uint64_t max_tasks,
                                int64_t created_unix_ms) {
  ASSIGN_OR_RETURN(const JobShape shape, ValidateJobSpec(spec, max_tasks));
  JobRecord record;
  *record.mutable_spec() = spec;
  record.set_num_tasks(shape.tasks);
  record.set_created_unix_ms(created_unix_ms);
  Job job(std::move(record), /*stored=*/false);
  job.tasks_.reserve(shape.tasks);
  for (uint32_t e = 0; e < spec.epochs(); ++e) {
    AppendTasks(spec, spec.files(), Task::TRAIN, e, &job.tasks_);
    AppendTasks(spec, spec.eval_files(), Task::EVAL, e, &job.tasks_);
  }
  RETURN_IF_ERROR(job.Rebuild());
  return job;
}

Job::Job(JobRecord record, bool stored)
    : record_(std::make_shared<const JobRecord>(std::move(record))),
      train_records_total_(RecordsOver(record_->spec().files(), record_->spec().epochs())) {
  if (stored) tasks_.resize(record_->num_tasks());  // filled by Restore
}

void Job::set_record(JobRecord record) {
  record_ = std::make_shared<const JobRecord>(std::move(record));
}

bool Job::Restore(Task task) {
  if (task.task_id() >= tasks_.size()) return false;
  const uint64_t id = task.task_id();
  tasks_[id] = std::move(task);
  return true;
}

void Job::Count(const Task& t, int sign) {
  const uint64_t id = t.task_id();
  const auto add = [sign](uint64_t* n, uint64_t by) { *n = sign > 0 ? *n + by : *n - by; };
  switch (t.state()) {
    case Task::TODO:
      sign > 0 ? (void)todo_.insert(id) : (void)todo_.erase(id);
      break;
    case Task::DOING:
      sign > 0 ? (void)doing_.insert(id) : (void)doing_.erase(id);
      break;
    case Task::DONE:
      add(&done_, 1);
      add(t.kind() == Task::TRAIN ? &train_records_done_ : &eval_records_done_, t.records_done());
      break;
    default:
      sign > 0 ? (void)failed_.insert(id) : (void)failed_.erase(id);
  }
  if (Finished(t)) return;
  const uint64_t phase = PhaseOf(t);
  add(&unfinished_, 1);
  add(&unfinished_per_phase_[phase], 1);
  if (sign > 0) {
    first_unfinished_phase_ = std::min(first_unfinished_phase_, phase);
  } else {
    while (first_unfinished_phase_ < unfinished_per_phase_.size() &&
           unfinished_per_phase_[first_unfinished_phase_] == 0) {
      ++first_unfinished_phase_;
    }
  }
}

absl::Status Job::Rebuild() {
  const std::string& name = record_->spec().name();
  todo_.clear();
  doing_.clear();
  failed_.clear();
  unfinished_per_phase_.assign(2 * uint64_t{record_->spec().epochs()}, 0);
  first_unfinished_phase_ = unfinished_per_phase_.size();
  unfinished_ = done_ = train_records_done_ = eval_records_done_ = 0;
  for (uint64_t id = 0; id < tasks_.size(); ++id) {
    const Task& t = tasks_[id];
    if (t.job() != name || t.task_id() != id || PhaseOf(t) >= unfinished_per_phase_.size()) {
      return absl::DataLossError(absl::StrCat("master store: job ", name, " is missing task ", id,
                                              " (or it names another job or epoch)"));
    }
    Count(t, +1);
  }
  return absl::OkStatus();
}

const Task* Job::Next() const {
  if (unfinished_ == 0 || todo_.empty()) return nullptr;
  const Task& next = tasks_[*todo_.begin()];
  return PhaseOf(next) > first_unfinished_phase_ ? nullptr : &next;
}

void Job::Apply(const Task& t) {
  Task& old = tasks_.at(t.task_id());
  Count(old, -1);
  old = t;
  Count(old, +1);
}

JobInfo Job::Describe() const {
  const CreateJobRequest& spec = record_->spec();
  JobInfo info;
  info.set_name(spec.name());
  info.set_epochs(spec.epochs());
  info.set_records_per_task(spec.records_per_task());
  info.set_tasks_total(tasks_.size());
  info.set_tasks_todo(todo_.size());
  info.set_tasks_doing(doing_.size());
  info.set_tasks_done(done_);
  info.set_tasks_failed(failed_.size());
  info.set_train_records_total(train_records_total_);
  info.set_train_records_done(train_records_done_);
  info.set_eval_records_done(eval_records_done_);
  info.set_current_epoch(static_cast<uint32_t>(first_unfinished_phase_ / 2));
  info.set_created_unix_ms(record_->created_unix_ms());
  info.set_finished_unix_ms(record_->finished_unix_ms());
  if (unfinished_ > 0) {
    info.set_state(JobInfo::RUNNING);
  } else {
    info.set_state(failed_.empty() ? JobInfo::SUCCEEDED : JobInfo::FAILED);
  }
  return info;
}

}  // namespace ps
