// 16-bit floating-point values for compact rows on the wire (PullRequest.value_type):
// bfloat16 (8-bit exponent, 7-bit mantissa: float32's range, ~3 significant digits) and
// IEEE 754 binary16 ("fp16": 5-bit exponent, 10-bit mantissa, finite range +-65504).
// The one home of these conversions: the pod narrows with them, the client widens.
//
// Narrowing rounds to nearest, ties to even, exactly as IEEE 754 (and so numpy's
// astype(float16), torch's .to(torch.bfloat16 / torch.float16)) do:
//  - a float32 beyond fp16's range rounds to +-Inf (from 65520 up, the first value whose
//    nearest-even is past 65504); bfloat16 has float32's range, so only values within half
//    a bf16 step of FLT_MAX round to Inf;
//  - fp16 subnormals are produced (values below 2^-14), and values below 2^-25 go to +-0;
//  - +-Inf stay +-Inf, and a NaN stays a NaN (quiet, sign kept; its payload is not kept).
// Widening is exact (every 16-bit value is a float32).
//
// The array forms are branch-free loops over 32-bit integers that the compiler
// vectorizes; they need the default floating-point environment (round to nearest, no
// -ffast-math), which the project builds with. Thread-safe (pure functions).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ps {

namespace half_internal {
inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace half_internal

// float32 -> bfloat16 bits, round to nearest even.
inline uint16_t FloatToBf16(float f) {
  const uint32_t u = half_internal::Bits(f);
  const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(nan ? ((u >> 16) | 0x40u) : rounded);
}

// bfloat16 bits -> float32 (exact).
inline float Bf16ToFloat(uint16_t h) { return half_internal::FromBits(uint32_t{h} << 16); }

// float32 -> IEEE binary16 bits, round to nearest even, overflow to +-Inf. (M. Dukhan's
// FP16 library, fp16_ieee_from_fp32_value: the float adds do the rounding.)
inline uint16_t FloatToFp16(float f) {
  using half_internal::Bits;
  using half_internal::FromBits;
  const float scale_to_inf = 0x1.0p+112f;
  const float scale_to_zero = 0x1.0p-110f;
  float base = (__builtin_fabsf(f) * scale_to_inf) * scale_to_zero;
  const uint32_t w = Bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = FromBits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = Bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

// IEEE binary16 bits -> float32 (exact; subnormals, Inf and NaN included).
inline float Fp16ToFloat(uint16_t h) {
  using half_internal::Bits;
  using half_internal::FromBits;
  const uint32_t w = uint32_t{h} << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = FromBits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = FromBits((two_w >> 17) | (126u << 23)) - 0.5f;
  return FromBits(sign | (two_w < (1u << 27) ? Bits(denormalized) : Bits(normalized)));
}

// The array forms: n values from `in` to `out` (which must not overlap).
void FloatsToBf16(const float* in, size_t n, uint16_t* out);
void FloatsToFp16(const float* in, size_t n, uint16_t* out);
void Bf16sToFloats(const uint16_t* in, size_t n, float* out);
void Fp16sToFloats(const uint16_t* in, size_t n, float* out);

}  // namespace ps
