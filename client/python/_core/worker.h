// elastic_ps._core.WorkerSession: the C++ worker protocol (client/worker_session.h) for
// Python. elastic_ps.Worker wraps it (Task objects, master_pb2 messages, TaskLostError,
// SIGTERM); registration, heartbeats, re-registration after a lost lease, the master
// calls' retries and the push identity of the session's client are the C++ library's.
//
// Every method is called with the GIL held and releases it for anything that may block (a
// master call, Leave, the destructor's Leave). Errors raise elastic_ps.errors.PsError.
// Thread-safe, as WorkerSession: Python threads may share a session.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "client/python/_core/client.h"
#include "client/worker_session.h"

namespace ps::py {

namespace pyb = pybind11;

class Session {
 public:
  // Registers (WorkerSession::Start, the GIL released); raises PsError.
  explicit Session(const WorkerOptions& options);
  // Leaves (if not done yet) with the GIL released.
  ~Session();

  uint64_t worker_id() const { return session_->worker_id(); }
  uint64_t incarnation() const { return session_->incarnation(); }
  int64_t lease_ms() const { return session_->lease_ms(); }
  uint64_t reregistrations() const { return session_->reregistrations(); }
  bool superseded() const { return session_->superseded(); }
  bool stopping() const { return session_->stopping(); }
  void RequestStop() { session_->RequestStop(); }

  // files / eval_files: [(path, records)]. Returns the job's task count.
  uint64_t CreateJob(const pyb::list& files, uint32_t epochs, uint64_t records_per_task,
                     const pyb::list& eval_files);
  // ("task", task) / ("wait", None) / ("done", None); task is a dict of WorkerTask's
  // fields (eval as a bool).
  pyb::tuple GetTask();
  // (job_done, duplicate, lost, lost_reason). The task is given by the fields its report
  // needs; records < 0: the task's count.
  pyb::tuple ReportTask(const std::string& job, uint64_t task_id, uint64_t first_record,
                        uint64_t end_record, uint64_t incarnation, bool ok, int64_t records,
                        const std::string& error, const pyb::dict& table_pushes);
  // The number of tasks re-queued (idempotent: the first call's result).
  uint32_t Leave();
  // The master's StatusResponse, serialized.
  pyb::bytes Status();
  // Makes `client`'s C++ PsClient the session's: its pushes carry the session's identity,
  // now and after every re-registration.
  void AttachClient(const Client& client);
  void PauseHeartbeatsForTest(int ms) { session_->PauseHeartbeatsForTest(ms); }

 private:
  std::unique_ptr<WorkerSession> session_;  // never null
};

// Registers WorkerOptions and WorkerSession in `m`.
void BindWorker(pyb::module_& m);

}  // namespace ps::py
