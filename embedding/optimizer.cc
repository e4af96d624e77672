#include "embedding/optimizer.h"

#include <Eigen/Core>
#include <cmath>

#include "embedding/optimizer_kernels.h"
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
  ++*step;
  switch (spec_.kind()) {
    case OptimizerSpec::SGD:
      kernels::Sgd(wp, gp, n, lr);
      break;
    case OptimizerSpec::MOMENTUM:
      kernels::Momentum(wp, slots, gp, n, lr, spec_.momentum(), spec_.nesterov());
      break;
    case OptimizerSpec::ADAGRAD:
      kernels::Adagrad(wp, slots, gp, n, lr, spec_.epsilon());
      break;
    case OptimizerSpec::ADAM: {
      const float b1 = spec_.beta1(), b2 = spec_.beta2();
      const double t = static_cast<double>(*step);
      const float c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), t));
      const float c2 = static_cast<float>(1.0 - std::pow(static_cast<double>(b2), t));
      kernels::Adam(wp, slots, slots + n, gp, n, lr, b1, b2, c1, c2, spec_.epsilon());
      break;
    }
    case OptimizerSpec::FTRL:
      kernels::Ftrl(wp, slots, slots + n, gp, n, lr, spec_.ftrl_beta(), spec_.ftrl_l1(),
                    spec_.ftrl_l2());
      break;
    default:
      break;
  }
}

}  // namespace ps
