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
    ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes;
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
