#include "client/finite_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace ps::internal {
namespace {

TEST(CheckFinite, AcceptsFiniteValuesIncludingExtremes) {
  std::vector<float> g = {0.f, -0.f, 1e-45f, -3.4e38f, 3.4e38f, 1.f};
  EXPECT_TRUE(CheckFinite("push", g.data(), 3, 2).ok());
  EXPECT_TRUE(CheckFinite("push", nullptr, 0, 8).ok());
}

TEST(CheckFinite, NamesTheFirstBadValueByIdAndElement) {
  // Several blocks, the bad values in the second one.
  const uint32_t dim = 64;
  std::vector<float> g(40 * dim, 0.5f);
  std::vector<int64_t> ids(40);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = 1000 + static_cast<int64_t>(i);
  g[21 * dim + 5] = std::numeric_limits<float>::infinity();
  g[30 * dim + 1] = std::nanf("");
  absl::Status s = CheckFinite("push to 't'", g.data(), 40, dim, ids);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("push to 't' has a non-finite gradient (inf) for id 1021 element 5"),
            absl::string_view::npos)
      << s.message();
}

TEST(CheckFinite, WithoutIdsNamesTheRow) {
  std::vector<float> g = {1.f, 2.f, -std::numeric_limits<float>::infinity()};
  absl::Status s = CheckFinite("dense push to 'w'", g.data(), 3, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("for row 2 element 0"), absl::string_view::npos) << s.message();
}

}  // namespace
}  // namespace ps::internal
