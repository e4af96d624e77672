// One thread that runs closures after a delay: the client's retry backoff, so that no gRPC
// callback thread ever sleeps.
#pragma once

#include <functional>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ps {

class Timer {
 public:
  Timer();
  // Drops closures not yet due and joins the thread.
  ~Timer();

  // Runs fn on the timer thread after `delay`. Thread-safe.
  void After(absl::Duration delay, std::function<void()> fn);

 private:
  void Run();

  absl::Mutex mu_;
  std::multimap<absl::Time, std::function<void()>> due_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ps
