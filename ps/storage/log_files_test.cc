#include "ps/storage/log_files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

class LogFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/log_files_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<LogFiles> OpenLog(size_t segment_bytes = 1 << 20) {
    LogFilesOptions options;
    options.dir = dir_;
    options.segment_bytes = segment_bytes;
    auto log = LogFiles::Open(options);
    EXPECT_TRUE(log.ok()) << log.status();
    return std::move(*log);
  }
  static std::string Record(uint64_t lsn) {
    return absl::StrCat("record-", lsn, "-", std::string(100 + lsn % 50, 'a' + lsn % 26));
  }
  // Appends records [first, last] in groups of `group`.
  static void AppendRange(LogFiles& log, uint64_t first, uint64_t last, size_t group = 3) {
    std::vector<std::string> payloads;
    std::vector<LogAppend> batch;
    for (uint64_t lsn = first; lsn <= last; lsn += group) {
      payloads.clear();
      batch.clear();
      for (uint64_t l = lsn; l <= last && l < lsn + group; ++l) payloads.push_back(Record(l));
      for (size_t i = 0; i < payloads.size(); ++i) {
        batch.push_back({lsn + i, payloads[i], LogFiles::Checksum(payloads[i])});
      }
      ASSERT_TRUE(log.Append(batch, /*sync=*/false).ok());
    }
  }
  static std::vector<uint64_t> ReadLsns(LogFiles& log, uint64_t from, absl::Status* status) {
    LogRead read;
    *status = log.ReadAll(from, &read);
    std::vector<uint64_t> lsns;
    for (const LogEntryView& e : read.records) {
      EXPECT_EQ(e.record, Record(e.lsn));
      lsns.push_back(e.lsn);
    }
    return lsns;
  }
  std::vector<std::string> Segments() {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      names.push_back(e.path().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }
  static std::vector<uint64_t> Range(uint64_t a, uint64_t b) {
    std::vector<uint64_t> v;
    for (uint64_t i = a; i <= b; ++i) v.push_back(i);
    return v;
  }

  std::string dir_;
};

TEST_F(LogFilesTest, AppendedRecordsReadBackInOrderFromTheBase) {
  {
    auto log = OpenLog();
    AppendRange(*log, 5, 40);
  }
  auto log = OpenLog();
  absl::Status s;
  EXPECT_EQ(ReadLsns(*log, 0, &s), Range(5, 40));
  EXPECT_TRUE(s.ok()) << s;
  auto again = OpenLog();
  EXPECT_EQ(ReadLsns(*again, 17, &s), Range(17, 40));
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(LogFilesTest, SegmentsRotateAndOnlyWholeSegmentsBelowTheCutAreDeleted) {
  auto log = OpenLog(/*segment_bytes=*/1000);
  AppendRange(*log, 1, 60);
  const size_t before = Segments().size();
  ASSERT_GT(before, 4u);
  ASSERT_TRUE(log->DeleteBelow(30).ok());
  const size_t after = Segments().size();
  EXPECT_LT(after, before);
  EXPECT_GT(after, 1u);
  // Every record from the cut on is still there.
  auto reopened = OpenLog(1000);
  absl::Status s;
  std::vector<uint64_t> lsns = ReadLsns(*reopened, 30, &s);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(lsns, Range(30, 60));
  // Appends continue after a restart, in a new segment.
  AppendRange(*reopened, 61, 70);
  auto third = OpenLog(1000);
  EXPECT_EQ(ReadLsns(*third, 30, &s), Range(30, 70));
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(LogFilesTest, TornTailOfTheNewestSegmentIsCutOff) {
  {
    auto log = OpenLog();
    AppendRange(*log, 1, 10);
  }
  const std::string seg = Segments().back();
  const auto size = std::filesystem::file_size(seg);
  std::filesystem::resize_file(seg, size - 7);  // a write cut short by a crash
  {
    auto log = OpenLog();
    absl::Status s;
    EXPECT_EQ(ReadLsns(*log, 0, &s), Range(1, 9));
    ASSERT_TRUE(s.ok()) << s;
    AppendRange(*log, 10, 12);  // the lost record's lsn is written again
  }
  auto log = OpenLog();
  absl::Status s;
  EXPECT_EQ(ReadLsns(*log, 0, &s), Range(1, 12));
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(LogFilesTest, DamageBeforeTheNewestSegmentIsDataLoss) {
  {
    auto log = OpenLog(/*segment_bytes=*/500);
    AppendRange(*log, 1, 30);
  }
  std::vector<std::string> segs = Segments();
  ASSERT_GT(segs.size(), 2u);
  {
    std::fstream f(segs[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('#');  // inside the first record's payload
  }
  auto log = OpenLog(500);
  absl::Status s;
  ReadLsns(*log, 0, &s);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(segs[0]), std::string::npos) << s;
}

TEST_F(LogFilesTest, MissingSegmentIsDataLoss) {
  {
    auto log = OpenLog(/*segment_bytes=*/500);
    AppendRange(*log, 1, 30);
  }
  std::vector<std::string> segs = Segments();
  ASSERT_GT(segs.size(), 2u);
  std::filesystem::remove(segs[1]);
  auto log = OpenLog(500);
  absl::Status s;
  ReadLsns(*log, 0, &s);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("missing"), std::string::npos) << s;
}

TEST_F(LogFilesTest, ForeignFileIsRefused) {
  std::filesystem::create_directories(dir_);
  std::ofstream(dir_ + "/notes.txt") << "hello";
  auto log = OpenLog();
  absl::Status s;
  ReadLsns(*log, 0, &s);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

TEST_F(LogFilesTest, CopyHoldsWhatWasWritten) {
  auto log = OpenLog(/*segment_bytes=*/800);
  AppendRange(*log, 1, 25);
  const std::string copy = dir_ + "_copy";
  std::filesystem::remove_all(copy);
  ASSERT_TRUE(log->CopyTo(copy).ok());
  AppendRange(*log, 26, 30);  // after the copy: not in it
  LogFilesOptions options;
  options.dir = copy;
  auto copied = LogFiles::Open(options);
  ASSERT_TRUE(copied.ok());
  absl::Status s;
  EXPECT_EQ(ReadLsns(**copied, 0, &s), Range(1, 25));
  EXPECT_TRUE(s.ok()) << s;
  std::filesystem::remove_all(copy);
}

TEST_F(LogFilesTest, InjectedWriteErrorFailsTheAppend) {
  bool full = false;
  LogFilesOptions options;
  options.dir = dir_;
  options.inject_write_error = [&full] { return full; };
  auto log = LogFiles::Open(options);
  ASSERT_TRUE(log.ok());
  AppendRange(**log, 1, 3);
  full = true;
  const std::string payload = Record(4);
  std::vector<LogAppend> batch = {{4, payload, LogFiles::Checksum(payload)}};
  absl::Status s = (*log)->Append(batch, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ((*log)->Sync().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace ps
