#include "ps/synced_acks.h"

#include <utility>

namespace ps {

SyncedAcks::SyncedAcks(std::function<absl::Status()> sync, std::function<absl::Time()> clock)
    : sync_(std::move(sync)), clock_(std::move(clock)), thread_([this] { Run(); }) {}

SyncedAcks::~SyncedAcks() { Stop(); }

void SyncedAcks::Add(Done done) {
  const absl::Time added = clock_();
  {
    absl::MutexLock lock(&mu_);
    if (!stop_) {
      waiting_.push_back({std::move(done), added});
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

uint64_t SyncedAcks::syncs() const { return stats().syncs; }

uint64_t SyncedAcks::acks() const { return stats().acks; }

SyncedAcks::Stats SyncedAcks::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

bool SyncedAcks::Ready() const { return stop_ || !waiting_.empty(); }

void SyncedAcks::Run() {
  for (;;) {
    std::vector<Waiting> batch;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &SyncedAcks::Ready));
      if (waiting_.empty()) return;  // stopping, nothing left
      batch.swap(waiting_);
    }
    const absl::Time start = clock_();
    const absl::Status s = sync_();
    const absl::Time end = clock_();
    {
      absl::MutexLock lock(&mu_);
      ++stats_.syncs;
      stats_.acks += batch.size();
      stats_.sync_time += end - start;
      for (const Waiting& w : batch) stats_.ack_wait += end - w.added;
    }
    for (Waiting& w : batch) w.done(s);
  }
}

}  // namespace ps
