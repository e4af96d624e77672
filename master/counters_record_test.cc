#include "master/counters_record.h"

#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "master/keys.h"
#include "master/memory_store_for_test.h"

namespace ps {
namespace {

Counters Stored(MemoryStore& store) {
  auto stored = GetRecord<Counters>(store, keys::kCounters);
  EXPECT_TRUE(stored.ok() && stored->has_value());
  return stored.ok() && stored->has_value() ? **stored : Counters();
}

TEST(CountersRecordTest, WritesTheCountersWithTheBatchAndOnlyThenChangesMemory) {
  MemoryStore store;
  CountersRecord counters(&store);
  ASSERT_TRUE(counters.Load().ok());  // absent: all zero
  EXPECT_EQ(counters.Get().next_worker_id(), 0u);

  StoreBatch batch;
  TableSpec spec;
  spec.set_name("emb");
  batch.Put(keys::Table("emb"), spec);
  ASSERT_TRUE(counters.Write(batch, [](Counters* c) { c->set_catalog_version(1); }).ok());
  EXPECT_EQ(counters.catalog_version(), 1u);
  EXPECT_EQ(Stored(store).catalog_version(), 1u);
  EXPECT_TRUE(store.Get(keys::Table("emb"))->has_value());

  // A failed write changes neither the store nor memory.
  store.before_write = [](const StoreBatch&) { return absl::UnavailableError("disk gone"); };
  EXPECT_EQ(counters.Write(StoreBatch(), [](Counters* c) { c->set_catalog_version(2); }).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(counters.catalog_version(), 1u);
  EXPECT_EQ(Stored(store).catalog_version(), 1u);

  // Load reads back what was written.
  CountersRecord reopened(&store);
  ASSERT_TRUE(reopened.Load().ok());
  EXPECT_EQ(reopened.catalog_version(), 1u);
}

TEST(CountersRecordTest, PartsWritingTheirOwnFieldsConcurrentlyLoseNothing) {
  MemoryStore store;
  CountersRecord counters(&store);
  ASSERT_TRUE(counters.Load().ok());
  constexpr int kWrites = 300;
  std::thread catalog([&] {
    for (int i = 0; i < kWrites; ++i) {
      ASSERT_TRUE(counters
                      .Write(StoreBatch(),
                             [](Counters* c) { c->set_catalog_version(c->catalog_version() + 1); })
                      .ok());
    }
  });
  std::thread jobs([&] {
    for (int i = 0; i < kWrites; ++i) {
      ASSERT_TRUE(
          counters.Write(StoreBatch(), [](Counters* c) { ++(*c->mutable_table_versions())["emb"]; })
              .ok());
    }
  });
  catalog.join();
  jobs.join();
  EXPECT_EQ(counters.Get().catalog_version(), uint64_t{kWrites});
  EXPECT_EQ(counters.Get().table_versions().at("emb"), uint64_t{kWrites});
  EXPECT_EQ(Stored(store).catalog_version(), uint64_t{kWrites});
  EXPECT_EQ(Stored(store).table_versions().at("emb"), uint64_t{kWrites});
}

TEST(CountersRecordTest, ReadersDoNotWaitForAWrite) {
  MemoryStore store;
  CountersRecord counters(&store);
  ASSERT_TRUE(counters.Load().ok());
  absl::Notification writing, release;
  store.before_write = [&](const StoreBatch&) {
    writing.Notify();
    release.WaitForNotification();
    return absl::OkStatus();
  };
  std::thread writer([&] {
    EXPECT_TRUE(counters.Write(StoreBatch(), [](Counters* c) { c->set_catalog_version(5); }).ok());
  });
  writing.WaitForNotification();
  EXPECT_EQ(counters.catalog_version(), 0u);  // the write is on its way to disk: not yet
  release.Notify();
  writer.join();
  EXPECT_EQ(counters.catalog_version(), 5u);
}

}  // namespace
}  // namespace ps
