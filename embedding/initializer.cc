#include "embedding/initializer.h"

#include <cmath>

#include "common/routing/hash.h"

namespace ps {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

// Uniform in (0, 1], 53 bits, from counter `c` of the stream `row_seed`.
double Uniform01(uint64_t row_seed, uint64_t c) {
  uint64_t bits = Mix64(row_seed + (c + 1) * kGolden);
  return (static_cast<double>(bits >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

// Standard normal via Box-Muller from counters 2c and 2c+1.
double StdNormal(uint64_t row_seed, uint64_t c) {
  double u1 = Uniform01(row_seed, 2 * c);
  double u2 = Uniform01(row_seed, 2 * c + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace

Initializer::Initializer(const InitializerSpec& spec)
    : kind_(spec.kind()), a_(0), b_(0), seed_(spec.seed()) {
  switch (kind_) {
    case InitializerSpec::CONSTANT:
      a_ = spec.value();
      break;
    case InitializerSpec::UNIFORM:
      a_ = spec.low();
      b_ = spec.high();
      break;
    case InitializerSpec::NORMAL:
    case InitializerSpec::TRUNCATED_NORMAL:
      a_ = spec.mean();
      b_ = spec.stddev();
      break;
    default:
      break;
  }
}

void Initializer::Fill(uint64_t name_hash, int64_t id, float* out, size_t n) const {
  const uint64_t row_seed = Mix64(name_hash ^ Mix64(static_cast<uint64_t>(id) ^ Mix64(seed_)));
  switch (kind_) {
    case InitializerSpec::ZEROS:
      for (size_t j = 0; j < n; ++j) out[j] = 0.0f;
      break;
    case InitializerSpec::CONSTANT:
      for (size_t j = 0; j < n; ++j) out[j] = a_;
      break;
    case InitializerSpec::UNIFORM:
      for (size_t j = 0; j < n; ++j) {
        // Uniform01 is in (0, 1]; 1 - u is in [0, 1), so the value is in [low, high).
        float v = static_cast<float>(a_ + (b_ - a_) * (1.0 - Uniform01(row_seed, j)));
        out[j] = v < b_ ? v : a_;  // float rounding could reach `high`
      }
      break;
    case InitializerSpec::NORMAL:
      for (size_t j = 0; j < n; ++j) {
        out[j] = static_cast<float>(a_ + b_ * StdNormal(row_seed, j));
      }
      break;
    case InitializerSpec::TRUNCATED_NORMAL:
      for (size_t j = 0; j < n; ++j) {
        // Redraw from further counters of the same element until within 2 stddev; each try
        // succeeds with p = 0.954, so 64 tries fail with p < 1e-85 (then: the mean).
        double z = 0.0;
        for (uint64_t attempt = 0; attempt < 64; ++attempt) {
          double candidate = StdNormal(row_seed, (attempt << 32) | j);
          if (std::fabs(candidate) <= 2.0) {
            z = candidate;
            break;
          }
        }
        out[j] = static_cast<float>(a_ + b_ * z);
      }
      break;
    default:
      for (size_t j = 0; j < n; ++j) out[j] = 0.0f;
  }
}

}  // namespace ps
