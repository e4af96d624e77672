#include "client/ps_client_impl.h"

#include <glog/logging.h>

#include "common/base/status_macros.h"

namespace ps::internal {

PsClientImpl::PsClientImpl(const ClientOptions& options, std::shared_ptr<const Routing> routing)
    : options_(options),
      policy_(RetryOptionsOf(options_)),
      master_(options_.master.empty() ? nullptr
                                      : Master::NewStub(Channels(options_).Make(options_.master))),
      completions_(std::make_unique<CompletionThreads>(options_.completion_threads)),
      router_(options_, std::move(routing), master_.get(), &timer_, &inflight_, &counters_),
      runner_(options_, &policy_, &router_, completions_.get(), &timer_, &inflight_, &counters_),
      catalog_(options_, &policy_, master_.get(), &router_, &runner_),
      keys_(options_.worker_id, options_.incarnation, options_.first_push_sequence, &counters_),
      sparse_(&router_, &runner_, &catalog_, &keys_, &counters_),
      dense_(options_, &router_, &runner_, &catalog_, &keys_, &counters_) {}

PsClientImpl::~PsClientImpl() {
  // From a completion callback the wait below could never end (the callback's own call
  // is still in flight) and the completion threads could not be joined.
  LOG_IF(FATAL, CompletionThreads::OnCompletionThread())
      << "a PsClient was destroyed from one of its completion callbacks";
  inflight_.WaitIdle();
  // Nothing is in flight, so no retry waits on the timer and no answer can arrive.
  completions_.reset();
}

}  // namespace ps::internal
