// A C++ worker process for integration tests, on the client library's worker protocol
// (client/worker_session.h). Two modes:
//
//   test_worker MASTER_HOST:PORT JOB
//     registers with the master, takes one task of JOB, prints it, and then only
//     heartbeats (never reports), until it is killed.
//
//   test_worker train --master=HOST:PORT --job=JOB --journal=FILE --num_vshards=V
//                     [--worker_id=N] [--record_pause_ms=MS]
//     ps-chaos's worker: trains JOB to the end. For each record of each task it pushes the
//     gradients tests/chaos_workload.h derives from (record, epoch), one push per record,
//     and reports the task; every step goes to the journal FILE first
//     (tests/chaos_journal.h), so the checker knows what was acknowledged even of a worker
//     killed mid-task. --worker_id registers as a new incarnation of that id (a restarted
//     worker: the master re-queues what the old one held at once). Errors (a master or pod
//     down) are retried until they pass; exit 0 when the job is done, 3 when superseded.
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "client/worker_session.h"
#include "tests/chaos_journal.h"
#include "tests/chaos_workload.h"

namespace {

void Sleep(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

int Fail(const std::string& what) {
  std::fprintf(stderr, "test_worker: %s\n", what.c_str());
  return 1;
}

// --key=value arguments after the mode; false on anything else.
bool ParseFlags(int argc, char** argv, std::map<std::string, std::string>* flags) {
  for (int i = 2; i < argc; ++i) {
    absl::string_view a = argv[i];
    if (!absl::ConsumePrefix(&a, "--")) return false;
    const size_t eq = a.find('=');
    if (eq == absl::string_view::npos) return false;
    (*flags)[std::string(a.substr(0, eq))] = std::string(a.substr(eq + 1));
  }
  return true;
}

// Holds one task: pushes its records, then reports it. False when the session is
// superseded (another process took this worker id).
bool Train(ps::WorkerSession& session, ps::PsClient& client, ps::chaos::JournalWriter& journal,
           const ps::chaos::Workload& workload, const ps::WorkerTask& task, int pause_ms) {
  const std::string id = absl::StrCat(task.task_id, " ", task.attempt);
  journal
      .Append(absl::StrCat("T ", id, " ", task.epoch, " ", task.first_record, " ", task.end_record))
      .IgnoreError();
  uint64_t pushes = 0;
  for (uint64_t r = task.first_record; r < task.end_record; ++r) {
    std::vector<int64_t> ids;
    std::vector<float> grads;
    for (const ps::chaos::Part& p : workload.Record(r, task.epoch)) {
      ids.insert(ids.end(), p.ids.begin(), p.ids.end());
      grads.insert(grads.end(), p.grads.begin(), p.grads.end());
    }
    const std::string rec = absl::StrCat(id, " ", task.epoch, " ", r);
    for (;;) {
      if (session.superseded()) return false;
      journal.Append("P " + rec).IgnoreError();
      const absl::Status s = client.Push({{ps::chaos::kTable, ids, grads.data()}});
      if (s.ok()) {
        journal.Append("A " + rec).IgnoreError();
        break;
      }
      // The parts may have been applied: the journal says so, and this record is pushed
      // again (a new call, a new key).
      journal.Append("F " + rec).IgnoreError();
      std::fprintf(stderr, "push of record %lu failed (retrying): %s\n",
                   static_cast<unsigned long>(r), s.ToString().c_str());
      Sleep(200);
    }
    ++pushes;
    if (pause_ms > 0) Sleep(pause_ms);
  }
  ps::TaskReport report;
  report.table_pushes[ps::chaos::kTable] = pushes;
  for (;;) {
    auto outcome = session.ReportTask(task, report);
    if (outcome.ok()) {
      const char* what = outcome->lost ? "lost" : outcome->duplicate ? "duplicate" : "ok";
      journal.Append(absl::StrCat("R ", id, " ", what)).IgnoreError();
      return true;
    }
    if (session.superseded()) return false;
    std::fprintf(stderr, "report of task %lu failed (retrying): %s\n",
                 static_cast<unsigned long>(task.task_id), outcome.status().ToString().c_str());
    Sleep(200);
  }
}

int TrainMain(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  uint64_t worker_id = 0;
  uint32_t num_vshards = 0;
  int pause_ms = 0;
  if (!ParseFlags(argc, argv, &flags) || flags["master"].empty() || flags["job"].empty() ||
      flags["journal"].empty() || !absl::SimpleAtoi(flags["num_vshards"], &num_vshards) ||
      (flags.count("worker_id") && !absl::SimpleAtoi(flags["worker_id"], &worker_id)) ||
      (flags.count("record_pause_ms") && !absl::SimpleAtoi(flags["record_pause_ms"], &pause_ms))) {
    return Fail(
        "usage: test_worker train --master=HOST:PORT --job=JOB --journal=FILE --num_vshards=V "
        "[--worker_id=N] [--record_pause_ms=MS]");
  }
  auto journal = ps::chaos::JournalWriter::Open(flags["journal"]);
  if (!journal.ok()) return Fail(journal.status().ToString());
  const ps::chaos::Workload workload(num_vshards);
  ps::WorkerOptions options;
  options.master = flags["master"];
  options.job = flags["job"];
  options.worker_id = worker_id;
  options.poll_interval_ms = 50;
  std::unique_ptr<ps::WorkerSession> session;
  std::shared_ptr<ps::PsClient> client;
  for (;;) {  // the master (or a pod, for Connect) may be down right now
    if (session == nullptr) {
      auto s = ps::WorkerSession::Start(options);
      if (s.ok()) {
        session = *std::move(s);
        std::printf("worker %lu incarnation %lu\n",
                    static_cast<unsigned long>(session->worker_id()),
                    static_cast<unsigned long>(session->incarnation()));
        std::fflush(stdout);
      } else {
        std::fprintf(stderr, "cannot register (retrying): %s\n", s.status().ToString().c_str());
      }
    }
    if (session != nullptr) {
      auto c = session->Client();
      if (c.ok()) {
        client = *std::move(c);
        break;
      }
      std::fprintf(stderr, "cannot connect to the pods (retrying): %s\n",
                   c.status().ToString().c_str());
    }
    Sleep(200);
  }
  for (;;) {
    auto next = session->NextTask();
    if (!next.ok()) {
      if (session->superseded()) return 3;
      std::fprintf(stderr, "GetTask failed (retrying): %s\n", next.status().ToString().c_str());
      Sleep(200);
      continue;
    }
    if (next->state == ps::TaskState::kDone) break;
    if (next->state != ps::TaskState::kTask) continue;
    if (!Train(*session, *client, *journal, workload, next->task, pause_ms)) return 3;
  }
  session->Leave().IgnoreError();
  std::printf("job done\n");
  return 0;
}

int HoldMain(int argc, char** argv) {
  if (argc != 3) return Fail("usage: test_worker MASTER_HOST:PORT JOB (or: test_worker train ...)");
  ps::WorkerOptions options;
  options.master = argv[1];
  options.job = argv[2];
  options.poll_interval_ms = 20;
  auto session = ps::WorkerSession::Start(options);
  if (!session.ok()) return Fail("cannot register: " + session.status().ToString());
  auto next = (*session)->NextTask();
  if (!next.ok()) return Fail("GetTask failed: " + next.status().ToString());
  if (next->state != ps::TaskState::kTask) return 0;
  std::printf("worker %lu task %lu\n", static_cast<unsigned long>((*session)->worker_id()),
              static_cast<unsigned long>(next->task.task_id));
  std::fflush(stdout);
  for (;;) {  // "working" on the task: alive (the session heartbeats), never done
    std::this_thread::sleep_for(std::chrono::hours(1));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "train") return TrainMain(argc, argv);
  return HoldMain(argc, argv);
}
