// A minimal C++ worker process for integration tests, on the client library's worker
// protocol (client/worker_session.h): registers with the master, takes one task of JOB,
// prints it, and then only heartbeats (never reports), until it is killed.
// Usage: test_worker MASTER_HOST:PORT JOB
#include <chrono>
#include <cstdio>
#include <thread>

#include "client/worker_session.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: test_worker MASTER_HOST:PORT JOB\n");
    return 2;
  }
  ps::WorkerOptions options;
  options.master = argv[1];
  options.job = argv[2];
  options.poll_interval_ms = 20;
  auto session = ps::WorkerSession::Start(options);
  if (!session.ok()) {
    std::fprintf(stderr, "cannot register: %s\n", session.status().ToString().c_str());
    return 1;
  }
  auto next = (*session)->NextTask();
  if (!next.ok()) {
    std::fprintf(stderr, "GetTask failed: %s\n", next.status().ToString().c_str());
    return 1;
  }
  if (next->state != ps::TaskState::kTask) return 0;
  std::printf("worker %lu task %lu\n", static_cast<unsigned long>((*session)->worker_id()),
              static_cast<unsigned long>(next->task.task_id));
  std::fflush(stdout);
  for (;;) {  // "working" on the task: alive (the session heartbeats), never done
    std::this_thread::sleep_for(std::chrono::hours(1));
  }
}
