#include "master/job.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/base/status_macros.h"
#include "embedding/spec.h"

namespace ps {
namespace {

uint64_t TasksOf(const google::protobuf::RepeatedPtrField<DataFile>& files, uint64_t per_task) {
  uint64_t n = 0;
  for (const DataFile& f : files) n += (f.records() + per_task - 1) / per_task;
  return n;
}

absl::Status ValidateFiles(const google::protobuf::RepeatedPtrField<DataFile>& files,
                           absl::string_view what) {
  for (int i = 0; i < files.size(); ++i) {
    if (files[i].path().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " file ", i, " has an empty path"));
    }
  }
  return absl::OkStatus();
}

void AppendTasks(const CreateJobRequest& spec,
                 const google::protobuf::RepeatedPtrField<DataFile>& files, Task::Kind kind,
                 uint32_t epoch, std::vector<Task>* out) {
  for (const DataFile& f : files) {
    for (uint64_t first = 0; first < f.records(); first += spec.records_per_task()) {
      Task t;
      t.set_job(spec.name());
      t.set_task_id(out->size());
      t.set_file(f.path());
      t.set_first_record(first);
      t.set_end_record(std::min(f.records(), first + spec.records_per_task()));
      t.set_kind(kind);
      t.set_epoch(epoch);
      t.set_state(Task::TODO);
      out->push_back(std::move(t));
    }
  }
}

}  // namespace

absl::Status ValidateJobSpec(const CreateJobRequest& req, uint64_t max_tasks) {
  RETURN_IF_ERROR(ValidateName(req.name()));
  if (req.epochs() < 1 || req.records_per_task() < 1 || req.files_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", req.name(), " needs epochs >= 1 (got ", req.epochs(),
                     "), records_per_task >= 1 (got ", req.records_per_task(),
                     ") and at least one file (got ", req.files_size(), ")"));
  }
  RETURN_IF_ERROR(ValidateFiles(req.files(), "training"));
  RETURN_IF_ERROR(ValidateFiles(req.eval_files(), "evaluation"));
  const uint64_t per_epoch = TasksOf(req.files(), req.records_per_task()) +
                             TasksOf(req.eval_files(), req.records_per_task());
  if (per_epoch == 0 || per_epoch > max_tasks / req.epochs()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job ", req.name(), " would have ", per_epoch, " tasks per epoch over ", req.epochs(),
        " epochs; it must have between 1 and ", max_tasks, " tasks (raise records_per_task)"));
  }
  return absl::OkStatus();
}

Job Job::Create(const CreateJobRequest& spec) {
  JobRecord record;
  *record.mutable_spec() = spec;
  Job job(std::move(record));
  for (uint32_t e = 0; e < spec.epochs(); ++e) {
    AppendTasks(spec, spec.files(), Task::TRAIN, e, &job.tasks_);
    AppendTasks(spec, spec.eval_files(), Task::EVAL, e, &job.tasks_);
  }
  job.record_.set_num_tasks(job.tasks_.size());
  job.unfinished_per_phase_.assign(2 * spec.epochs(), 0);
  for (const Task& t : job.tasks_) {
    job.todo_.insert(t.task_id());
    ++job.unfinished_per_phase_[PhaseOf(t)];
  }
  job.unfinished_ = job.tasks_.size();
  return job;
}

Job::Job(JobRecord record) : record_(std::move(record)) { tasks_.resize(record_.num_tasks()); }

bool Job::Restore(Task task) {
  if (task.task_id() >= tasks_.size()) return false;
  const uint64_t id = task.task_id();
  tasks_[id] = std::move(task);
  return true;
}

absl::Status Job::Rebuild() {
  const std::string& name = record_.spec().name();
  todo_.clear();
  unfinished_per_phase_.assign(2 * record_.spec().epochs(), 0);
  unfinished_ = 0;
  for (uint64_t id = 0; id < tasks_.size(); ++id) {
    const Task& t = tasks_[id];
    if (t.job() != name || t.task_id() != id) {
      return absl::DataLossError(absl::StrCat("master store: job ", name, " is missing task ", id));
    }
    if (Finished(t)) continue;
    ++unfinished_;
    ++unfinished_per_phase_[PhaseOf(t)];
    if (t.state() == Task::TODO) todo_.insert(id);
  }
  return absl::OkStatus();
}

const Task* Job::Next() const {
  if (unfinished_ == 0 || todo_.empty()) return nullptr;
  uint32_t current_phase = 0;
  while (unfinished_per_phase_[current_phase] == 0) ++current_phase;
  const Task& next = tasks_[*todo_.begin()];
  return PhaseOf(next) > current_phase ? nullptr : &next;
}

void Job::Apply(const Task& t) {
  Task& old = tasks_.at(t.task_id());
  if (!Finished(old)) {
    --unfinished_;
    --unfinished_per_phase_[PhaseOf(old)];
  }
  if (old.state() == Task::TODO) todo_.erase(old.task_id());
  if (!Finished(t)) {
    ++unfinished_;
    ++unfinished_per_phase_[PhaseOf(t)];
  }
  if (t.state() == Task::TODO) todo_.insert(t.task_id());
  old = t;
}

JobInfo Job::Describe() const {
  const CreateJobRequest& spec = record_.spec();
  JobInfo info;
  info.set_name(spec.name());
  info.set_epochs(spec.epochs());
  info.set_records_per_task(spec.records_per_task());
  info.set_tasks_total(tasks_.size());
  uint64_t per_epoch = 0;
  for (const DataFile& f : spec.files()) per_epoch += f.records();
  info.set_train_records_total(per_epoch * spec.epochs());
  for (const Task& t : tasks_) {
    switch (t.state()) {
      case Task::TODO:
        info.set_tasks_todo(info.tasks_todo() + 1);
        break;
      case Task::DOING:
        info.set_tasks_doing(info.tasks_doing() + 1);
        break;
      case Task::DONE:
        info.set_tasks_done(info.tasks_done() + 1);
        if (t.kind() == Task::TRAIN) {
          info.set_train_records_done(info.train_records_done() + t.records_done());
        } else {
          info.set_eval_records_done(info.eval_records_done() + t.records_done());
        }
        break;
      default:
        info.set_tasks_failed(info.tasks_failed() + 1);
    }
  }
  uint32_t phase = 0;
  while (phase < unfinished_per_phase_.size() && unfinished_per_phase_[phase] == 0) ++phase;
  info.set_current_epoch(phase / 2);
  if (unfinished_ > 0) {
    info.set_state(JobInfo::RUNNING);
  } else {
    info.set_state(info.tasks_failed() > 0 ? JobInfo::FAILED : JobInfo::SUCCEEDED);
  }
  return info;
}

}  // namespace ps
