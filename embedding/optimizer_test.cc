#include "embedding/optimizer.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "embedding/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

// Reference values computed by hand (float64, the formulas in proto/ps.proto) for
// w0 = {0.5, -0.3}, gradients {0.1,-0.2}, {0.3,0.1}, {-0.2,0.4}, learning rate 0.1.
struct Case {
  const char* name;
  OptimizerSpec spec;
  std::vector<std::vector<double>> expected;  // weights after steps 1, 2, 3
};

OptimizerSpec Spec(OptimizerSpec::Kind kind) {
  OptimizerSpec s;
  s.set_kind(kind);
  s.set_learning_rate(0.1f);
  return s;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  cases.push_back({"sgd", Spec(OptimizerSpec::SGD), {{0.49, -0.28}, {0.46, -0.29}, {0.48, -0.33}}});
  OptimizerSpec momentum = Spec(OptimizerSpec::MOMENTUM);
  momentum.set_momentum(0.9f);
  cases.push_back({"momentum", momentum, {{0.49, -0.28}, {0.451, -0.272}, {0.4359, -0.3048}}});
  OptimizerSpec nesterov = momentum;
  nesterov.set_nesterov(true);
  cases.push_back(
      {"nesterov", nesterov, {{0.481, -0.262}, {0.4159, -0.2648}, {0.42231, -0.33432}}});
  OptimizerSpec adagrad = Spec(OptimizerSpec::ADAGRAD);
  adagrad.set_initial_accumulator(0.1f);
  cases.push_back(
      {"adagrad",
       adagrad,
       {{0.469848866, -0.246547752}, {0.402766826, -0.272367641}, {0.443591655, -0.344209761}}});
  cases.push_back(
      {"adam",
       Spec(OptimizerSpec::ADAM),
       {{0.40000001, -0.200000005}, {0.308221902, -0.173366303}, {0.282431523, -0.21909948}}});
  OptimizerSpec ftrl = Spec(OptimizerSpec::FTRL);
  ftrl.set_ftrl_beta(1.0f);
  ftrl.set_ftrl_l1(0.01f);
  ftrl.set_ftrl_l2(0.1f);
  cases.push_back({"ftrl",
                   ftrl,
                   {{0.0351351351, -0.032231405},
                    {0.0125145863, -0.0403377157},
                    {0.026963723, -0.0675808921}}});
  return cases;
}

TEST(OptimizerTest, MatchesHandComputedReferenceOverThreeSteps) {
  const std::vector<std::vector<float>> grads = {{0.1f, -0.2f}, {0.3f, 0.1f}, {-0.2f, 0.4f}};
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    auto spec = NormalizeOptimizer(c.spec);
    ASSERT_TRUE(spec.ok()) << spec.status();
    Optimizer opt(*spec);
    std::vector<float> w = {0.5f, -0.3f};
    std::vector<float> slots(2 * opt.slots());
    opt.InitSlots(slots.data(), 2);
    uint64_t step = 0;
    for (size_t t = 0; t < grads.size(); ++t) {
      opt.Apply(0.0f, w.data(), slots.data(), &step, grads[t].data(), 2);
      EXPECT_EQ(step, t + 1);
      EXPECT_NEAR(w[0], c.expected[t][0], 2e-6) << "step " << t + 1;
      EXPECT_NEAR(w[1], c.expected[t][1], 2e-6) << "step " << t + 1;
    }
  }
}

TEST(OptimizerTest, SlotsStartAtOptimizerInitialValue) {
  OptimizerSpec adagrad = Spec(OptimizerSpec::ADAGRAD);
  adagrad.set_initial_accumulator(0.25f);
  Optimizer opt(*NormalizeOptimizer(adagrad));
  std::vector<float> slots(3, -7.0f);
  opt.InitSlots(slots.data(), 3);
  EXPECT_THAT(slots, testing::Each(0.25f));

  Optimizer adam(*NormalizeOptimizer(Spec(OptimizerSpec::ADAM)));
  std::vector<float> adam_slots(6, -7.0f);
  adam.InitSlots(adam_slots.data(), 3);
  EXPECT_THAT(adam_slots, testing::Each(0.0f));
}

TEST(OptimizerTest, PushLearningRateOverridesSpec) {
  Optimizer opt(*NormalizeOptimizer(Spec(OptimizerSpec::SGD)));
  float w = 1.0f, g = 1.0f;
  uint64_t step = 0;
  opt.Apply(0.5f, &w, nullptr, &step, &g, 1);
  EXPECT_FLOAT_EQ(w, 0.5f);
  opt.Apply(0.0f, &w, nullptr, &step, &g, 1);  // 0: the table's rate (0.1)
  EXPECT_FLOAT_EQ(w, 0.4f);
}

TEST(OptimizerTest, AdamBiasCorrectionUsesPerRowStep) {
  // Two rows with different histories: a row's first update is always lr * sign(g),
  // however many updates other rows have had.
  Optimizer opt(*NormalizeOptimizer(Spec(OptimizerSpec::ADAM)));
  std::vector<float> slots_a(2), slots_b(2);
  opt.InitSlots(slots_a.data(), 1);
  opt.InitSlots(slots_b.data(), 1);
  float wa = 0, wb = 0, g = 3.0f;
  uint64_t step_a = 0, step_b = 0;
  for (int i = 0; i < 5; ++i) opt.Apply(0, &wa, slots_a.data(), &step_a, &g, 1);
  opt.Apply(0, &wb, slots_b.data(), &step_b, &g, 1);
  EXPECT_NEAR(wb, -0.1f, 1e-6);
  EXPECT_EQ(step_a, 5u);
  EXPECT_EQ(step_b, 1u);
}

// The update loops are vectorized and dispatched by CPU (optimizer_kernels.h); on any
// machine they must give the same bits as one scalar, separately rounded evaluation of the
// formulas, here written out in the test. 67 weights: full vectors and a remainder.
std::vector<float> ScalarReference(const OptimizerSpec& spec, std::vector<float> w,
                                   std::vector<float> slots, const std::vector<float>& g,
                                   int steps) {
  const size_t n = w.size();
  const float lr = spec.learning_rate(), eps = spec.epsilon();
  for (int t = 1; t <= steps; ++t) {
    for (size_t j = 0; j < n; ++j) {
      switch (spec.kind()) {
        case OptimizerSpec::SGD:
          w[j] = w[j] - lr * g[j];
          break;
        case OptimizerSpec::MOMENTUM: {
          float& v = slots[j];
          v = spec.momentum() * v + g[j];
          w[j] = w[j] - lr * (spec.nesterov() ? g[j] + spec.momentum() * v : v);
          break;
        }
        case OptimizerSpec::ADAGRAD: {
          float& acc = slots[j];
          acc = acc + g[j] * g[j];
          w[j] = w[j] - lr * g[j] / (std::sqrt(acc) + eps);
          break;
        }
        case OptimizerSpec::ADAM: {
          const float b1 = spec.beta1(), b2 = spec.beta2();
          const float c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), t));
          const float c2 = static_cast<float>(1.0 - std::pow(static_cast<double>(b2), t));
          float& m = slots[j];
          float& v = slots[n + j];
          m = b1 * m + (1 - b1) * g[j];
          v = b2 * v + (1 - b2) * (g[j] * g[j]);
          w[j] = w[j] - lr * (m / c1) / (std::sqrt(v / c2) + eps);
          break;
        }
        case OptimizerSpec::FTRL: {
          const float alpha = lr, beta = spec.ftrl_beta(), l1 = spec.ftrl_l1(), l2 = spec.ftrl_l2();
          float& z = slots[j];
          float& acc = slots[n + j];
          const float new_acc = acc + g[j] * g[j];
          const float sqrt_new = std::sqrt(new_acc);
          z = z + (g[j] - (sqrt_new - std::sqrt(acc)) / alpha * w[j]);
          acc = new_acc;
          if (std::fabs(z) <= l1) {
            w[j] = 0.0f;
          } else {
            w[j] = -(z - std::copysign(l1, z)) / ((beta + sqrt_new) / alpha + l2);
          }
          break;
        }
        default:
          ADD_FAILURE() << "no reference for " << OptimizerSpec::Kind_Name(spec.kind());
      }
    }
  }
  std::vector<float> out = w;
  out.insert(out.end(), slots.begin(), slots.end());
  return out;
}

TEST(OptimizerTest, VectorizedUpdatesAreBitwiseTheScalarFormulas) {
  for (auto kind :
       {OptimizerSpec::SGD, OptimizerSpec::MOMENTUM, OptimizerSpec::ADAGRAD, OptimizerSpec::ADAM}) {
    for (bool nesterov : {false, true}) {
      if (nesterov && kind != OptimizerSpec::MOMENTUM) continue;
      OptimizerSpec raw = Spec(kind);
      raw.set_momentum(0.9f);
      raw.set_nesterov(nesterov);
      raw.set_ftrl_l1(0.3f);  // some weights shrink to 0, some not
      raw.set_ftrl_l2(0.01f);
      auto spec = NormalizeOptimizer(raw);
      ASSERT_TRUE(spec.ok()) << spec.status();
      const Optimizer opt(*spec);
      const size_t n = 67;
      std::mt19937 rng(7);
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      std::vector<float> w(n), g(n), slots(opt.slots() * n);
      for (float& x : w) x = dist(rng);
      for (float& x : g) x = dist(rng);
      opt.InitSlots(slots.data(), n);
      const std::vector<float> expected = ScalarReference(*spec, w, slots, g, 3);
      uint64_t step = 0;
      for (int t = 0; t < 3; ++t) opt.Apply(0, w.data(), slots.data(), &step, g.data(), n);
      std::vector<float> got = w;
      got.insert(got.end(), slots.begin(), slots.end());
      ASSERT_EQ(got.size(), expected.size());
      for (size_t j = 0; j < got.size(); ++j) {
        uint32_t a, b;
        std::memcpy(&a, &got[j], 4);
        std::memcpy(&b, &expected[j], 4);
        ASSERT_EQ(a, b) << OptimizerSpec::Kind_Name(kind) << (nesterov ? " nesterov" : "")
                        << " float " << j << ": " << got[j] << " vs " << expected[j];
      }
    }
  }
}

}  // namespace
}  // namespace ps
