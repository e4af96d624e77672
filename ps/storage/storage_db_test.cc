// The contract ps/storage/storage_db.h documents: which directories Open accepts, the
// on-disk layout, that what each write path stores reads back bit for bit (through a
// reopen and a checkpoint), the push log and its truncation, and the fault-injection hook.
// RocksDB is opened directly only to read or plant raw records of that layout.
#include "ps/storage/storage_db.h"

#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace ps {
namespace {

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
// Row ids at the extremes of the key encoding (id ^ 2^63, big-endian): stored order is
// signed order, so INT64_MIN comes first and -1 before 0.
const std::vector<int64_t> kIds = {kMin, kMin + 1, -1, 0, 1, 42, kMax};

constexpr size_t kDim = 3;    // weights
constexpr size_t kSlots = 2;  // optimizer slots beside them
constexpr size_t kRowFloats = kDim + kSlots;

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Floats that only a bit-exact store keeps: NaNs with payloads, signed zero, the smallest
// subnormal, infinities, the largest float; then bits that vary with table, id and salt.
std::vector<float> RowValues(uint32_t table_no, int64_t id, uint32_t salt) {
  static constexpr uint32_t kSpecial[] = {0x7fc12345, 0xffc00abc, 0x80000000, 0x00000001,
                                          0x7f800000, 0xff800000, 0x7f7fffff};
  std::vector<float> values(kRowFloats);
  uint64_t h = (static_cast<uint64_t>(id) * 0x9e3779b97f4a7c15ull) ^ (table_no * 0x85ebca6bull) ^
               (salt * 0xc2b2ae35ull);
  for (size_t i = 0; i < kRowFloats; ++i) {
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    values[i] =
        i < 2 ? FromBits(kSpecial[(h >> 33) % 7]) : FromBits(static_cast<uint32_t>(h >> 32));
  }
  return values;
}

uint64_t RowStep(int64_t id, uint32_t salt) {
  return (static_cast<uint64_t>(id) ^ 0xa5a5a5a5a5a5a5a5ull) + salt;  // all 64 bits used
}

// A row as compared: (table number, id, step, the floats' bits).
using RowBits = std::tuple<uint32_t, int64_t, uint64_t, std::vector<uint32_t>>;

RowBits Bits(uint32_t table_no, int64_t id, uint64_t step, absl::Span<const float> values) {
  std::vector<uint32_t> bits(values.size());
  std::memcpy(bits.data(), values.data(), values.size() * sizeof(float));
  return {table_no, id, step, bits};
}

RowBits Expected(uint32_t table_no, int64_t id, uint32_t salt) {
  return Bits(table_no, id, RowStep(id, salt), RowValues(table_no, id, salt));
}

TableSpec Table(const std::string& name, uint32_t dim) {
  TableSpec spec;
  spec.set_name(name);
  spec.set_dim(dim);
  spec.mutable_initializer()->set_kind(InitializerSpec::UNIFORM);
  spec.mutable_initializer()->set_low(-0.5f);
  spec.mutable_initializer()->set_high(0.5f);
  spec.mutable_optimizer()->set_kind(OptimizerSpec::ADAM);
  spec.mutable_optimizer()->set_learning_rate(0.01f);
  return spec;
}

DenseSpec Dense(const std::string& name, int64_t numel) {
  DenseSpec spec;
  spec.set_name(name);
  spec.add_shape(numel);
  spec.mutable_optimizer()->set_kind(OptimizerSpec::MOMENTUM);
  return spec;
}

std::string Record(uint64_t lsn) {
  return absl::StrCat("push-record-", lsn, std::string(lsn % 7, '\0'));
}

// Raw access to the database's column families, bypassing StorageDb.
using RawFamilies = std::map<std::string, std::map<std::string, std::string>>;

RawFamilies ReadRaw(const std::string& dir) {
  RawFamilies out;
  std::vector<std::string> names;
  EXPECT_TRUE(rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), dir, &names).ok());
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  for (const std::string& name : names) families.emplace_back(name, rocksdb::ColumnFamilyOptions());
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s =
      rocksdb::DB::OpenForReadOnly(rocksdb::DBOptions(), dir, families, &handles, &raw);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return out;
  std::unique_ptr<rocksdb::DB> db(raw);
  for (size_t i = 0; i < names.size(); ++i) {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), handles[i]));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      out[names[i]][it->key().ToString()] = it->value().ToString();
    }
    db->DestroyColumnFamilyHandle(handles[i]);
  }
  return out;
}

// Writes `puts` (family -> key -> value) with RocksDB directly, creating the database and
// the families if missing.
void WriteRaw(const std::string& dir, const std::vector<std::string>& names,
              const RawFamilies& puts) {
  rocksdb::DBOptions options;
  options.create_if_missing = true;
  options.create_missing_column_families = true;
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  for (const std::string& name : names) families.emplace_back(name, rocksdb::ColumnFamilyOptions());
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, dir, families, &handles, &raw);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::unique_ptr<rocksdb::DB> db(raw);
  for (size_t i = 0; i < names.size(); ++i) {
    auto it = puts.find(names[i]);
    if (it != puts.end()) {
      for (const auto& [key, value] : it->second) {
        EXPECT_TRUE(db->Put(rocksdb::WriteOptions(), handles[i], key, value).ok());
      }
    }
  }
  for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
}

// Rows 1..100 of table 1, in one batch.
RowBatch HundredRows(StorageDb& db) {
  RowBatch batch = db.NewRowBatch();
  for (int64_t id = 1; id <= 100; ++id) batch.AddRow(1, id, 2, RowValues(1, id, 2), {});
  return batch;
}

const std::vector<std::string> kFamilies = {"default", "meta", "rows", "log"};

class StorageDbTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/storage_db_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::remove_all(dir_ + "_checkpoint");
  }
  void TearDown() override {
    std::filesystem::remove_all(dir_);
    std::filesystem::remove_all(dir_ + "_checkpoint");
  }

  StorageDbOptions Options(const std::string& dir) const {
    StorageDbOptions options;
    options.dir = dir;
    options.log_memtable_bytes = size_t{1} << 20;
    return options;
  }
  // Opens dir_ (or `dir`); null (and a test failure) on an error.
  std::unique_ptr<StorageDb> OpenDb(StorageDbOptions options) {
    auto db = StorageDb::Open(options);
    EXPECT_TRUE(db.ok()) << db.status();
    return db.ok() ? *std::move(db) : nullptr;
  }
  std::unique_ptr<StorageDb> OpenDb() { return OpenDb(Options(dir_)); }

  // Every stored row of `table_no`, in the order ForEachTableRow gives.
  static std::vector<RowBits> TableRows(StorageDb& db, uint32_t table_no) {
    std::vector<RowBits> rows;
    absl::Status s = db.ForEachTableRow(table_no, [&](const StoredRow& row) {
      EXPECT_EQ(row.table_no, table_no);
      rows.push_back(Bits(row.table_no, row.id, row.step, row.values));
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << s;
    return rows;
  }
  // Every stored table row, then every dense tensor as (name, step, bits).
  struct AllRows {
    std::vector<RowBits> rows;
    std::vector<std::tuple<std::string, uint64_t, std::vector<uint32_t>>> dense;
  };
  static AllRows ForEachRow(StorageDb& db, bool table_rows = true) {
    AllRows all;
    absl::Status s = db.ForEachRow(
        [&](const StoredRow& row) {
          EXPECT_TRUE(all.dense.empty()) << "a table row after a dense tensor";
          all.rows.push_back(Bits(row.table_no, row.id, row.step, row.values));
          return absl::OkStatus();
        },
        [&](absl::string_view name, uint64_t step, absl::Span<const float> values) {
          all.dense.emplace_back(std::string(name), step, std::get<3>(Bits(0, 0, 0, values)));
          return absl::OkStatus();
        },
        table_rows);
    EXPECT_TRUE(s.ok()) << s;
    return all;
  }
  // ReadRows of `ids`: the found rows as RowBits (table number `table_no`), in ids' order.
  static std::vector<RowBits> ReadRows(StorageDb& db, uint32_t table_no,
                                       const std::vector<int64_t>& ids,
                                       std::vector<bool>* found_out = nullptr) {
    std::vector<float> values(ids.size() * kRowFloats, FromBits(0xdeadbeef));
    std::vector<uint64_t> steps(ids.size(), 0);
    auto found = std::make_unique<bool[]>(ids.size());
    absl::Status s =
        db.ReadRows(table_no, ids, kRowFloats, values.data(), steps.data(), found.get());
    EXPECT_TRUE(s.ok()) << s;
    std::vector<RowBits> rows;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (found_out != nullptr) found_out->push_back(found[i]);
      if (!found[i]) continue;
      rows.push_back(Bits(table_no, ids[i], steps[i],
                          absl::MakeConstSpan(values.data() + i * kRowFloats, kRowFloats)));
    }
    return rows;
  }
  // ReadLog from `from` on, on a database just opened.
  static std::vector<std::pair<uint64_t, std::string>> ReadLog(StorageDb& db, uint64_t from) {
    LogRead read;
    absl::Status s = db.ReadLog(from, &read);
    EXPECT_TRUE(s.ok()) << s;
    std::vector<std::pair<uint64_t, std::string>> records;
    for (const LogEntryView& e : read.records) records.emplace_back(e.lsn, std::string(e.record));
    return records;
  }
  static std::vector<std::pair<uint64_t, std::string>> Records(uint64_t first, uint64_t last) {
    std::vector<std::pair<uint64_t, std::string>> records;
    for (uint64_t lsn = first; lsn <= last; ++lsn) records.emplace_back(lsn, Record(lsn));
    return records;
  }
  static absl::Status AppendLog(StorageDb& db, uint64_t first, uint64_t last, bool sync) {
    std::vector<std::string> payloads;
    for (uint64_t lsn = first; lsn <= last; ++lsn) payloads.push_back(Record(lsn));
    std::vector<LogAppend> appends;
    for (uint64_t lsn = first; lsn <= last; ++lsn) {
      const std::string& p = payloads[lsn - first];
      appends.push_back({lsn, p, LogFiles::Checksum(p)});
    }
    return db.AppendLog(appends, sync);
  }

  std::string dir_;
};

// --- Which directories Open accepts ----------------------------------------------------

TEST_F(StorageDbTest, NewDatabaseGetsTheFormatMarker) {
  {
    auto db = OpenDb();  // dir_ does not exist
    ASSERT_NE(db, nullptr);
    auto catalog = db->LoadCatalog();
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    EXPECT_TRUE(catalog->tables.empty());
    EXPECT_TRUE(catalog->dense.empty());
    EXPECT_EQ(catalog->dedup, "");
    EXPECT_EQ(catalog->log_base, 1u);
  }
  EXPECT_EQ(ReadRaw(dir_)["meta"]["format"], "ps-server-1");
  EXPECT_NE(OpenDb(), nullptr);  // and it opens again

  const std::string empty = dir_ + "/empty";  // an empty directory is a new pod too
  std::filesystem::create_directories(empty);
  EXPECT_NE(OpenDb(Options(empty)), nullptr);
  EXPECT_EQ(ReadRaw(empty)["meta"]["format"], "ps-server-1");
}

TEST_F(StorageDbTest, StorageIdIsDrawnAtCreationAndKeptAcrossOpens) {
  std::string id;
  {
    auto db = OpenDb();
    ASSERT_NE(db, nullptr);
    EXPECT_TRUE(db->created());
    id = db->storage_id();
  }
  EXPECT_EQ(id.size(), 32u);
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
  EXPECT_EQ(ReadRaw(dir_)["meta"]["storage_id"], id);
  {
    auto again = OpenDb();
    ASSERT_NE(again, nullptr);
    EXPECT_FALSE(again->created());
    EXPECT_EQ(again->storage_id(), id);
  }
  // The same directory lost and started afresh is another database.
  std::filesystem::remove_all(dir_);
  auto fresh = OpenDb();
  ASSERT_NE(fresh, nullptr);
  EXPECT_TRUE(fresh->created());
  EXPECT_NE(fresh->storage_id(), id);
}

TEST_F(StorageDbTest, DatabaseOfAnOlderVersionGetsAStorageIdOnce) {
  WriteRaw(dir_, kFamilies, {{"meta", {{"format", "ps-server-1"}}}});
  std::string id;
  {
    auto db = OpenDb();
    ASSERT_NE(db, nullptr);
    EXPECT_FALSE(db->created());
    id = db->storage_id();
    EXPECT_EQ(id.size(), 32u);
  }
  EXPECT_EQ(ReadRaw(dir_)["meta"]["storage_id"], id);
  auto again = OpenDb();
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->storage_id(), id);
}

// One identity: export cursors carry the storage id's first 64 bits (StorageIdentity),
// the same across opens and for a database of an older version; a damaged id is refused.
TEST_F(StorageDbTest, TheIdentityIsTheStorageIdsFirst64Bits) {
  uint64_t identity = 0;
  {
    auto db = OpenDb();
    ASSERT_NE(db, nullptr);
    uint64_t expected = 0;
    ASSERT_TRUE(absl::SimpleHexAtoi(db->storage_id().substr(0, 16), &expected));
    EXPECT_NE(expected, 0u);
    EXPECT_EQ(db->identity(), expected);
    identity = db->identity();
  }
  auto again = OpenDb();
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->identity(), identity);

  EXPECT_EQ(*StorageIdentity("0123456789abcdef0000000000000001"), 0x0123456789abcdefu);
  // An id drawn before the first half was kept non-zero: the second half, else 1.
  EXPECT_EQ(*StorageIdentity("00000000000000000000000000000abc"), 0xabcu);
  EXPECT_EQ(*StorageIdentity(std::string(32, '0')), 1u);
  for (const char* bad :
       {"", "0123", "0123456789abcdefg123456789abcdef", "0123456789abcdef0123456789abcdef0"}) {
    EXPECT_EQ(StorageIdentity(bad).status().code(), absl::StatusCode::kDataLoss) << bad;
  }
  for (int i = 0; i < 100; ++i) EXPECT_NE(NewStorageId().substr(0, 16), std::string(16, '0'));
}

TEST_F(StorageDbTest, ADamagedStorageIdIsRefusedAtOpen) {
  WriteRaw(dir_, kFamilies, {{"meta", {{"format", "ps-server-1"}, {"storage_id", "x"}}}});
  auto db = StorageDb::Open(Options(dir_));
  EXPECT_EQ(db.status().code(), absl::StatusCode::kDataLoss) << db.status();
  EXPECT_NE(db.status().message().find("storage id"), std::string::npos) << db.status();
}

TEST_F(StorageDbTest, EmptyDirectoryNameIsInvalid) {
  EXPECT_EQ(StorageDb::Open(Options("")).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(StorageDbTest, DirectoryWithoutDatabaseIsRefusedAndLeftAlone) {
  std::filesystem::create_directories(dir_);
  std::ofstream(dir_ + "/notes.txt") << "someone else's file";
  absl::Status s = StorageDb::Open(Options(dir_)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find(dir_), std::string::npos) << s;
  EXPECT_NE(s.message().find("no CURRENT file"), std::string::npos) << s;
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    left.push_back(e.path().filename());
  }
  EXPECT_EQ(left, std::vector<std::string>{"notes.txt"});
}

TEST_F(StorageDbTest, DatabaseWithAnotherFormatMarkerIsRefused) {
  { ASSERT_NE(OpenDb(), nullptr); }
  WriteRaw(dir_, kFamilies, {{"meta", {{"format", "ps-server-0"}}}});
  absl::Status s = StorageDb::Open(Options(dir_)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find(dir_), std::string::npos) << s;
  EXPECT_NE(s.message().find("format 'ps-server-0'"), std::string::npos) << s;
}

TEST_F(StorageDbTest, DatabaseWithoutFormatMarkerIsRefused) {
  WriteRaw(dir_, kFamilies, {{"rows", {{"key", "value"}}}});
  absl::Status s = StorageDb::Open(Options(dir_)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("not a ps-server pod's"), std::string::npos) << s;
}

TEST_F(StorageDbTest, ForeignRocksDbIsRefusedAndKeepsItsData) {
  WriteRaw(dir_, {"default"}, {{"default", {{"their-key", "their-value"}}}});
  absl::Status s = StorageDb::Open(Options(dir_)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find(dir_), std::string::npos) << s;
  const RawFamilies raw = ReadRaw(dir_);
  EXPECT_EQ(raw.size(), 1u);  // no column family was added
  EXPECT_EQ(raw.at("default").at("their-key"), "their-value");
}

// A first Open cut short (a full disk from its k-th file write on, as here, or the pod
// killed) after it wrote anything used to leave a directory that every later Open refused
// ("no CURRENT file", or "not a ps-server pod's (NotFound: )" before the format marker):
// the pod could not start on its volume until an operator emptied it, though nothing was
// ever stored there. The creating marker makes the next Open start again.
TEST_F(StorageDbTest, FirstOpenCutShortCanBeRetried) {
  bool opened = false;
  for (int k = 0; k < 64 && !opened; ++k) {
    SCOPED_TRACE(absl::StrCat("the disk fills at file write ", k));
    std::filesystem::remove_all(dir_);
    auto writes = std::make_shared<std::atomic<int>>(0);
    StorageDbOptions options = Options(dir_);
    options.inject_write_error = [writes, k] { return writes->fetch_add(1) >= k; };
    opened = StorageDb::Open(options).ok();
    EXPECT_NE(OpenDb(), nullptr);
  }
  EXPECT_TRUE(opened);
}

// A kill between the creating marker and the format marker leaves the marker beside
// whatever RocksDB wrote: the next Open starts again. A finished creation leaves no marker,
// and a directory without it is never emptied.
TEST_F(StorageDbTest, CreatingMarkerMeansTheFirstStartDidNotFinish) {
  std::filesystem::create_directories(dir_);
  std::ofstream(dir_ + "/CREATING-ps-server").put('\0');
  std::ofstream(dir_ + "/CURRENT") << "MANIFEST-000099\n";  // RocksDB's, cut short
  std::filesystem::create_directories(dir_ + "/pushlog");
  {
    auto db = OpenDb();
    ASSERT_NE(db, nullptr);
    ASSERT_TRUE(db->PutTable(1, Table("t", kDim)).ok());
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/CREATING-ps-server"));
  auto db = OpenDb();
  ASSERT_NE(db, nullptr);
  auto catalog = db->LoadCatalog();
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  EXPECT_EQ(catalog->tables.size(), 1u);  // the second Open kept what the first stored
}

TEST_F(StorageDbTest, DamagedManifestIsDataLoss) {
  {
    auto db = OpenDb();
    ASSERT_NE(db, nullptr);
    ASSERT_TRUE(db->PutTable(1, Table("t", kDim)).ok());
  }
  std::string manifest;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    if (e.path().filename().string().rfind("MANIFEST-", 0) == 0) manifest = e.path();
  }
  ASSERT_FALSE(manifest.empty());
  const auto size = std::filesystem::file_size(manifest);
  ASSERT_GT(size, 64u);
  {
    std::fstream f(manifest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size / 2));
    f.write("\xde\xad\xbe\xef\xde\xad\xbe\xef", 8);
  }
  absl::Status s = StorageDb::Open(Options(dir_)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(dir_), std::string::npos) << s;
}

// --- The catalog -----------------------------------------------------------------------

TEST_F(StorageDbTest, CatalogSurvivesReopen) {
  const TableSpec a = Table("clicks", 8), b = Table("users.embedding", 64);
  const DenseSpec d1 = Dense("bias", 1), d2 = Dense("mlp/w0", 4096);
  {
    auto db = OpenDb();
    ASSERT_NE(db, nullptr);
    ASSERT_TRUE(db->PutTable(7, a).ok());
    ASSERT_TRUE(db->PutTable(3, b).ok());
    ASSERT_TRUE(db->PutDense(d1).ok());
    ASSERT_TRUE(db->PutDense(d2).ok());
  }
  auto db = OpenDb();
  ASSERT_NE(db, nullptr);
  auto catalog = db->LoadCatalog();
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  std::map<uint32_t, std::string> tables;
  for (const auto& [no, spec] : catalog->tables) tables[no] = spec.SerializeAsString();
  EXPECT_EQ(tables, (std::map<uint32_t, std::string>{{7, a.SerializeAsString()},
                                                     {3, b.SerializeAsString()}}));
  std::map<std::string, std::string> dense;
  for (const DenseSpec& spec : catalog->dense) dense[spec.name()] = spec.SerializeAsString();
  EXPECT_EQ(dense, (std::map<std::string, std::string>{{"bias", d1.SerializeAsString()},
                                                       {"mlp/w0", d2.SerializeAsString()}}));
}

// --- Rows --------------------------------------------------------------------------------

enum class WritePath { kWriteRowsThenFlush, kWriteRowsLogged, kIngestRows };

std::string PathName(const ::testing::TestParamInfo<std::tuple<WritePath, bool>>& info) {
  static const char* kNames[] = {"WriteRowsThenFlush", "WriteRowsLogged", "IngestRows"};
  return absl::StrCat(kNames[static_cast<int>(std::get<0>(info.param))],
                      std::get<1>(info.param) ? "PointReads" : "");
}

class StorageDbRowsTest : public StorageDbTest,
                          public ::testing::WithParamInterface<std::tuple<WritePath, bool>> {
 protected:
  StorageDbOptions RowOptions() const {
    StorageDbOptions options = Options(dir_);
    options.rows_point_reads = std::get<1>(GetParam());
    return options;
  }
  // Writes rows (table_no, id) for every id of kIds, with values of `salt`, by the path
  // under test.
  void Write(StorageDb& db, const std::vector<uint32_t>& tables, uint32_t salt) {
    const WritePath path = std::get<0>(GetParam());
    if (path == WritePath::kIngestRows) {
      RowFile file;
      for (uint32_t t : tables) {
        for (int64_t id : kIds) {
          const std::vector<float> v = RowValues(t, id, salt);
          file.AddRow(t, id, RowStep(id, salt), absl::MakeConstSpan(v).first(kDim),
                      absl::MakeConstSpan(v).subspan(kDim));
        }
      }
      EXPECT_EQ(file.count(), tables.size() * kIds.size());
      ASSERT_TRUE(db.IngestRows(&file).ok());
      EXPECT_EQ(file.count(), 0u);  // cleared
      EXPECT_EQ(file.bytes(), 0u);
      return;
    }
    RowBatch batch = db.NewRowBatch();
    for (uint32_t t : tables) {
      // Backwards: the batch's order must not matter.
      for (auto it = kIds.rbegin(); it != kIds.rend(); ++it) {
        const std::vector<float> v = RowValues(t, *it, salt);
        batch.AddRow(t, *it, RowStep(*it, salt), absl::MakeConstSpan(v).first(kDim),
                     absl::MakeConstSpan(v).subspan(kDim));
      }
    }
    EXPECT_EQ(batch.count(), tables.size() * kIds.size());
    EXPECT_GT(batch.bytes(), batch.count() * (12 + 8 + kRowFloats * sizeof(float)));
    if (path == WritePath::kWriteRowsLogged) {
      ASSERT_TRUE(db.WriteRowsLogged(&batch).ok());
    } else {
      ASSERT_TRUE(db.WriteRows(&batch).ok());
      ASSERT_TRUE(db.FlushRows().ok());
    }
  }
  static std::vector<RowBits> ExpectedRows(uint32_t table_no, uint32_t salt) {
    std::vector<RowBits> rows;
    for (int64_t id : kIds) rows.push_back(Expected(table_no, id, salt));
    return rows;
  }
  // Checks every read path against rows of tables 1 and 2 written with `salt`.
  void ExpectStored(StorageDb& db, uint32_t salt) {
    // In signed id order, each table's rows apart (table 1's INT64_MAX and table 2's
    // INT64_MIN have adjacent keys).
    EXPECT_EQ(TableRows(db, 1), ExpectedRows(1, salt));
    EXPECT_EQ(TableRows(db, 2), ExpectedRows(2, salt));
    EXPECT_TRUE(TableRows(db, 3).empty());
    std::vector<RowBits> both = ExpectedRows(1, salt);
    for (const RowBits& r : ExpectedRows(2, salt)) both.push_back(r);
    EXPECT_EQ(ForEachRow(db).rows, both);
    EXPECT_TRUE(ForEachRow(db, /*table_rows=*/false).rows.empty());

    // The batched read, in the caller's order, with ids not stored and one asked twice.
    const std::vector<int64_t> ask = {kMax, 7, kMin, -1, 0, -2, kMax, 1, 42, kMin + 1};
    std::vector<bool> found;
    const std::vector<RowBits> got = ReadRows(db, 2, ask, &found);
    EXPECT_EQ(found,
              (std::vector<bool>{true, false, true, true, true, false, true, true, true, true}));
    std::vector<RowBits> want;
    for (size_t i = 0; i < ask.size(); ++i) {
      if (found[i]) want.push_back(Expected(2, ask[i], salt));
    }
    EXPECT_EQ(got, want);
  }
};

TEST_P(StorageDbRowsTest, RowsReadBackBitForBitThroughReopen) {
  {
    auto db = OpenDb(RowOptions());
    ASSERT_NE(db, nullptr);
    Write(*db, {2, 1}, /*salt=*/1);
    ExpectStored(*db, 1);
  }
  auto db = OpenDb(RowOptions());
  ASSERT_NE(db, nullptr);
  ExpectStored(*db, 1);
  // Written again: the newer values replace the older ones.
  Write(*db, {1, 2}, /*salt=*/2);
  ExpectStored(*db, 2);
}

INSTANTIATE_TEST_SUITE_P(WritePaths, StorageDbRowsTest,
                         ::testing::Combine(::testing::Values(WritePath::kWriteRowsThenFlush,
                                                              WritePath::kWriteRowsLogged,
                                                              WritePath::kIngestRows),
                                            ::testing::Bool()),
                         PathName);

TEST_F(StorageDbTest, IngestedRowsAreNewerThanEarlierWritesAndTheLastAddedWins) {
  auto db = OpenDb();
  ASSERT_NE(db, nullptr);
  const std::vector<float> v1 = RowValues(1, 5, 1), v2 = RowValues(1, 5, 2),
                           v3 = RowValues(1, 5, 3);
  RowBatch batch = db->NewRowBatch();
  batch.AddRow(1, 5, 1, v1, {});
  batch.AddRow(1, 6, 1, v1, {});
  ASSERT_TRUE(db->WriteRowsLogged(&batch).ok());
  RowFile file;
  file.AddRow(1, 5, 2, v2, {});
  file.AddRow(1, 5, 3, v3, {});  // added twice: this one is kept
  ASSERT_TRUE(db->IngestRows(&file).ok());
  EXPECT_EQ(TableRows(*db, 1), (std::vector<RowBits>{Bits(1, 5, 3, v3), Bits(1, 6, 1, v1)}));
  RowFile none;
  EXPECT_TRUE(db->IngestRows(&none).ok());  // nothing to ingest
}

TEST_F(StorageDbTest, DeletesRemoveRowsAndDenseTensors) {
  auto db = OpenDb();
  ASSERT_NE(db, nullptr);
  const std::vector<float> v = RowValues(4, 0, 0);
  RowBatch batch = db->NewRowBatch();
  for (int64_t id : kIds) batch.AddRow(4, id, 1, v, {});
  batch.AddDense("bias", 9, v);
  ASSERT_TRUE(db->WriteRows(&batch).ok());
  batch.Clear();
  EXPECT_EQ(batch.count(), 0u);
  batch.DeleteRow(4, kMin);
  batch.DeleteRow(4, 0);
  batch.DeleteDense("bias");
  EXPECT_EQ(batch.count(), 3u);
  ASSERT_TRUE(db->WriteRowsLogged(&batch).ok());
  std::vector<int64_t> left;
  for (const RowBits& r : TableRows(*db, 4)) left.push_back(std::get<1>(r));
  EXPECT_EQ(left, (std::vector<int64_t>{kMin + 1, -1, 1, 42, kMax}));
  EXPECT_TRUE(ForEachRow(*db).dense.empty());
}

TEST_F(StorageDbTest, DenseTensorsReadBackAfterTheTableRows) {
  const std::vector<float> bias = RowValues(0, 1, 1), w = RowValues(0, 2, 2);
  const std::vector<float> row = RowValues(0xfffffffe, kMax, 3);
  {
    auto db = OpenDb();
    ASSERT_NE(db, nullptr);
    RowBatch batch = db->NewRowBatch();
    batch.AddDense("mlp/w0", 11, w);
    batch.AddDense("bias", ~uint64_t{0}, bias);
    batch.AddRow(0xfffffffe, kMax, 5, row, {});  // the largest table number before dense
    ASSERT_TRUE(db->WriteRowsLogged(&batch).ok());
  }
  auto db = OpenDb();
  ASSERT_NE(db, nullptr);
  const AllRows all = ForEachRow(*db);
  EXPECT_EQ(all.rows, (std::vector<RowBits>{Bits(0xfffffffe, kMax, 5, row)}));
  using DenseBits = std::tuple<std::string, uint64_t, std::vector<uint32_t>>;
  const std::vector<DenseBits> dense = {{"bias", ~uint64_t{0}, std::get<3>(Bits(0, 0, 0, bias))},
                                        {"mlp/w0", 11, std::get<3>(Bits(0, 0, 0, w))}};
  EXPECT_EQ(all.dense, dense);
  const AllRows dense_only = ForEachRow(*db, /*table_rows=*/false);
  EXPECT_TRUE(dense_only.rows.empty());
  EXPECT_EQ(dense_only.dense, dense);
}

TEST_F(StorageDbTest, ReadRowsOfAnotherSizeIsDataLoss) {
  auto db = OpenDb();
  ASSERT_NE(db, nullptr);
  const std::vector<float> v = RowValues(1, 1, 1);
  RowBatch batch = db->NewRowBatch();
  batch.AddRow(1, 1, 1, absl::MakeConstSpan(v).first(kDim), {});  // 3 floats, not 5
  ASSERT_TRUE(db->WriteRowsLogged(&batch).ok());
  std::vector<float> values(kRowFloats);
  uint64_t step;
  bool found;
  const int64_t id = 1;
  absl::Status s =
      db->ReadRows(1, absl::MakeConstSpan(&id, 1), kRowFloats, values.data(), &step, &found);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

// The layout storage_db.h documents, byte for byte.
TEST_F(StorageDbTest, OnDiskLayoutIsAsDocumented) {
  const TableSpec spec = Table("t", 2);
  const DenseSpec dense = Dense("bias", 1);
  {
    auto db = OpenDb();
    ASSERT_NE(db, nullptr);
    ASSERT_TRUE(db->PutTable(0x01020304, spec).ok());
    ASSERT_TRUE(db->PutDense(dense).ok());
    const float w[] = {1.0f, -2.5f}, slot[] = {0.25f}, d[] = {3.0f};
    RowBatch batch = db->NewRowBatch();
    batch.AddRow(7, -1, 0x0102030405060708, w, slot);
    batch.AddRow(7, kMin, 1, w, {});
    batch.AddDense("bias", 9, d);
    ASSERT_TRUE(db->WriteRowsLogged(&batch).ok());
    ASSERT_TRUE(AppendLog(*db, 1, 3, /*sync=*/true).ok());
    ASSERT_TRUE(db->TruncateLog(3, std::string("dedup\0blob", 10), /*sync=*/true).ok());
  }
  RawFamilies raw = ReadRaw(dir_);
  const std::string le_step("\x08\x07\x06\x05\x04\x03\x02\x01", 8);
  const std::string floats("\x00\x00\x80\x3f\x00\x00\x20\xc0\x00\x00\x80\x3e", 12);
  EXPECT_EQ(raw["rows"][std::string("\x00\x00\x00\x07\x7f\xff\xff\xff\xff\xff\xff\xff", 12)],
            le_step + floats);
  EXPECT_EQ(raw["rows"][std::string("\x00\x00\x00\x07\x00\x00\x00\x00\x00\x00\x00\x00", 12)],
            std::string("\x01\0\0\0\0\0\0\0", 8) + floats.substr(0, 8));
  EXPECT_EQ(raw["rows"]["\xff\xff\xff\xff"
                        "bias"],
            std::string("\x09\0\0\0\0\0\0\0\x00\x00\x40\x40", 12));
  EXPECT_EQ(raw["rows"].size(), 3u);
  EXPECT_EQ(raw["meta"]["format"], "ps-server-1");
  EXPECT_EQ(raw["meta"]["table/t"], std::string("\x01\x02\x03\x04") + spec.SerializeAsString());
  EXPECT_EQ(raw["meta"]["dense/bias"], dense.SerializeAsString());
  EXPECT_EQ(raw["meta"]["dedup"], std::string("dedup\0blob", 10));
  EXPECT_EQ(raw["meta"]["log_base"], std::string("\0\0\0\0\0\0\0\x03", 8));
  EXPECT_TRUE(raw["log"].empty());  // the log is in files now
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/pushlog/00000000000000000001.log"));
}

// --- The push log ------------------------------------------------------------------------

TEST_F(StorageDbTest, LogRecordsReadBackAfterReopen) {
  {
    auto db = OpenDb();
    ASSERT_NE(db, nullptr);
    EXPECT_TRUE(ReadLog(*db, 1).empty());
    ASSERT_TRUE(AppendLog(*db, 1, 10, /*sync=*/false).ok());
    ASSERT_TRUE(AppendLog(*db, 11, 12, /*sync=*/true).ok());
    ASSERT_TRUE(db->SyncLog().ok());
    ASSERT_TRUE(db->SyncWal().ok());
  }
  auto db = OpenDb();
  ASSERT_NE(db, nullptr);
  EXPECT_EQ(ReadLog(*db, 4), Records(4, 12));
}

TEST_F(StorageDbTest, TruncationStoresDedupAndBaseTogetherAndDropsOldFiles) {
  StorageDbOptions options = Options(dir_);
  options.log_segment_bytes = 200;  // a few records per segment
  auto segments = [&] {
    size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir_ + "/pushlog"))
      n += !e.is_directory();
    return n;
  };
  size_t before = 0;
  {
    auto db = OpenDb(options);
    ASSERT_NE(db, nullptr);
    for (uint64_t lsn = 1; lsn <= 40; lsn += 2)
      ASSERT_TRUE(AppendLog(*db, lsn, lsn + 1, false).ok());
    before = segments();
    ASSERT_GT(before, 5u);
    ASSERT_TRUE(db->TruncateLog(25, "first", /*sync=*/true).ok());
    auto catalog = db->LoadCatalog();
    ASSERT_TRUE(catalog.ok());
    EXPECT_EQ(catalog->dedup, "first");
    EXPECT_EQ(catalog->log_base, 25u);
    EXPECT_LT(segments(), before);  // segments holding only records below 25 are gone
  }
  {
    auto db = OpenDb(options);
    ASSERT_NE(db, nullptr);
    auto catalog = db->LoadCatalog();
    ASSERT_TRUE(catalog.ok());
    EXPECT_EQ(catalog->dedup, "first");
    EXPECT_EQ(catalog->log_base, 25u);
    EXPECT_EQ(ReadLog(*db, catalog->log_base), Records(25, 40));
    ASSERT_TRUE(db->TruncateLog(31, "second", /*sync=*/false).ok());
  }
  auto db = OpenDb(options);
  ASSERT_NE(db, nullptr);
  auto catalog = db->LoadCatalog();
  ASSERT_TRUE(catalog.ok());
  EXPECT_EQ(catalog->dedup, "second");
  EXPECT_EQ(catalog->log_base, 31u);
  EXPECT_EQ(ReadLog(*db, 31), Records(31, 40));
}

// An earlier version wrote the log to the "log" column family: its records come first,
// and truncation deletes them too.
TEST_F(StorageDbTest, LogColumnFamilyRecordsAreReadFirst) {
  {
    auto db = OpenDb();
    ASSERT_NE(db, nullptr);
  }
  std::map<std::string, std::string> old;
  for (uint64_t lsn = 1; lsn <= 5; ++lsn) {
    std::string key(8, '\0');
    key[7] = static_cast<char>(lsn);
    old[key] = Record(lsn);
  }
  WriteRaw(dir_, kFamilies, {{"log", old}});
  {
    auto db = OpenDb();
    ASSERT_NE(db, nullptr);
    EXPECT_EQ(ReadLog(*db, 1), Records(1, 5));
    ASSERT_TRUE(AppendLog(*db, 6, 9, /*sync=*/true).ok());
  }
  {
    auto db = OpenDb();
    ASSERT_NE(db, nullptr);
    EXPECT_EQ(ReadLog(*db, 3), Records(3, 9));
    ASSERT_TRUE(db->TruncateLog(4, "d", /*sync=*/true).ok());
  }
  auto db = OpenDb();
  ASSERT_NE(db, nullptr);
  EXPECT_EQ(ReadLog(*db, 1), Records(4, 9));
}

// --- Checkpoints ---------------------------------------------------------------------------

TEST_F(StorageDbTest, CheckpointOpensWithTheSameContents) {
  const std::string copy = dir_ + "_checkpoint";
  auto db = OpenDb();
  ASSERT_NE(db, nullptr);
  ASSERT_TRUE(db->PutTable(1, Table("a", kDim)).ok());
  ASSERT_TRUE(db->PutTable(2, Table("b", kDim)).ok());
  ASSERT_TRUE(db->PutDense(Dense("bias", kRowFloats)).ok());
  RowBatch batch = db->NewRowBatch();
  for (int64_t id : kIds) {
    const std::vector<float> v = RowValues(1, id, 1);
    batch.AddRow(1, id, RowStep(id, 1), v, {});
  }
  batch.AddDense("bias", 3, RowValues(0, 0, 0));
  ASSERT_TRUE(db->WriteRows(&batch).ok());
  ASSERT_TRUE(db->FlushRows().ok());
  RowFile file;
  for (int64_t id : kIds) {
    const std::vector<float> v = RowValues(2, id, 1);
    file.AddRow(2, id, RowStep(id, 1), v, {});
  }
  ASSERT_TRUE(db->IngestRows(&file).ok());
  RowBatch logged = db->NewRowBatch();
  const std::vector<float> v = RowValues(1, 42, 2);
  logged.AddRow(1, 42, RowStep(42, 2), v, {});  // replaces a flushed row
  ASSERT_TRUE(db->WriteRowsLogged(&logged).ok());
  ASSERT_TRUE(AppendLog(*db, 1, 20, /*sync=*/false).ok());
  ASSERT_TRUE(db->TruncateLog(8, "dedup", /*sync=*/true).ok());

  ASSERT_TRUE(db->Checkpoint(copy).ok());
  EXPECT_FALSE(db->Checkpoint(copy).ok());  // the directory must not exist
  // After the checkpoint: not in it.
  ASSERT_TRUE(AppendLog(*db, 21, 22, /*sync=*/false).ok());
  RowBatch later = db->NewRowBatch();
  later.AddRow(1, 1000, 1, v, {});
  ASSERT_TRUE(db->WriteRowsLogged(&later).ok());

  auto copied = OpenDb(Options(copy));
  ASSERT_NE(copied, nullptr);
  auto original_catalog = db->LoadCatalog();
  auto copy_catalog = copied->LoadCatalog();
  ASSERT_TRUE(original_catalog.ok() && copy_catalog.ok());
  EXPECT_EQ(copy_catalog->tables.size(), 2u);
  for (size_t i = 0; i < copy_catalog->tables.size(); ++i) {
    EXPECT_EQ(copy_catalog->tables[i].first, original_catalog->tables[i].first);
    EXPECT_EQ(copy_catalog->tables[i].second.SerializeAsString(),
              original_catalog->tables[i].second.SerializeAsString());
  }
  ASSERT_EQ(copy_catalog->dense.size(), 1u);
  EXPECT_EQ(copy_catalog->dense[0].SerializeAsString(),
            Dense("bias", kRowFloats).SerializeAsString());
  EXPECT_EQ(copy_catalog->dedup, "dedup");
  EXPECT_EQ(copy_catalog->log_base, 8u);
  std::vector<RowBits> rows;
  for (int64_t id : kIds)
    rows.push_back(id == 42 ? Bits(1, 42, RowStep(42, 2), v) : Expected(1, id, 1));
  for (int64_t id : kIds) rows.push_back(Expected(2, id, 1));
  const AllRows all = ForEachRow(*copied);
  EXPECT_EQ(all.rows, rows);
  ASSERT_EQ(all.dense.size(), 1u);
  EXPECT_EQ(std::get<0>(all.dense[0]), "bias");
  EXPECT_EQ(ReadLog(*copied, 8), Records(8, 20));
}

// --- Fault injection ---------------------------------------------------------------------

// Opens dir_ with the hook on `full`, stores a table, a row and log records 1..3, then
// makes the disk full and runs `write`: it must fail with UNAVAILABLE naming the injected
// error. Reopened without faults, the database holds what it held before, nothing more.
class StorageDbFaultTest : public StorageDbTest {
 protected:
  void ExpectFailsWhole(const std::function<absl::Status(StorageDb&)>& write) {
    auto full = std::make_shared<std::atomic<bool>>(false);
    {
      StorageDbOptions options = Options(dir_);
      options.inject_write_error = [full] { return full->load(); };
      auto db = OpenDb(options);
      ASSERT_NE(db, nullptr);
      ASSERT_TRUE(db->PutTable(1, Table("t", kDim)).ok());
      RowBatch batch = db->NewRowBatch();
      batch.AddRow(1, 0, 1, RowValues(1, 0, 1), {});
      ASSERT_TRUE(db->WriteRowsLogged(&batch).ok());
      ASSERT_TRUE(AppendLog(*db, 1, 3, /*sync=*/true).ok());
      ASSERT_TRUE(db->TruncateLog(2, "before", /*sync=*/true).ok());
      full->store(true);
      absl::Status s = write(*db);
      EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
      EXPECT_NE(s.message().find("No space left on device"), std::string::npos) << s;
      EXPECT_TRUE(std::filesystem::is_empty(dir_ + "/ingest"));  // no table file left
    }                                                            // closed with the disk still full
    auto db = OpenDb();
    ASSERT_NE(db, nullptr);
    auto catalog = db->LoadCatalog();
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    ASSERT_EQ(catalog->tables.size(), 1u);
    EXPECT_EQ(catalog->tables[0].first, 1u);
    EXPECT_TRUE(catalog->dense.empty());
    EXPECT_EQ(catalog->dedup, "before");
    EXPECT_EQ(catalog->log_base, 2u);
    EXPECT_EQ(TableRows(*db, 1), (std::vector<RowBits>{Bits(1, 0, 1, RowValues(1, 0, 1))}));
    EXPECT_EQ(ReadLog(*db, 2), Records(2, 3));
  }
};

TEST_F(StorageDbFaultTest, PutTable) {
  ExpectFailsWhole([](StorageDb& db) { return db.PutTable(2, Table("u", kDim)); });
}

TEST_F(StorageDbFaultTest, PutDense) {
  ExpectFailsWhole([](StorageDb& db) { return db.PutDense(Dense("bias", 4)); });
}

TEST_F(StorageDbFaultTest, WriteRowsLogged) {
  ExpectFailsWhole([](StorageDb& db) {
    RowBatch batch = HundredRows(db);
    return db.WriteRowsLogged(&batch);
  });
}

TEST_F(StorageDbFaultTest, IngestRows) {
  ExpectFailsWhole([](StorageDb& db) {
    RowFile file;
    for (int64_t id = 1; id <= 100; ++id) file.AddRow(1, id, 2, RowValues(1, id, 2), {});
    return db.IngestRows(&file);
  });
}

TEST_F(StorageDbFaultTest, AppendLog) {
  ExpectFailsWhole([](StorageDb& db) { return AppendLog(db, 4, 10, /*sync=*/false); });
}

TEST_F(StorageDbFaultTest, AppendLogSynced) {
  ExpectFailsWhole([](StorageDb& db) { return AppendLog(db, 4, 10, /*sync=*/true); });
}

TEST_F(StorageDbFaultTest, TruncateLog) {
  ExpectFailsWhole([](StorageDb& db) { return db.TruncateLog(3, "after", /*sync=*/true); });
}

// Wherever the disk fills up during a write (the k-th file append or sync from then on
// fails, for every k until the write succeeds), a reopened database holds the write whole
// or not at all, and whole if the write succeeded. `held` says which: 0 for none, 1 for
// all, -1 for neither. Each attempt starts from a database that holds log base 2.
class StorageDbFaultSweepTest : public StorageDbTest {
 protected:
  void Sweep(const std::function<absl::Status(StorageDb&)>& write,
             const std::function<int(StorageDb&)>& held) {
    bool failed = false, succeeded = false;
    for (int k = 0; k < 16 && !succeeded; ++k) {
      SCOPED_TRACE(absl::StrCat("the disk fills at file write ", k));
      std::filesystem::remove_all(dir_);
      auto armed = std::make_shared<std::atomic<bool>>(false);
      auto writes = std::make_shared<std::atomic<int>>(0);
      absl::Status status;
      {
        StorageDbOptions options = Options(dir_);
        options.inject_write_error = [armed, writes, k] {
          return armed->load() && writes->fetch_add(1) >= k;
        };
        auto db = OpenDb(options);
        ASSERT_NE(db, nullptr);
        ASSERT_TRUE(db->TruncateLog(2, "before", /*sync=*/true).ok());
        armed->store(true);
        status = write(*db);
      }
      (status.ok() ? succeeded : failed) = true;
      if (!status.ok()) EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
      auto db = OpenDb();
      ASSERT_NE(db, nullptr);
      const int whole = held(*db);
      EXPECT_NE(whole, -1) << status;
      if (status.ok()) EXPECT_EQ(whole, 1);
    }
    EXPECT_TRUE(failed);
    EXPECT_TRUE(succeeded) << "still failing after 16 faulty file writes";
  }

  // Rows 1..100 of table 1: all there (1), none (0), or some (-1).
  static int RowsHeld(StorageDb& db) {
    const size_t n = TableRows(db, 1).size();
    return n == 0 ? 0 : n == 100 ? 1 : -1;
  }
};

TEST_F(StorageDbFaultSweepTest, TruncateLog) {
  Sweep([](StorageDb& db) { return db.TruncateLog(3, "after", /*sync=*/true); },
        [](StorageDb& db) {
          auto catalog = db.LoadCatalog();
          if (!catalog.ok()) return -1;
          if (catalog->dedup == "before" && catalog->log_base == 2) return 0;
          if (catalog->dedup == "after" && catalog->log_base == 3) return 1;
          return -1;
        });
}

TEST_F(StorageDbFaultSweepTest, WriteRowsLogged) {
  Sweep(
      [](StorageDb& db) {
        RowBatch batch = HundredRows(db);
        RETURN_IF_ERROR(db.WriteRowsLogged(&batch));
        return db.SyncWal();
      },
      RowsHeld);
}

TEST_F(StorageDbFaultSweepTest, WriteRowsThenFlush) {
  Sweep(
      [](StorageDb& db) {
        RowBatch batch = HundredRows(db);
        RETURN_IF_ERROR(db.WriteRows(&batch));
        return db.FlushRows();
      },
      RowsHeld);
}

// When the sync of the MANIFEST record that adds the ingested table file fails,
// IngestExternalFile reports the error and deletes the file it linked into the database,
// but the record may already be in the MANIFEST (in the page cache): the next Open failed
// with DATA_LOSS ("...000014.ldb: No such file or directory in file .../MANIFEST-000005").
// RocksDB (7.8 and upstream: ExternalSstFileIngestionJob::Cleanup deletes the internal
// files on any failure) stops file deletions after a failed MANIFEST write for flushes and
// compactions (facebook/rocksdb#5379), not for ingestion, so StorageDb keeps the files an
// ingestion linked in (its file system refuses their deletion while the ingestion runs).
TEST_F(StorageDbFaultSweepTest, IngestRows) {
  Sweep(
      [](StorageDb& db) {
        RowFile file;
        for (int64_t id = 1; id <= 100; ++id) file.AddRow(1, id, 2, RowValues(1, id, 2), {});
        return db.IngestRows(&file);
      },
      RowsHeld);
}

TEST_F(StorageDbTest, SizesCountStoredRowsAndLogFiles) {
  auto db = OpenDb();
  ASSERT_NE(db, nullptr);
  const uint64_t empty = db->disk_bytes();
  RowFile file;
  for (int64_t id = 0; id < 1000; ++id) file.AddRow(1, id, 1, RowValues(1, id, 1), {});
  ASSERT_TRUE(db->IngestRows(&file).ok());
  EXPECT_GT(db->EstimateRows(), 0u);
  EXPECT_LE(db->EstimateRows(), 2000u);
  const uint64_t with_rows = db->disk_bytes();
  EXPECT_GT(with_rows, empty + 1000 * kRowFloats * sizeof(float));
  ASSERT_TRUE(AppendLog(*db, 1, 10, /*sync=*/false).ok());
  EXPECT_GT(db->disk_bytes(), with_rows);
}

}  // namespace
}  // namespace ps
