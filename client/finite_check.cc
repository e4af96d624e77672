#include "client/finite_check.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ps::internal {
namespace {

// A float is not finite when its exponent bits are all ones.
constexpr uint32_t kExponent = 0x7f800000u;

bool Finite(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return (bits & kExponent) != kExponent;
}

}  // namespace

absl::Status CheckFinite(absl::string_view what, const float* grads, size_t rows, uint32_t dim,
                         absl::Span<const int64_t> ids) {
  const size_t n = rows * dim;
  // Branch-free over blocks (the compiler vectorizes it); the first bad value is searched
  // only in a block that has one.
  constexpr size_t kBlock = 1024;
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t end = std::min(n, start + kBlock);
    uint32_t all_ones = 0;
    for (size_t i = start; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, grads + i, sizeof(bits));
      all_ones |= static_cast<uint32_t>((bits & kExponent) == kExponent);
    }
    if (all_ones == 0) continue;
    for (size_t i = start; i < end; ++i) {
      if (Finite(grads[i])) continue;
      const size_t row = i / dim;
      return absl::InvalidArgumentError(
          absl::StrCat(what, " has a non-finite gradient (", grads[i], ") for ",
                       ids.empty() ? absl::StrCat("row ", row) : absl::StrCat("id ", ids[row]),
                       " element ", i % dim, "; nothing was sent"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ps::internal
