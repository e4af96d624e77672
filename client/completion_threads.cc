#include "client/completion_threads.h"

#include <glog/logging.h>

#include <algorithm>

namespace ps {

CompletionThreads::CompletionThreads(int threads) {
  for (int t = 0; t < std::max(1, threads); ++t) {
    queues_.push_back(std::make_unique<grpc::CompletionQueue>());
  }
  for (auto& q : queues_) threads_.emplace_back([this, q = q.get()] { Poll(q); });
}

CompletionThreads::~CompletionThreads() {
  for (auto& q : queues_) q->Shutdown();
  for (std::thread& t : threads_) t.join();
}

namespace {
thread_local bool on_completion_thread = false;
}  // namespace

bool CompletionThreads::OnCompletionThread() { return on_completion_thread; }

void CompletionThreads::Dispatch(void* tag, bool ok) {
  std::unique_ptr<Call> call(static_cast<Call*>(tag));
  // A unary Finish always completes with ok; its status says how the call ended.
  LOG_IF(DFATAL, !ok) << "a unary call completed without a status";
  call->done(ok ? call->status : grpc::Status(grpc::StatusCode::INTERNAL, "no status"));
}

void CompletionThreads::Poll(grpc::CompletionQueue* queue) {
  on_completion_thread = true;
  void* tag;
  bool ok;
  while (queue->Next(&tag, &ok)) Dispatch(tag, ok);
}

void CompletionThreads::Drain(grpc::CompletionQueue* queue, const std::function<bool()>& done) {
  void* tag;
  bool ok;
  while (!done() && queue->Next(&tag, &ok)) Dispatch(tag, ok);
}

}  // namespace ps
