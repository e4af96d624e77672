#include "client/python/_core/worker.h"

#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/python/_core/errors.h"

namespace ps::py {
namespace {

// [(path, records)] -> DataFileSpecs; ValueError for anything else.
std::vector<DataFileSpec> FilesOf(const pyb::list& files, const char* what) {
  std::vector<DataFileSpec> out;
  out.reserve(files.size());
  for (const pyb::handle item : files) {
    auto pair = pyb::reinterpret_borrow<pyb::sequence>(item);
    if (!pyb::isinstance<pyb::sequence>(item) || pyb::len(pair) != 2) {
      ThrowValueError(absl::StrCat(what, " wants [(path, records), ...]"));
    }
    int64_t records = -1;
    try {
      records = pair[1].cast<int64_t>();
    } catch (const pyb::cast_error&) {
      ThrowValueError(absl::StrCat(what, ": a file's record count must be an integer"));
    }
    if (records < 0) {
      ThrowValueError(absl::StrCat(what, ": ", records, " records for a file"));
    }
    out.push_back(
        DataFileSpec{pyb::str(pair[0]).cast<std::string>(), static_cast<uint64_t>(records)});
  }
  return out;
}

pyb::dict TaskDict(const WorkerTask& t) {
  pyb::dict d;
  d["job"] = t.job;
  d["task_id"] = t.task_id;
  d["file"] = t.file;
  d["first_record"] = t.first_record;
  d["end_record"] = t.end_record;
  d["eval"] = t.eval;
  d["epoch"] = t.epoch;
  d["attempt"] = t.attempt;
  d["incarnation"] = t.incarnation;
  return d;
}

}  // namespace

Session::Session(const WorkerOptions& options) {
  absl::StatusOr<std::unique_ptr<WorkerSession>> s;
  {
    pyb::gil_scoped_release unlocked;
    s = WorkerSession::Start(options);
  }
  ThrowIfError(s.status());
  session_ = std::move(*s);
}

Session::~Session() {
  pyb::gil_scoped_release unlocked;
  session_.reset();  // Leave (if not done yet) and the heartbeat thread's end
}

uint64_t Session::CreateJob(const pyb::list& files, uint32_t epochs, uint64_t records_per_task,
                            const pyb::list& eval_files) {
  JobSpec job;
  job.files = FilesOf(files, "create_job: files");
  job.eval_files = FilesOf(eval_files, "create_job: eval_files");
  job.epochs = epochs;
  job.records_per_task = records_per_task;
  absl::StatusOr<uint64_t> n;
  {
    pyb::gil_scoped_release unlocked;
    n = session_->CreateJob(job);
  }
  ThrowIfError(n.status());
  return *n;
}

pyb::tuple Session::GetTask() {
  absl::StatusOr<TaskAnswer> answer;
  {
    pyb::gil_scoped_release unlocked;
    answer = session_->GetTask();
  }
  ThrowIfError(answer.status());
  switch (answer->state) {
    case TaskState::kTask:
      return pyb::make_tuple("task", TaskDict(answer->task));
    case TaskState::kDone:
      return pyb::make_tuple("done", pyb::none());
    default:  // GetTask never answers kStopped
      return pyb::make_tuple("wait", pyb::none());
  }
}

pyb::tuple Session::ReportTask(const std::string& job, uint64_t task_id, uint64_t first_record,
                               uint64_t end_record, uint64_t incarnation, bool ok, int64_t records,
                               const std::string& error, const pyb::dict& table_pushes) {
  WorkerTask task;
  task.job = job;
  task.task_id = task_id;
  task.first_record = first_record;
  task.end_record = end_record;
  task.incarnation = incarnation;
  TaskReport report;
  report.ok = ok;
  report.records = records;
  report.error = error;
  for (const auto& [table, n] : table_pushes) {
    const int64_t pushes = n.cast<int64_t>();
    if (pushes < 0) ThrowValueError(absl::StrCat("table_pushes: ", pushes, " pushes"));
    report.table_pushes[pyb::str(table).cast<std::string>()] = static_cast<uint64_t>(pushes);
  }
  absl::StatusOr<ReportOutcome> outcome;
  {
    pyb::gil_scoped_release unlocked;
    outcome = session_->ReportTask(task, report);
  }
  ThrowIfError(outcome.status());
  return pyb::make_tuple(outcome->job_done, outcome->duplicate, outcome->lost,
                         outcome->lost_reason);
}

uint32_t Session::Leave() {
  absl::StatusOr<uint32_t> requeued;
  {
    pyb::gil_scoped_release unlocked;
    requeued = session_->Leave();
  }
  ThrowIfError(requeued.status());
  return *requeued;
}

pyb::bytes Session::Status() {
  absl::StatusOr<StatusResponse> status;
  {
    pyb::gil_scoped_release unlocked;
    status = session_->Status();
  }
  ThrowIfError(status.status());
  return pyb::bytes(status->SerializeAsString());
}

void Session::AttachClient(const Client& client) {
  std::shared_ptr<PsClient> c = client.shared();
  absl::Status s;
  {
    pyb::gil_scoped_release unlocked;
    s = session_->AttachClient(std::move(c));
  }
  ThrowIfError(s);
}

void BindWorker(pyb::module_& m) {
  pyb::class_<WorkerOptions>(m, "WorkerOptions", "client/worker_session.h WorkerOptions")
      .def(pyb::init<>())
      .def_readwrite("master", &WorkerOptions::master)
      .def_readwrite("job", &WorkerOptions::job)
      .def_readwrite("worker_id", &WorkerOptions::worker_id)
      .def_readwrite("heartbeat", &WorkerOptions::heartbeat)
      .def_readwrite("poll_interval_ms", &WorkerOptions::poll_interval_ms)
      .def_readwrite("client", &WorkerOptions::client);

  pyb::class_<Session>(m, "WorkerSession",
                       "The C++ WorkerSession (see client/python/_core/worker.h).")
      .def(pyb::init<const WorkerOptions&>(), pyb::arg("options"))
      .def_property_readonly("worker_id", &Session::worker_id)
      .def_property_readonly("incarnation", &Session::incarnation)
      .def_property_readonly("lease_ms", &Session::lease_ms)
      .def_property_readonly("reregistrations", &Session::reregistrations)
      .def_property_readonly("superseded", &Session::superseded)
      .def_property_readonly("stopping", &Session::stopping)
      .def("request_stop", &Session::RequestStop)
      .def("create_job", &Session::CreateJob, pyb::arg("files"), pyb::arg("epochs"),
           pyb::arg("records_per_task"), pyb::arg("eval_files"))
      .def("get_task", &Session::GetTask)
      .def("report_task", &Session::ReportTask, pyb::arg("job"), pyb::arg("task_id"),
           pyb::arg("first_record"), pyb::arg("end_record"), pyb::arg("incarnation"),
           pyb::arg("ok"), pyb::arg("records"), pyb::arg("error"), pyb::arg("table_pushes"))
      .def("leave", &Session::Leave)
      .def("status", &Session::Status)
      .def("attach_client", &Session::AttachClient, pyb::arg("client"))
      .def("pause_heartbeats_for_test", &Session::PauseHeartbeatsForTest, pyb::arg("ms"));
}

}  // namespace ps::py
