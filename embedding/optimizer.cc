#include "embedding/optimizer.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/base/attributes.h"
#include "absl/strings/str_cat.h"
#include "embedding/optimizer_kernels.h"
#include "embedding/spec.h"

namespace ps {
namespace {

using Vec = Eigen::Map<Eigen::ArrayXf>;

// Clipped gradients are made in chunks of this many floats on the stack: a row (dim <=
// 4096) is one or a few chunks, a dense tensor many; the kernels are element-wise, so the
// chunking changes no result.
constexpr size_t kClipChunk = 1024;

}  // namespace

Optimizer::Optimizer(const OptimizerSpec& spec, GradientClip clip)
    : spec_(spec),
      slots_(SlotsPerElement(spec.kind())),
      clip_(clip),
      clips_(clip.value > 0 || clip.norm > 0) {}

Optimizer Optimizer::For(const TableSpec& spec) {
  return Optimizer(spec.optimizer(), GradientClip{spec.clip_value(), spec.clip_norm()});
}

Optimizer Optimizer::For(const DenseSpec& spec) {
  return Optimizer(spec.optimizer(), GradientClip{spec.clip_value(), spec.clip_norm()});
}

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

// The update itself, inlined into Apply: a row's update is a few dozen nanoseconds, so the
// common path (no clipping) must not pay for the clipping path's frame (a 4 KiB buffer).
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void Optimizer::Update(float lr, uint64_t t, float* w,
                                                           float* s0, float* s1, const float* g,
                                                           size_t n) const {
  switch (spec_.kind()) {
    case OptimizerSpec::SGD:
      kernels::Sgd(w, g, n, lr);
      break;
    case OptimizerSpec::MOMENTUM:
      kernels::Momentum(w, s0, g, n, lr, spec_.momentum(), spec_.nesterov());
      break;
    case OptimizerSpec::ADAGRAD:
      kernels::Adagrad(w, s0, g, n, lr, spec_.epsilon());
      break;
    case OptimizerSpec::ADAM: {
      const float b1 = spec_.beta1(), b2 = spec_.beta2();
      const double td = static_cast<double>(t);
      const float c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), td));
      const float c2 = static_cast<float>(1.0 - std::pow(static_cast<double>(b2), td));
      kernels::Adam(w, s0, s1, g, n, lr, b1, b2, c1, c2, spec_.epsilon());
      break;
    }
    case OptimizerSpec::FTRL:
      kernels::Ftrl(w, s0, s1, g, n, lr, spec_.ftrl_beta(), spec_.ftrl_l1(), spec_.ftrl_l2());
      break;
    default:
      break;
  }
}

void Optimizer::Apply(float lr, float* w, float* slots, uint64_t* step, const float* g,
                      size_t n) const {
  if (!(lr > 0)) lr = spec_.learning_rate();
  const uint64_t t = ++*step;
  if (clips_) return ApplyClipped(lr, t, w, slots, g, n);
  Update(lr, t, w, slots, slots_ == 2 ? slots + n : nullptr, g, n);
}

void Optimizer::ApplyClipped(float lr, uint64_t t, float* w, float* slots, const float* g,
                             size_t n) const {
  float* s0 = slots;
  float* s1 = slots_ == 2 ? slots + n : nullptr;
  const float value = clip_.value > 0 ? clip_.value : std::numeric_limits<float>::max();
  float scale = 1.0f;
  if (clip_.norm > 0) {
    const double norm = std::sqrt(kernels::ClippedSquaredNorm(g, n, value));
    if (norm > clip_.norm) scale = static_cast<float>(clip_.norm / norm);
  }
  float clipped[kClipChunk];
  for (size_t begin = 0; begin < n; begin += kClipChunk) {
    const size_t m = std::min(kClipChunk, n - begin);
    kernels::ClipAndScale(clipped, g + begin, m, value, scale);
    Update(lr, t, w + begin, s0 == nullptr ? nullptr : s0 + begin,
           s1 == nullptr ? nullptr : s1 + begin, clipped, m);
  }
}

bool Optimizer::ValidState(const float* w, const float* slots, size_t n, std::string* why) const {
  auto bad = [&](const char* what, size_t j, float v, bool negative) {
    if (why != nullptr) {
      *why = absl::StrCat(what, "[", j, "] = ", v,
                          negative ? " is a negative accumulator"
                                   : absl::StrCat(" is not finite or beyond +-", kMaxValue));
    }
    return false;
  };
  auto within = [](float v) { return std::fabs(v) <= kMaxValue; };  // false for NaN
  for (size_t j = 0; j < n; ++j) {
    if (!within(w[j])) return bad("weight", j, w[j], false);
  }
  // Slot k of the optimizer holds an accumulator (never negative) for: Adagrad 0, Adam 1,
  // FTRL 1.
  const int accumulator =
      spec_.kind() == OptimizerSpec::ADAGRAD                                         ? 0
      : (spec_.kind() == OptimizerSpec::ADAM || spec_.kind() == OptimizerSpec::FTRL) ? 1
                                                                                     : -1;
  for (int k = 0; k < slots_; ++k) {
    const float* s = slots + k * n;
    for (size_t j = 0; j < n; ++j) {
      if (!within(s[j])) return bad(k == 0 ? "slot0" : "slot1", j, s[j], false);
      if (k == accumulator && s[j] < 0) return bad(k == 0 ? "slot0" : "slot1", j, s[j], true);
    }
  }
  return true;
}

}  // namespace ps
