#include "embedding/initializer.h"

#include <cmath>
#include <vector>

#include "common/routing/hash.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

InitializerSpec Spec(InitializerSpec::Kind kind) {
  InitializerSpec s;
  s.set_kind(kind);
  return s;
}

std::vector<float> Row(const InitializerSpec& spec, absl::string_view table, int64_t id, size_t n) {
  std::vector<float> out(n);
  Initializer(spec).Fill(NameHash(table), id, out.data(), n);
  return out;
}

TEST(InitializerTest, SameRowSameValueDifferentRowsDiffer) {
  InitializerSpec s = Spec(InitializerSpec::NORMAL);
  s.set_stddev(1.0f);
  EXPECT_EQ(Row(s, "t", 42, 16), Row(s, "t", 42, 16));
  EXPECT_NE(Row(s, "t", 42, 16), Row(s, "t", 43, 16));
  EXPECT_NE(Row(s, "t", 42, 16), Row(s, "u", 42, 16));
  InitializerSpec seeded = s;
  seeded.set_seed(7);
  EXPECT_NE(Row(s, "t", 42, 16), Row(seeded, "t", 42, 16));
  // A prefix of a longer row equals the shorter row: element j depends on j only.
  std::vector<float> longer = Row(s, "t", 42, 32);
  EXPECT_EQ(std::vector<float>(longer.begin(), longer.begin() + 16), Row(s, "t", 42, 16));
}

TEST(InitializerTest, PinnedValuesDoNotChangeAcrossBuilds) {
  // Rows are created lazily on any pod at any time; a change in these values would give
  // rows created after an upgrade different starting points. Update only on purpose.
  InitializerSpec s = Spec(InitializerSpec::UNIFORM);
  s.set_low(-1);
  s.set_high(1);
  // Expected values from an independent Python implementation of the same formulas.
  std::vector<float> row = Row(s, "table", 12345, 2);
  EXPECT_FLOAT_EQ(row[0], 0.07779500633478165f);
  EXPECT_FLOAT_EQ(row[1], 0.3294651508331299f);
  EXPECT_EQ(Mix64(0), 0u);
  EXPECT_EQ(Mix64(1), 0x5692161d100b05e5ULL);
  EXPECT_EQ(NameHash(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(NameHash("a"), 0xaf63dc4c8601ec8cULL);
}

struct Moments {
  double mean = 0, var = 0, min = 1e30, max = -1e30;
};

Moments Sample(const InitializerSpec& spec, int rows, int dim) {
  std::vector<double> all;
  for (int id = 0; id < rows; ++id) {
    for (float v : Row(spec, "dist", id, dim)) all.push_back(v);
  }
  Moments m;
  for (double v : all) {
    m.mean += v;
    m.min = std::min(m.min, v);
    m.max = std::max(m.max, v);
  }
  m.mean /= all.size();
  for (double v : all) m.var += (v - m.mean) * (v - m.mean);
  m.var /= all.size();
  return m;
}

TEST(InitializerTest, UniformDistribution) {
  InitializerSpec s = Spec(InitializerSpec::UNIFORM);
  s.set_low(-0.5f);
  s.set_high(1.5f);
  Moments m = Sample(s, 4000, 32);  // 128k samples: the mean's sd is ~0.0016
  EXPECT_NEAR(m.mean, 0.5, 0.01);
  EXPECT_NEAR(m.var, 4.0 / 12, 0.01);
  EXPECT_GE(m.min, -0.5);
  EXPECT_LT(m.max, 1.5);
}

TEST(InitializerTest, NormalDistribution) {
  InitializerSpec s = Spec(InitializerSpec::NORMAL);
  s.set_mean(2.0f);
  s.set_stddev(0.5f);
  Moments m = Sample(s, 4000, 32);
  EXPECT_NEAR(m.mean, 2.0, 0.01);
  EXPECT_NEAR(std::sqrt(m.var), 0.5, 0.01);
  EXPECT_LT(m.min, 2.0 - 4 * 0.5);  // tails exist: ~4 of 128k beyond 4 sd, expect >=1
}

TEST(InitializerTest, TruncatedNormalStaysWithinTwoStddev) {
  InitializerSpec s = Spec(InitializerSpec::TRUNCATED_NORMAL);
  s.set_mean(0.0f);
  s.set_stddev(1.0f);
  Moments m = Sample(s, 4000, 32);
  EXPECT_GE(m.min, -2.0);
  EXPECT_LE(m.max, 2.0);
  EXPECT_NEAR(m.mean, 0.0, 0.01);
  // Variance of N(0,1) truncated at +-2 is 0.7737.
  EXPECT_NEAR(m.var, 0.7737, 0.01);
}

TEST(InitializerTest, ConstantAndZeros) {
  InitializerSpec c = Spec(InitializerSpec::CONSTANT);
  c.set_value(0.25f);
  EXPECT_EQ(Row(c, "t", 9, 3), std::vector<float>(3, 0.25f));
  EXPECT_EQ(Row(Spec(InitializerSpec::ZEROS), "t", 9, 3), std::vector<float>(3, 0.0f));
}

}  // namespace
}  // namespace ps
