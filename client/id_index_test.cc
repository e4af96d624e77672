#include "client/id_index.h"

#include <random>
#include <unordered_map>

#include "common/routing/hash.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(IdIndexTest, FindsFirstValueOfEachIdAcrossResets) {
  IdIndex index;
  std::mt19937_64 rng(3);
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{20}, size_t{5000}}) {
    index.Reset(n);
    std::unordered_map<int64_t, uint32_t> expected;
    for (uint32_t i = 0; i < n; ++i) {
      // Ids from a small range, so about half repeat; some negative.
      const int64_t id = static_cast<int64_t>(rng() % (n + 1)) - static_cast<int64_t>(n / 4);
      bool inserted;
      const uint32_t got = index.FindOrInsert(id, Mix64(static_cast<uint64_t>(id)), i, &inserted);
      auto [it, fresh] = expected.try_emplace(id, i);
      EXPECT_EQ(inserted, fresh);
      EXPECT_EQ(got, it->second);
    }
  }
}

TEST(IdIndexTest, CollidingHashesStillSeparateIds) {
  IdIndex index;
  index.Reset(100);
  bool inserted;
  for (uint32_t i = 0; i < 100; ++i) {  // every id hashes to the same slot
    EXPECT_EQ(index.FindOrInsert(i * 3, 0, i, &inserted), i);
    EXPECT_TRUE(inserted);
  }
  for (uint32_t i = 0; i < 100; ++i) {
    EXPECT_EQ(index.FindOrInsert(i * 3, 0, 999, &inserted), i);
    EXPECT_FALSE(inserted);
  }
}

}  // namespace
}  // namespace ps
