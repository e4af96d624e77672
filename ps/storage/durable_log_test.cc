#include "ps/storage/durable_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ps {
namespace {

TEST(DurableLogTest, PushesWaitWhileTheUnmaterializedLogIsOverItsBound) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/durable_log_test_", getpid());
  std::filesystem::remove_all(dir);
  {
    StorageDbOptions db_options;
    db_options.dir = dir;
    auto db = StorageDb::Open(db_options);
    ASSERT_TRUE(db.ok()) << db.status();
    DurableLogOptions options;
    options.max_log_bytes = 1000;
    DurableLog log(db->get(), 1, options);
    auto append = [&log] {
      std::promise<absl::Status> done;
      log.Append(std::string(400, 'x'), [&done](absl::Status s) { done.set_value(s); });
      return done.get_future().get();
    };
    ASSERT_TRUE(append().ok());  // lsn 1
    ASSERT_TRUE(append().ok());  // lsn 2
    log.WaitForRoom();           // 800 bytes: room
    ASSERT_TRUE(append().ok());  // lsn 3: 1200 bytes
    std::atomic<bool> passed{false};
    std::thread waiter([&] {
      log.WaitForRoom();
      passed = true;
    });
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_FALSE(passed.load());
    log.Truncated(2);  // lsn 1 deleted: 800 bytes live
    waiter.join();
    EXPECT_TRUE(passed.load());
    ASSERT_TRUE(append().ok());  // 1200 again
    log.SetMaxLogBytes(0);       // no bound
    log.WaitForRoom();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ps
