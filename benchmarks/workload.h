// The ids a benchmark sends: batches drawn up front (uniform or Zipf over [0, rows)), so
// that drawing ids is never inside the timed loop and every target sees the same stream.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ps {

struct Workload {
  std::vector<std::vector<int64_t>> batches;
};

// dist: "uniform" or "zipf:S" (S > 0, rank r drawn with probability ~ 1/r^S). Ranks are
// scattered over the id space by a fixed permutation, so hot ids are not neighbours.
inline absl::StatusOr<Workload> MakeWorkload(const std::string& dist, uint64_t rows, size_t batch,
                                             size_t num_batches, uint64_t seed) {
  if (rows == 0 || batch == 0) return absl::InvalidArgumentError("rows and batch must be > 0");
  std::mt19937_64 rng(seed);
  Workload w;
  w.batches.assign(num_batches, std::vector<int64_t>(batch));
  auto scatter = [rows](uint64_t rank) {
    // An odd multiplier is a bijection mod 2^64; reduce into [0, rows) keeping it one-to-one
    // only when rows is a power of two, which is close enough for a load generator.
    return static_cast<int64_t>((rank * 0x9E3779B97F4A7C15ULL) % rows);
  };
  if (dist == "uniform") {
    std::uniform_int_distribution<uint64_t> u(0, rows - 1);
    for (auto& b : w.batches) {
      for (auto& id : b) id = static_cast<int64_t>(u(rng));
    }
    return w;
  }
  if (absl::StartsWith(dist, "zipf:")) {
    double s = 0;
    if (!absl::SimpleAtod(dist.substr(5), &s) || !(s > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad --dist '", dist, "': want zipf:S, S > 0"));
    }
    std::vector<double> cdf(rows);
    double total = 0;
    for (uint64_t r = 0; r < rows; ++r) cdf[r] = (total += 1.0 / std::pow(r + 1.0, s));
    std::uniform_real_distribution<double> u(0, total);
    for (auto& b : w.batches) {
      for (auto& id : b) {
        uint64_t rank = std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin();
        id = scatter(std::min(rank, rows - 1));
      }
    }
    return w;
  }
  return absl::InvalidArgumentError(absl::StrCat("bad --dist '", dist, "': uniform or zipf:S"));
}

}  // namespace ps
