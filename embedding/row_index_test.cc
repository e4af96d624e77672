#include "embedding/row_index.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/base/spin_lock.h"
#include "common/routing/hash.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr uint64_t kNameHash = 0x1234567887654321ULL;

uint64_t GoodHash(int64_t id) { return RouteHash(kNameHash, id); }

// The inverse of the Fibonacci multiplier mod 2^64 (Newton's iteration), to build hashes
// that land in chosen buckets.
uint64_t InverseFibonacci() {
  const uint64_t a = 0x9E3779B97F4A7C15ULL;
  uint64_t x = a;  // a * a == 1 mod 8
  for (int i = 0; i < 6; ++i) x *= 2 - a * x;
  return x;
}

enum class HashKind { kGood, kLow3Bits, kConstant, kLastBuckets };

// Bad hashes stress clustering: kLow3Bits has 8 values, kConstant one, and kLastBuckets
// puts every key in (or just before) the last bucket at any capacity, so every probe
// run wraps around the end of the array.
uint64_t HashOf(HashKind kind, int64_t id) {
  switch (kind) {
    case HashKind::kGood:
      return GoodHash(id);
    case HashKind::kLow3Bits:
      return static_cast<uint64_t>(id) & 7;
    case HashKind::kConstant:
      return 42;
    case HashKind::kLastBuckets:
      return InverseFibonacci() * (~uint64_t{0} - (static_cast<uint64_t>(id) & 3));
  }
  return 0;
}

uint32_t ValueOf(int64_t id) { return static_cast<uint32_t>(GoodHash(id) >> 7); }

TEST(RowIndexTest, Empty) {
  RowIndex index;
  EXPECT_EQ(index.size(), 0u);
  EXPECT_TRUE(index.empty());
  EXPECT_EQ(index.capacity(), RowIndex::kMinCapacity);
  EXPECT_EQ(index.memory_bytes(), RowIndex::kMinCapacity * 16);
  for (int64_t id : {kMin, int64_t{0}, int64_t{-1}, kMax, int64_t{7}}) {
    EXPECT_EQ(index.Find(id, GoodHash(id)), nullptr) << id;
    EXPECT_FALSE(index.Erase(id, GoodHash(id))) << id;
  }
  int visits = 0;
  index.ForEach([&](int64_t, uint32_t) { ++visits; });
  EXPECT_EQ(visits, 0);
  index.Prefetch(GoodHash(1));
}

TEST(RowIndexTest, SpecialKeys) {
  const std::vector<int64_t> ids = {kMin, 0, -1, kMax, kMin + 1, kMax - 1, 1};
  RowIndex index;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto [value, inserted] = index.Insert(ids[i], GoodHash(ids[i]), 100 + i);
    EXPECT_TRUE(inserted) << ids[i];
    EXPECT_EQ(*value, 100 + i) << ids[i];
    EXPECT_EQ(index.size(), i + 1);
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t* value = index.Find(ids[i], GoodHash(ids[i]));
    ASSERT_NE(value, nullptr) << ids[i];
    EXPECT_EQ(*value, 100 + i) << ids[i];
    // Inserting again keeps the stored slot and reports it.
    auto [existing, inserted] = index.Insert(ids[i], GoodHash(ids[i]), 999);
    EXPECT_FALSE(inserted) << ids[i];
    EXPECT_EQ(*existing, 100 + i) << ids[i];
  }
  EXPECT_EQ(index.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_TRUE(index.Erase(ids[i], GoodHash(ids[i]))) << ids[i];
    EXPECT_FALSE(index.Erase(ids[i], GoodHash(ids[i]))) << ids[i];
    EXPECT_EQ(index.Find(ids[i], GoodHash(ids[i])), nullptr) << ids[i];
    for (size_t j = i + 1; j < ids.size(); ++j) {
      const uint32_t* value = index.Find(ids[j], GoodHash(ids[j]));
      ASSERT_NE(value, nullptr) << ids[j];
      EXPECT_EQ(*value, 100 + j);
    }
  }
  EXPECT_TRUE(index.empty());
  // Reinsert after erase, the sentinel included.
  EXPECT_TRUE(index.Insert(kMin, GoodHash(kMin), 5).second);
  EXPECT_TRUE(index.Insert(0, GoodHash(0), 6).second);
  EXPECT_EQ(*index.Find(kMin, GoodHash(kMin)), 5u);
  EXPECT_EQ(*index.Find(0, GoodHash(0)), 6u);
}

TEST(RowIndexTest, FindPointerUpdatesSlot) {
  RowIndex index;
  index.Insert(kMin, GoodHash(kMin), 1);
  index.Insert(3, GoodHash(3), 2);
  *index.Find(kMin, GoodHash(kMin)) = 10;
  *index.Find(3, GoodHash(3)) = 20;
  const RowIndex& const_index = index;
  EXPECT_EQ(*const_index.Find(kMin, GoodHash(kMin)), 10u);
  EXPECT_EQ(*const_index.Find(3, GoodHash(3)), 20u);
}

TEST(RowIndexTest, GrowsAcrossRehashes) {
  RowIndex index;
  std::mt19937_64 rng(1);
  std::vector<int64_t> ids;
  size_t last_capacity = index.capacity();
  int rehashes = 0;
  for (int i = 0; i < 200000; ++i) {
    const int64_t id = static_cast<int64_t>(rng());
    if (!index.Insert(id, GoodHash(id), ValueOf(id)).second) continue;  // 64-bit dup
    ids.push_back(id);
    ASSERT_EQ(index.size(), ids.size());
    // At most 3/4 full; growth by one capacity step (1.14x to 1.25x, never a doubling),
    // so at least 0.6 full after the first growth.
    ASSERT_LE(index.size() * 4, index.capacity() * 3);
    ASSERT_EQ(index.max_load(), index.capacity() * 3 / 4);
    if (index.capacity() != last_capacity) {
      ASSERT_GE(index.capacity() * 7, last_capacity * 8);
      ASSERT_LE(index.capacity() * 4, last_capacity * 5);
      ASSERT_EQ(index.capacity() % 4, 0u);  // whole cache lines
      last_capacity = index.capacity();
      ++rehashes;
      // Everything inserted so far survived the rehash.
      for (int64_t old : ids) {
        const uint32_t* value = index.Find(old, GoodHash(old));
        ASSERT_NE(value, nullptr) << old;
        ASSERT_EQ(*value, ValueOf(old));
      }
    }
    ASSERT_GE(index.size() * 100 + 60 * RowIndex::kMinCapacity, index.capacity() * 60);
  }
  EXPECT_GE(rehashes, 30);
  EXPECT_EQ(index.memory_bytes(), index.capacity() * 16);
  for (int i = 0; i < 1000; ++i) {
    const int64_t absent = static_cast<int64_t>(rng());
    EXPECT_EQ(index.Find(absent, GoodHash(absent)), nullptr);
  }
}

TEST(RowIndexTest, ForEachVisitsEachIdOnce) {
  RowIndex index;
  std::unordered_map<int64_t, uint32_t> expected;
  for (int64_t id : {kMin, int64_t{0}, int64_t{-1}, kMax}) expected[id] = ValueOf(id);
  for (int64_t id = -5000; id < 5000; id += 3) expected[id * 1000003] = ValueOf(id);
  for (const auto& [id, value] : expected) index.Insert(id, GoodHash(id), value);
  // Erase a few so that ForEach runs over shifted entries too.
  for (int64_t id = -5000; id < 5000; id += 33) {
    EXPECT_TRUE(index.Erase(id * 1000003, GoodHash(id * 1000003)));
    expected.erase(id * 1000003);
  }
  std::unordered_map<int64_t, int> visits;
  index.ForEach([&](int64_t id, uint32_t value) {
    ++visits[id];
    auto it = expected.find(id);
    ASSERT_NE(it, expected.end()) << id;
    EXPECT_EQ(value, it->second) << id;
  });
  EXPECT_EQ(visits.size(), expected.size());
  for (const auto& [id, n] : visits) EXPECT_EQ(n, 1) << id;
  EXPECT_EQ(index.size(), expected.size());
}

TEST(RowIndexTest, ReserveAndClear) {
  RowIndex index;
  index.Reserve(1000);
  const size_t capacity = index.capacity();
  EXPECT_GE(index.max_load(), 1000u);
  EXPECT_LT(capacity * 3, 1000u * 4 * 5 / 4);  // the smallest step that holds 1000
  for (int64_t id = 0; id < 1000; ++id) index.Insert(id, GoodHash(id), ValueOf(id));
  EXPECT_EQ(index.capacity(), capacity);
  index.Reserve(10);  // never shrinks
  EXPECT_EQ(index.capacity(), capacity);
  index.Insert(kMin, GoodHash(kMin), 1);
  EXPECT_EQ(index.size(), 1001u);
  index.Clear();
  EXPECT_TRUE(index.empty());
  EXPECT_EQ(index.capacity(), RowIndex::kMinCapacity);
  EXPECT_EQ(index.Find(kMin, GoodHash(kMin)), nullptr);
  EXPECT_EQ(index.Find(5, GoodHash(5)), nullptr);
  EXPECT_TRUE(index.Insert(5, GoodHash(5), 9).second);
  EXPECT_EQ(*index.Find(5, GoodHash(5)), 9u);
}

// Erasing from one long probe run in random order leaves the rest findable (backward
// shift moves exactly the entries that may move).
TEST(RowIndexTest, EraseFromOneCluster) {
  for (HashKind kind : {HashKind::kConstant, HashKind::kLastBuckets, HashKind::kLow3Bits}) {
    RowIndex index;
    std::vector<int64_t> ids;
    for (int64_t id = -50; id < 150; ++id) ids.push_back(id);
    for (int64_t id : ids) ASSERT_TRUE(index.Insert(id, HashOf(kind, id), ValueOf(id)).second);
    std::mt19937_64 rng(7);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_TRUE(index.Erase(ids[i], HashOf(kind, ids[i])));
      ASSERT_EQ(index.size(), ids.size() - i - 1);
      for (size_t j = 0; j < ids.size(); ++j) {
        const uint32_t* value = index.Find(ids[j], HashOf(kind, ids[j]));
        if (j <= i) {
          ASSERT_EQ(value, nullptr) << ids[j];
        } else {
          ASSERT_NE(value, nullptr) << ids[j];
          ASSERT_EQ(*value, ValueOf(ids[j]));
        }
      }
    }
  }
}

class RowIndexRandomTest : public testing::TestWithParam<HashKind> {};

// 1e5 mixed operations against std::unordered_map.
TEST_P(RowIndexRandomTest, MatchesUnorderedMap) {
  const HashKind kind = GetParam();
  std::mt19937_64 rng(static_cast<uint64_t>(kind) + 11);
  // A pool small enough that ids recur (so erase and reinsert happen often) and, with the
  // bad hashes, every operation probes a long cluster.
  std::vector<int64_t> pool = {kMin, kMin + 1, 0, -1, kMax, kMax - 1};
  const int64_t range = kind == HashKind::kGood ? 20000 : 1500;
  for (int64_t id = -range / 2; id < range / 2; ++id) {
    pool.push_back(id);
    pool.push_back(id * 0x10000000001LL);
  }
  RowIndex index;
  std::unordered_map<int64_t, uint32_t> reference;
  auto check_all = [&] {
    ASSERT_EQ(index.size(), reference.size());
    size_t visits = 0;
    index.ForEach([&](int64_t id, uint32_t value) {
      ++visits;
      auto it = reference.find(id);
      ASSERT_NE(it, reference.end()) << id;
      ASSERT_EQ(value, it->second) << id;
    });
    ASSERT_EQ(visits, reference.size());
    for (const auto& [id, value] : reference) {
      const uint32_t* found = index.Find(id, HashOf(kind, id));
      ASSERT_NE(found, nullptr) << id;
      ASSERT_EQ(*found, value) << id;
    }
  };
  // Phases that favour inserts then erases, so the size swings up and down across
  // several capacities.
  for (int op = 0; op < 100000; ++op) {
    const int64_t id = pool[rng() % pool.size()];
    const uint64_t hash = HashOf(kind, id);
    const bool growing = (op / 10000) % 2 == 0;
    const int dice = static_cast<int>(rng() % 100);
    if (dice < (growing ? 50 : 20)) {
      const uint32_t value = static_cast<uint32_t>(rng());
      auto [stored, inserted] = index.Insert(id, hash, value);
      auto [it, ref_inserted] = reference.emplace(id, value);
      ASSERT_EQ(inserted, ref_inserted) << id;
      ASSERT_EQ(*stored, it->second) << id;
    } else if (dice < 75) {
      ASSERT_EQ(index.Erase(id, hash), reference.erase(id) == 1) << id;
    } else if (dice < 80) {
      // Update through the pointer.
      uint32_t* found = index.Find(id, hash);
      auto it = reference.find(id);
      ASSERT_EQ(found != nullptr, it != reference.end()) << id;
      if (found != nullptr) *found = it->second = static_cast<uint32_t>(rng());
    } else {
      const uint32_t* found = index.Find(id, hash);
      auto it = reference.find(id);
      ASSERT_EQ(found != nullptr, it != reference.end()) << id;
      if (found != nullptr) {
        ASSERT_EQ(*found, it->second) << id;
      }
    }
    ASSERT_EQ(index.size(), reference.size());
    if (op % 5000 == 4999) {
      check_all();
      if (HasFatalFailure()) return;
    }
  }
  check_all();
}

INSTANTIATE_TEST_SUITE_P(Hashes, RowIndexRandomTest,
                         testing::Values(HashKind::kGood, HashKind::kLow3Bits, HashKind::kConstant,
                                         HashKind::kLastBuckets),
                         [](const testing::TestParamInfo<HashKind>& info) {
                           switch (info.param) {
                             case HashKind::kGood:
                               return "Good";
                             case HashKind::kLow3Bits:
                               return "Low3Bits";
                             case HashKind::kConstant:
                               return "Constant";
                             case HashKind::kLastBuckets:
                               return "LastBuckets";
                           }
                           return "Unknown";
                         });

// One thread prefetches without the lock while another inserts, erases and clears under
// it, rehashing many times (and freeing old arrays) meanwhile.
TEST(RowIndexTest, PrefetchConcurrentWithWriters) {
  SpinLock mu;
  RowIndex index;
  std::atomic<bool> done{false};
  std::atomic<uint64_t> prefetches{0};
  std::thread prefetcher([&] {
    uint64_t h = 1;
    uint64_t n = 0;
    while (!done.load(std::memory_order_acquire)) {
      for (int i = 0; i < 64; ++i) index.Prefetch(Mix64(h++));
      n += 64;
    }
    prefetches.store(n, std::memory_order_relaxed);
  });
  for (int round = 0; round < 3; ++round) {
    for (int64_t id = 0; id < 300000; ++id) {
      const int64_t key = id * 7919 - round;
      SpinLockHolder lock(&mu);
      ASSERT_TRUE(index.Insert(key, GoodHash(key), static_cast<uint32_t>(id)).second);
      if (id % 4 == 3) {
        ASSERT_TRUE(index.Erase(key, GoodHash(key)));
      }
    }
    {
      SpinLockHolder lock(&mu);
      EXPECT_EQ(index.size(), 225000u);
      const uint32_t* value = index.Find(4 * 7919 - round, GoodHash(4 * 7919 - round));
      ASSERT_NE(value, nullptr);
      EXPECT_EQ(*value, 4u);
      index.Clear();
    }
  }
  done.store(true, std::memory_order_release);
  prefetcher.join();
  EXPECT_GT(prefetches.load(), 0u);
}

}  // namespace
}  // namespace ps
