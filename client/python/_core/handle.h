// The asynchronous handles of the Python binding (elastic_ps._core.Handle, what
// PsClient.pull_async / push_async return), and the thread that runs their Python
// callbacks.
//
// A call's C++ completion runs on the client's completion thread, which serves every call
// of the client: it must never wait for the GIL there. So it only records the outcome in
// a CallState (no Python object inside) and, when Python must hear of it (a done-callback
// was added, or the handle was dropped while the call was in flight), queues the state on
// the client's Notifier. A Python thread of the client (elastic_ps.client starts it) takes
// finished states from there with the GIL released (Callbacks::Next), then, holding the
// GIL, runs their callbacks and drops the arrays of dropped handles.
//
// Buffer lifetime: a Handle holds references to the arrays the call reads or writes (ids,
// rows). If it is dropped before the call is done, those references move to Callbacks and
// are released once the call is done, so the rows still land in live memory.
#pragma once

#include <pybind11/pybind11.h>

#include <deque>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace ps::py {

namespace pyb = pybind11;

class CallState;

// Finished calls that Python must hear of, and the count of calls not finished yet.
// Thread-safe; no Python inside.
class Notifier {
 public:
  // A call started / finished (CallState does both).
  void Begin();
  void End();
  // Blocks until every call begun has ended.
  void WaitIdle();

  void Push(std::shared_ptr<CallState> state);
  // Blocks until there are finished calls (returns them all) or the notifier is closed
  // and empty (returns none).
  std::vector<std::shared_ptr<CallState>> Next();
  // Wakes Next; calls pushed later are still returned.
  void Close();

 private:
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || !finished_.empty(); }

  absl::Mutex mu_;
  std::deque<std::shared_ptr<CallState>> finished_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;
};

// The outcome of one asynchronous call. Thread-safe; no Python inside.
class CallState : public std::enable_shared_from_this<CallState> {
 public:
  // Counts as running on `notifier` until Complete.
  explicit CallState(std::shared_ptr<Notifier> notifier) : notifier_(std::move(notifier)) {
    notifier_->Begin();
  }

  // Records the outcome (once), on the thread that finishes the call.
  void Complete(absl::Status status);
  bool done();
  // Blocks until done (the GIL must be released); the call's status.
  absl::Status Wait();
  // As Wait, for at most `seconds`; nullopt if the call is still running.
  std::optional<absl::Status> WaitFor(double seconds);
  // Asks for this state to be queued on the notifier once done; false if it already is
  // done (then nothing is queued).
  bool NotifyWhenDone();

 private:
  const std::shared_ptr<Notifier> notifier_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool notify_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// The Python side of the notifier: the callbacks and the references of dropped handles
// waiting for their calls. Every method needs the GIL (Next releases it while it waits).
class Callbacks {
 public:
  explicit Callbacks(std::shared_ptr<Notifier> notifier) : notifier_(std::move(notifier)) {}
  const std::shared_ptr<Notifier>& notifier() const { return notifier_; }

  // Runs fn(handle) once `state` is done, on the callback thread.
  void Add(const std::shared_ptr<CallState>& state, pyb::object fn, pyb::object handle);
  // Keeps `keep` until `state` is done (a handle dropped while its call runs).
  void Adopt(const std::shared_ptr<CallState>& state, pyb::object keep);
  // One step of the callback thread: waits (GIL released) for finished calls, releases
  // what they kept and returns [(fn, handle), ...] to run; None once the client is closed
  // and every call is done.
  pyb::object Next();

 private:
  struct Entry {
    std::vector<pyb::object> fns;
    pyb::object handle;
    pyb::object keep;
  };
  const std::shared_ptr<Notifier> notifier_;
  std::unordered_map<const CallState*, Entry> entries_;  // guarded by the GIL
};

// elastic_ps._core.Handle: a call in flight. Used from Python only (with the GIL).
class Handle {
 public:
  // `keep`: the arrays the call reads or writes; `value`: what result() returns.
  Handle(std::shared_ptr<CallState> state, std::shared_ptr<Callbacks> callbacks, pyb::object keep,
         pyb::object value)
      : state_(std::move(state)),
        callbacks_(std::move(callbacks)),
        keep_(std::move(keep)),
        value_(std::move(value)) {}
  // A handle of a call that failed before it started.
  static std::unique_ptr<Handle> Failed(absl::Status status, std::shared_ptr<Callbacks> callbacks);
  ~Handle();

  bool done() const { return state_->done(); }
  // Blocks (GIL released) until done or `timeout` seconds passed; returns done().
  bool wait(std::optional<double> timeout);
  // The value (rows of a pull, None for a push) once done; raises the call's PsError, or
  // TimeoutError if it is not done within `timeout` seconds.
  pyb::object result(std::optional<double> timeout);
  // The call's PsError, or None if it succeeded (waits as result does).
  pyb::object exception(std::optional<double> timeout);
  // fn(handle) once done: at once on this thread if it is, else on the callback thread.
  void add_done_callback(pyb::object fn, pyb::object self);

  pyb::object value() const { return value_; }
  void set_value(pyb::object v) { value_ = std::move(v); }

 private:
  // The status once done (GIL released while waiting); nullopt on timeout.
  std::optional<absl::Status> Outcome(std::optional<double> timeout);

  const std::shared_ptr<CallState> state_;
  const std::shared_ptr<Callbacks> callbacks_;
  pyb::object keep_;
  pyb::object value_;
};

// Registers Handle and Callbacks in `m`.
void BindHandles(pyb::module_& m);

}  // namespace ps::py
