#include "client/python/_core/handle.h"

#include <pybind11/stl.h>

#include <utility>

#include "absl/time/time.h"
#include "client/python/_core/errors.h"

namespace ps::py {

void Notifier::Begin() {
  absl::MutexLock lock(&mu_);
  ++running_;
}

void Notifier::End() {
  absl::MutexLock lock(&mu_);
  --running_;
}

void Notifier::WaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int64_t* running) { return *running == 0; }, &running_));
}

void Notifier::Push(std::shared_ptr<CallState> state) {
  absl::MutexLock lock(&mu_);
  finished_.push_back(std::move(state));
}

std::vector<std::shared_ptr<CallState>> Notifier::Next() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &Notifier::Ready));
  std::vector<std::shared_ptr<CallState>> out(std::make_move_iterator(finished_.begin()),
                                              std::make_move_iterator(finished_.end()));
  finished_.clear();
  return out;
}

void Notifier::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

void CallState::Complete(absl::Status status) {
  bool notify;
  {
    absl::MutexLock lock(&mu_);
    done_ = true;
    status_ = std::move(status);
    notify = notify_;
  }
  if (notify) notifier_->Push(shared_from_this());
  notifier_->End();
}

bool CallState::done() {
  absl::MutexLock lock(&mu_);
  return done_;
}

absl::Status CallState::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
  return status_;
}

std::optional<absl::Status> CallState::WaitFor(double seconds) {
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Seconds(std::max(0.0, seconds)))) {
    return std::nullopt;
  }
  return status_;
}

bool CallState::NotifyWhenDone() {
  absl::MutexLock lock(&mu_);
  if (done_) return false;
  notify_ = true;
  return true;
}

void Callbacks::Add(const std::shared_ptr<CallState>& state, pyb::object fn, pyb::object handle) {
  Entry& e = entries_[state.get()];
  e.fns.push_back(std::move(fn));
  e.handle = std::move(handle);
}

void Callbacks::Adopt(const std::shared_ptr<CallState>& state, pyb::object keep) {
  entries_[state.get()].keep = std::move(keep);
}

pyb::object Callbacks::Next() {
  std::vector<std::shared_ptr<CallState>> finished;
  {
    pyb::gil_scoped_release unlocked;
    finished = notifier_->Next();
  }
  if (finished.empty()) return pyb::none();
  pyb::list todo;
  for (const auto& state : finished) {
    auto it = entries_.find(state.get());
    if (it == entries_.end()) continue;
    Entry entry = std::move(it->second);
    entries_.erase(it);
    for (pyb::object& fn : entry.fns) todo.append(pyb::make_tuple(fn, entry.handle));
    // entry.keep (a dropped handle's arrays) is released here, with the GIL.
  }
  return std::move(todo);
}

namespace {

[[noreturn]] void ThrowTimeout() {
  PyErr_SetString(PyExc_TimeoutError, "the call is still running");
  throw pyb::error_already_set();
}

}  // namespace

std::unique_ptr<Handle> Handle::Failed(absl::Status status, std::shared_ptr<Callbacks> callbacks) {
  auto state = std::make_shared<CallState>(callbacks->notifier());
  state->Complete(std::move(status));
  return std::make_unique<Handle>(std::move(state), std::move(callbacks), pyb::none(), pyb::none());
}

Handle::~Handle() {
  // Dropped while the call runs: what it reads or writes must outlive it.
  if (keep_ && !keep_.is_none() && state_->NotifyWhenDone()) {
    callbacks_->Adopt(state_, std::move(keep_));
  }
}

std::optional<absl::Status> Handle::Outcome(std::optional<double> timeout) {
  pyb::gil_scoped_release unlocked;
  if (!timeout) return state_->Wait();
  return state_->WaitFor(*timeout);
}

bool Handle::wait(std::optional<double> timeout) { return Outcome(timeout).has_value(); }

pyb::object Handle::result(std::optional<double> timeout) {
  std::optional<absl::Status> s = Outcome(timeout);
  if (!s) ThrowTimeout();
  ThrowIfError(*s);
  return value_;
}

pyb::object Handle::exception(std::optional<double> timeout) {
  std::optional<absl::Status> s = Outcome(timeout);
  if (!s) ThrowTimeout();
  if (s->ok()) return pyb::none();
  return ErrorOf(*s);
}

void Handle::add_done_callback(pyb::object fn, pyb::object self) {
  if (state_->NotifyWhenDone()) {
    callbacks_->Add(state_, std::move(fn), std::move(self));
    return;
  }
  try {
    fn(self);
  } catch (pyb::error_already_set& e) {  // as concurrent.futures: logged, not raised
    pyb::module_::import("logging")
        .attr("getLogger")("elastic_ps")
        .attr("error")("a done-callback of an elastic_ps call raised",
                       pyb::arg("exc_info") = pyb::make_tuple(e.type(), e.value(), e.trace()));
  }
}

void BindHandles(pyb::module_& m) {
  pyb::class_<Handle>(m, "Handle", R"(A call in flight (PsClient.pull_async, push_async, ...).

wait(timeout=None) -> bool: blocks (the GIL released) until the call is done, or timeout
  seconds; True once done. Never raises the call's error.
done() -> bool.
result(timeout=None): the call's value (the rows of a pull; None for a push) or raises its
  PsError; TimeoutError if not done within timeout seconds.
exception(timeout=None): the call's PsError, or None.
add_done_callback(fn): fn(handle) once the call is done: at once if it is, else on the
  client's callback thread (keep it short: one thread runs every callback).
The handle keeps the arrays of the call alive until it is done, even if dropped.)")
      .def("done", &Handle::done)
      .def("wait", &Handle::wait, pyb::arg("timeout") = pyb::none())
      .def("result", &Handle::result, pyb::arg("timeout") = pyb::none())
      .def("exception", &Handle::exception, pyb::arg("timeout") = pyb::none())
      .def(
          "add_done_callback",
          [](pyb::object self, pyb::object fn) {
            self.cast<Handle&>().add_done_callback(std::move(fn), self);
          },
          pyb::arg("fn"))
      .def(
          "cancel", [](Handle&) { return false; }, "Calls cannot be cancelled: False.")
      .def("cancelled", [](Handle&) { return false; })
      .def("running", [](Handle& h) { return !h.done(); })
      .def_property("value", &Handle::value, &Handle::set_value,
                    "What result() returns once the call succeeded.");

  pyb::class_<Callbacks, std::shared_ptr<Callbacks>>(m, "Callbacks")
      .def("next", &Callbacks::Next,
           "One step of the client's callback thread: [(fn, handle), ...] to run, or None "
           "once the client is closed and every call is done.");
}

}  // namespace ps::py
