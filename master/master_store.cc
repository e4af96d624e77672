#include "master/master_store.h"

#include <google/protobuf/message_lite.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/utilities/checkpoint.h>
#include <rocksdb/write_batch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ps {
namespace {

absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  const std::string msg = absl::StrCat("master store: ", what, ": ", s.ToString());
  if (s.IsBusy() || s.IsTimedOut() || s.IsTryAgain() || s.IsIOError()) {
    return absl::UnavailableError(msg);
  }
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(msg);
  return absl::InternalError(msg);
}

rocksdb::Slice ToSlice(absl::string_view s) { return rocksdb::Slice(s.data(), s.size()); }

class RocksMasterStore final : public MasterStore {
 public:
  explicit RocksMasterStore(std::unique_ptr<rocksdb::DB> db) : db_(std::move(db)) {}

  absl::Status Checkpoint(const std::string& dir) override {
    rocksdb::Checkpoint* raw = nullptr;
    absl::Status s = FromRocks(rocksdb::Checkpoint::Create(db_.get(), &raw), "checkpoint");
    if (!s.ok()) return s;
    std::unique_ptr<rocksdb::Checkpoint> checkpoint(raw);
    return FromRocks(checkpoint->CreateCheckpoint(dir), "checkpoint to " + dir);
  }

  absl::Status Write(const StoreBatch& batch) override {
    rocksdb::WriteBatch wb;
    for (const auto& [key, value] : batch.ops()) {
      rocksdb::Status s = value.has_value() ? wb.Put(key, *value) : wb.Delete(key);
      if (!s.ok()) return FromRocks(s, "batch");
    }
    rocksdb::WriteOptions options;
    options.sync = true;
    return FromRocks(db_->Write(options, &wb), "write");
  }

  absl::StatusOr<std::optional<std::string>> Get(absl::string_view key) override {
    std::string value;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), ToSlice(key), &value);
    if (s.IsNotFound()) return std::nullopt;
    if (!s.ok()) return FromRocks(s, absl::StrCat("get ", key));
    return value;
  }

  absl::Status Scan(
      absl::string_view prefix,
      const std::function<absl::Status(absl::string_view, absl::string_view)>& fn) override {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
    for (it->Seek(ToSlice(prefix)); it->Valid() && it->key().starts_with(ToSlice(prefix));
         it->Next()) {
      absl::Status s = fn(absl::string_view(it->key().data(), it->key().size()),
                          absl::string_view(it->value().data(), it->value().size()));
      if (!s.ok()) return s;
    }
    return FromRocks(it->status(), absl::StrCat("scan ", prefix));
  }

 private:
  std::unique_ptr<rocksdb::DB> db_;
};

}  // namespace

absl::Status ParseRecord(absl::string_view key, absl::string_view value,
                         google::protobuf::MessageLite* out) {
  if (!out->ParseFromArray(value.data(), static_cast<int>(value.size()))) {
    return absl::DataLossError(absl::StrCat("master store: unparsable record at key '", key, "'"));
  }
  return absl::OkStatus();
}

void StoreBatch::Put(std::string key, const google::protobuf::MessageLite& value) {
  ops_.emplace_back(std::move(key), value.SerializeAsString());
}

absl::StatusOr<std::unique_ptr<MasterStore>> MasterStore::Open(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("master store: empty data dir");
  rocksdb::Options options;
  options.create_if_missing = true;
  // The master's state is small (pods, workers, tasks): keep RocksDB's footprint small.
  options.write_buffer_size = 8 << 20;
  options.max_open_files = 256;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, dir, &raw);
  if (!s.ok()) return FromRocks(s, absl::StrCat("open ", dir));
  return std::unique_ptr<MasterStore>(
      std::make_unique<RocksMasterStore>(std::unique_ptr<rocksdb::DB>(raw)));
}

}  // namespace ps
