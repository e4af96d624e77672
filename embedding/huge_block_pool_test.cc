#include "embedding/huge_block_pool.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

struct Block {
  char* p;
  size_t bytes;
  char fill;
};

// Blocks of mixed sizes: aligned, never overlapping (each keeps its own fill pattern
// while the others are written), split from and merged back into whole chunks, which
// all go back to the system once everything is freed.
TEST(HugeBlockPoolTest, BlocksAreDisjointAndChunksReturnWhenFree) {
  HugeBlockPool pool;
  std::mt19937 rng(7);
  const size_t sizes[] = {4096, 8192, 65536, 131072, 1 << 20, 2 << 20, 100, 5000, 3 << 20};
  std::vector<Block> blocks;
  for (int i = 0; i < 300; ++i) {
    const size_t bytes = sizes[rng() % std::size(sizes)];
    char* p = static_cast<char*>(pool.Allocate(bytes));
    ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % HugeBlockPool::kAlignment, 0u) << bytes;
    const char fill = static_cast<char>(i);
    std::memset(p, fill, bytes);
    blocks.push_back({p, bytes, fill});
  }
  for (const Block& b : blocks) {
    ASSERT_EQ(b.p[0], b.fill);
    ASSERT_EQ(b.p[b.bytes - 1], b.fill);
    ASSERT_EQ(b.p[b.bytes / 2], b.fill);
  }
  EXPECT_GT(pool.chunk_bytes(), 0u);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  for (const Block& b : blocks) pool.Free(b.p, b.bytes);
  EXPECT_EQ(pool.chunk_bytes(), 0u);
  EXPECT_EQ(pool.used_bytes(), 0u);
}

// Blocks take whole pages, not powers of two: five 100-page blocks share one chunk (a
// buddy allocator would round each to 128 pages and need three), and a freed hole is
// refilled best-fit: the smallest free run that holds a block, not the first.
TEST(HugeBlockPoolTest, BlocksTakeWholePagesBestFit) {
  HugeBlockPool pool;
  const size_t page = HugeBlockPool::kPageBytes;
  std::vector<char*> blocks;
  for (int i = 0; i < 5; ++i) {
    blocks.push_back(static_cast<char*>(pool.Allocate(100 * page - 100)));
  }
  EXPECT_EQ(pool.chunk_bytes(), HugeBlockPool::kChunkBytes);
  EXPECT_EQ(pool.used_bytes(), 500 * page);
  for (int i = 1; i < 5; ++i) EXPECT_EQ(blocks[i] - blocks[i - 1], 100 * page);
  // Free runs now: 100 pages at blocks[1], 12 at the end. A 10-page block goes into the
  // 12-page tail, a 50-page one into the hole.
  pool.Free(blocks[1], 100 * page - 100);
  char* small = static_cast<char*>(pool.Allocate(10 * page));
  EXPECT_EQ(small, blocks[4] + 100 * page);
  char* medium = static_cast<char*>(pool.Allocate(50 * page));
  EXPECT_EQ(medium, blocks[1]);
  EXPECT_EQ(pool.chunk_bytes(), HugeBlockPool::kChunkBytes);
  // 60 pages fit nowhere now (50 free in the hole, 2 at the end): a second chunk.
  char* big = static_cast<char*>(pool.Allocate(60 * page));
  EXPECT_EQ(pool.chunk_bytes(), 2 * HugeBlockPool::kChunkBytes);
  pool.Free(big, 60 * page);
  EXPECT_EQ(pool.chunk_bytes(), HugeBlockPool::kChunkBytes);
  pool.Free(small, 10 * page);
  pool.Free(medium, 50 * page);
  for (int i : {0, 2, 3, 4}) pool.Free(blocks[i], 100 * page - 100);
  EXPECT_EQ(pool.chunk_bytes(), 0u);
  EXPECT_EQ(pool.used_bytes(), 0u);
}

// 512 blocks of 4 KiB fill exactly one chunk; the 513th needs a second. Freeing all but
// one keeps one chunk; freeing that one releases it.
TEST(HugeBlockPoolTest, SmallBlocksPackIntoChunks) {
  HugeBlockPool pool;
  std::vector<void*> blocks;
  for (int i = 0; i < 512; ++i) blocks.push_back(pool.Allocate(4096));
  EXPECT_EQ(pool.chunk_bytes(), HugeBlockPool::kChunkBytes);
  void* extra = pool.Allocate(4096);
  EXPECT_EQ(pool.chunk_bytes(), 2 * HugeBlockPool::kChunkBytes);
  pool.Free(extra, 4096);
  EXPECT_EQ(pool.chunk_bytes(), HugeBlockPool::kChunkBytes);
  for (size_t i = 1; i < blocks.size(); ++i) pool.Free(blocks[i], 4096);
  EXPECT_EQ(pool.chunk_bytes(), HugeBlockPool::kChunkBytes);
  // The freed space is reused: a 1 MiB block fits in the chunk's upper half.
  void* half = pool.Allocate(1 << 20);
  EXPECT_EQ(pool.chunk_bytes(), HugeBlockPool::kChunkBytes);
  pool.Free(half, 1 << 20);
  pool.Free(blocks[0], 4096);
  EXPECT_EQ(pool.chunk_bytes(), 0u);
}

}  // namespace
}  // namespace ps
