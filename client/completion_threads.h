// Threads that receive the answers of the client's calls to the pods and run their
// completions.
//
// Each thread polls its own gRPC completion queue. A call started on a queue is answered
// on that queue's thread, which reads the pod's answer from the socket and runs the
// call's callback itself: no other thread is woken to run it. (gRPC's callback API hands
// each completion from the thread that polled it to another; on loopback that costs ~2.5
// context switches and ~40 us of CPU per call, about a third of the client's work on a
// 1024-row pull: docs/benchmarks.md.) Calls are spread over the queues round-robin.
#pragma once

#include <grpcpp/alarm.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace ps {

class CompletionThreads {
 public:
  // `threads` >= 1 queues, each with its thread.
  explicit CompletionThreads(int threads);
  // Runs fn on one of the threads, soon (an alarm due now on its queue); or, with
  // `queue` set, on the thread that drains that queue (see Start).
  void Run(std::function<void()> fn, grpc::CompletionQueue* queue = nullptr);

  // Runs the callbacks of calls started on `queue` (see Start) on this thread, until
  // done() is true after one of them.
  static void Drain(grpc::CompletionQueue* queue, const std::function<bool()>& done);

  // True on one of any CompletionThreads' threads (where Handle::Wait must not block).
  static bool OnCompletionThread();

  // Shuts the queues down and joins the threads. Every call started must have completed
  // (its callback returned or running to its end): the owner waits for that first.
  ~CompletionThreads();
  CompletionThreads(const CompletionThreads&) = delete;
  CompletionThreads& operator=(const CompletionThreads&) = delete;

  // Starts the unary call that prepare(queue) returns, not yet started: a stub's
  // PrepareAsyncX(ctx, request, queue), or GenericStub::PrepareUnaryCall for raw
  // messages. The call's context, request and `response` must stay valid until
  // done(status) runs, on the queue's thread, once the call has finished (`response`
  // then holds the answer if status is OK). done must not block: it holds up every call
  // answered on its thread.
  //
  // With `queue` set, the call runs on that queue instead, which its owner drains with
  // Drain: a blocking call then depends on no completion thread, so it may be made from
  // one (a Then callback that refreshes the table catalog, say).
  template <typename Resp, typename Prepare>
  void Start(Prepare prepare, Resp* response, std::function<void(grpc::Status)> done,
             grpc::CompletionQueue* queue = nullptr) {
    auto call = std::make_unique<TypedCall<Resp>>();
    call->done = std::move(done);
    call->reader = prepare(queue != nullptr ? queue : NextQueue());
    call->reader->StartCall();
    TypedCall<Resp>* tag = call.get();
    tag->reader->Finish(response, &tag->status, static_cast<Call*>(tag));
    call.release();  // the queue's until Poll takes the tag back
  }

 private:
  // One call in flight: owned by its queue from Finish until the thread takes it back.
  struct Call {
    virtual ~Call() = default;
    grpc::Status status;
    std::function<void(grpc::Status)> done;
  };
  // The reader lives in the call's arena, freed with its ClientContext: it must be
  // destroyed first (Dispatch does, before running `done`).
  template <typename Resp>
  struct TypedCall final : Call {
    std::unique_ptr<grpc::ClientAsyncResponseReader<Resp>> reader;
  };
  struct AlarmCall final : Call {
    grpc::Alarm alarm;
  };

  grpc::CompletionQueue* NextQueue() {
    return queues_[next_.fetch_add(1, std::memory_order_relaxed) % queues_.size()].get();
  }
  void Poll(grpc::CompletionQueue* queue);
  // Runs the callback of a tag taken from a queue, and frees the call.
  static void Dispatch(void* tag, bool ok);

  std::vector<std::unique_ptr<grpc::CompletionQueue>> queues_;
  std::vector<std::thread> threads_;
  std::atomic<uint32_t> next_{0};
};

}  // namespace ps
