#include "embedding/admission_sketch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "common/routing/hash.h"

namespace ps {
namespace {

uint64_t H(int64_t id) { return RouteHash(NameHash("emb"), id); }

TEST(AdmissionSketchTest, CountsNeverUnderestimate) {
  AdmissionSketch sketch(16);
  for (int64_t id = 0; id < 1000; ++id) {
    for (int k = 0; k <= id % 4; ++k) sketch.Add(H(id));
  }
  for (int64_t id = 0; id < 1000; ++id) EXPECT_GE(sketch.Estimate(H(id)), id % 4 + 1) << id;
  EXPECT_EQ(sketch.Estimate(H(5000)) < 4, true);
}

// Counting commutes: the same counts in another order give the same bytes (recovery
// and followers count in log order, not in the order pushes were applied).
TEST(AdmissionSketchTest, SameCountsInAnyOrderGiveTheSameState) {
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < 3000; ++id) ids.push_back(id % 700);
  AdmissionSketch a(8), b(8);
  for (int64_t id : ids) a.Add(H(id));
  std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
  for (int64_t id : ids) b.Add(H(id));
  EXPECT_EQ(a.Serialize(), b.Serialize());
}

TEST(AdmissionSketchTest, DecayHalvesAndRareIdsFade) {
  AdmissionSketch sketch(1);
  for (int k = 0; k < 3; ++k) sketch.Add(H(42));
  EXPECT_TRUE(sketch.DueForDecay().empty());
  for (uint64_t i = 0; i < AdmissionSketch::kDecayEvery; ++i) sketch.Add(H(1000000 + i));
  EXPECT_EQ(sketch.DueForDecay(), std::vector<uint32_t>{0});
  const uint32_t before = sketch.Estimate(H(42));
  sketch.Decay({0});
  EXPECT_EQ(sketch.Estimate(H(42)), before / 2);
  EXPECT_TRUE(sketch.DueForDecay().empty());
  for (int k = 0; k < 20; ++k) sketch.Decay({0});
  EXPECT_EQ(sketch.Estimate(H(42)), 0u);
}

TEST(AdmissionSketchTest, SerializeRestoreAndMoveVShards) {
  AdmissionSketch a(4);
  for (int64_t id = 0; id < 500; ++id) a.Add(H(id));
  a.CountAdmitted();
  a.CountDropped();
  a.CountDropped();
  AdmissionSketch b(4);
  ASSERT_TRUE(b.Restore(a.Serialize(), /*with_totals=*/true).ok());
  EXPECT_EQ(b.Serialize(), a.Serialize());
  EXPECT_EQ(b.admitted(), 1u);
  EXPECT_EQ(b.dropped(), 2u);
  // One vshard's counters alone (a move), onto another sketch.
  AdmissionSketch c(4);
  ASSERT_TRUE(c.Restore(a.SerializeVShards({2}), /*with_totals=*/false).ok());
  for (int64_t id = 0; id < 500; ++id) {
    EXPECT_EQ(c.Estimate(H(id)), (H(id) & 3) == 2 ? a.Estimate(H(id)) : 0u) << id;
  }
  EXPECT_EQ(c.admitted(), 0u);
  // Damaged bytes are refused.
  std::string bytes = a.Serialize();
  EXPECT_FALSE(c.Restore(bytes.substr(0, bytes.size() - 1), true).ok());
  EXPECT_FALSE(AdmissionSketch(2).Restore(bytes, true).ok());  // vshard 3 of 2
}

}  // namespace
}  // namespace ps
