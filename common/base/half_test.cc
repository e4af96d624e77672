#include "common/base/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace ps {
namespace {

using Narrow = uint16_t (*)(float);
using Widen = float (*)(uint16_t);

bool IsNan16(uint16_t h, Widen widen) { return std::isnan(widen(h)); }

// Exhaustive over every finite 16-bit value h and its successor: h and the midpoints
// around it map back exactly; a value just inside a midpoint goes to the nearer side; a
// midpoint itself goes to the one with the even mantissa (ties to even). The midpoint of
// two 16-bit values needs at most 12 significant bits, so it is exact in float32.
void CheckRounding(Narrow narrow, Widen widen) {
  for (uint32_t sign = 0; sign <= 0x8000; sign += 0x8000) {
    for (uint32_t mag = 0; mag < 0x7FFF; ++mag) {
      const uint16_t a = static_cast<uint16_t>(sign | mag);
      const uint16_t b = static_cast<uint16_t>(sign | (mag + 1));
      const float fa = widen(a), fb = widen(b);
      if (std::isnan(fa) || std::isinf(fa)) continue;
      ASSERT_EQ(narrow(fa), a) << std::hex << a;
      if (std::isinf(fb)) continue;  // the overflow tests below cover the top
      const float mid = static_cast<float>((static_cast<double>(fa) + fb) / 2);
      ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(fa) + fb) / 2) << std::hex << a;
      const uint16_t even = (a & 1) == 0 ? a : b;
      ASSERT_EQ(narrow(mid), even) << "tie between " << std::hex << a << " and " << b;
      ASSERT_EQ(narrow(std::nextafter(mid, fa)), a) << std::hex << a;
      ASSERT_EQ(narrow(std::nextafter(mid, fb)), b) << std::hex << a;
    }
  }
}

TEST(HalfTest, Bf16RoundsToNearestEvenExhaustively) { CheckRounding(FloatToBf16, Bf16ToFloat); }

TEST(HalfTest, Fp16RoundsToNearestEvenExhaustively) { CheckRounding(FloatToFp16, Fp16ToFloat); }

TEST(HalfTest, Fp16WidensExactlyIncludingSubnormals) {
  EXPECT_EQ(Fp16ToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(Fp16ToFloat(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(Fp16ToFloat(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(Fp16ToFloat(0x3C00), 1.0f);
  EXPECT_EQ(Fp16ToFloat(0xC000), -2.0f);
  EXPECT_EQ(Fp16ToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(Fp16ToFloat(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::signbit(Fp16ToFloat(0x8000)));
  EXPECT_EQ(Bf16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(Bf16ToFloat(0xC040), -3.0f);
}

TEST(HalfTest, Fp16OverflowGoesToInfinityAndUnderflowToZero) {
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToFp16(65519.99f), 0x7BFF);  // below the midpoint to 65536
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7C00);   // the midpoint: ties to "even" Inf
  EXPECT_EQ(FloatToFp16(1e10f), 0x7C00);
  EXPECT_EQ(FloatToFp16(-1e10f), 0xFC00);
  EXPECT_EQ(FloatToFp16(std::numeric_limits<float>::max()), 0x7C00);
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and 2^-24
  EXPECT_EQ(FloatToFp16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(FloatToFp16(-1e-30f), 0x8000);
}

TEST(HalfTest, Bf16OverflowOnlyNearFloatMax) {
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to Inf
  EXPECT_EQ(FloatToBf16(3.0e38f), 0x7F62);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::denorm_min()), 0x0000);
}

TEST(HalfTest, InfinityAndNanSurvive) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(FloatToBf16(inf), 0x7F80);
  EXPECT_EQ(FloatToBf16(-inf), 0xFF80);
  EXPECT_EQ(FloatToFp16(inf), 0x7C00);
  EXPECT_EQ(FloatToFp16(-inf), 0xFC00);
  EXPECT_TRUE(IsNan16(FloatToBf16(nan), Bf16ToFloat));
  EXPECT_TRUE(IsNan16(FloatToFp16(nan), Fp16ToFloat));
  // A NaN whose payload sits only in the low 16 bits must not become Inf.
  uint32_t low_payload = 0x7F800001u;
  float snan;
  std::memcpy(&snan, &low_payload, sizeof snan);
  EXPECT_TRUE(IsNan16(FloatToBf16(snan), Bf16ToFloat));
  EXPECT_TRUE(IsNan16(FloatToFp16(snan), Fp16ToFloat));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(0x7FC0)));
  EXPECT_TRUE(std::isnan(Fp16ToFloat(0x7E00)));
}

TEST(HalfTest, ArrayFormsMatchTheScalarOnes) {
  std::vector<float> in;
  for (int i = -3000; i < 3000; ++i) in.push_back(std::ldexp(static_cast<float>(i), -7) / 3.0f);
  in.push_back(std::numeric_limits<float>::infinity());
  in.push_back(1e20f);
  std::vector<uint16_t> bf(in.size()), fp(in.size());
  FloatsToBf16(in.data(), in.size(), bf.data());
  FloatsToFp16(in.data(), in.size(), fp.data());
  std::vector<float> bf_back(in.size()), fp_back(in.size());
  Bf16sToFloats(bf.data(), bf.size(), bf_back.data());
  Fp16sToFloats(fp.data(), fp.size(), fp_back.data());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(bf[i], FloatToBf16(in[i])) << i;
    ASSERT_EQ(fp[i], FloatToFp16(in[i])) << i;
    ASSERT_EQ(bf_back[i], Bf16ToFloat(bf[i])) << i;
    ASSERT_EQ(fp_back[i], Fp16ToFloat(fp[i])) << i;
  }
}

}  // namespace
}  // namespace ps
