// Graceful shutdown of a server binary on SIGTERM (Kubernetes) or SIGINT (Ctrl-C).
#pragma once

#include <glog/logging.h>
#include <signal.h>

#include <functional>
#include <thread>

namespace ps {

class ShutdownSignal {
 public:
  // Blocks SIGTERM and SIGINT in the calling thread and in every thread started after
  // it, so that only the waiting thread takes them: construct it in main() before any
  // other thread exists.
  ShutdownSignal() {
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGTERM);
    sigaddset(&signals_, SIGINT);
    pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
  }
  // Joins the waiting thread: call it once the server has stopped because of a signal.
  ~ShutdownSignal() { Join(); }
  // Waits for on_signal to return (once the server has stopped because of a signal), so
  // that what it used can be destroyed.
  void Join() {
    if (waiter_.joinable()) waiter_.join();
  }
  ShutdownSignal(const ShutdownSignal&) = delete;
  ShutdownSignal& operator=(const ShutdownSignal&) = delete;

  // Starts a thread that waits for SIGTERM or SIGINT, logs it and calls on_signal once.
  void OnSignal(std::function<void(int)> on_signal) {
    waiter_ = std::thread([this, on_signal = std::move(on_signal)] {
      int sig = 0;
      sigwait(&signals_, &sig);
      LOG(INFO) << "signal " << sig << ": shutting down";
      on_signal(sig);
    });
  }

 private:
  sigset_t signals_;
  std::thread waiter_;
};

}  // namespace ps
