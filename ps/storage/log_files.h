// The push log's files: records of applied pushes (ps/storage/log_record.h) appended to segment
// files beside the pod's RocksDB database, `<data_dir>/pushlog/<first lsn>.log`.
//
// Why not a RocksDB column family: a record written there is copied into a write batch,
// checksummed by RocksDB's WAL, copied into a memtable and later flushed, which cost the
// durable push path more CPU than the push itself (docs/benchmarks.md). Here a group of
// records is one writev() (one copy, into the page cache) and at most one fdatasync.
//
// File format (little-endian): records back to back, each a 24-byte header
//   u64 lsn, u32 payload bytes, u32 CRC-32C of the payload, u32 CRC-32C of the previous
//   16 header bytes, u32 zero
// followed by the payload. A segment is named by its first record's lsn (20 digits); lsns
// are consecutive within and across segments. Reading stops at the first record that is
// torn or fails its checksum: at the end of the newest segment that is a write cut short by
// a crash (never acknowledged), which is cut off; anywhere else it is DATA_LOSS.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace ps {

struct LogFilesOptions {
  std::string dir;  // created if missing
  // A segment is closed and a new one started once it holds this many bytes.
  size_t segment_bytes = size_t{64} << 20;
  // Fdatasync a segment when it is closed (machine and periodic durability: Sync only
  // syncs the open segment).
  bool sync_on_rotate = false;
  // Fault injection (StorageDbOptions.inject_write_error): when it returns true, a write
  // or sync fails with "No space left on device".
  std::function<bool()> inject_write_error;
};

// One record to append: `crc` is LogFiles::Checksum(record), computed by the caller (on
// the request threads, not the single writer thread).
struct LogAppend {
  uint64_t lsn;
  absl::string_view record;
  uint32_t crc;
};

// A record read back: the view points into a buffer of the LogRead that returned it.
struct LogEntryView {
  uint64_t lsn;
  absl::string_view record;
};

// Every record of the log from some lsn on, in order, and the buffers they live in.
struct LogRead {
  // What the views point into: a read-only mapping of each segment file (the page cache
  // itself: no copy), or a record's own buffer.
  std::vector<std::shared_ptr<const void>> buffers;
  std::vector<LogEntryView> records;
  uint64_t bytes = 0;  // payload bytes
};

class LogFiles {
 public:
  static uint32_t Checksum(absl::string_view record);

  // Opens (creates) the directory. Nothing is read until ReadAll.
  static absl::StatusOr<std::unique_ptr<LogFiles>> Open(const LogFilesOptions& options);
  ~LogFiles();

  // Reads every record with lsn >= `from` (older segments, whose deletion a crash
  // interrupted, are deleted). Cuts off a torn tail of the newest segment. DATA_LOSS for a
  // damaged record elsewhere or a missing segment (a gap in the lsns). Call once, before
  // the first Append.
  absl::Status ReadAll(uint64_t from, LogRead* out);

  // Appends the records (consecutive lsns, continuing the log) in one writev; `sync`
  // fdatasyncs them. On an error the log is left as written (a torn tail at worst).
  // One caller at a time.
  absl::Status Append(absl::Span<const LogAppend> records, bool sync);
  // Fdatasyncs what Append wrote. Thread-safe (with Append too).
  absl::Status Sync();
  // Deletes the segments that hold only records below `cut` (never the open one).
  // Thread-safe.
  absl::Status DeleteBelow(uint64_t cut);
  // Copies the segments, as written up to now (whole groups), into `dir` (created).
  // Thread-safe; appends continue meanwhile.
  absl::Status CopyTo(const std::string& dir);
  // Bytes in the segment files. Thread-safe.
  uint64_t bytes() const;

 private:
  struct Segment;
  explicit LogFiles(const LogFilesOptions& options);
  absl::Status Injected(absl::string_view what) const;

  const LogFilesOptions options_;
  mutable absl::Mutex mu_;
  // Oldest first; the last one is open for appends (if any append happened).
  std::vector<std::shared_ptr<Segment>> segments_ ABSL_GUARDED_BY(mu_);
  bool open_for_append_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ps
