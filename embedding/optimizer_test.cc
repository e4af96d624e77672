#include "embedding/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
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
// Saturation as optimizer_kernels.h states it.
float Sat(float x) {
  if (std::isnan(x) || std::fabs(x) > kMaxValue) return std::copysign(kMaxValue, x);
  return x;
}
float SatAcc(float x) {
  if (std::isnan(x) || std::signbit(x) || x > kMaxValue) return kMaxValue;
  return x;
}

// The gradient after clipping, as the optimizer documents it: each element to
// [-clip_value, clip_value], then the row's norm (summed in double, element j into partial
// sum j % 8, as ClippedSquaredNorm does) to clip_norm.
std::vector<float> ClippedReference(std::vector<float> g, GradientClip clip) {
  if (clip.value > 0) {
    for (float& x : g) x = std::min(std::max(x, -clip.value), clip.value);
  }
  if (clip.norm > 0) {
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t j = 0; j < g.size(); ++j) s[j % 8] += static_cast<double>(g[j]) * g[j];
    const double norm =
        std::sqrt(((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])));
    if (norm > clip.norm) {
      const float scale = static_cast<float>(clip.norm / norm);
      for (float& x : g) x = x * scale;
    }
  }
  return g;
}

std::vector<float> ScalarReference(const OptimizerSpec& spec, std::vector<float> w,
                                   std::vector<float> slots, const std::vector<float>& raw_g,
                                   int steps, GradientClip clip = {}) {
  const size_t n = w.size();
  const float lr = spec.learning_rate(), eps = spec.epsilon();
  const std::vector<float> g = ClippedReference(raw_g, clip);
  for (int t = 1; t <= steps; ++t) {
    for (size_t j = 0; j < n; ++j) {
      switch (spec.kind()) {
        case OptimizerSpec::SGD:
          w[j] = Sat(w[j] - lr * g[j]);
          break;
        case OptimizerSpec::MOMENTUM: {
          float& v = slots[j];
          v = Sat(spec.momentum() * v + g[j]);
          w[j] = Sat(w[j] - lr * (spec.nesterov() ? g[j] + spec.momentum() * v : v));
          break;
        }
        case OptimizerSpec::ADAGRAD: {
          float& acc = slots[j];
          const float a = acc + g[j] * g[j];
          w[j] = Sat(w[j] - lr * g[j] / (std::sqrt(a) + eps));
          acc = SatAcc(a);
          break;
        }
        case OptimizerSpec::ADAM: {
          const float b1 = spec.beta1(), b2 = spec.beta2();
          const float c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), t));
          const float c2 = static_cast<float>(1.0 - std::pow(static_cast<double>(b2), t));
          float& m = slots[j];
          float& v = slots[n + j];
          m = Sat(b1 * m + (1 - b1) * g[j]);
          v = SatAcc(b2 * v + (1 - b2) * (g[j] * g[j]));
          w[j] = Sat(w[j] - lr * (m / c1) / (std::sqrt(v / c2) + eps));
          break;
        }
        case OptimizerSpec::FTRL: {
          const float alpha = lr, beta = spec.ftrl_beta(), l1 = spec.ftrl_l1(), l2 = spec.ftrl_l2();
          float& z = slots[j];
          float& acc = slots[n + j];
          const float new_acc = acc + g[j] * g[j];
          const float sqrt_new = std::sqrt(new_acc);
          z = Sat(z + (g[j] - (sqrt_new - std::sqrt(acc)) / alpha * w[j]));
          acc = SatAcc(new_acc);
          if (std::fabs(z) <= l1) {
            w[j] = 0.0f;
          } else {
            w[j] = Sat(-(z - std::copysign(l1, z)) / ((beta + sqrt_new) / alpha + l2));
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

// Every optimizer, plain, clipping by value, by norm and both, and with weights next to
// the saturation bound (some updates saturate, some not): 67 weights, and 2500 (a dense
// tensor: several clipping chunks).
TEST(OptimizerTest, VectorizedUpdatesAreBitwiseTheScalarFormulas) {
  const std::vector<GradientClip> clips = {{0, 0}, {0.3f, 0}, {0, 1.5f}, {0.5f, 0.8f}};
  for (auto kind : {OptimizerSpec::SGD, OptimizerSpec::MOMENTUM, OptimizerSpec::ADAGRAD,
                    OptimizerSpec::ADAM, OptimizerSpec::FTRL}) {
    for (bool nesterov : {false, true}) {
      if (nesterov && kind != OptimizerSpec::MOMENTUM) continue;
      for (size_t c = 0; c < clips.size() + 1; ++c) {
        const bool saturating = c == clips.size();
        const GradientClip clip = saturating ? GradientClip{} : clips[c];
        OptimizerSpec raw = Spec(kind);
        raw.set_momentum(0.9f);
        raw.set_nesterov(nesterov);
        raw.set_ftrl_l1(0.3f);  // some weights shrink to 0, some not
        raw.set_ftrl_l2(0.01f);
        auto spec = NormalizeOptimizer(raw);
        ASSERT_TRUE(spec.ok()) << spec.status();
        const Optimizer opt(*spec, clip);
        for (size_t n : {size_t{67}, size_t{2500}}) {
          std::mt19937 rng(7);
          std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
          std::vector<float> w(n), g(n), slots(opt.slots() * n);
          for (float& x : w) x = dist(rng);
          for (float& x : g) x = dist(rng);
          opt.InitSlots(slots.data(), n);
          if (saturating) {
            for (float& x : w) x = x * kMaxValue;
            for (float& x : g) x = x * 1e12f;
          }
          const std::vector<float> expected = ScalarReference(*spec, w, slots, g, 3, clip);
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
                            << " clip " << clip.value << "/" << clip.norm
                            << (saturating ? " saturating" : "") << " n " << n << " float " << j
                            << ": " << got[j] << " vs " << expected[j];
          }
        }
      }
    }
  }
}

// Issue 15: FTRL with a gradient of 1e20 left the row NaN forever, Adagrad's accumulator
// went Inf (the row frozen), SGD with learning_rate 1e30 gave -Inf. A push of such
// gradients is refused by the pod (ps_core), and a spec with such a rate at creation; the
// kernels themselves never store a non-finite value whatever they are given (here specs
// normalized under the stored rules, as an older pod's catalog may hold).
TEST(OptimizerTest, UpdatesNeverStoreNonFiniteValues) {
  struct Case {
    OptimizerSpec::Kind kind;
    float lr;
    float g;
  };
  const float big = std::numeric_limits<float>::max();
  for (const Case& c :
       {Case{OptimizerSpec::FTRL, 0.05f, 1e20f}, Case{OptimizerSpec::ADAGRAD, 0.1f, 1e20f},
        Case{OptimizerSpec::SGD, 1e30f, 1.0f}, Case{OptimizerSpec::ADAM, 1e30f, big},
        Case{OptimizerSpec::MOMENTUM, 1e30f, big}, Case{OptimizerSpec::FTRL, 1e-38f, big},
        Case{OptimizerSpec::SGD, 1.0f, std::numeric_limits<float>::quiet_NaN()}}) {
    OptimizerSpec raw = Spec(c.kind);
    raw.set_learning_rate(c.lr);
    auto spec = NormalizeOptimizer(raw, SpecRules::kStored);
    ASSERT_TRUE(spec.ok()) << spec.status();
    const Optimizer opt(*spec);
    std::vector<float> w = {0.0f, 0.5f, -2.0f};
    std::vector<float> slots(opt.slots() * 3);
    opt.InitSlots(slots.data(), 3);
    uint64_t step = 0;
    for (int t = 0; t < 4; ++t) {
      const std::vector<float> g = {c.g, -c.g, t % 2 == 0 ? c.g : 0.0f};
      opt.Apply(0, w.data(), slots.data(), &step, g.data(), 3);
      for (float x : w)
        ASSERT_TRUE(std::isfinite(x)) << OptimizerSpec::Kind_Name(c.kind) << " w " << x;
      for (float x : slots) {
        ASSERT_TRUE(std::isfinite(x)) << OptimizerSpec::Kind_Name(c.kind) << " slot " << x;
      }
    }
    std::string why;
    EXPECT_TRUE(opt.ValidState(w.data(), slots.data(), 3, &why)) << why;
  }
}

// The bounds of spec.h keep every intermediate of every update finite, so within them no
// value is ever saturated from a NaN or an overflow: each formula is evaluated here in
// double at the corners of the accepted ranges (every stored value at 0 or ±kMaxValue,
// gradients at 0, tiny or ±kMaxGradient, hyperparameters at their range ends), checking
// each intermediate stays below float's largest value with room to spare, and that the
// float kernels then only saturate where the exact result is beyond kMaxValue.
TEST(OptimizerTest, ExtremeValidInputsStayFinite) {
  const double kRoom = std::numeric_limits<float>::max() / 16.0;
  int checked = 0;
  auto fine = [&](double x, const char* what) {
    ++checked;
    EXPECT_FALSE(std::isnan(x)) << what;
    EXPECT_LT(std::fabs(x), kRoom) << what;
    return x;
  };
  auto sat = [](double x) { return std::min(std::max(x, -double{kMaxValue}), double{kMaxValue}); };
  const std::vector<double> values = {-kMaxValue, -1, 0, 1e-30, kMaxValue};
  const std::vector<double> accumulators = {0, 1e-30, kMaxValue};
  const std::vector<double> grads = {-kMaxGradient, -1e-30, 0, 1e-25, kMaxGradient};
  const std::vector<double> rates = {kMinLearningRate, kMaxLearningRate};
  const std::vector<double> decays = {0, kMaxDecay};
  const std::vector<double> epsilons = {kMinEpsilon, kMaxEpsilon};
  const std::vector<double> coefficients = {0, kMaxCoefficient};
  // Runs the float kernel on one element and compares with the exact result.
  auto kernel_agrees = [&](const OptimizerSpec& spec, std::vector<float> state, float g,
                           double exact_w) {
    const Optimizer opt(spec);
    float w = state[0];
    uint64_t step = 0;
    opt.Apply(0, &w, state.data() + 1, &step, &g, 1);
    if (std::fabs(exact_w) < 0.5 * kMaxValue) {
      EXPECT_LT(std::fabs(w), 0.9f * kMaxValue)
          << spec.ShortDebugString() << " w " << state[0] << " g " << g << ": float " << w
          << " exact " << exact_w;
    }
  };
  for (double lr : rates) {
    for (double g : grads) {
      for (double w : values) {
        // SGD
        {
          const double out = sat(fine(w - fine(lr * g, "sgd lr*g"), "sgd w"));
          OptimizerSpec o = Spec(OptimizerSpec::SGD);
          o.set_learning_rate(static_cast<float>(lr));
          kernel_agrees(*NormalizeOptimizer(o), {static_cast<float>(w)}, static_cast<float>(g),
                        out);
        }
        for (double mu : decays) {
          for (double v : values) {  // Momentum (and Nesterov)
            const double v2 = sat(fine(mu * v + g, "momentum v"));
            fine(w - fine(lr * fine(g + mu * v2, "nesterov"), "nesterov lr"), "nesterov w");
            fine(w - fine(lr * v2, "momentum lr*v"), "momentum w");
          }
          for (double b2 : decays) {
            for (double eps : epsilons) {
              for (double m : values) {
                for (double v : accumulators) {  // Adam, at t = 1 (the smallest c1, c2)
                  const double c1 = 1 - mu, c2 = 1 - b2;
                  const double m2 = sat(fine(mu * m + (1 - mu) * g, "adam m"));
                  const double v2 =
                      sat(fine(b2 * v + (1 - b2) * fine(g * g, "adam g*g"), "adam v"));
                  const double step = fine(
                      fine(m2 / c1, "adam m/c1") / (std::sqrt(fine(v2 / c2, "adam v/c2")) + eps),
                      "adam ratio");
                  fine(w - fine(lr * step, "adam lr*ratio"), "adam w");
                }
              }
            }
          }
        }
        for (double eps : epsilons) {
          for (double acc : accumulators) {  // Adagrad
            const double a = fine(acc + fine(g * g, "adagrad g*g"), "adagrad acc");
            const double out =
                sat(fine(w - fine(lr * g / (std::sqrt(a) + eps), "adagrad step"), "adagrad w"));
            OptimizerSpec o = Spec(OptimizerSpec::ADAGRAD);
            o.set_learning_rate(static_cast<float>(lr));
            o.set_epsilon(static_cast<float>(eps));
            kernel_agrees(*NormalizeOptimizer(o), {static_cast<float>(w), static_cast<float>(acc)},
                          static_cast<float>(g), out);
          }
        }
        for (double beta : coefficients) {
          for (double l : coefficients) {
            for (double z : values) {
              for (double n : accumulators) {  // FTRL
                const double n2 = fine(n + g * g, "ftrl n");
                const double sigma = fine((std::sqrt(n2) - std::sqrt(n)) / lr, "ftrl sigma");
                const double z2 = sat(fine(z + (g - fine(sigma * w, "ftrl sigma*w")), "ftrl z"));
                const double denominator =
                    fine((beta + std::sqrt(n2)) / lr + l, "ftrl denominator");
                fine(z2 - std::copysign(l, z2), "ftrl shrink");
                (void)denominator;  // may be 0 (beta = 0, n = 0, l2 = 0): saturates, see spec.h
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 10000);
}

TEST(OptimizerTest, ClippingBoundsEachElementThenTheRowNorm) {
  auto spec = NormalizeOptimizer(Spec(OptimizerSpec::SGD));  // lr 0.1
  ASSERT_TRUE(spec.ok());
  {
    const Optimizer opt(*spec, GradientClip{2.0f, 0});
    std::vector<float> w = {0, 0, 0};
    const std::vector<float> g = {1e30f, -5.0f, 1.0f};
    uint64_t step = 0;
    opt.Apply(1.0f, w.data(), nullptr, &step, g.data(), 3);
    EXPECT_EQ(w, (std::vector<float>{-2.0f, 2.0f, -1.0f}));
  }
  {
    const Optimizer opt(*spec, GradientClip{0, 5.0f});
    std::vector<float> w = {0, 0};
    const std::vector<float> g = {30.0f, 40.0f};  // norm 50: scaled by 1/10
    uint64_t step = 0;
    opt.Apply(1.0f, w.data(), nullptr, &step, g.data(), 2);
    EXPECT_FLOAT_EQ(w[0], -3.0f);
    EXPECT_FLOAT_EQ(w[1], -4.0f);
    const std::vector<float> small = {0.3f, 0.4f};  // norm 0.5: unchanged
    opt.Apply(1.0f, w.data(), nullptr, &step, small.data(), 2);
    EXPECT_FLOAT_EQ(w[0], -3.3f);
    EXPECT_FLOAT_EQ(w[1], -4.4f);
    // The largest finite gradient too: the norm is summed in double.
    std::vector<float> huge = {std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::max()};
    std::vector<float> w2 = {0, 0};
    opt.Apply(1.0f, w2.data(), nullptr, &step, huge.data(), 2);
    EXPECT_NEAR(w2[0], -5.0f / std::sqrt(2.0f), 1e-5);
  }
  {
    // A dense tensor of 3000 elements: the norm is the whole tensor's, applied across
    // the clipping chunks.
    const Optimizer opt(*spec, GradientClip{0, 1.0f});
    std::vector<float> w(3000, 0.0f), g(3000, 1.0f);  // norm sqrt(3000)
    uint64_t step = 0;
    opt.Apply(1.0f, w.data(), nullptr, &step, g.data(), w.size());
    double norm = 0;
    for (float x : w) norm += double{x} * x;
    EXPECT_NEAR(std::sqrt(norm), 1.0, 1e-5);
    EXPECT_EQ(w.front(), w.back());
  }
}

TEST(OptimizerTest, ValidStateIsWhatUpdatesCanLeave) {
  const Optimizer adagrad(*NormalizeOptimizer(Spec(OptimizerSpec::ADAGRAD)));
  std::vector<float> w = {1, -kMaxValue}, acc = {0, kMaxValue};
  std::string why;
  EXPECT_TRUE(adagrad.ValidState(w.data(), acc.data(), 2, &why)) << why;
  acc[0] = -0.5f;
  EXPECT_FALSE(adagrad.ValidState(w.data(), acc.data(), 2, &why));
  EXPECT_EQ(why, "slot0[0] = -0.5 is a negative accumulator");
  acc[0] = 0;
  w[1] = std::nanf("");
  EXPECT_FALSE(adagrad.ValidState(w.data(), acc.data(), 2, &why));
  EXPECT_NE(why.find("weight[1] = nan is not finite or beyond +-1e+15"), std::string::npos) << why;
  w[1] = 2e15f;
  EXPECT_FALSE(adagrad.ValidState(w.data(), acc.data(), 2, &why));
  // Adam's first moment and Momentum's velocity may be negative; Adam's second may not.
  const Optimizer adam(*NormalizeOptimizer(Spec(OptimizerSpec::ADAM)));
  std::vector<float> one = {1}, mv = {-3, 2};
  EXPECT_TRUE(adam.ValidState(one.data(), mv.data(), 1));
  mv = {3, -2};
  EXPECT_FALSE(adam.ValidState(one.data(), mv.data(), 1));
  const Optimizer ftrl(*NormalizeOptimizer(Spec(OptimizerSpec::FTRL)));
  std::vector<float> zn = {-7, 0};
  EXPECT_TRUE(ftrl.ValidState(one.data(), zn.data(), 1));
  zn = {std::numeric_limits<float>::infinity(), 0};
  EXPECT_FALSE(ftrl.ValidState(one.data(), zn.data(), 1));
}

}  // namespace
}  // namespace ps
