#include "ps/storage/storage_db.h"

#include <dirent.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/memtablerep.h>
#include <rocksdb/sst_file_writer.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/checkpoint.h>
#include <rocksdb/write_batch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"

namespace ps {
namespace {

constexpr char kFormat[] = "ps-server-1";
constexpr char kDenseKeyPrefix[] = "\xff\xff\xff\xff";

absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": ", s.ToString());
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsNoSpace() || s.IsIOError()) return absl::UnavailableError(msg);
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsInvalidArgument()) return absl::FailedPreconditionError(msg);
  return absl::InternalError(msg);
}

// A file system that fails appends and syncs with ENOSPC while `fail` says so (see
// StorageDbOptions.inject_write_error).
class FaultFile final : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  FaultFile(std::unique_ptr<rocksdb::FSWritableFile> file, std::function<bool()> fail)
      : FSWritableFileOwnerWrapper(std::move(file)), fail_(std::move(fail)) {}
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                           rocksdb::IODebugContext* d) override {
    if (fail_()) return Injected();
    return FSWritableFileOwnerWrapper::Append(data, o, d);
  }
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                           const rocksdb::DataVerificationInfo& v,
                           rocksdb::IODebugContext* d) override {
    if (fail_()) return Injected();
    return FSWritableFileOwnerWrapper::Append(data, o, v, d);
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& o,
                                     rocksdb::IODebugContext* d) override {
    if (fail_()) return Injected();
    return FSWritableFileOwnerWrapper::PositionedAppend(data, offset, o, d);
  }
  rocksdb::IOStatus Sync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* d) override {
    if (fail_()) return Injected();
    return FSWritableFileOwnerWrapper::Sync(o, d);
  }
  rocksdb::IOStatus Fsync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* d) override {
    if (fail_()) return Injected();
    return FSWritableFileOwnerWrapper::Fsync(o, d);
  }
  static rocksdb::IOStatus Injected() {
    return rocksdb::IOStatus::NoSpace("injected fault", "No space left on device");
  }

 private:
  std::function<bool()> fail_;
};

class FaultFileSystem final : public rocksdb::FileSystemWrapper {
 public:
  FaultFileSystem(std::shared_ptr<rocksdb::FileSystem> base, std::function<bool()> fail)
      : FileSystemWrapper(std::move(base)), fail_(std::move(fail)) {}
  const char* Name() const override { return "PsFaultFileSystem"; }
  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* d) override {
    rocksdb::IOStatus s = FileSystemWrapper::NewWritableFile(f, o, r, d);
    if (s.ok()) *r = std::make_unique<FaultFile>(std::move(*r), fail_);
    return s;
  }
  rocksdb::IOStatus ReopenWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                       std::unique_ptr<rocksdb::FSWritableFile>* r,
                                       rocksdb::IODebugContext* d) override {
    rocksdb::IOStatus s = FileSystemWrapper::ReopenWritableFile(f, o, r, d);
    if (s.ok()) *r = std::make_unique<FaultFile>(std::move(*r), fail_);
    return s;
  }

 private:
  std::function<bool()> fail_;
};

// The file system every pod database goes through: while an ingestion runs (IngestRows),
// the files it links into the database are never deleted. RocksDB deletes them when an
// ingestion fails, even when the failure is the sync of the MANIFEST record that adds
// them, which may already be in the file: the database would then name a file that is
// gone and never open again (facebook/rocksdb#5379 fixed this for flushes, not for
// ingestion). A file kept this way is either named by the MANIFEST (the rows were
// ingested after all) or an orphan that RocksDB deletes itself (at the next open, or when
// it next purges obsolete files). Thread-safe.
class IngestGuardFileSystem final : public rocksdb::FileSystemWrapper {
 public:
  explicit IngestGuardFileSystem(std::shared_ptr<rocksdb::FileSystem> base)
      : FileSystemWrapper(std::move(base)) {}
  const char* Name() const override { return "PsIngestGuardFileSystem"; }

  // Between Begin and End, files linked from `source_dir` are kept.
  void BeginIngest(const std::string& source_dir) {
    absl::MutexLock lock(&mu_);
    source_dir_ = source_dir + "/";
    linked_.clear();
  }
  // Returns how many deletions it refused.
  size_t EndIngest() {
    absl::MutexLock lock(&mu_);
    source_dir_.clear();
    linked_.clear();
    const size_t kept = kept_;
    kept_ = 0;
    return kept;
  }

  rocksdb::IOStatus LinkFile(const std::string& src, const std::string& target,
                             const rocksdb::IOOptions& o, rocksdb::IODebugContext* d) override {
    rocksdb::IOStatus s = FileSystemWrapper::LinkFile(src, target, o, d);
    absl::MutexLock lock(&mu_);
    if (s.ok() && !source_dir_.empty() && absl::StartsWith(src, source_dir_)) {
      linked_.push_back(target);
    }
    return s;
  }
  rocksdb::IOStatus DeleteFile(const std::string& f, const rocksdb::IOOptions& o,
                               rocksdb::IODebugContext* d) override {
    {
      absl::MutexLock lock(&mu_);
      if (std::find(linked_.begin(), linked_.end(), f) != linked_.end()) {
        ++kept_;
        return rocksdb::IOStatus::OK();
      }
    }
    return FileSystemWrapper::DeleteFile(f, o, d);
  }

 private:
  absl::Mutex mu_;
  std::string source_dir_ ABSL_GUARDED_BY(mu_);  // empty: no ingestion runs
  std::vector<std::string> linked_ ABSL_GUARDED_BY(mu_);
  size_t kept_ ABSL_GUARDED_BY(mu_) = 0;
};

void PutBE32(std::string* out, uint32_t v) {
  for (int i = 3; i >= 0; --i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutBE64(std::string* out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out->push_back(static_cast<char>(v >> (8 * i)));
}
uint64_t GetBE(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

std::string LogKey(uint64_t lsn) {
  std::string k;
  PutBE64(&k, lsn);
  return k;
}

// Value: u64 step then floats (little-endian, this machine's order).
std::string RowValue(uint64_t step, absl::Span<const float> a, absl::Span<const float> b) {
  std::string v(sizeof(step) + (a.size() + b.size()) * sizeof(float), '\0');
  std::memcpy(v.data(), &step, sizeof(step));
  std::memcpy(v.data() + sizeof(step), a.data(), a.size() * sizeof(float));
  std::memcpy(v.data() + sizeof(step) + a.size() * sizeof(float), b.data(),
              b.size() * sizeof(float));
  return v;
}

bool DirIsMissingOrEmpty(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return errno == ENOENT;
  bool empty = true;
  while (dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      empty = false;
      break;
    }
  }
  closedir(d);
  return empty;
}

}  // namespace

struct RowBatch::Rep {
  rocksdb::WriteBatch batch;
  rocksdb::ColumnFamilyHandle* cf = nullptr;
};

RowBatch::RowBatch() : rep_(std::make_unique<Rep>()) {}
RowBatch::~RowBatch() = default;
RowBatch::RowBatch(RowBatch&&) noexcept = default;

namespace {
std::string RowKey(uint32_t table_no, int64_t id) {
  std::string key;
  key.reserve(12);
  PutBE32(&key, table_no);
  PutBE64(&key, static_cast<uint64_t>(id) ^ (uint64_t{1} << 63));
  return key;
}
}  // namespace

void RowBatch::AddRow(uint32_t table_no, int64_t id, uint64_t step, absl::Span<const float> weights,
                      absl::Span<const float> slots) {
  rep_->batch.Put(rep_->cf, RowKey(table_no, id), RowValue(step, weights, slots));
  ++count_;
}

void RowBatch::DeleteRow(uint32_t table_no, int64_t id) {
  rep_->batch.Delete(rep_->cf, RowKey(table_no, id));
  ++count_;
}

void RowBatch::DeleteDense(absl::string_view name) {
  rep_->batch.Delete(rep_->cf, absl::StrCat(kDenseKeyPrefix, name));
  ++count_;
}

void RowBatch::AddDense(absl::string_view name, uint64_t step, absl::Span<const float> values) {
  rep_->batch.Put(rep_->cf, absl::StrCat(kDenseKeyPrefix, name), RowValue(step, values, {}));
  ++count_;
}

size_t RowBatch::bytes() const { return rep_->batch.GetDataSize(); }

void RowBatch::Clear() {
  rep_->batch.Clear();
  count_ = 0;
}

struct StorageDb::Rep {
  std::string dir;
  std::shared_ptr<IngestGuardFileSystem> fs;  // every file of the database goes through it
  std::unique_ptr<rocksdb::Env> env;          // over fs; outlives db
  std::unique_ptr<rocksdb::DB> db;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;  // default, meta, rows, log
  rocksdb::ColumnFamilyHandle* meta = nullptr;
  rocksdb::ColumnFamilyHandle* rows = nullptr;
  rocksdb::ColumnFamilyHandle* log = nullptr;
  std::unique_ptr<LogFiles> log_files;
  rocksdb::Options rows_file_options;  // for SstFileWriter (IngestRows)
  std::string ingest_dir;
  uint64_t next_ingest = 0;
  std::string storage_id;  // meta "storage_id"
  uint64_t identity = 0;   // StorageIdentity(storage_id)
  bool created = false;    // this Open created the database

  ~Rep() {
    for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
  }

  // The steps of StorageDb::Open, in order.
  absl::Status OpenDatabase(const StorageDbOptions& options, bool fresh);
  absl::Status ClearIngestDir();
  absl::Status OpenLogFiles(const StorageDbOptions& options);
  absl::Status CheckFormat(bool fresh);
};

namespace {

// Present while a new pod's database is being created: written (and synced) before
// RocksDB writes anything in the directory, removed once the format marker is durable. A
// directory that carries it holds only what a cut-short first start wrote (nothing was
// ever acknowledged from it), so the next start begins again.
constexpr char kCreatingMarker[] = "CREATING-ps-server";

// The run marker's file (StorageDb::ReadRunMarker).
constexpr char kRunMarker[] = "RUN-ps-server";

// Fsyncs the directory itself, so that a file created or removed in it stays so.
absl::Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot open ", dir, ": ", std::strerror(errno)));
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot fsync ", dir, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

// Removes everything inside `dir` (not `dir` itself: it may be a volume's mount point).
absl::Status EmptyDir(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::filesystem::remove_all(e.path(), ec);
    if (ec) break;
  }
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot empty ", dir, " (a first start cut short): ", ec.message()));
  }
  return absl::OkStatus();
}

// Open's first step: true if `dir` starts a new pod (it was missing or empty, or held
// what a cut-short first start left, and now exists, empty but for the creating marker),
// false if it holds a RocksDB database. FAILED_PRECONDITION for a directory that holds
// something else, or that cannot be created.
absl::StatusOr<bool> PrepareDir(const std::string& dir) {
  const std::string marker = absl::StrCat(dir, "/", kCreatingMarker);
  struct stat st;
  if (!DirIsMissingOrEmpty(dir)) {
    if (stat(marker.c_str(), &st) == 0) {
      LOG(WARNING) << "data dir " << dir << " holds a first start that did not finish ("
                   << kCreatingMarker << " is there): starting it again";
      RETURN_IF_ERROR(EmptyDir(dir));
    } else if (stat((dir + "/CURRENT").c_str(), &st) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "data dir ", dir,
          " is not empty but holds no RocksDB database (no CURRENT file): refusing to start "
          "over it. Point --data_dir at the pod's volume, or at an empty directory for a new "
          "pod"));
    } else {
      return false;
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create data dir ", dir, ": ", ec.message()));
  }
  const int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", marker, ": ", std::strerror(errno)));
  }
  ::close(fd);
  RETURN_IF_ERROR(SyncDir(dir));
  return true;
}

// Open's last step for a new pod: the database is whole (its format marker is durable), so
// the creating marker goes.
absl::Status FinishCreation(const std::string& dir) {
  const std::string marker = absl::StrCat(dir, "/", kCreatingMarker);
  if (::unlink(marker.c_str()) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot remove ", marker, ": ", std::strerror(errno)));
  }
  return SyncDir(dir);
}

// The database's options: a new pod's database is created (and must not exist yet); an
// existing one must already have every column family.
rocksdb::DBOptions DatabaseOptions(const StorageDbOptions& options, bool fresh) {
  rocksdb::DBOptions db_options;
  db_options.create_if_missing = fresh;
  db_options.error_if_exists = fresh;
  db_options.create_missing_column_families = fresh;
  db_options.paranoid_checks = true;
  db_options.max_background_jobs = 2;
  // Required by the vector memtable; writes come from one thread at a time anyway.
  db_options.allow_concurrent_memtable_write = false;
  db_options.keep_log_file_num = 5;
  db_options.max_total_wal_size = 4 * options.log_memtable_bytes;
  return db_options;
}

rocksdb::ColumnFamilyOptions RowsOptions(const StorageDbOptions& options) {
  rocksdb::ColumnFamilyOptions rows_options;
  rows_options.compression = rocksdb::kNoCompression;  // float rows barely compress
  rows_options.write_buffer_size = size_t{128} << 20;
  rows_options.max_write_buffer_number = 4;
  // Each materializer round rewrites the rows that changed, often most of them: universal
  // compaction merges those runs with far less rewriting than leveled compaction, which
  // otherwise falls behind and stalls every write of the pod (the log's too).
  rows_options.compaction_style = rocksdb::kCompactionStyleUniversal;
  rows_options.level0_slowdown_writes_trigger = 40;
  rows_options.level0_stop_writes_trigger = 60;
  // Rows are written in large groups and read back only after a flush: an append-only
  // vector memtable (sorted once, at flush) costs far less per row than a skiplist. But
  // a point read of a vector memtable copies and sorts it whole, so a pod that reads
  // evicted rows back (ReadRows) keeps the skiplist.
  if (!options.rows_point_reads) {
    rows_options.memtable_factory.reset(new rocksdb::VectorRepFactory());
  }
  rocksdb::BlockBasedTableOptions table_options;
  table_options.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  rows_options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table_options));
  return rows_options;
}

rocksdb::ColumnFamilyOptions LogOptions(const StorageDbOptions& options) {
  rocksdb::ColumnFamilyOptions log_options;
  log_options.compression = rocksdb::kNoCompression;
  log_options.write_buffer_size = options.log_memtable_bytes;
  log_options.max_write_buffer_number = 4;
  return log_options;
}

}  // namespace

// Opens (or creates) the RocksDB database with its column families, through the
// fault-injecting file system if the options ask for one.
absl::Status StorageDb::Rep::OpenDatabase(const StorageDbOptions& options, bool fresh) {
  dir = options.dir;
  rocksdb::DBOptions db_options = DatabaseOptions(options, fresh);
  const rocksdb::ColumnFamilyOptions meta_options;
  const rocksdb::ColumnFamilyOptions rows_options = RowsOptions(options);
  const std::vector<rocksdb::ColumnFamilyDescriptor> families = {
      {rocksdb::kDefaultColumnFamilyName, meta_options},
      {"meta", meta_options},
      {"rows", rows_options},
      {"log", LogOptions(options)}};
  std::shared_ptr<rocksdb::FileSystem> base = rocksdb::FileSystem::Default();
  if (options.inject_write_error) {
    base = std::make_shared<FaultFileSystem>(std::move(base), options.inject_write_error);
  }
  fs = std::make_shared<IngestGuardFileSystem>(std::move(base));
  env = rocksdb::NewCompositeEnv(fs);
  db_options.env = env.get();
  rocksdb::DB* opened = nullptr;
  const rocksdb::Status s = rocksdb::DB::Open(db_options, dir, families, &handles, &opened);
  if (!s.ok()) return FromRocks(s, absl::StrCat("cannot open the pod database in ", dir));
  db.reset(opened);
  rows_file_options = rocksdb::Options(db_options, rows_options);
  meta = handles[1];
  rows = handles[2];
  log = handles[3];
  return absl::OkStatus();
}

// Files a crash left between writing and ingesting (IngestRows) are never part of the
// database: the ingest directory starts empty.
absl::Status StorageDb::Rep::ClearIngestDir() {
  ingest_dir = dir + "/ingest";
  std::error_code ec;
  std::filesystem::remove_all(ingest_dir, ec);
  std::filesystem::create_directories(ingest_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", ingest_dir, ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::Status StorageDb::Rep::OpenLogFiles(const StorageDbOptions& options) {
  LogFilesOptions log_options;
  log_options.dir = dir + "/pushlog";
  log_options.segment_bytes = options.log_segment_bytes;
  log_options.sync_on_rotate = options.sync_log_on_rotate;
  log_options.inject_write_error = options.inject_write_error;
  ASSIGN_OR_RETURN(log_files, LogFiles::Open(log_options));
  return absl::OkStatus();
}

// A new database gets the format marker and a new storage id (one synced write); an
// existing one must carry the marker, and gets its storage id the first time a version
// that writes one opens it.
absl::Status StorageDb::Rep::CheckFormat(bool fresh) {
  created = fresh;
  rocksdb::WriteOptions sync;
  sync.sync = true;
  if (fresh) {
    storage_id = NewStorageId();
    rocksdb::WriteBatch batch;
    batch.Put(meta, "format", kFormat);
    batch.Put(meta, "storage_id", storage_id);
    return FromRocks(db->Write(sync, &batch), "cannot initialize the pod database");
  }
  std::string format;
  const rocksdb::Status s = db->Get(rocksdb::ReadOptions(), meta, "format", &format);
  if (!s.ok() || format != kFormat) {
    return absl::FailedPreconditionError(
        absl::StrCat("data dir ", dir, " holds a RocksDB database that is not a ps-server pod's (",
                     s.ok() ? absl::StrCat("format '", format, "'") : s.ToString(), ")"));
  }
  const rocksdb::Status id = db->Get(rocksdb::ReadOptions(), meta, "storage_id", &storage_id);
  if (id.IsNotFound()) {
    storage_id = NewStorageId();
    return FromRocks(db->Put(sync, meta, "storage_id", storage_id),
                     "cannot store the pod database's storage id");
  }
  return FromRocks(id, "cannot read the pod database's storage id");
}

absl::StatusOr<uint64_t> StorageIdentity(absl::string_view storage_id) {
  uint64_t high = 0, low = 0;
  if (storage_id.size() != 32 || !absl::SimpleHexAtoi(storage_id.substr(0, 16), &high) ||
      !absl::SimpleHexAtoi(storage_id.substr(16), &low)) {
    return absl::DataLossError(absl::StrCat("the database's storage id '", storage_id.substr(0, 64),
                                            "' is damaged (expected 32 hex digits)"));
  }
  // NewStorageId never draws 0 for the first half; ids drawn before it made sure of that
  // fall back to the second half (and, 128 zero bits, to 1).
  return high != 0 ? high : low != 0 ? low : 1;
}

const std::string& StorageDb::storage_id() const { return rep_->storage_id; }
uint64_t StorageDb::identity() const { return rep_->identity; }
bool StorageDb::created() const { return rep_->created; }

std::string NewStorageId() {
  std::random_device os;  // reads the OS's entropy (/dev/urandom)
  for (;;) {
    std::string id;
    for (int i = 0; i < 4; ++i) absl::StrAppend(&id, absl::Hex(uint32_t{os()}, absl::kZeroPad8));
    // The first 64 bits are the identity export cursors carry (StorageIdentity): never 0.
    if (id.compare(0, 16, std::string(16, '0')) != 0) return id;
  }
}

StorageDb::StorageDb(std::unique_ptr<Rep> rep) : rep_(std::move(rep)) {}
StorageDb::~StorageDb() = default;

absl::StatusOr<std::unique_ptr<StorageDb>> StorageDb::Open(const StorageDbOptions& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("storage directory is empty");
  ASSIGN_OR_RETURN(const bool fresh, PrepareDir(options.dir));
  auto rep = std::make_unique<Rep>();
  RETURN_IF_ERROR(rep->OpenDatabase(options, fresh));
  RETURN_IF_ERROR(rep->ClearIngestDir());
  RETURN_IF_ERROR(rep->OpenLogFiles(options));
  RETURN_IF_ERROR(rep->CheckFormat(fresh));
  ASSIGN_OR_RETURN(rep->identity, StorageIdentity(rep->storage_id));
  if (fresh) RETURN_IF_ERROR(FinishCreation(options.dir));
  return std::unique_ptr<StorageDb>(new StorageDb(std::move(rep)));
}

absl::Status StorageDb::PutTable(uint32_t table_no, const TableSpec& spec) {
  std::string value;
  PutBE32(&value, table_no);
  value += spec.SerializeAsString();
  rocksdb::WriteOptions sync;
  sync.sync = true;
  return FromRocks(rep_->db->Put(sync, rep_->meta, "table/" + spec.name(), value),
                   absl::StrCat("cannot store table '", spec.name(), "'"));
}

absl::Status StorageDb::PutDense(const DenseSpec& spec) {
  rocksdb::WriteOptions sync;
  sync.sync = true;
  return FromRocks(
      rep_->db->Put(sync, rep_->meta, "dense/" + spec.name(), spec.SerializeAsString()),
      absl::StrCat("cannot store dense tensor '", spec.name(), "'"));
}

absl::StatusOr<StorageDb::Catalog> StorageDb::LoadCatalog() {
  Catalog catalog;
  std::unique_ptr<rocksdb::Iterator> it(rep_->db->NewIterator(rocksdb::ReadOptions(), rep_->meta));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    const absl::string_view key(it->key().data(), it->key().size());
    const absl::string_view value(it->value().data(), it->value().size());
    if (absl::StartsWith(key, "table/")) {
      TableSpec spec;
      if (value.size() < 4 || !spec.ParseFromArray(value.data() + 4, value.size() - 4)) {
        return absl::DataLossError(absl::StrCat("stored spec of ", key, " is unreadable"));
      }
      catalog.tables.emplace_back(static_cast<uint32_t>(GetBE(value.data(), 4)), spec);
    } else if (absl::StartsWith(key, "dense/")) {
      DenseSpec spec;
      if (!spec.ParseFromArray(value.data(), value.size())) {
        return absl::DataLossError(absl::StrCat("stored spec of ", key, " is unreadable"));
      }
      catalog.dense.push_back(spec);
    } else if (absl::StartsWith(key, "admission/") && key.size() == 10 + 4) {
      catalog.admission.emplace_back(static_cast<uint32_t>(GetBE(key.data() + 10, 4)),
                                     std::string(value));
    } else if (key == "dedup") {
      catalog.dedup = std::string(value);
    } else if (key == "log_base" && value.size() == 8) {
      catalog.log_base = GetBE(value.data(), 8);
    }
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "cannot read the catalog"));
  return catalog;
}

absl::Status StorageDb::AppendLog(absl::Span<const LogAppend> records, bool sync) {
  return rep_->log_files->Append(records, sync);
}

absl::Status StorageDb::SyncLog() { return rep_->log_files->Sync(); }

absl::Status StorageDb::SyncWal() {
  return FromRocks(rep_->db->SyncWAL(), "cannot fsync the database's WAL");
}

absl::Status StorageDb::ReadLog(uint64_t from, LogRead* out) {
  // Records of the log column family (an earlier version's log): below the files' records.
  std::unique_ptr<rocksdb::Iterator> it(rep_->db->NewIterator(rocksdb::ReadOptions(), rep_->log));
  std::vector<std::pair<uint64_t, absl::string_view>> cf_records;
  for (it->Seek(LogKey(from)); it->Valid(); it->Next()) {
    if (it->key().size() != 8) {
      return absl::DataLossError(absl::StrCat("log key of ", it->key().size(), " bytes"));
    }
    auto record = std::make_shared<const std::string>(it->value().data(), it->value().size());
    cf_records.emplace_back(GetBE(it->key().data(), 8), *record);
    out->bytes += record->size();
    out->buffers.push_back(std::move(record));
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "cannot read the push log"));
  std::vector<LogEntryView> views;
  for (const auto& [lsn, record] : cf_records) views.push_back({lsn, record});
  RETURN_IF_ERROR(rep_->log_files->ReadAll(from, out));
  views.insert(views.end(), out->records.begin(), out->records.end());
  out->records = std::move(views);
  return absl::OkStatus();
}

absl::Status StorageDb::TruncateLog(
    uint64_t cut, absl::string_view dedup, bool sync,
    const std::vector<std::pair<uint32_t, std::string>>& admission) {
  rocksdb::WriteBatch batch;
  for (const auto& [no, bytes] : admission) {
    std::string key = "admission/";
    for (int shift = 24; shift >= 0; shift -= 8) key.push_back(static_cast<char>(no >> shift));
    RETURN_IF_ERROR(FromRocks(
        batch.Put(rep_->meta, key, rocksdb::Slice(bytes.data(), bytes.size())), "truncate"));
  }
  RETURN_IF_ERROR(FromRocks(batch.DeleteRange(rep_->log, LogKey(0), LogKey(cut)), "truncate"));
  RETURN_IF_ERROR(FromRocks(
      batch.Put(rep_->meta, "dedup", rocksdb::Slice(dedup.data(), dedup.size())), "truncate"));
  RETURN_IF_ERROR(FromRocks(batch.Put(rep_->meta, "log_base", LogKey(cut)), "truncate"));
  rocksdb::WriteOptions options;
  options.sync = sync;
  RETURN_IF_ERROR(FromRocks(rep_->db->Write(options, &batch), "cannot truncate the push log"));
  return rep_->log_files->DeleteBelow(cut);
}

RowBatch StorageDb::NewRowBatch() {
  RowBatch batch;
  batch.rep_->cf = rep_->rows;
  return batch;
}

absl::Status StorageDb::WriteRows(RowBatch* batch) {
  rocksdb::WriteOptions options;
  options.disableWAL = true;
  return FromRocks(rep_->db->Write(options, &batch->rep_->batch), "cannot write rows");
}

absl::Status StorageDb::WriteRowsLogged(RowBatch* batch) {
  return FromRocks(rep_->db->Write(rocksdb::WriteOptions(), &batch->rep_->batch),
                   "cannot write rows");
}

absl::Status StorageDb::FlushRows() {
  rocksdb::FlushOptions options;
  options.wait = true;
  // allow_write_stall stays false: forcing the flush would stall every write of the pod,
  // the log's included, for the flush's duration (seen as multi-second periodic-mode
  // losses in ps-crash-test); the materializer waits instead.
  return FromRocks(rep_->db->Flush(options, rep_->rows), "cannot flush rows");
}

void RowFile::AddRow(uint32_t table_no, int64_t id, uint64_t step, absl::Span<const float> weights,
                     absl::Span<const float> slots) {
  const size_t offset = values_.size();
  const size_t size = sizeof(step) + (weights.size() + slots.size()) * sizeof(float);
  values_.append(reinterpret_cast<const char*>(&step), sizeof(step));
  values_.append(reinterpret_cast<const char*>(weights.data()), weights.size() * sizeof(float));
  values_.append(reinterpret_cast<const char*>(slots.data()), slots.size() * sizeof(float));
  entries_.push_back({table_no, static_cast<uint64_t>(id) ^ (uint64_t{1} << 63), offset,
                      static_cast<uint32_t>(size)});
}

absl::Status StorageDb::IngestRows(RowFile* rows) {
  if (rows->count() == 0) return absl::OkStatus();
  std::vector<RowFile::Entry>& entries = rows->entries_;
  std::stable_sort(entries.begin(), entries.end(),
                   [](const RowFile::Entry& a, const RowFile::Entry& b) {
                     return std::tie(a.table_no, a.key_id) < std::tie(b.table_no, b.key_id);
                   });
  const std::string path = absl::StrCat(rep_->ingest_dir, "/", rep_->next_ingest++, ".sst");
  // Keeps the written pages cached: rows are read back soon (compaction, lazy loads).
  rocksdb::SstFileWriter writer(rocksdb::EnvOptions(), rep_->rows_file_options, rep_->rows,
                                /*invalidate_page_cache=*/false);
  absl::Status status = FromRocks(writer.Open(path), absl::StrCat("cannot create ", path));
  std::string key;
  for (size_t i = 0; status.ok() && i < entries.size(); ++i) {
    const RowFile::Entry& e = entries[i];
    if (i + 1 < entries.size() && entries[i + 1].table_no == e.table_no &&
        entries[i + 1].key_id == e.key_id) {
      continue;  // added again later: the last value wins
    }
    key.clear();
    PutBE32(&key, e.table_no);
    PutBE64(&key, e.key_id);
    status = FromRocks(writer.Put(key, rocksdb::Slice(rows->values_.data() + e.offset, e.size)),
                       absl::StrCat("cannot write ", path));
  }
  // Finish syncs the file.
  if (status.ok()) status = FromRocks(writer.Finish(), absl::StrCat("cannot write ", path));
  if (status.ok()) {
    rocksdb::IngestExternalFileOptions ingest;
    ingest.move_files = true;
    ingest.allow_blocking_flush = true;
    rep_->fs->BeginIngest(rep_->ingest_dir);
    status = FromRocks(rep_->db->IngestExternalFile(rep_->rows, {path}, ingest),
                       absl::StrCat("cannot ingest rows from ", path));
    if (const size_t kept = rep_->fs->EndIngest(); kept > 0) {
      LOG(WARNING) << "ingestion of " << path << " failed (" << status << "); kept the " << kept
                   << " file(s) it had linked into the database, which its MANIFEST may name";
    }
  }
  if (!status.ok()) {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
  rows->Clear();
  return status;
}

absl::Status StorageDb::ForEachRow(
    const std::function<absl::Status(const StoredRow&)>& fn,
    const std::function<absl::Status(absl::string_view, uint64_t, absl::Span<const float>)>&
        fn_dense,
    bool table_rows) {
  rocksdb::ReadOptions read;
  read.readahead_size = size_t{4} << 20;
  read.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(rep_->db->NewIterator(read, rep_->rows));
  std::vector<float> values;
  // Dense tensors sort after every table row (their prefix is the largest table number).
  if (table_rows) {
    it->SeekToFirst();
  } else {
    it->Seek(rocksdb::Slice(kDenseKeyPrefix, 4));
  }
  for (; it->Valid(); it->Next()) {
    const rocksdb::Slice key = it->key();
    const rocksdb::Slice value = it->value();
    if (value.size() < 8 || (value.size() - 8) % sizeof(float) != 0) {
      return absl::DataLossError(absl::StrCat("stored row value of ", value.size(), " bytes"));
    }
    uint64_t step;
    std::memcpy(&step, value.data(), 8);
    values.resize((value.size() - 8) / sizeof(float));
    std::memcpy(values.data(), value.data() + 8, value.size() - 8);
    if (key.starts_with(rocksdb::Slice(kDenseKeyPrefix, 4))) {
      RETURN_IF_ERROR(fn_dense(absl::string_view(key.data() + 4, key.size() - 4), step, values));
      continue;
    }
    if (key.size() != 12) {
      return absl::DataLossError(absl::StrCat("stored row key of ", key.size(), " bytes"));
    }
    StoredRow row;
    row.table_no = static_cast<uint32_t>(GetBE(key.data(), 4));
    row.id = static_cast<int64_t>(GetBE(key.data() + 4, 8) ^ (uint64_t{1} << 63));
    row.step = step;
    row.values = values;
    RETURN_IF_ERROR(fn(row));
  }
  return FromRocks(it->status(), "cannot read stored rows");
}

absl::Status StorageDb::ForEachTableRow(uint32_t table_no,
                                        const std::function<absl::Status(const StoredRow&)>& fn) {
  rocksdb::ReadOptions read;
  read.readahead_size = size_t{4} << 20;
  read.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(rep_->db->NewIterator(read, rep_->rows));
  std::string prefix;
  PutBE32(&prefix, table_no);
  std::vector<float> values;
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    const rocksdb::Slice key = it->key();
    const rocksdb::Slice value = it->value();
    if (key.size() != 12 || value.size() < 8 || (value.size() - 8) % sizeof(float) != 0) {
      return absl::DataLossError(absl::StrCat("stored row of ", key.size(), "-byte key and ",
                                              value.size(), "-byte value"));
    }
    StoredRow row;
    row.table_no = table_no;
    row.id = static_cast<int64_t>(GetBE(key.data() + 4, 8) ^ (uint64_t{1} << 63));
    std::memcpy(&row.step, value.data(), 8);
    values.resize((value.size() - 8) / sizeof(float));
    std::memcpy(values.data(), value.data() + 8, value.size() - 8);
    row.values = values;
    RETURN_IF_ERROR(fn(row));
  }
  return FromRocks(it->status(), "cannot read stored rows");
}

uint64_t StorageDb::EstimateRows() {
  uint64_t n = 0;
  rep_->db->GetIntProperty(rep_->rows, "rocksdb.estimate-num-keys", &n);
  return n;
}

absl::Status StorageDb::ReadRows(uint32_t table_no, absl::Span<const int64_t> ids,
                                 size_t row_floats, float* values, uint64_t* steps, bool* found) {
  const size_t n = ids.size();
  std::vector<std::string> keys(n);
  std::vector<rocksdb::Slice> slices(n);
  for (size_t i = 0; i < n; ++i) {
    keys[i].reserve(12);
    PutBE32(&keys[i], table_no);
    PutBE64(&keys[i], static_cast<uint64_t>(ids[i]) ^ (uint64_t{1} << 63));
    slices[i] = keys[i];
  }
  std::vector<rocksdb::PinnableSlice> got(n);
  std::vector<rocksdb::Status> statuses(n);
  rep_->db->MultiGet(rocksdb::ReadOptions(), rep_->rows, n, slices.data(), got.data(),
                     statuses.data());
  const size_t value_bytes = 8 + row_floats * sizeof(float);
  for (size_t i = 0; i < n; ++i) {
    found[i] = false;
    if (statuses[i].IsNotFound()) continue;
    RETURN_IF_ERROR(FromRocks(statuses[i], "cannot read a stored row"));
    if (got[i].size() != value_bytes) {
      return absl::DataLossError(absl::StrCat("stored row ", ids[i], " of table number ", table_no,
                                              " has ", got[i].size(), " bytes, expected ",
                                              value_bytes));
    }
    std::memcpy(&steps[i], got[i].data(), 8);
    std::memcpy(values + i * row_floats, got[i].data() + 8, row_floats * sizeof(float));
    found[i] = true;
  }
  return absl::OkStatus();
}

absl::Status StorageDb::Checkpoint(const std::string& dir) {
  rocksdb::Checkpoint* raw = nullptr;
  RETURN_IF_ERROR(FromRocks(rocksdb::Checkpoint::Create(rep_->db.get(), &raw), "checkpoint"));
  std::unique_ptr<rocksdb::Checkpoint> checkpoint(raw);
  RETURN_IF_ERROR(
      FromRocks(checkpoint->CreateCheckpoint(dir), absl::StrCat("cannot checkpoint to ", dir)));
  // The log files after the database: the copy holds every record the database's log base
  // needs, and perhaps a few newer ones (a slightly later cut, consistent in itself).
  return rep_->log_files->CopyTo(dir + "/pushlog");
}

absl::Status StorageDb::WriteMeta(
    absl::Span<const std::pair<std::string, std::string>> puts,
    absl::Span<const std::pair<std::string, std::string>> delete_ranges, bool sync) {
  rocksdb::WriteBatch batch;
  for (const auto& [from, to] : delete_ranges) {
    RETURN_IF_ERROR(FromRocks(batch.DeleteRange(rep_->meta, from, to), "meta delete"));
  }
  for (const auto& [key, value] : puts) {
    RETURN_IF_ERROR(FromRocks(batch.Put(rep_->meta, key, value), "meta put"));
  }
  rocksdb::WriteOptions options;
  options.sync = sync;
  return FromRocks(rep_->db->Write(options, &batch), "cannot write the meta column family");
}

absl::Status StorageDb::ScanMeta(
    absl::string_view from, absl::string_view to,
    const std::function<absl::Status(absl::string_view key, absl::string_view value)>& fn) {
  std::unique_ptr<rocksdb::Iterator> it(rep_->db->NewIterator(rocksdb::ReadOptions(), rep_->meta));
  for (it->Seek(rocksdb::Slice(from.data(), from.size())); it->Valid(); it->Next()) {
    const absl::string_view key(it->key().data(), it->key().size());
    if (key >= to) break;
    RETURN_IF_ERROR(fn(key, absl::string_view(it->value().data(), it->value().size())));
  }
  return FromRocks(it->status(), "cannot read the meta column family");
}

absl::StatusOr<std::optional<std::string>> StorageDb::ReadRunMarker() {
  const std::string path = absl::StrCat(rep_->dir, "/", kRunMarker);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  std::string content;
  char buf[256];
  ssize_t n;
  // Small (a word); read at most a few KB of whatever is there.
  while (content.size() < 4096 && (n = ::read(fd, buf, sizeof(buf))) != 0) {
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return absl::UnavailableError(absl::StrCat("cannot read ", path, ": ", std::strerror(err)));
    }
    content.append(buf, n);
  }
  ::close(fd);
  return content;
}

absl::Status StorageDb::WriteRunMarker(absl::string_view content) {
  const std::string path = absl::StrCat(rep_->dir, "/", kRunMarker);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(err)));
    }
    done += n;
  }
  const int synced = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (synced != 0) {
    return absl::UnavailableError(absl::StrCat("cannot fsync ", path, ": ", std::strerror(err)));
  }
  return SyncDir(rep_->dir);
}

absl::Status StorageDb::RemoveRunMarker() {
  const std::string path = absl::StrCat(rep_->dir, "/", kRunMarker);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::UnavailableError(absl::StrCat("cannot remove ", path, ": ", std::strerror(errno)));
  }
  return SyncDir(rep_->dir);
}

absl::StatusOr<std::string> StorageDb::GetMeta(absl::string_view key) {
  std::string value;
  const rocksdb::Status s = rep_->db->Get(rocksdb::ReadOptions(), rep_->meta,
                                          rocksdb::Slice(key.data(), key.size()), &value);
  if (s.IsNotFound()) return absl::NotFoundError(absl::StrCat("no meta key ", key));
  RETURN_IF_ERROR(FromRocks(s, "cannot read the meta column family"));
  return value;
}

uint64_t StorageDb::disk_bytes() {
  uint64_t total = 0;
  for (auto* cf : {rep_->meta, rep_->rows, rep_->log}) {
    uint64_t v = 0;
    if (rep_->db->GetIntProperty(cf, "rocksdb.live-sst-files-size", &v)) total += v;
  }
  return total + rep_->log_files->bytes();
}

}  // namespace ps
