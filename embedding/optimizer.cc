#include "embedding/optimizer.h"

#include <Eigen/Core>
#include <cmath>

#include "embedding/spec.h"

namespace ps {
namespace {

using Vec = Eigen::Map<Eigen::ArrayXf>;
using ConstVec = Eigen::Map<const Eigen::ArrayXf>;

}  // namespace

Optimizer::Optimizer(const OptimizerSpec& spec)
    : spec_(spec), slots_(SlotsPerElement(spec.kind())) {}

void Optimizer::InitSlots(float* slots, size_t n) const {
  switch (spec_.kind()) {
    case OptimizerSpec::MOMENTUM:
      Vec(slots, n).setZero();
      break;
    case OptimizerSpec::ADAGRAD:
      Vec(slots, n).setConstant(spec_.initial_accumulator());
      break;
    case OptimizerSpec::ADAM:
      Vec(slots, 2 * n).setZero();
      break;
    case OptimizerSpec::FTRL:
      Vec(slots, n).setZero();                                     // z
      Vec(slots + n, n).setConstant(spec_.initial_accumulator());  // n
      break;
    default:
      break;
  }
}

void Optimizer::Apply(float lr, float* wp, float* slots, uint64_t* step, const float* gp,
                      size_t n) const {
  if (!(lr > 0)) lr = spec_.learning_rate();
  Vec w(wp, n);
  ConstVec g(gp, n);
  ++*step;
  switch (spec_.kind()) {
    case OptimizerSpec::SGD:
      w -= lr * g;
      break;
    case OptimizerSpec::MOMENTUM: {
      Vec v(slots, n);
      const float mu = spec_.momentum();
      v = mu * v + g;
      if (spec_.nesterov()) {
        w -= lr * (g + mu * v);
      } else {
        w -= lr * v;
      }
      break;
    }
    case OptimizerSpec::ADAGRAD: {
      Vec acc(slots, n);
      acc += g.square();
      w -= lr * g / (acc.sqrt() + spec_.epsilon());
      break;
    }
    case OptimizerSpec::ADAM: {
      Vec m(slots, n);
      Vec v(slots + n, n);
      const float b1 = spec_.beta1(), b2 = spec_.beta2();
      m = b1 * m + (1 - b1) * g;
      v = b2 * v + (1 - b2) * g.square();
      const double t = static_cast<double>(*step);
      const float c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), t));
      const float c2 = static_cast<float>(1.0 - std::pow(static_cast<double>(b2), t));
      w -= lr * (m / c1) / ((v / c2).sqrt() + spec_.epsilon());
      break;
    }
    case OptimizerSpec::FTRL: {
      // No temporaries: this runs once per row on the push path.
      float* z = slots;
      float* acc = slots + n;
      const float alpha = lr, beta = spec_.ftrl_beta(), l1 = spec_.ftrl_l1(), l2 = spec_.ftrl_l2();
      for (size_t j = 0; j < n; ++j) {
        const float new_acc = acc[j] + gp[j] * gp[j];
        const float sqrt_new = std::sqrt(new_acc);
        z[j] += gp[j] - (sqrt_new - std::sqrt(acc[j])) / alpha * wp[j];
        acc[j] = new_acc;
        // w = 0 where |z| <= l1, else -(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2).
        const float zj = z[j];
        wp[j] = std::fabs(zj) <= l1
                    ? 0.0f
                    : -(zj - std::copysign(l1, zj)) / ((beta + sqrt_new) / alpha + l2);
      }
      break;
    }
    default:
      break;
  }
}

}  // namespace ps
