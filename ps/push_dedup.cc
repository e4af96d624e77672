#include "ps/push_dedup.h"

#include "absl/strings/str_cat.h"

namespace ps {

PushDedup::PushDedup(PushDedupOptions options) : options_(options) {}

bool PushDedup::IsDone(const Writer& w, uint64_t seq) const {
  const uint64_t slot = seq % options_.window;
  return (w.done[slot >> 6] >> (slot & 63)) & 1;
}

void PushDedup::SetDone(Writer& w, uint64_t seq) {
  const uint64_t slot = seq % options_.window;
  w.done[slot >> 6] |= uint64_t{1} << (slot & 63);
}

// Moves the window so that it ends at `seq`, clearing the slots that now stand for new,
// not yet applied sequences.
void PushDedup::Advance(Writer& w, uint64_t seq) {
  const uint64_t new_base = seq - options_.window + 1;
  if (new_base - w.base >= options_.window) {
    std::fill(w.done.begin(), w.done.end(), 0);
  } else {
    for (uint64_t s = w.base; s < new_base; ++s) {
      const uint64_t slot = s % options_.window;
      w.done[slot >> 6] &= ~(uint64_t{1} << (slot & 63));
    }
  }
  w.base = new_base;
}

absl::StatusOr<PushDedup::Claim> PushDedup::Begin(const PushKey& key) {
  if (key.worker_id() == 0) return Claim::kNew;
  if (key.sequence() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("push from worker ", key.worker_id(), " has sequence 0 (must be > 0)"));
  }
  absl::MutexLock lock(&mu_);
  auto it = writers_.find(key.worker_id());
  if (it == writers_.end()) {
    if (writers_.size() >= options_.max_writers) EvictOldest();
    it = writers_.emplace(key.worker_id(), Writer()).first;
    it->second.incarnation = key.incarnation();
    it->second.done.assign((options_.window + 63) / 64, 0);
  }
  Writer& w = it->second;
  w.last_used = ++clock_;
  if (key.incarnation() < w.incarnation) {
    return absl::FailedPreconditionError(
        absl::StrCat("push from worker ", key.worker_id(), " incarnation ", key.incarnation(),
                     " is superseded by incarnation ", w.incarnation));
  }
  if (key.incarnation() > w.incarnation) {
    w.incarnation = key.incarnation();
    w.base = 1;
    std::fill(w.done.begin(), w.done.end(), 0);
    w.in_progress.clear();
  }
  const uint64_t seq = key.sequence();
  if (seq < w.base) {
    return absl::FailedPreconditionError(absl::StrCat(
        "push sequence ", seq, " of worker ", key.worker_id(), " is older than the ",
        options_.window, " remembered (from ", w.base, "); it cannot be de-duplicated"));
  }
  if (seq >= w.base + options_.window) Advance(w, seq);
  if (IsDone(w, seq)) return Claim::kDuplicate;
  if (!w.in_progress.insert(seq).second) return Claim::kInProgress;
  return Claim::kNew;
}

void PushDedup::Finish(const PushKey& key, bool applied) {
  if (key.worker_id() == 0) return;
  absl::MutexLock lock(&mu_);
  auto it = writers_.find(key.worker_id());
  if (it == writers_.end() || it->second.incarnation != key.incarnation()) return;
  Writer& w = it->second;
  w.in_progress.erase(key.sequence());
  if (applied && key.sequence() >= w.base) SetDone(w, key.sequence());
}

void PushDedup::EvictOldest() {
  auto oldest = writers_.begin();
  for (auto it = writers_.begin(); it != writers_.end(); ++it) {
    if (it->second.last_used < oldest->second.last_used) oldest = it;
  }
  if (oldest != writers_.end()) writers_.erase(oldest);
}

size_t PushDedup::writers() const {
  absl::MutexLock lock(&mu_);
  return writers_.size();
}

}  // namespace ps
