#include "client/push_keys.h"

#include <glog/logging.h>

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ps::internal {
namespace {

uint64_t ClockSequence() { return static_cast<uint64_t>(absl::ToUnixMicros(absl::Now())); }

}  // namespace

PushKeys::PushKeys(uint64_t worker_id, uint64_t incarnation, uint64_t first_sequence,
                   ClientCounters* counters)
    : counters_(counters),
      worker_id_(worker_id),
      incarnation_(incarnation),
      next_sequence_(first_sequence != 0 ? first_sequence : ClockSequence()) {
  if (worker_id_ == 0) {
    std::random_device rd;
    while (worker_id_ == 0) worker_id_ = (uint64_t{rd()} << 32) | rd();
  }
}

uint64_t PushKeys::worker_id() const {
  absl::MutexLock lock(&mu_);
  return worker_id_;
}

uint64_t PushKeys::incarnation() const {
  absl::MutexLock lock(&mu_);
  return incarnation_;
}

absl::Status PushKeys::SetIdentity(uint64_t worker_id, uint64_t incarnation) {
  if (worker_id == 0 || incarnation == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("push identity needs worker_id > 0 and "
                     "incarnation > 0 (got ",
                     worker_id, ", ", incarnation, ")"));
  }
  absl::MutexLock lock(&mu_);
  if (worker_id != worker_id_ || incarnation != incarnation_) {
    LOG(INFO) << "pushes now carry worker " << worker_id << " incarnation " << incarnation
              << " (were worker " << worker_id_ << " incarnation " << incarnation_ << ")";
  }
  worker_id_ = worker_id;
  incarnation_ = incarnation;
  next_sequence_ = std::max(next_sequence_, ClockSequence());
  return absl::OkStatus();
}

PushKey PushKeys::Next() {
  PushKey key;
  absl::MutexLock lock(&mu_);
  key.set_worker_id(worker_id_);
  key.set_incarnation(incarnation_);
  key.set_sequence(next_sequence_++);
  return key;
}

void PushKeys::Acknowledged(const PushKey& key, bool duplicate, int attempts) {
  counters_->push_rpcs.fetch_add(1, std::memory_order_relaxed);
  if (!duplicate) return;
  counters_->duplicate_pushes.fetch_add(1, std::memory_order_relaxed);
  if (attempts > 1) {
    VLOG(1) << "push " << key.worker_id() << "/" << key.incarnation() << "/" << key.sequence()
            << " was applied by an earlier attempt (answered duplicate after " << attempts
            << " attempts)";
    return;
  }
  counters_->reused_keys.fetch_add(1, std::memory_order_relaxed);
  LOG_EVERY_N(WARNING, 1000) << "push " << key.worker_id() << "/" << key.incarnation() << "/"
                             << key.sequence()
                             << " was answered duplicate on its first attempt: another sender "
                                "used this key (two clients with one worker id and incarnation?)"
                                " and this push's gradients were dropped ("
                             << google::COUNTER << " so far; every 1000th is logged)";
}

}  // namespace ps::internal
