// Periodic: calls a function every `interval` on a thread of its own, until destroyed.
//
//   Periodic retention;
//   retention.Start(absl::Seconds(10), [&] { core.EnforceRetention(); });
//
// Thread-safety: Start once, from one thread; the destructor stops the thread, waiting for
// a call in progress. `fn` must not destroy the Periodic.
#pragma once

#include <functional>
#include <thread>
#include <utility>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace ps {

class Periodic {
 public:
  Periodic() = default;
  Periodic(const Periodic&) = delete;
  Periodic& operator=(const Periodic&) = delete;
  ~Periodic() {
    stop_.Notify();
    if (thread_.joinable()) thread_.join();
  }

  // Calls fn() every `interval` (the first call one interval from now). Call at most once.
  void Start(absl::Duration interval, std::function<void()> fn) {
    thread_ = std::thread([this, interval, fn = std::move(fn)] {
      while (!stop_.WaitForNotificationWithTimeout(interval)) fn();
    });
  }

 private:
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace ps
