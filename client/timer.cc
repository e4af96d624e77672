#include "client/timer.h"

namespace ps {

Timer::Timer() : thread_([this] { Run(); }) {}

Timer::~Timer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void Timer::After(absl::Duration delay, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  due_.emplace(absl::Now() + delay, std::move(fn));
}

void Timer::Run() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    if (due_.empty()) {
      mu_.Await(absl::Condition(
          +[](Timer* t)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu_) { return t->stopping_ || !t->due_.empty(); },
          this));
      continue;
    }
    const absl::Time next = due_.begin()->first;
    if (absl::Now() < next) {
      // Wakes early on a new (possibly sooner) entry or on stop; the loop re-checks.
      const size_t size = due_.size();
      struct Args {
        Timer* t;
        size_t size;
      } args{this, size};
      mu_.AwaitWithDeadline(absl::Condition(
                                +[](Args* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                  return a->t->stopping_ || a->t->due_.size() != a->size;
                                },
                                &args),
                            next);
      continue;
    }
    std::function<void()> fn = std::move(due_.begin()->second);
    due_.erase(due_.begin());
    mu_.Unlock();
    fn();
    mu_.Lock();
  }
}

}  // namespace ps
