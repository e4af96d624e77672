#include "embedding/optimizer_kernels.h"

#include <cmath>

#include "embedding/spec.h"

// Built with -O3 -ffp-contract=off -fno-math-errno -fno-trapping-math (embedding/
// CMakeLists.txt): -O3 lets GCC vectorize the loops; no contraction keeps every operation
// separately rounded; the last two let sqrt vectorize and FTRL's select be computed on
// both sides (FP exceptions are masked: nothing traps; no result changes). Each function exists for
// the baseline ISA and for x86-64-v3 (AVX2).
#define PS_KERNEL __attribute__((target_clones("arch=x86-64-v3", "default")))

namespace ps::kernels {
namespace {

// min(max(x, -kMaxValue), kMaxValue); NaN -> -kMaxValue (the first comparison is false).
// Both are exact selections: maxps/minps or a blend, bitwise alike in every clone.
inline float Sat(float x) {
  x = x > -kMaxValue ? x : -kMaxValue;
  return x < kMaxValue ? x : kMaxValue;
}

// An accumulator (a sum or average of squares, never negative): min(x, kMaxValue), NaN ->
// kMaxValue, so it stays >= 0.
inline float SatAcc(float x) { return x < kMaxValue ? x : kMaxValue; }

inline float Clip(float x, float clip) {
  x = x > -clip ? x : -clip;
  return x < clip ? x : clip;
}

}  // namespace

PS_KERNEL void Sgd(float* __restrict w, const float* __restrict g, size_t n, float lr) {
  for (size_t j = 0; j < n; ++j) w[j] = Sat(w[j] - lr * g[j]);
}

PS_KERNEL void Momentum(float* __restrict w, float* __restrict v, const float* __restrict g,
                        size_t n, float lr, float mu, bool nesterov) {
  if (nesterov) {
    for (size_t j = 0; j < n; ++j) {
      v[j] = Sat(mu * v[j] + g[j]);
      w[j] = Sat(w[j] - lr * (g[j] + mu * v[j]));
    }
  } else {
    for (size_t j = 0; j < n; ++j) {
      v[j] = Sat(mu * v[j] + g[j]);
      w[j] = Sat(w[j] - lr * v[j]);
    }
  }
}

PS_KERNEL void Adagrad(float* __restrict w, float* __restrict acc, const float* __restrict g,
                       size_t n, float lr, float eps) {
  for (size_t j = 0; j < n; ++j) {
    const float a = acc[j] + g[j] * g[j];
    w[j] = Sat(w[j] - lr * g[j] / (std::sqrt(a) + eps));
    acc[j] = SatAcc(a);
  }
}

PS_KERNEL void Adam(float* __restrict w, float* __restrict m, float* __restrict v,
                    const float* __restrict g, size_t n, float lr, float b1, float b2, float c1,
                    float c2, float eps) {
  const float one_minus_b1 = 1 - b1, one_minus_b2 = 1 - b2;
  for (size_t j = 0; j < n; ++j) {
    m[j] = Sat(b1 * m[j] + one_minus_b1 * g[j]);
    v[j] = SatAcc(b2 * v[j] + one_minus_b2 * (g[j] * g[j]));
    w[j] = Sat(w[j] - lr * (m[j] / c1) / (std::sqrt(v[j] / c2) + eps));
  }
}

PS_KERNEL void Ftrl(float* __restrict w, float* __restrict z, float* __restrict acc,
                    const float* __restrict g, size_t n, float alpha, float beta, float l1,
                    float l2) {
  for (size_t j = 0; j < n; ++j) {
    const float new_acc = acc[j] + g[j] * g[j];
    const float sqrt_new = std::sqrt(new_acc);
    z[j] = Sat(z[j] + (g[j] - (sqrt_new - std::sqrt(acc[j])) / alpha * w[j]));
    acc[j] = SatAcc(new_acc);
    // w = 0 where |z| <= l1, else -(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2).
    // Both computed, then one picked: a loop without branches vectorizes (the unused
    // quotient may be 0/0 for a row never updated; FP exceptions are masked).
    const float zj = z[j];
    const float shrunk = -(zj - std::copysign(l1, zj)) / ((beta + sqrt_new) / alpha + l2);
    w[j] = Sat(std::fabs(zj) <= l1 ? 0.0f : shrunk);
  }
}

PS_KERNEL double ClippedSquaredNorm(const float* __restrict g, size_t n, float clip) {
  // Eight partial sums, element j into sum j % 8: each sum adds its elements in the same
  // order however many of them a vector holds, so every clone gives the same bits.
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (size_t k = 0; k < 8; ++k) {
      const double x = Clip(g[j + k], clip);
      s[k] += x * x;
    }
  }
  for (size_t k = 0; j < n; ++j, ++k) {
    const double x = Clip(g[j], clip);
    s[k] += x * x;
  }
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

PS_KERNEL void ClipAndScale(float* __restrict out, const float* __restrict g, size_t n, float clip,
                            float scale) {
  for (size_t j = 0; j < n; ++j) out[j] = Clip(g[j], clip) * scale;
}

}  // namespace ps::kernels
