#include "client/op.h"

#include "client/completion_threads.h"
#include "client/ps_client.h"

namespace ps {
namespace internal {
namespace {

// Then callbacks running on this thread (nested when one finishes another call at once).
thread_local int then_depth = 0;

// Runs a Then callback, marking the thread as inside one for Handle::Wait.
void RunThen(const std::function<void(absl::Status)>& done, absl::Status result) {
  ++then_depth;
  done(std::move(result));
  --then_depth;
}

}  // namespace

bool InThenCallback() { return then_depth > 0; }

void Op::RpcDone(const absl::Status& s) {
  std::function<void(absl::Status)> then;
  absl::Status result;
  {
    absl::MutexLock lock(&mu_);
    if (!s.ok() && status_.ok()) status_ = s;
    if (--pending_ == 0 && then_) {
      result = FinishLocked();
      then = std::move(then_);
    }
  }
  if (then) RunThen(then, std::move(result));
}

void Op::Add(int n) {
  absl::MutexLock lock(&mu_);
  pending_ += n;
}

void Op::Keep(std::shared_ptr<void> p) {
  absl::MutexLock lock(&mu_);
  keep_.push_back(std::move(p));
}

bool Op::done() {
  absl::MutexLock lock(&mu_);
  return pending_ == 0;
}

absl::Status Op::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* pending) { return *pending == 0; }, &pending_));
  return FinishLocked();
}

void Op::Then(std::function<void(absl::Status)> done) {
  absl::Status result;
  {
    absl::MutexLock lock(&mu_);
    if (pending_ != 0) {
      then_ = std::move(done);
      return;
    }
    result = FinishLocked();
  }
  RunThen(done, std::move(result));
}

std::shared_ptr<Op> Op::Failed(absl::Status s) {
  auto op = std::make_shared<Op>(0);
  op->set_finish([s = std::move(s)] { return s; });
  return op;
}

absl::Status Op::FinishLocked() {
  if (!finished_) {
    finished_ = true;
    if (status_.ok() && finish_) status_ = finish_();
    finish_ = nullptr;  // frees the plan
  }
  return status_;
}

}  // namespace internal

absl::Status Handle::Wait() {
  if (op_ == nullptr) return absl::FailedPreconditionError("Wait on an empty Handle");
  if (internal::InThenCallback() || CompletionThreads::OnCompletionThread()) {
    // On a completion thread the answer may have to arrive on this very thread: waiting
    // could never end. Refused in every Then callback, whichever thread runs it and
    // whether or not the call is finished already, so the outcome never depends on a race.
    return absl::FailedPreconditionError(
        "Handle::Wait called from a completion callback (Handle::Then); chain the call with "
        "Then instead");
  }
  return op_->Wait();
}

void Handle::Then(std::function<void(absl::Status)> done) {
  if (op_ == nullptr) return done(absl::FailedPreconditionError("Then on an empty Handle"));
  op_->Then(std::move(done));
}

}  // namespace ps
