#include "embedding/spec.h"

#include "gtest/gtest.h"

namespace ps {
namespace {

TableSpec Table(std::string name, uint32_t dim) {
  TableSpec t;
  t.set_name(std::move(name));
  t.set_dim(dim);
  return t;
}

TEST(SpecTest, FillsDefaultsPerOptimizer) {
  TableSpec t = Table("emb", 8);
  t.mutable_optimizer()->set_kind(OptimizerSpec::ADAGRAD);
  auto n = NormalizeTableSpec(t);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_FLOAT_EQ(n->optimizer().learning_rate(), 0.01f);
  EXPECT_FLOAT_EQ(n->optimizer().initial_accumulator(), 0.1f);
  EXPECT_FLOAT_EQ(n->optimizer().epsilon(), 1e-10f);
  EXPECT_FALSE(n->optimizer().has_beta1());
}

TEST(SpecTest, ExplicitZeroIsKept) {
  TableSpec t = Table("emb", 8);
  t.mutable_optimizer()->set_kind(OptimizerSpec::ADAGRAD);
  t.mutable_optimizer()->set_initial_accumulator(0.0f);
  EXPECT_FLOAT_EQ(NormalizeTableSpec(t)->optimizer().initial_accumulator(), 0.0f);
}

TEST(SpecTest, RejectsBadInputWithTheValue) {
  struct Bad {
    TableSpec spec;
    std::string fragment;
  };
  std::vector<Bad> bad;
  bad.push_back({Table("", 8), "1..128"});
  bad.push_back({Table("a b", 8), "character"});
  bad.push_back({Table("t", 0), "dim 0"});
  bad.push_back({Table("t", 5000), "dim 5000"});
  TableSpec lr = Table("t", 4);
  lr.mutable_optimizer()->set_learning_rate(-1);
  bad.push_back({lr, "learning_rate = -1"});
  TableSpec mom = Table("t", 4);
  mom.mutable_optimizer()->set_kind(OptimizerSpec::MOMENTUM);
  mom.mutable_optimizer()->set_momentum(1.5);
  bad.push_back({mom, "momentum = 1.5"});
  TableSpec uni = Table("t", 4);
  uni.mutable_initializer()->set_kind(InitializerSpec::UNIFORM);
  uni.mutable_initializer()->set_low(1);
  uni.mutable_initializer()->set_high(1);
  bad.push_back({uni, "low < high"});
  TableSpec normal = Table("t", 4);
  normal.mutable_initializer()->set_kind(InitializerSpec::NORMAL);
  bad.push_back({normal, "stddev = 0"});
  TableSpec ftrl = Table("t", 4);
  ftrl.mutable_optimizer()->set_kind(OptimizerSpec::FTRL);
  ftrl.mutable_optimizer()->set_ftrl_beta(0);
  bad.push_back({ftrl, "divides by zero"});
  for (const Bad& b : bad) {
    auto n = NormalizeTableSpec(b.spec);
    ASSERT_FALSE(n.ok()) << b.spec.ShortDebugString();
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(n.status().message().find(b.fragment), std::string::npos) << n.status();
  }
}

TEST(SpecTest, DenseShapeLimits) {
  DenseSpec d;
  d.set_name("w");
  EXPECT_FALSE(NormalizeDenseSpec(d).ok());
  d.add_shape(16);
  d.add_shape(0);
  EXPECT_FALSE(NormalizeDenseSpec(d).ok());
  d.set_shape(1, 1 << 20);
  d.add_shape(1 << 10);
  EXPECT_FALSE(NormalizeDenseSpec(d).ok());  // 2^34 elements
  d.clear_shape();
  d.add_shape(16);
  d.add_shape(4);
  EXPECT_TRUE(NormalizeDenseSpec(d).ok());
}

}  // namespace
}  // namespace ps
