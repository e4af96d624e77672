#include "ps/synced_acks.h"

#include <utility>

namespace ps {

SyncedAcks::SyncedAcks(std::function<absl::Status()> sync)
    : sync_(std::move(sync)), thread_([this] { Run(); }) {}

SyncedAcks::~SyncedAcks() { Stop(); }

void SyncedAcks::Add(Done done) {
  {
    absl::MutexLock lock(&mu_);
    if (!stop_) {
      waiting_.push_back(std::move(done));
      return;
    }
  }
  done(absl::UnavailableError(
      "this pod is closing before its log was fsynced; retry (the push keeps its key)"));
}

void SyncedAcks::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

uint64_t SyncedAcks::syncs() const {
  absl::MutexLock lock(&mu_);
  return syncs_;
}

uint64_t SyncedAcks::acks() const {
  absl::MutexLock lock(&mu_);
  return acks_;
}

bool SyncedAcks::Ready() const { return stop_ || !waiting_.empty(); }

void SyncedAcks::Run() {
  for (;;) {
    std::vector<Done> batch;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &SyncedAcks::Ready));
      if (waiting_.empty()) return;  // stopping, nothing left
      batch.swap(waiting_);
    }
    const absl::Status s = sync_();
    {
      absl::MutexLock lock(&mu_);
      ++syncs_;
      acks_ += batch.size();
    }
    for (Done& done : batch) done(s);
  }
}

}  // namespace ps
