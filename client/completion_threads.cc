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
  // A unary Finish (and an alarm, never cancelled) always completes with ok; the status
  // says how the call ended.
  LOG_IF(DFATAL, !ok) << "a call completed without a status";
  std::function<void(grpc::Status)> done = std::move(call->done);
  const grpc::Status status =
      ok ? call->status : grpc::Status(grpc::StatusCode::INTERNAL, "no status");
  // The reader lives in its call's arena, which its ClientContext frees: destroy it
  // before `done`, which may destroy the context (a retry makes a new one).
  call.reset();
  done(status);
}

void CompletionThreads::Run(std::function<void()> fn, grpc::CompletionQueue* queue) {
  auto call = std::make_unique<AlarmCall>();
  call->done = [fn = std::move(fn)](const grpc::Status&) { fn(); };
  AlarmCall* tag = call.get();
  tag->alarm.Set(queue != nullptr ? queue : NextQueue(), gpr_now(GPR_CLOCK_MONOTONIC),
                 static_cast<Call*>(tag));
  call.release();  // the queue's until Poll takes the tag back
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
