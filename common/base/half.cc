#include "common/base/half.h"

namespace ps {

// Plain loops over the inline conversions: with them inlined, GCC vectorizes each (the
// branches are selects).
void FloatsToBf16(const float* __restrict in, size_t n, uint16_t* __restrict out) {
  for (size_t i = 0; i < n; ++i) out[i] = FloatToBf16(in[i]);
}

void FloatsToFp16(const float* __restrict in, size_t n, uint16_t* __restrict out) {
  for (size_t i = 0; i < n; ++i) out[i] = FloatToFp16(in[i]);
}

void Bf16sToFloats(const uint16_t* __restrict in, size_t n, float* __restrict out) {
  for (size_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(in[i]);
}

void Fp16sToFloats(const uint16_t* __restrict in, size_t n, float* __restrict out) {
  for (size_t i = 0; i < n; ++i) out[i] = Fp16ToFloat(in[i]);
}

}  // namespace ps
