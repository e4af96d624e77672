// The master's durable storage: a RocksDB under its data dir, written in synced atomic
// batches. The only file that sees RocksDB; rocksdb::Status becomes absl::Status here.
//
// Keys (values are serialized protos from proto/master_state.proto and proto/master.proto):
//   config                      ClusterConfig
//   counters                    Counters
//   map                         ShardMapRecord
//   pod/<pod id>                PodRecord
//   table/<name>, dense/<name>  TableSpec, DenseSpec (normalized)
//   worker/<20-digit id>        WorkerRecord
//   job/<name>                  JobRecord
//   task/<job>/<20-digit id>    Task
//   move/<20-digit id>          MoveRecord (a move being copied)
//   checkpoint/<20-digit id>    CheckpointInfo (a cluster checkpoint taken)
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace google::protobuf {
class MessageLite;
}

namespace ps {

// Puts and deletes applied together, all or nothing.
// Not thread-safe; build it on one thread, then hand it to MasterStore::Write.
class StoreBatch {
 public:
  // Sets `key` to the serialized `value` (copied now; `value` may change afterwards).
  void Put(std::string key, const google::protobuf::MessageLite& value);
  // Removes `key` (absent keys are fine).
  void Delete(std::string key) { ops_.emplace_back(std::move(key), std::nullopt); }
  bool empty() const { return ops_.empty(); }
  // (key, value) in order; a missing value is a delete.
  const std::vector<std::pair<std::string, std::optional<std::string>>>& ops() const {
    return ops_;
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> ops_;
};

class MasterStore {
 public:
  // Opens (creating if missing) the database in `dir`. INTERNAL / UNAVAILABLE with
  // RocksDB's message on failure (e.g. another master holds the directory's lock).
  static absl::StatusOr<std::unique_ptr<MasterStore>> Open(const std::string& dir);
  virtual ~MasterStore() = default;

  // Applies `batch` atomically and syncs it to disk before returning. Thread-safe.
  virtual absl::Status Write(const StoreBatch& batch) = 0;
  // The value of `key`, or nullopt when absent. Thread-safe.
  virtual absl::StatusOr<std::optional<std::string>> Get(absl::string_view key) = 0;
  // A consistent copy of the whole store in `dir` (must not exist), hard-linked where it
  // can: a master started with --data_dir=<dir> resumes from it. Thread-safe.
  virtual absl::Status Checkpoint(const std::string& dir) = 0;
  // Calls fn(key, value) for every key starting with `prefix`, in key order; stops at and
  // returns the first error fn returns. Thread-safe.
  virtual absl::Status Scan(
      absl::string_view prefix,
      const std::function<absl::Status(absl::string_view, absl::string_view)>& fn) = 0;
};

// Parses `value`, the record stored at `key`, into `out`. DATA_LOSS naming the key when it
// does not parse.
absl::Status ParseRecord(absl::string_view key, absl::string_view value,
                         google::protobuf::MessageLite* out);

// Calls fn(key, record) for every record under `prefix`, in key order, each parsed as a
// `Record` (a proto message); stops at and returns the first parse error or error of fn.
template <typename Record, typename Fn>
absl::Status ScanRecords(MasterStore& store, absl::string_view prefix, Fn fn) {
  return store.Scan(prefix, [&](absl::string_view key, absl::string_view value) -> absl::Status {
    Record record;
    if (absl::Status s = ParseRecord(key, value, &record); !s.ok()) return s;
    return fn(key, std::move(record));
  });
}

// The record at `key` parsed as a `Record`, or nullopt when absent. DATA_LOSS when it does
// not parse; store errors as they come.
template <typename Record>
absl::StatusOr<std::optional<Record>> GetRecord(MasterStore& store, absl::string_view key) {
  absl::StatusOr<std::optional<std::string>> value = store.Get(key);
  if (!value.ok()) return value.status();
  if (!value->has_value()) return std::optional<Record>();
  Record record;
  if (absl::Status s = ParseRecord(key, **value, &record); !s.ok()) return s;
  return std::optional<Record>(std::move(record));
}

}  // namespace ps
