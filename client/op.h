// One logical call of the client (a pull, a push, a blocking fan-out): the RPCs it is made
// of, which finish independently, and the handle the caller waits on (Handle in
// client/ps_client.h is a shared pointer to an Op).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace ps::internal {

// Counts the RPCs of a call still pending; the last one to finish completes the call.
// The call's status is the first error an RPC reported; once every RPC is done and all
// succeeded, the finish step (set_finish) runs once, on the thread that first learns the
// call is complete (a pull copies its duplicate rows there). Thread-safe.
class Op {
 public:
  // `pending`: the RPCs the call starts with (0: already complete).
  explicit Op(int pending) : pending_(pending) {}
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  // An RPC of the call is done with `s`. The last one runs the Then callback, if any, on
  // this thread, after the finish step.
  void RpcDone(const absl::Status& s);

  // `n` more RPCs joined the call (a re-routed part); call before the RPC they replace
  // reports RpcDone, so the count never reaches 0 in between.
  void Add(int n);
  // Keeps `p` alive as long as the Op (the RPCs of a call; re-routed ones join later).
  void Keep(std::shared_ptr<void> p);

  // True once every RPC is done.
  bool done();

  // Blocks until every RPC is done; returns the call's status. May be called again.
  absl::Status Wait();

  // Runs done(status) once every RPC is done: at once, on this thread, if they already
  // are; otherwise on the thread that finishes the last one. At most one per Op.
  void Then(std::function<void(absl::Status)> done);

  // The finish step; set before any RPC starts (not synchronized).
  void set_finish(std::function<absl::Status()> f) { finish_ = std::move(f); }

  // A call that failed before any RPC: complete, with status `s`.
  static std::shared_ptr<Op> Failed(absl::Status s);

 private:
  // The call's status, running the finish step the first time (pending_ must be 0).
  absl::Status FinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::function<absl::Status()> finish_;  // set before any RPC starts
  std::vector<std::shared_ptr<void>> keep_ ABSL_GUARDED_BY(mu_);
  std::function<void(absl::Status)> then_ ABSL_GUARDED_BY(mu_);
};

// True while a Then callback runs on this thread (Handle::Wait refuses to wait there).
bool InThenCallback();

}  // namespace ps::internal
