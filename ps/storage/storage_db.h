// The RocksDB database of one PS pod (its --data_dir): the system of record for what the
// pod owns. RocksDB types stay inside storage_db.cc; rocksdb::Status is converted to
// absl::Status there, once.
//
// Column families and keys (docs/architecture.md, "On-disk layout"):
//   meta  "format"        -> "ps-server-1"
//         "table/<name>"  -> u32 table number, then the normalized TableSpec (protobuf)
//         "dense/<name>"  -> the normalized DenseSpec (protobuf)
//         "dedup"         -> PushDedup::Serialize() as of the last log truncation
//         "log_base"      -> u64be: log records below it were deleted
//         "storage_id"    -> 32 hex digits, random, written when the database is created;
//                            the database's one identity (lost-volume check, export cursors)
//         "journal..."    -> the change journal (ps/storage/change_journal.h)
// Beside the column families: <dir>/RUN-ps-server, the run marker (ps/storage/run_marker.h),
// present while a pod runs on the database and after it crashed.
//   rows  u32be table number, u64be id^2^63 -> u64 step, dim weights, slot floats
//         ff ff ff ff, dense name           -> u64 step, weights, slot floats
//   log   u64be log sequence number         -> one push record (ps/storage/log_record.h): written
//                                              by earlier versions only, still read
// Floats and the u64 step in values are little-endian. The push log itself lives in
// segment files beside the database, <dir>/pushlog (ps/storage/log_files.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/ps.pb.h"
#include "ps/storage/log_files.h"

namespace ps {

struct StorageDbOptions {
  std::string dir;
  // Memtable of the log column family (only read now: the log is in files, see
  // log_files.h).
  size_t log_memtable_bytes = size_t{256} << 20;
  // Push log segment size, and whether a full segment is fsynced when the next one starts
  // (the durability modes that fsync: see LogFilesOptions).
  size_t log_segment_bytes = size_t{64} << 20;
  bool sync_log_on_rotate = false;
  // Rows are read back one by one (ReadRows: a pod with a memory budget): the rows
  // column family then keeps a skiplist memtable, which serves point reads.
  bool rows_point_reads = false;
  // Fault injection, for tests: when set, every append to or sync of a database file
  // first calls it, and fails with an injected "No space left on device" I/O error when
  // it returns true (a full disk). Called from RocksDB's threads; must be thread-safe.
  std::function<bool()> inject_write_error;
};

// A group of row writes (from StorageDb::NewRowBatch), applied by StorageDb::WriteRows.
// Not thread-safe.
class RowBatch {
 public:
  ~RowBatch();
  RowBatch(RowBatch&&) noexcept;
  void AddRow(uint32_t table_no, int64_t id, uint64_t step, absl::Span<const float> weights,
              absl::Span<const float> slots);
  void AddDense(absl::string_view name, uint64_t step, absl::Span<const float> values);
  // Deletes (a vshard moved away).
  void DeleteRow(uint32_t table_no, int64_t id);
  void DeleteDense(absl::string_view name);
  size_t bytes() const;
  size_t count() const { return count_; }
  void Clear();

 private:
  friend class StorageDb;
  RowBatch();
  struct Rep;
  std::unique_ptr<Rep> rep_;
  size_t count_ = 0;
};

// Rows gathered for one table file (StorageDb::IngestRows): the materializer's path, which
// skips the memtable, its sort and its flush. Not thread-safe.
class RowFile {
 public:
  void AddRow(uint32_t table_no, int64_t id, uint64_t step, absl::Span<const float> weights,
              absl::Span<const float> slots);
  void Reserve(size_t bytes) { values_.reserve(bytes); }
  size_t bytes() const { return values_.size(); }
  size_t count() const { return entries_.size(); }
  void Clear() {
    entries_.clear();
    values_.clear();
  }

 private:
  friend class StorageDb;
  struct Entry {
    uint32_t table_no;
    uint64_t key_id;  // id ^ 2^63: orders as the key encoding does
    size_t offset;    // of the value in values_
    uint32_t size;
  };
  std::vector<Entry> entries_;
  std::string values_;
};

// One stored row, as recovery reads it; the spans point into the iterator's buffer and
// live only during the callback.
struct StoredRow {
  uint32_t table_no = 0;
  int64_t id = 0;
  uint64_t step = 0;
  absl::Span<const float> values;  // weights then slots
};

// 128 random bits from the OS as 32 hex digits, the first 16 never all zero: a new
// database's storage id, and the data identity of a pod in memory (drawn once per
// process). Thread-safe.
std::string NewStorageId();

// The storage id as the 64-bit identity an export cursor carries for the database
// (ps/storage/change_journal.h): its first 16 hex digits, so a cursor's entry names the
// database whose storage id the master shows (0 never: see the .cc). DATA_LOSS for an id
// that is not 32 hex digits.
absl::StatusOr<uint64_t> StorageIdentity(absl::string_view storage_id);

class StorageDb {
 public:
  // Opens the database in options.dir, creating it if the directory is missing or empty.
  // A directory that holds something that is not a pod's database (or a damaged one)
  // is refused with FAILED_PRECONDITION / DATA_LOSS naming what is wrong: never a silent
  // fresh start over existing files. A creation carries the marker file
  // <dir>/CREATING-ps-server from before RocksDB writes anything until the format marker
  // is durable; a directory that has it (a first start cut short by a full disk or a kill)
  // is emptied and created again.
  static absl::StatusOr<std::unique_ptr<StorageDb>> Open(const StorageDbOptions& options);
  ~StorageDb();

  // This database's identity: 128 random bits (32 hex digits) drawn when it was created
  // (or, for a database an older version created, the first time it was opened by one
  // that writes it), stored in meta. A pod reports it to the master at registration, so a
  // data dir that was lost and started afresh is told apart from the one the pod had.
  // Constant after Open; thread-safe.
  const std::string& storage_id() const;
  // StorageIdentity(storage_id()): the same identity as 64 bits, as export cursors carry
  // it. Constant after Open; thread-safe.
  uint64_t identity() const;
  // Whether this Open created the database (the directory was missing or empty).
  bool created() const;

  // Catalog. PutTable stores the spec under `table_no`; both write synchronously (fsync)
  // before returning, since a table's log records are useless without it.
  absl::Status PutTable(uint32_t table_no, const TableSpec& spec);
  absl::Status PutDense(const DenseSpec& spec);
  struct Catalog {
    std::vector<std::pair<uint32_t, TableSpec>> tables;
    std::vector<DenseSpec> dense;
    std::string dedup;      // empty if never truncated
    uint64_t log_base = 1;  // log records below it were deleted
    // Admission counters (AdmissionSketch::Serialize) by table number, as of log_base.
    std::vector<std::pair<uint32_t, std::string>> admission;
  };
  absl::StatusOr<Catalog> LoadCatalog();

  // Appends log records in one write (a group commit); `sync` fsyncs them. One caller at
  // a time.
  absl::Status AppendLog(absl::Span<const LogAppend> records, bool sync);
  // Fsyncs what AppendLog wrote without sync. Thread-safe.
  absl::Status SyncLog();
  // Fsyncs RocksDB's WAL (rows written with WriteRowsLogged).
  absl::Status SyncWal();
  // Every log record from `from` on, in order (records an earlier version wrote to the log
  // column family first). Call once, before the first AppendLog.
  absl::Status ReadLog(uint64_t from, LogRead* out);
  // Stores the de-duplication state and `cut` as the log's base (log records below it are
  // then dead) in one atomic write, then deletes the log files that hold only records below
  // it.
  // `admission`: the admission counters of tables (by number) as of `cut`, stored in the
  // same write.
  absl::Status TruncateLog(uint64_t cut, absl::string_view dedup, bool sync,
                           const std::vector<std::pair<uint32_t, std::string>>& admission = {});

  RowBatch NewRowBatch();
  // Writes rows without the WAL: they are durable only after FlushRows, which the
  // materializer calls before it truncates the log records that would rebuild them.
  absl::Status WriteRows(RowBatch* batch);
  // The same through the WAL: durable against a process crash once written, against power
  // loss after SyncLog; no flush needed (rows a live migration brings in).
  absl::Status WriteRowsLogged(RowBatch* batch);
  absl::Status FlushRows();
  // Writes the rows as one sorted table file and ingests it into the rows column family:
  // durable when this returns (the file and the manifest are synced), newer than every row
  // written before. A row added twice keeps its last value. Clears `rows`. One caller at a
  // time. On failure the rows are stored whole or not at all, and the database still opens
  // (the files an ingestion linked in are never deleted while it runs: the MANIFEST may
  // name them even though its sync failed).
  absl::Status IngestRows(RowFile* rows);
  // Calls fn for every stored table row (unless !table_rows: a lazy start skips them) and
  // fn_dense for every dense tensor.
  absl::Status ForEachRow(const std::function<absl::Status(const StoredRow&)>& fn,
                          const std::function<absl::Status(absl::string_view name, uint64_t step,
                                                           absl::Span<const float>)>& fn_dense,
                          bool table_rows = true);

  // Calls fn for every stored row of table `table_no`, in id order of the key encoding.
  absl::Status ForEachTableRow(uint32_t table_no,
                               const std::function<absl::Status(const StoredRow&)>& fn);

  // Reads stored rows of table `table_no` in one batched MultiGet: for each i, if row
  // ids[i] is stored with row_floats floats, copies them to values[i*row_floats...] and its
  // step to steps[i] and sets found[i]. DATA_LOSS for a stored row of another size.
  // Thread-safe.
  absl::Status ReadRows(uint32_t table_no, absl::Span<const int64_t> ids, size_t row_floats,
                        float* values, uint64_t* steps, bool* found);

  // A consistent copy of the database in `dir` (must not exist), hard-linked where it can.
  absl::Status Checkpoint(const std::string& dir);

  // Keys of the meta column family that other storage code owns (the change journal,
  // ps/storage/change_journal.h). WriteMeta applies the puts and the deletions of the key
  // ranges [first, second) in one atomic write (fsynced with `sync`). ScanMeta calls fn for
  // every key in [from, to), in order; fn's views live only during the call. GetMeta:
  // NOT_FOUND for a missing key. Thread-safe.
  absl::Status WriteMeta(absl::Span<const std::pair<std::string, std::string>> puts,
                         absl::Span<const std::pair<std::string, std::string>> delete_ranges,
                         bool sync);
  absl::Status ScanMeta(
      absl::string_view from, absl::string_view to,
      const std::function<absl::Status(absl::string_view key, absl::string_view value)>& fn);
  absl::StatusOr<std::string> GetMeta(absl::string_view key);

  // The run marker, the file <dir>/RUN-ps-server (ps/storage/run_marker.h gives it its
  // meaning): beside the database, not in it, so a checkpoint or an export's copy of the
  // database never carries it. ReadRunMarker: its content, or nullopt when there is none.
  // WriteRunMarker replaces it and fsyncs it and the directory; RemoveRunMarker removes it
  // (if there) and fsyncs the directory. UNAVAILABLE for an I/O error. Not thread-safe
  // (a pod's open and close only).
  absl::StatusOr<std::optional<std::string>> ReadRunMarker();
  absl::Status WriteRunMarker(absl::string_view content);
  absl::Status RemoveRunMarker();

  // RocksDB's estimate of the stored rows (keys of the rows column family).
  uint64_t EstimateRows();

  // Bytes of live SST files and push log files, for Stats.
  uint64_t disk_bytes();

 private:
  struct Rep;
  explicit StorageDb(std::unique_ptr<Rep> rep);
  std::unique_ptr<Rep> rep_;
};

}  // namespace ps
