#include "ps/storage/push_dedup.h"

#include "gtest/gtest.h"

namespace ps {
namespace {

PushKey Key(uint64_t worker, uint64_t incarnation, uint64_t seq) {
  PushKey k;
  k.set_worker_id(worker);
  k.set_incarnation(incarnation);
  k.set_sequence(seq);
  return k;
}

using Claim = PushDedup::Claim;

TEST(PushDedupTest, AppliedOnceAcrossRetriesAndOutOfOrder) {
  PushDedup d;
  EXPECT_EQ(*d.Begin(Key(1, 1, 2)), Claim::kNew);
  EXPECT_EQ(*d.Begin(Key(1, 1, 1)), Claim::kNew);  // out of order is fine
  EXPECT_EQ(*d.Begin(Key(1, 1, 2)), Claim::kInProgress);
  d.Finish(Key(1, 1, 2), true);
  d.Finish(Key(1, 1, 1), true);
  EXPECT_EQ(*d.Begin(Key(1, 1, 2)), Claim::kDuplicate);
  EXPECT_EQ(*d.Begin(Key(1, 1, 1)), Claim::kDuplicate);
  EXPECT_EQ(*d.Begin(Key(2, 1, 1)), Claim::kNew);  // another writer
}

TEST(PushDedupTest, ReleasedClaimCanBeRetried) {
  PushDedup d;
  EXPECT_EQ(*d.Begin(Key(1, 1, 5)), Claim::kNew);
  d.Finish(Key(1, 1, 5), false);
  EXPECT_EQ(*d.Begin(Key(1, 1, 5)), Claim::kNew);
}

TEST(PushDedupTest, WindowSlidesAndRefusesTooOld) {
  PushDedupOptions o;
  o.window = 64;
  PushDedup d(o);
  for (uint64_t s = 1; s <= 200; ++s) {
    ASSERT_EQ(*d.Begin(Key(1, 1, s)), Claim::kNew) << s;
    d.Finish(Key(1, 1, s), true);
  }
  for (uint64_t s = 137; s <= 200; ++s) EXPECT_EQ(*d.Begin(Key(1, 1, s)), Claim::kDuplicate);
  auto old = d.Begin(Key(1, 1, 136));
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition);
  // A jump far ahead clears the whole window: the new slots are not mistaken for done.
  EXPECT_EQ(*d.Begin(Key(1, 1, 10000)), Claim::kNew);
  d.Finish(Key(1, 1, 10000), true);
  EXPECT_EQ(*d.Begin(Key(1, 1, 9999)), Claim::kNew);
}

TEST(PushDedupTest, NewIncarnationSupersedesOld) {
  PushDedup d;
  EXPECT_EQ(*d.Begin(Key(1, 1, 1)), Claim::kNew);
  d.Finish(Key(1, 1, 1), true);
  EXPECT_EQ(*d.Begin(Key(1, 2, 1)), Claim::kNew);  // same sequence, new incarnation
  auto stale = d.Begin(Key(1, 1, 2));
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.status().message().find("superseded"), std::string::npos);
}

TEST(PushDedupTest, AnonymousAndBadKeys) {
  PushDedup d;
  EXPECT_EQ(*d.Begin(Key(0, 0, 0)), Claim::kNew);
  EXPECT_EQ(*d.Begin(Key(0, 0, 0)), Claim::kNew);
  EXPECT_EQ(d.Begin(Key(3, 1, 0)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PushDedupTest, WritersAreBounded) {
  PushDedupOptions o;
  o.max_writers = 10;
  PushDedup d(o);
  for (uint64_t w = 1; w <= 50; ++w) {
    ASSERT_EQ(*d.Begin(Key(w, 1, 1)), Claim::kNew);
    d.Finish(Key(w, 1, 1), true);
  }
  EXPECT_EQ(d.writers(), 10u);
  EXPECT_EQ(*d.Begin(Key(50, 1, 1)), Claim::kDuplicate);  // recent writers are kept
}

}  // namespace
}  // namespace ps
