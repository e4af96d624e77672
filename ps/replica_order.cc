#include "ps/replica_order.h"

#include <glog/logging.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ps {

ReplicaOrder::~ReplicaOrder() {
  std::vector<Batch> failed;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, p] : primaries_) {
      TakeParked(
          p, [](const Batch&) { return true; }, &failed);
    }
  }
  for (Batch& b : failed) b.run(absl::UnavailableError("the follower is shutting down"));
}

bool ReplicaOrder::Runnable(const Primary& p, const Batch& b) {
  return !p.busy && (b.restart || (b.stream == p.stream && b.first <= p.next));
}

template <typename Pred>
void ReplicaOrder::TakeParked(Primary& p, Pred fail, std::vector<Batch>* out) {
  auto keep = std::stable_partition(p.parked.begin(), p.parked.end(),
                                    [&](const Batch& b) { return !fail(b); });
  for (auto it = keep; it != p.parked.end(); ++it) out->push_back(std::move(*it));
  p.parked.erase(keep, p.parked.end());
}

void ReplicaOrder::Submit(const std::string& primary_ref, uint64_t stream, uint64_t first,
                          uint64_t count, bool restart, Run run) {
  // A copy: `primary_ref` may be the request's, which a batch's answer frees.
  const std::string primary = primary_ref;
  if (stream == 0) {  // an unnumbered batch: applied on arrival, as before pipelining
    run(absl::OkStatus());
    return;
  }
  std::vector<Batch> failed;
  std::vector<std::pair<Batch, absl::Status>> refused;
  Batch b{stream, first, count, restart, std::move(run), absl::Now()};
  bool run_now = false;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, p] : primaries_) {
      TakeParked(
          p, [&](const Batch& x) { return b.since - x.since > options_.max_wait; }, &failed);
    }
    Primary& p = primaries_[primary];
    if (b.stream != p.stream && !b.restart) {
      ++refused_total_;
      refused.emplace_back(
          std::move(b),
          absl::UnavailableError(absl::StrCat(
              "records ", first, "+ of stream ", stream, " from ", primary,
              ": this follower does not know that stream (it restarted, or the primary began "
              "another); resend from the records it holds, with restart")));
    } else if (!Runnable(p, b)) {
      if (p.parked.size() >= options_.max_parked) {
        ++refused_total_;
        refused.emplace_back(std::move(b),
                             absl::UnavailableError(absl::StrCat(
                                 "records ", first, "+ from ", primary, " arrived ahead of record ",
                                 p.next, " with ", p.parked.size(), " batches waiting already")));
      } else {
        ++parked_total_;
        p.parked.push_back(std::move(b));
      }
    } else {
      p.busy = true;
      run_now = true;
    }
  }
  FailAll(&failed);
  for (auto& [f, why] : refused) f.run(why);
  if (!run_now) return;  // parked or refused

  // This thread runs the batch, then every parked one whose turn it brings.
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      Primary& p = primaries_[primary];
      if (b.restart && (b.stream != p.stream || b.first > p.next)) {
        if (b.stream != p.stream) {
          TakeParked(
              p, [&](const Batch& x) { return x.stream != b.stream && !x.restart; }, &failed);
        }
        p.stream = b.stream;
        p.next = b.first;
      }
    }
    FailAll(&failed);
    const uint64_t applied = b.run(absl::OkStatus());
    absl::MutexLock lock(&mu_);
    Primary& p = primaries_[primary];
    p.busy = false;
    if (p.stream == b.stream) p.next = std::max(p.next, b.first + applied);
    if (applied < b.count) {
      // Those after the failed record wait for a resend that will cover them anyway.
      TakeParked(
          p, [&](const Batch& x) { return x.stream == p.stream && x.first > p.next; }, &failed);
    }
    // The next in number order; a restart of another stream only when none is left.
    auto it = p.parked.end();
    for (auto x = p.parked.begin(); x != p.parked.end(); ++x) {
      if (!Runnable(p, *x)) continue;
      if (it == p.parked.end() || (x->stream == p.stream && it->stream != p.stream) ||
          (x->stream == it->stream && x->first < it->first)) {
        it = x;
      }
    }
    if (it == p.parked.end()) break;
    b = std::move(*it);
    p.parked.erase(it);
    p.busy = true;
  }
  FailAll(&failed);
}

void ReplicaOrder::FailAll(std::vector<Batch>* batches) {
  for (Batch& f : *batches) {
    f.run(absl::UnavailableError(absl::StrCat(
        "records ", f.first, "+ of stream ", f.stream,
        " were not applied in order here (a record before them failed, the stream was "
        "replaced, or they waited too long for the records before them); resend them")));
  }
  batches->clear();
}

uint64_t ReplicaOrder::parked_total() const {
  absl::MutexLock lock(&mu_);
  return parked_total_;
}

uint64_t ReplicaOrder::refused_total() const {
  absl::MutexLock lock(&mu_);
  return refused_total_;
}

}  // namespace ps
