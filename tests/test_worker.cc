// A minimal worker process for integration tests: registers with the master, takes one task
// of JOB, prints it, and then only heartbeats (never reports), until it is killed.
// Usage: test_worker MASTER_HOST:PORT JOB
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "proto/master.grpc.pb.h"

namespace {

template <typename Req, typename Resp>
bool Call(ps::Master::Stub* stub,
          grpc::Status (ps::Master::Stub::*rpc)(grpc::ClientContext*, const Req&, Resp*),
          const Req& req, Resp* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Status s = (stub->*rpc)(&ctx, req, resp);
  if (!s.ok()) std::fprintf(stderr, "call failed: %s\n", s.error_message().c_str());
  return s.ok();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: test_worker MASTER_HOST:PORT JOB\n");
    return 2;
  }
  auto stub = ps::Master::NewStub(grpc::CreateChannel(argv[1], grpc::InsecureChannelCredentials()));
  ps::RegisterWorkerResponse me;
  if (!Call(stub.get(), &ps::Master::Stub::RegisterWorker, ps::RegisterWorkerRequest(), &me)) {
    return 1;
  }
  ps::GetTaskRequest get;
  get.set_worker_id(me.worker_id());
  get.set_incarnation(me.incarnation());
  get.set_job(argv[2]);
  ps::GetTaskResponse task;
  while (true) {
    if (!Call(stub.get(), &ps::Master::Stub::GetTask, get, &task)) return 1;
    if (task.result() == ps::GetTaskResponse::TASK) break;
    if (task.result() == ps::GetTaskResponse::DONE) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::printf("worker %lu task %lu\n", static_cast<unsigned long>(me.worker_id()),
              static_cast<unsigned long>(task.task().task_id()));
  std::fflush(stdout);
  ps::WorkerHeartbeatRequest hb;
  hb.set_worker_id(me.worker_id());
  hb.set_incarnation(me.incarnation());
  while (true) {  // "working" on the task: alive, never done
    ps::WorkerHeartbeatResponse ignored;
    Call(stub.get(), &ps::Master::Stub::WorkerHeartbeat, hb, &ignored);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}
