#include "proto/export_file.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>

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

}  // namespace
}  // namespace ps
