#include "embedding/optimizer_kernels.h"

#include <cmath>
#include <cstdint>

#include "embedding/spec.h"

// Built with -O3 -ffp-contract=off -fno-math-errno -fno-trapping-math (embedding/
// CMakeLists.txt): -O3 lets GCC vectorize the loops; no contraction keeps every operation
// separately rounded; the last two let sqrt vectorize and FTRL's select be computed on
// both sides (FP exceptions are masked: nothing traps; no result changes). Each function exists for
// the baseline ISA and for x86-64-v3 (AVX2).
#define PS_KERNEL __attribute__((target_clones("arch=x86-64-v3", "default")))

namespace ps::kernels {
namespace {

// Saturation works on the bits: for floats of one sign, the magnitude orders as its bit
// pattern, so one unsigned min clamps it (vpminud). Four integer operations per value; a
// float min/max pair (a compare and a blend each, as GCC emits them keeping IEEE
// semantics) cost Adagrad's push a fifth of its time. Integer operations are exact, so
// every clone gives the same bits.
constexpr uint32_t kMaxValueBits = __builtin_bit_cast(uint32_t, kMaxValue);
constexpr uint32_t kSignBit = 0x80000000u;

inline uint32_t Bits(float x) { return __builtin_bit_cast(uint32_t, x); }
inline float Float(uint32_t b) { return __builtin_bit_cast(float, b); }

// sign(x) * min(|x|, kMaxValue); a NaN (whose magnitude bits exceed every finite float's)
// becomes ±kMaxValue by its sign bit.
inline float Sat(float x) {
  const uint32_t b = Bits(x);
  const uint32_t magnitude = b & ~kSignBit;
  return Float((magnitude < kMaxValueBits ? magnitude : kMaxValueBits) | (b & kSignBit));
}

// An accumulator of squares (>= +0 after any update): min(x, kMaxValue) for x >= +0;
// anything with the sign bit set, and a NaN, becomes kMaxValue. One operation.
inline float SatAcc(float x) {
  const uint32_t b = Bits(x);
  return Float(b < kMaxValueBits ? b : kMaxValueBits);
}

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
