#include "common/base/work_pool.h"

namespace ps {

WorkPool::WorkPool(WorkPoolOptions options) : options_(options) {
  for (int i = 0; i < std::max(1, options_.threads); ++i) threads_.emplace_back([this] { Run(); });
}

WorkPool::~WorkPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (auto& t : threads_) t.join();
}

bool WorkPool::TrySubmit(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || queue_.size() >= options_.max_queued) return false;
  queue_.push_back(std::move(fn));
  return true;
}

size_t WorkPool::queued() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

void WorkPool::Run() {
  for (;;) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkPool* p)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->stopping_ || !p->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // stopping and drained
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

}  // namespace ps
