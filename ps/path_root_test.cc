#include "ps/path_root.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

namespace ps {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class PathRootTest : public testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/path_root_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    tmp_ = fs::canonical(tmpl).string();
    root_ = tmp_ + "/exports";
  }
  void TearDown() override { fs::remove_all(tmp_); }

  absl::StatusCode Code(const std::string& requested) const {
    return PathRoot(root_, "--export_root").Resolve(requested).status().code();
  }

  std::string tmp_, root_;
};

TEST_F(PathRootTest, RelativeAndAbsolutePathsUnderTheRootResolveThere) {
  PathRoot root(root_, "--export_root");
  EXPECT_EQ(*root.Resolve("e1"), root_ + "/e1");
  EXPECT_EQ(*root.Resolve("a/b/./c/"), root_ + "/a/b/c");
  EXPECT_EQ(*root.Resolve(root_ + "/e2"), root_ + "/e2");
  EXPECT_EQ(*root.Resolve(root_ + "//x/"), root_ + "/x");
  EXPECT_TRUE(fs::is_directory(root_));  // created on first use
}

TEST_F(PathRootTest, PathsOutsideTheRootAreRefused) {
  EXPECT_EQ(Code("/etc/ps"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(tmp_ + "/exportsX/e"), absl::StatusCode::kInvalidArgument);  // a prefix only
  EXPECT_EQ(Code(tmp_), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code("../data"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code("a/../../data"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(root_ + "/a/../b"), absl::StatusCode::kInvalidArgument);  // no '..' at all
  EXPECT_EQ(Code(""), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(root_), absl::StatusCode::kInvalidArgument);  // the root itself
  EXPECT_EQ(Code("."), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(std::string("a\0b", 3)), absl::StatusCode::kInvalidArgument);
  auto s = PathRoot(root_, "--export_root").Resolve("/var/tmp/x");
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("--export_root"));
}

TEST_F(PathRootTest, SymbolicLinksOutOfTheRootAreRefused) {
  fs::create_directories(root_);
  fs::create_directories(tmp_ + "/data");
  fs::create_symlink(tmp_ + "/data", root_ + "/escape");
  fs::create_symlink(tmp_ + "/nowhere", root_ + "/dangling");
  fs::create_directories(root_ + "/real");
  fs::create_symlink(root_ + "/real", root_ + "/inside");
  EXPECT_EQ(Code("escape"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code("escape/ckpt"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(root_ + "/escape/x"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code("dangling"), absl::StatusCode::kInvalidArgument);
  // A link that stays inside is followed.
  EXPECT_EQ(*PathRoot(root_, "--export_root").Resolve("inside/e"), root_ + "/real/e");
}

TEST_F(PathRootTest, ARootThatIsALinkIsResolvedToo) {
  fs::create_directories(tmp_ + "/volume/exports");
  fs::create_symlink(tmp_ + "/volume/exports", tmp_ + "/link");
  PathRoot root(tmp_ + "/link", "--export_root");
  EXPECT_EQ(*root.Resolve("e"), tmp_ + "/volume/exports/e");
  EXPECT_EQ(*root.Resolve(tmp_ + "/link/e"), tmp_ + "/volume/exports/e");
  EXPECT_EQ(*root.Resolve(tmp_ + "/volume/exports/e"), tmp_ + "/volume/exports/e");
}

TEST(PathRootNoRootTest, EveryPathIsRefusedWithoutARoot) {
  auto s = PathRoot("", "--checkpoint_root").Resolve("/tmp/x");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("--checkpoint_root"));
}

}  // namespace
}  // namespace ps
