#include "embedding/spec.h"

#include <limits>
#include <string>
#include <vector>

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

// Issue 15: CreateTable accepted learning_rate = 1e30 (and any finite hyperparameter), whose
// first update overflowed. A new spec is held to the ranges in spec.h, and the error names
// the field and the value.
TEST(SpecTest, NewSpecsRefuseAbsurdHyperparametersNamingFieldAndValue) {
  struct Bad {
    TableSpec spec;
    std::string fragment;
  };
  std::vector<Bad> bad;
  auto with = [](OptimizerSpec::Kind kind, auto set) {
    TableSpec t = Table("t", 4);
    t.mutable_optimizer()->set_kind(kind);
    set(t.mutable_optimizer());
    return t;
  };
  bad.push_back({with(OptimizerSpec::SGD, [](OptimizerSpec* o) { o->set_learning_rate(1e30f); }),
                 "optimizer.learning_rate = 1e+30 is outside the accepted range [1e-10, 1000]"});
  bad.push_back({with(OptimizerSpec::SGD, [](OptimizerSpec* o) { o->set_learning_rate(1e-20f); }),
                 "learning_rate = 1e-20"});
  bad.push_back({with(OptimizerSpec::ADAM, [](OptimizerSpec* o) { o->set_epsilon(1e-30f); }),
                 "optimizer.epsilon = 1e-30"});
  bad.push_back({with(OptimizerSpec::ADAM, [](OptimizerSpec* o) { o->set_beta2(0.9999999f); }),
                 "optimizer.beta2 = 0.9999999"});
  bad.push_back({with(OptimizerSpec::MOMENTUM, [](OptimizerSpec* o) { o->set_momentum(-0.5f); }),
                 "optimizer.momentum = -0.5"});
  bad.push_back(
      {with(OptimizerSpec::ADAGRAD, [](OptimizerSpec* o) { o->set_initial_accumulator(1e7f); }),
       "optimizer.initial_accumulator = 1e+07"});
  bad.push_back({with(OptimizerSpec::FTRL, [](OptimizerSpec* o) { o->set_ftrl_l2(1e9f); }),
                 "optimizer.ftrl_l2 = 1e+09"});
  bad.push_back({with(OptimizerSpec::FTRL, [](OptimizerSpec* o) { o->set_ftrl_beta(1e20f); }),
                 "optimizer.ftrl_beta = 1e+20"});
  TableSpec constant = Table("t", 4);
  constant.mutable_initializer()->set_kind(InitializerSpec::CONSTANT);
  constant.mutable_initializer()->set_value(-3e7f);
  bad.push_back({constant, "initializer.value = -3e+07"});
  TableSpec normal = Table("t", 4);
  normal.mutable_initializer()->set_kind(InitializerSpec::NORMAL);
  normal.mutable_initializer()->set_stddev(1e10f);
  bad.push_back({normal, "initializer.stddev = 1e+10"});
  TableSpec uniform = Table("t", 4);
  uniform.mutable_initializer()->set_kind(InitializerSpec::UNIFORM);
  uniform.mutable_initializer()->set_low(-1);
  uniform.mutable_initializer()->set_high(1e30f);
  bad.push_back({uniform, "initializer.high = 1e+30"});
  TableSpec clip = Table("t", 4);
  clip.set_clip_value(-1);
  bad.push_back({clip, "clip_value = -1"});
  clip.set_clip_value(0);
  clip.set_clip_norm(1e13f);
  bad.push_back({clip, "clip_norm = 1e+13"});
  clip.set_clip_norm(std::numeric_limits<float>::quiet_NaN());
  bad.push_back({clip, "clip_norm = nan"});
  for (const Bad& b : bad) {
    auto n = NormalizeTableSpec(b.spec);
    ASSERT_FALSE(n.ok()) << b.spec.ShortDebugString();
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(n.status().message().find(b.fragment), std::string::npos) << n.status();
    EXPECT_NE(n.status().message().find("table 't'"), std::string::npos) << n.status();
    // The same for a dense tensor.
    DenseSpec d;
    d.set_name("t");
    d.add_shape(4);
    *d.mutable_initializer() = b.spec.initializer();
    *d.mutable_optimizer() = b.spec.optimizer();
    d.set_clip_value(b.spec.clip_value());
    d.set_clip_norm(b.spec.clip_norm());
    auto dn = NormalizeDenseSpec(d);
    ASSERT_FALSE(dn.ok()) << d.ShortDebugString();
    EXPECT_NE(dn.status().message().find(b.fragment), std::string::npos) << dn.status();
  }
}

TEST(SpecTest, RangeEndsAreAccepted) {
  TableSpec t = Table("t", 4);
  OptimizerSpec* o = t.mutable_optimizer();
  o->set_kind(OptimizerSpec::ADAM);
  o->set_learning_rate(kMaxLearningRate);
  o->set_epsilon(kMinEpsilon);
  o->set_beta1(kMaxDecay);
  o->set_beta2(0);
  t.set_clip_value(kMaxGradient);
  t.set_clip_norm(1e-30f);
  t.mutable_initializer()->set_kind(InitializerSpec::TRUNCATED_NORMAL);
  t.mutable_initializer()->set_mean(-kMaxInitValue);
  t.mutable_initializer()->set_stddev(kMaxInitValue);
  auto n = NormalizeTableSpec(t);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->clip_value(), kMaxGradient);
}

// A spec stored by an earlier version (a pod's catalog) still loads: only what the engine
// needs is checked, so its rows stay reachable.
TEST(SpecTest, StoredSpecsKeepTheOlderRules) {
  TableSpec t = Table("t", 4);
  t.mutable_optimizer()->set_learning_rate(1e30f);
  EXPECT_FALSE(NormalizeTableSpec(t).ok());
  auto stored = NormalizeTableSpec(t, SpecRules::kStored);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->optimizer().learning_rate(), 1e30f);
  t.mutable_optimizer()->set_learning_rate(-1);
  EXPECT_FALSE(NormalizeTableSpec(t, SpecRules::kStored).ok());

  DenseSpec d;
  d.set_name("big");
  d.add_shape(1 << 25);
  EXPECT_FALSE(NormalizeDenseSpec(d).ok());  // beyond kMaxNewDenseElements
  EXPECT_TRUE(NormalizeDenseSpec(d, SpecRules::kStored).ok());
}

// No clipping is the proto3 zero, so a spec stored before clipping existed normalizes to
// the same message as today's default (creating it again is idempotent).
TEST(SpecTest, NoClippingIsTheDefaultAndComparesEqual) {
  TableSpec t = Table("t", 4);
  auto a = NormalizeTableSpec(t);
  ASSERT_TRUE(a.ok());
  TableSpec explicit_zero = t;
  explicit_zero.set_clip_value(0);
  explicit_zero.set_clip_norm(0);
  EXPECT_TRUE(SpecsEqual(*a, *NormalizeTableSpec(explicit_zero)));
  EXPECT_EQ(a->SerializeAsString(), NormalizeTableSpec(explicit_zero)->SerializeAsString());
}

TEST(SpecTest, PushLearningRateAndGradientBounds) {
  EXPECT_TRUE(ValidatePushLearningRate(0, "t").ok());  // the table's own
  EXPECT_TRUE(ValidatePushLearningRate(0.5f, "t").ok());
  for (float bad : {-1.0f, 1e30f, 1e-20f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    absl::Status s = ValidatePushLearningRate(bad, "t");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("'t'"), std::string::npos) << s;
  }
  EXPECT_EQ(MaxPushGradient(0, 0), kMaxGradient);
  EXPECT_EQ(MaxPushGradient(1, 0), std::numeric_limits<float>::max());
  EXPECT_EQ(MaxPushGradient(0, 5), std::numeric_limits<float>::max());
  EXPECT_EQ(MaxPushGradient(1e30f, 0), kMaxGradient);  // a stored spec clipping too loosely
}

TEST(SpecTest, LifecycleOffHasOneSpelling) {
  TableSpec a;
  a.set_name("t");
  a.set_dim(4);
  TableSpec b = a;
  b.mutable_admission()->set_min_count(1);
  b.mutable_eviction()->set_policy(EvictionSpec::LRU);
  EXPECT_EQ(NormalizeTableSpec(a)->SerializeAsString(), NormalizeTableSpec(b)->SerializeAsString());
  b.mutable_admission()->set_min_count(2);
  EXPECT_EQ(NormalizeTableSpec(b)->admission().min_count(), 2u);
  b.mutable_admission()->set_min_count(kMaxAdmissionCount + 1);
  EXPECT_EQ(NormalizeTableSpec(b).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps
