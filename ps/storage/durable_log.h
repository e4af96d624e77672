// The pod's push log writer: records of applied pushes are queued by request threads and
// written by one thread in groups (one writev to the log files, at most one fsync per
// group: ps/storage/log_files.h), so durability costs a sequential write per group rather than a
// put per row. Request threads checksum their records, so the writer only writes.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ps/storage/storage_db.h"

namespace ps {

// What an acknowledged push survives (docs/operations.md, "Durability modes").
enum class Durability {
  kProcess,   // acknowledged once written to the WAL (page cache): survives kill -9
  kMachine,   // acknowledged once fsynced, groups share an fsync: survives power loss
  kPeriodic,  // acknowledged at once; written within flush_ms and fsynced every flush_ms:
              // a process crash loses at most the last flush_ms of acknowledged pushes, a
              // power loss about twice that
};
absl::StatusOr<Durability> ParseDurability(absl::string_view name);
const char* DurabilityName(Durability d);

struct DurableLogOptions {
  Durability durability = Durability::kProcess;
  // Periodic mode: the longest an acknowledged record waits to be written.
  int flush_ms = 100;
  // Queued bytes beyond which Append blocks until the writer catches up (backpressure:
  // memory stays bounded when the disk is slower than the pushes).
  size_t max_pending_bytes = size_t{512} << 20;
  // Bytes of records appended since the last truncation (Truncated) beyond which
  // WaitForRoom blocks: when materialization falls behind the pushes, pushes slow down to
  // its pace instead of the log (and so recovery) growing without bound. 0: no bound.
  uint64_t max_log_bytes = uint64_t{1} << 30;
  // Test only (a kill point, as RocksDB's): when set, the writer calls it before it writes
  // each group, outside its lock. false leaves the group unwritten, as if the process had
  // died just then: the log fails (every record queued then or later gets UNAVAILABLE,
  // nothing more is written), so a close leaves the disk as a SIGKILL before that write
  // would have (ps/ps_core_ship_order_test.cc).
  std::function<bool()> test_before_write;
};

class DurableLog {
 public:
  using Done = std::function<void(absl::Status)>;

  // Records get log sequence numbers from `next_lsn` on. `db` must outlive the log.
  DurableLog(StorageDb* db, uint64_t next_lsn, DurableLogOptions options);
  // Writes what is queued, then stops the writer.
  ~DurableLog();

  // Queues a record and calls done(OK) once it is durable as the mode says (periodic:
  // before Append returns, unless the oldest unwritten record is already half of flush_ms
  // old, in which case it waits for the write, so the loss bound holds). done gets the error if
  // the write fails; after a failed write every Append fails at once with UNAVAILABLE:
  // memory then holds updates that are not durable, and the pod must restart to recover
  // from its log. done may run on the caller's thread or the writer's. Thread-safe.
  void Append(std::string record, Done done);
  // The same for a record shared with others (a replicated primary's record, which its
  // follower streams send): the log holds a reference until the record is written.
  void Append(std::shared_ptr<const std::string> record, Done done);
  // The same, and `written` runs once the record is written as the mode writes it
  // (process and periodic: to the OS, which survives a SIGKILL; machine: fsynced too), with
  // OK, or with the error that kept it out of the log (a failed write, a refused append).
  // The `written` callbacks run in lsn order on the writer's thread (a refused append's on
  // the caller's), a group's before its `done` callbacks and before WaitWritten covers
  // it: once WaitWritten(lsn) returns, the `written` of every record below lsn has
  // returned. A replicated primary ships its records to its followers from it, so no
  // follower holds a record a SIGKILL can take from this log (pod_storage.h).
  void Append(std::shared_ptr<const std::string> record, Done done, Done written);

  // Blocks while the records appended since the last Truncated hold more than
  // max_log_bytes (returns at once after a failure or when closing). Call before taking
  // locks the materializer needs. Thread-safe.
  void WaitForRoom();
  // Records below `cut` were deleted (a materialization round). Thread-safe.
  void Truncated(uint64_t cut);
  // Changes max_log_bytes (0: no bound), e.g. none while a lazy replay keeps the log.
  // Records appended while there was no bound do not count against a later one.
  void SetMaxLogBytes(uint64_t bytes);
  // The bytes WaitForRoom weighs against max_log_bytes: of the records appended since the
  // last Truncated (0 while there is no bound). The materializer starts a round early
  // when they reach half the bound, so pushes do not wait for its timer. Thread-safe.
  uint64_t live_bytes() const;
  uint64_t max_log_bytes() const;

  // OK, or UNAVAILABLE once a write has failed (see Append). Thread-safe.
  absl::Status health() const;

  // The sequence number the next record will get: records below it are queued.
  uint64_t next_lsn() const;
  // Blocks until every record below `lsn` has been written (or failed); returns the first
  // write error, if any. In periodic mode the writer writes its group at once rather than
  // at the end of its gathering window. Thread-safe.
  absl::Status WaitWritten(uint64_t lsn);

  struct Stats {
    uint64_t records = 0, groups = 0, bytes = 0, pending_bytes = 0;
    double max_lag_ms = 0;  // longest a record waited for its write, since start
  };
  Stats stats() const;

 private:
  struct Entry {
    uint64_t lsn;
    std::shared_ptr<const std::string> record;
    uint32_t crc;  // LogFiles::Checksum(record), computed by the caller
    Done done;     // null once acknowledged
    Done written;  // null: none (see Append)
    absl::Time queued;
  };
  void Run();
  void RunSyncer();  // periodic mode: fsyncs the WAL every flush_ms

  StorageDb* const db_;
  const DurableLogOptions options_;

  mutable absl::Mutex mu_;
  std::vector<Entry> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t next_lsn_ ABSL_GUARDED_BY(mu_);
  uint64_t written_lsn_ ABSL_GUARDED_BY(mu_);  // records below it are written
  size_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t waiting_ ABSL_GUARDED_BY(mu_) = 0;  // queued records not acknowledged yet
  // Bytes ever appended, and for each record since the last truncation its lsn and the
  // bytes appended before it: live log bytes = appended_ - the first mark's.
  uint64_t appended_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::pair<uint64_t, uint64_t>> marks_ ABSL_GUARDED_BY(mu_);
  uint64_t max_log_bytes_ ABSL_GUARDED_BY(mu_);
  // When the oldest record of the group being written was queued (InfiniteFuture: none).
  absl::Time writing_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  std::thread writer_;
  std::thread syncer_;
};

}  // namespace ps
