#include "ps/storage/durable_log.h"

#include <glog/logging.h>

#include "absl/strings/str_cat.h"

namespace ps {

absl::StatusOr<Durability> ParseDurability(absl::string_view name) {
  if (name == "process") return Durability::kProcess;
  if (name == "machine") return Durability::kMachine;
  if (name == "periodic") return Durability::kPeriodic;
  return absl::InvalidArgumentError(
      absl::StrCat("durability '", name, "' is not one of process, machine, periodic"));
}

const char* DurabilityName(Durability d) {
  switch (d) {
    case Durability::kProcess:
      return "process";
    case Durability::kMachine:
      return "machine";
    case Durability::kPeriodic:
      return "periodic";
  }
  return "?";
}

DurableLog::DurableLog(StorageDb* db, uint64_t next_lsn, DurableLogOptions options)
    : db_(db),
      options_(options),
      next_lsn_(next_lsn),
      written_lsn_(next_lsn),
      max_log_bytes_(options.max_log_bytes) {
  writer_ = std::thread([this] { Run(); });
  if (options_.durability == Durability::kPeriodic) syncer_ = std::thread([this] { RunSyncer(); });
}

void DurableLog::RunSyncer() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(options_.flush_ms))) {
        return;
      }
    }
    absl::Status s = db_->SyncLog();
    if (!s.ok()) {
      LOG(ERROR) << "push log fsync failed: " << s;
      absl::MutexLock lock(&mu_);
      if (failed_.ok()) failed_ = s;
    }
  }
}

DurableLog::~DurableLog() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  writer_.join();
  if (syncer_.joinable()) syncer_.join();
}

void DurableLog::Append(std::string record, Done done) {
  Append(std::make_shared<const std::string>(std::move(record)), std::move(done));
}

void DurableLog::Append(std::shared_ptr<const std::string> record, Done done) {
  Append(std::move(record), std::move(done), nullptr);
}

void DurableLog::Append(std::shared_ptr<const std::string> record, Done done, Done written) {
  const size_t bytes = record->size();
  const uint32_t crc = LogFiles::Checksum(*record);
  const absl::Time now = absl::Now();
  bool ack_now = false;
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    auto room = [this] {
      mu_.AssertHeld();
      return pending_bytes_ < options_.max_pending_bytes || !failed_.ok() || stop_;
    };
    mu_.Await(absl::Condition(&room));
    if (!failed_.ok()) {
      refused = absl::UnavailableError(absl::StrCat(
          "the push log failed earlier (", failed_.message(),
          "); this pod refuses pushes until it is restarted and recovers from its log"));
    } else {
      // Periodic mode acknowledges now unless the writer lags: then the record waits for
      // its write like in process mode, which keeps the loss bound.
      if (options_.durability == Durability::kPeriodic) {
        absl::Time oldest = writing_since_;
        if (!queue_.empty()) oldest = std::min(oldest, queue_.front().queued);
        ack_now = now - oldest < absl::Milliseconds(options_.flush_ms) / 2;
      }
      if (max_log_bytes_ > 0) marks_.emplace_back(next_lsn_, appended_);  // else unbounded
      appended_ += bytes;
      if (!ack_now) ++waiting_;
      queue_.push_back(Entry{next_lsn_++, std::move(record), crc,
                             ack_now ? nullptr : std::move(done), std::move(written), now});
      pending_bytes_ += bytes;
    }
  }
  if (!refused.ok()) {
    if (written) written(refused);
    done(refused);
  } else if (ack_now) {
    done(absl::OkStatus());
  }
}

void DurableLog::WaitForRoom() {
  absl::MutexLock lock(&mu_);
  auto room = [this] {
    mu_.AssertHeld();
    return max_log_bytes_ == 0 || marks_.empty() ||
           appended_ - marks_.front().second <= max_log_bytes_ || !failed_.ok() || stop_;
  };
  mu_.Await(absl::Condition(&room));
}

void DurableLog::Truncated(uint64_t cut) {
  absl::MutexLock lock(&mu_);
  while (!marks_.empty() && marks_.front().first < cut) marks_.pop_front();
}

void DurableLog::SetMaxLogBytes(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  max_log_bytes_ = bytes;
}

uint64_t DurableLog::live_bytes() const {
  absl::MutexLock lock(&mu_);
  return marks_.empty() ? 0 : appended_ - marks_.front().second;
}

uint64_t DurableLog::max_log_bytes() const {
  absl::MutexLock lock(&mu_);
  return max_log_bytes_;
}

absl::Status DurableLog::health() const {
  absl::MutexLock lock(&mu_);
  if (failed_.ok()) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("the push log failed (", failed_.message(),
                   "); this pod refuses pushes until it is restarted and recovers from its log"));
}

uint64_t DurableLog::next_lsn() const {
  absl::MutexLock lock(&mu_);
  return next_lsn_;
}

absl::Status DurableLog::WaitWritten(uint64_t lsn) {
  absl::MutexLock lock(&mu_);
  auto written = [this, lsn] {
    mu_.AssertHeld();
    return written_lsn_ >= lsn || !failed_.ok();
  };
  // A periodic writer gathering its next group (a quarter of flush_ms) writes it at once
  // for a waiter, as for a push that waits for its write.
  if (written_lsn_ < lsn) ++waiting_;
  mu_.Await(absl::Condition(&written));
  return failed_;
}

DurableLog::Stats DurableLog::stats() const {
  absl::MutexLock lock(&mu_);
  Stats s = stats_;
  s.pending_bytes = pending_bytes_;
  return s;
}

void DurableLog::Run() {
  const bool periodic = options_.durability == Durability::kPeriodic;
  // Periodic mode writes each group to the page cache at once (a process crash then
  // loses nothing written); the syncer thread fsyncs every flush_ms.
  const bool sync = options_.durability == Durability::kMachine;
  std::vector<Entry> group;
  std::vector<LogAppend> records;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this] {
        mu_.AssertHeld();
        return !queue_.empty() || stop_;
      };
      if (periodic) {
        // Gather for a quarter of the bound: a record acknowledged at once is written
        // within flush_ms unless the write itself takes more than half of it, and Append
        // stops acknowledging at once when the oldest unwritten record nears the bound.
        // Records whose pushes wait for their write (the writer lagged) are written at
        // once, as in process mode.
        auto wake = [this] {
          mu_.AssertHeld();
          return stop_ || waiting_ > 0;
        };
        mu_.AwaitWithTimeout(absl::Condition(&wake), absl::Milliseconds(options_.flush_ms) / 4);
      }
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty() && stop_) return;
      group.swap(queue_);
      waiting_ = 0;
      writing_since_ = group.front().queued;
    }
    records.clear();
    size_t bytes = 0;
    for (Entry& e : group) {
      bytes += e.record->size();
      records.push_back({e.lsn, *e.record, e.crc});
    }
    absl::Status s;
    {
      absl::MutexLock lock(&mu_);
      if (!failed_.ok()) s = failed_;
    }
    if (s.ok() && options_.test_before_write && !options_.test_before_write()) {
      s = absl::UnavailableError("the log writer stopped before this write (test kill point)");
    }
    if (s.ok()) s = db_->AppendLog(records, sync);

    if (!s.ok()) LOG(ERROR) << "push log write failed: " << s;
    // `written` (a replicated primary ships the record), then the acknowledgements, both
    // before publishing written_lsn_: WaitWritten(lsn) then implies that the callbacks of
    // the records below lsn (which ship them and mark their keys applied) have run.
    for (Entry& e : group) {
      if (e.written) e.written(s);
    }
    for (Entry& e : group) {
      if (e.done) e.done(s);
    }
    const absl::Time now = absl::Now();
    {
      absl::MutexLock lock(&mu_);
      if (!s.ok() && failed_.ok()) failed_ = s;
      written_lsn_ = group.back().lsn + 1;
      writing_since_ = absl::InfiniteFuture();
      pending_bytes_ -= bytes;
      stats_.records += group.size();
      stats_.groups += 1;
      stats_.bytes += bytes;
      stats_.max_lag_ms =
          std::max(stats_.max_lag_ms, absl::ToDoubleMilliseconds(now - group.front().queued));
    }
    group.clear();
  }
}

}  // namespace ps
