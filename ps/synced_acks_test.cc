// SyncedAcks (ps/synced_acks.h): callbacks run after a sync that started after their Add,
// grouped; and the stats the pod exports (ps_sole_copy_* in ps_metrics.cc): syncs, acks,
// the time in `sync` and the acknowledgements' summed waits, on a fake clock that only a
// sync moves (each call takes one second), so every figure is exact.
#include "ps/synced_acks.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(SyncedAcksTest, WaitsAreCountedFromEachAddToTheEndOfItsSync) {
  std::atomic<int64_t> now_ms{0};
  absl::Notification first_sync_entered, first_sync_may_end;
  std::atomic<int> calls{0};
  SyncedAcks acks(
      [&] {
        if (calls.fetch_add(1) == 0) {
          first_sync_entered.Notify();
          first_sync_may_end.WaitForNotification();
        }
        now_ms.fetch_add(1000);
        return absl::OkStatus();
      },
      [&] { return absl::FromUnixMillis(now_ms.load()); });

  std::vector<absl::Notification> done(3);
  std::vector<absl::Status> results(3, absl::UnknownError("not run"));
  auto add = [&](int i) {
    acks.Add([&, i](absl::Status s) {
      results[i] = s;
      done[i].Notify();
    });
  };
  add(0);  // at 0 s; its sync runs from 0 to 1 s
  first_sync_entered.WaitForNotification();
  add(1);  // at 0 s, while that sync runs: covered by the next one, from 1 to 2 s
  add(2);
  EXPECT_FALSE(done[1].HasBeenNotified());
  first_sync_may_end.Notify();
  for (auto& d : done) d.WaitForNotification();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;

  const SyncedAcks::Stats stats = acks.stats();
  EXPECT_EQ(stats.syncs, 2u);
  EXPECT_EQ(stats.acks, 3u);
  EXPECT_EQ(stats.sync_time, absl::Seconds(2));
  EXPECT_EQ(stats.ack_wait, absl::Seconds(1 + 2 + 2));
  EXPECT_EQ(acks.syncs(), 2u);
  EXPECT_EQ(acks.acks(), 3u);
}

TEST(SyncedAcksTest, AFailedSyncIsEveryWaitingCallbacksAnswer) {
  SyncedAcks acks([] { return absl::ResourceExhaustedError("disk full"); });
  absl::Notification done;
  absl::Status result;
  acks.Add([&](absl::Status s) {
    result = s;
    done.Notify();
  });
  done.WaitForNotification();
  EXPECT_EQ(result.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(acks.stats().acks, 1u);
  acks.Stop();
  absl::Status after;
  acks.Add([&](absl::Status s) { after = s; });  // after Stop: at once, on this thread
  EXPECT_EQ(after.code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace ps
