#include "proto/export_file.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "common/base/crc32c.h"

namespace ps {
namespace {

class ExportFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/export_file_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes `n` records of dim 3 + 2 slots with small blocks; returns the summary.
  ExportFileSummary WriteFile(const std::string& path, int n) {
    auto w = ExportFileWriter::Create(path, ExportKind::kTableRows, "spec-bytes", 3, 2,
                                      /*block_bytes=*/100);
    EXPECT_TRUE(w.ok()) << w.status();
    for (int i = 0; i < n; ++i) {
      const float weights[3] = {i * 1.f, -i * 0.5f, 3.25f};
      const float slots[2] = {i * 0.125f, 7};
      EXPECT_TRUE((*w)->Add(i * 1000 - 5, static_cast<uint64_t>(i), weights, slots).ok());
    }
    auto summary = (*w)->Finish();
    EXPECT_TRUE(summary.ok()) << summary.status();
    return *summary;
  }

  std::string ReadAll(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  void WriteAll(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
  }

  // Reads a whole file; the first error, or OK with the records in *block_all.
  absl::Status ReadFile(const std::string& path, ExportBlock* all, ExportFileSummary* summary) {
    auto r = ExportFileReader::Open(path);
    if (!r.ok()) return r.status();
    ExportBlock b;
    for (;;) {
      auto more = (*r)->Next(&b);
      if (!more.ok()) return more.status();
      if (!*more) break;
      all->ids.insert(all->ids.end(), b.ids.begin(), b.ids.end());
      all->steps.insert(all->steps.end(), b.steps.begin(), b.steps.end());
      all->values.insert(all->values.end(), b.values.begin(), b.values.end());
    }
    *summary = (*r)->summary();
    return absl::OkStatus();
  }

  std::string dir_;
};

TEST(Crc32cTest, KnownValues) {
  EXPECT_EQ(Crc32c(0, "123456789", 9), 0xe3069283u);
  EXPECT_EQ(Crc32c(Crc32c(0, "1234", 4), "56789", 5), 0xe3069283u);
  EXPECT_EQ(Crc32c(0, "", 0), 0u);
}

TEST_F(ExportFileTest, RoundTripsRecordsAcrossBlocks) {
  const std::string path = dir_ + "/t.psx";
  const ExportFileSummary written = WriteFile(path, 50);
  EXPECT_EQ(written.rows, 50u);
  const std::string bytes = ReadAll(path);
  EXPECT_EQ(written.bytes, bytes.size());
  EXPECT_EQ(written.crc32c, Crc32c(0, bytes.data(), bytes.size()));

  auto r = ExportFileReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->kind(), ExportKind::kTableRows);
  EXPECT_EQ((*r)->spec_bytes(), "spec-bytes");
  EXPECT_EQ((*r)->dim(), 3u);
  EXPECT_EQ((*r)->slot_floats(), 2u);

  ExportBlock all;
  ExportFileSummary read;
  ASSERT_TRUE(ReadFile(path, &all, &read).ok());
  EXPECT_EQ(read.rows, 50u);
  EXPECT_EQ(read.bytes, written.bytes);
  EXPECT_EQ(read.crc32c, written.crc32c);
  ASSERT_EQ(all.ids.size(), 50u);
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(all.ids[i], i * 1000 - 5);
    EXPECT_EQ(all.steps[i], static_cast<uint64_t>(i));
    EXPECT_EQ(all.values[i * 5 + 0], i * 1.f);
    EXPECT_EQ(all.values[i * 5 + 1], -i * 0.5f);
    EXPECT_EQ(all.values[i * 5 + 3], i * 0.125f);
  }
}

TEST_F(ExportFileTest, DeletedIdsRoundTripAndCarryNoFloats) {
  const std::string path = dir_ + "/d.psx";
  auto w = ExportFileWriter::Create(path, ExportKind::kDeletedIds, "spec", 0, 0, 64);
  ASSERT_TRUE(w.ok()) << w.status();
  const float none = 0;
  const std::vector<int64_t> ids = {-3, 0, int64_t{1} << 62, 17, 5, 6, 7, 8, 9};
  for (int64_t id : ids) ASSERT_TRUE((*w)->Add(id, 0, &none, &none).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  ExportBlock all;
  ExportFileSummary sum;
  ASSERT_TRUE(ReadFile(path, &all, &sum).ok());
  EXPECT_EQ(all.ids, ids);
  EXPECT_TRUE(all.values.empty());
  EXPECT_EQ(sum.rows, ids.size());
  auto r = ExportFileReader::Open(path);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->kind(), ExportKind::kDeletedIds);

  // A deleted-ids header that claims floats per record is damage, not a newer format.
  const std::string floats = dir_ + "/f.psx";
  auto bad = ExportFileWriter::Create(floats, ExportKind::kDeletedIds, "spec", 1, 0);
  ASSERT_TRUE(bad.ok());
  ASSERT_TRUE((*bad)->Finish().ok());
  EXPECT_EQ(ExportFileReader::Open(floats).status().code(), absl::StatusCode::kDataLoss);
}

TEST(ExportCursorTest, FormatsAndParsesBackAndRefusesDamage) {
  const std::vector<ExportCursorEntry> entries = {{0x9f2c03a1e4b5d6c7, 42, 0x1b}, {1, 0, 0}};
  const std::string text = FormatExportCursor(entries);
  EXPECT_EQ(text, "v1:9f2c03a1e4b5d6c7.42.000000000000001b,0000000000000001.0.0000000000000000");
  auto back = ParseExportCursor(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, entries);
  EXPECT_TRUE(ParseExportCursor("v1:")->empty());
  EXPECT_EQ(FormatExportCursor({}), "v1:");
  for (const char* bad :
       {"", "v2:0000000000000001.0.0000000000000000", "v1:1.2.3", "v1:,",
        "v1:0000000000000001.x.0000000000000000", "v1:0000000000000000.1.0000000000000000",
        "v1:0000000000000001.1.0000000000000000.5", "v1:000000000000000g.1.0000000000000000"}) {
    EXPECT_EQ(ParseExportCursor(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST_F(ExportFileTest, DamageIsDataLoss) {
  const std::string path = dir_ + "/t.psx";
  WriteFile(path, 20);
  const std::string good = ReadAll(path);
  ExportBlock all;
  ExportFileSummary summary;
  // Every truncation is detected (the end block is missing or cut).
  for (size_t cut = 0; cut < good.size(); cut += 7) {
    WriteAll(path, good.substr(0, cut));
    ExportBlock b;
    EXPECT_EQ(ReadFile(path, &b, &summary).code(), absl::StatusCode::kDataLoss) << "cut " << cut;
  }
  // A flipped bit anywhere is detected by a checksum (or breaks the framing).
  for (size_t at = 0; at < good.size(); at += 13) {
    std::string bad = good;
    bad[at] ^= 0x10;
    WriteAll(path, bad);
    ExportBlock b;
    const absl::Status s = ReadFile(path, &b, &summary);
    EXPECT_FALSE(s.ok()) << "flip at " << at;
  }
  WriteAll(path, good + "x");
  EXPECT_EQ(ReadFile(path, &all, &summary).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ExportFileReader::Open(dir_ + "/missing").status().code(), absl::StatusCode::kNotFound);
  // Create refuses to overwrite.
  EXPECT_FALSE(ExportFileWriter::Create(path, ExportKind::kDense, "", 1, 0).ok());
}

// Found while writing tests/fuzz/fuzz_export_file.cc (regression input
// corpus/export_file/regression-wrapped_block): a block header's record count times the
// header's record size wrapped in 64 bits to the claimed payload (here 2^30 records of 2^34 bytes
// in 0 bytes), so the reader sized its arrays from the count: an 8 GB allocation, then a throw,
// from a 70-byte file.
TEST_F(ExportFileTest, BlockHeaderThatWrapsIsDataLoss) {
  const std::string path = dir_ + "/wrapped";
  {
    // dim + slot floats = 2^32 - 4: a record of 16 + 4 * (2^32 - 4) = 2^34 bytes.
    auto w = ExportFileWriter::Create(path, ExportKind::kTableRows, "s", uint32_t{1} << 31,
                                      (uint32_t{1} << 31) - 4);
    ASSERT_TRUE(w.ok()) << w.status();
  }  // the header only; the block is written by hand
  std::string bytes = ReadAll(path);
  auto put = [&bytes](const void* p, size_t n) { bytes.append(static_cast<const char*>(p), n); };
  const uint32_t records = uint32_t{1} << 30, crc = 0;
  const uint64_t payload = 0;
  put(&records, 4);
  put(&payload, 8);
  put(&crc, 4);
  WriteAll(path, bytes);
  auto r = ExportFileReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  ExportBlock block;
  auto more = (*r)->Next(&block);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kDataLoss) << more.status();
  EXPECT_TRUE(block.ids.empty());
}

// A block header that claims more bytes than the file has is refused once the file ends
// (corpus/export_file/regression-long_block),
// without allocating the claim first: a 4 GB claim in a small file is read in a child
// process whose address space allows 256 MB more than it uses (the reader used to size
// the payload from the claim: std::bad_alloc, an abort).
TEST_F(ExportFileTest, BlockLongerThanTheFileIsTruncatedWithoutAllocatingIt) {
  const std::string path = dir_ + "/long";
  {
    auto w = ExportFileWriter::Create(path, ExportKind::kTableRows, "s", 0, 0);
    ASSERT_TRUE(w.ok()) << w.status();
  }
  std::string bytes = ReadAll(path);
  const uint32_t records = 1u << 28;
  const uint64_t payload = uint64_t{16} << 28;  // 2^28 records of 16 bytes: 4 GB
  bytes.append(reinterpret_cast<const char*>(&records), 4);
  bytes.append(reinterpret_cast<const char*>(&payload), 8);
  bytes.append(100, 'x');
  WriteAll(path, bytes);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    size_t vm_pages = 0;
    std::ifstream("/proc/self/statm") >> vm_pages;
    const rlim_t limit = vm_pages * sysconf(_SC_PAGESIZE) + (rlim_t{256} << 20);
    const rlimit rl{limit, limit};
    if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(3);
    auto r = ExportFileReader::Open(path);
    if (!r.ok()) _exit(4);
    ExportBlock block;
    auto more = (*r)->Next(&block);
    const bool truncated = more.status().code() == absl::StatusCode::kDataLoss &&
                           more.status().message().find("truncated") != std::string::npos;
    _exit(truncated ? 0 : 5);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the reader died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace ps
