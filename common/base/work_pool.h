// A fixed set of threads running submitted closures from a bounded queue. gRPC reactions
// hand their work here and return at once, so they never block.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ps {

struct WorkPoolOptions {
  int threads = 2;
  // Closures waiting at most. Each holds a parsed request (up to a few MB), so this bounds
  // the memory a burst of clients can pin; beyond it TrySubmit refuses.
  size_t max_queued = 1024;
};

class WorkPool {
 public:
  explicit WorkPool(WorkPoolOptions options);
  // Runs what is queued, then joins the threads.
  ~WorkPool();

  // Queues fn; false (and fn is dropped) when the queue is full. Thread-safe.
  bool TrySubmit(std::function<void()> fn);

  size_t queued() const;

 private:
  void Run();

  const WorkPoolOptions options_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace ps
