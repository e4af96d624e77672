#include "master/master_store.h"

#include <stdlib.h>

#include <filesystem>

#include "gtest/gtest.h"
#include "proto/master_state.pb.h"

namespace ps {
namespace {

std::string MakeTempDir() {
  std::string templ = std::filesystem::temp_directory_path() / "master_store_test.XXXXXX";
  return mkdtemp(templ.data()) != nullptr ? templ : "";
}

TEST(MasterStoreTest, BatchesSurviveReopenAndScanHonoursPrefix) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  {
    auto store = MasterStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    PodRecord a, b;
    a.set_pod_id("ps-0");
    b.set_pod_id("ps-1");
    StoreBatch batch;
    batch.Put("pod/ps-0", a);
    batch.Put("pod/ps-1", b);
    batch.Put("podx", a);
    batch.Put("gone", a);
    batch.Delete("gone");
    ASSERT_TRUE((*store)->Write(batch).ok());
    // A second open of the same directory is refused while the first holds it.
    EXPECT_FALSE(MasterStore::Open(dir).ok());
  }
  auto store = MasterStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<std::string> ids;
  ASSERT_TRUE((*store)
                  ->Scan("pod/",
                         [&](absl::string_view, absl::string_view value) {
                           PodRecord r;
                           EXPECT_TRUE(r.ParseFromArray(value.data(), value.size()));
                           ids.push_back(r.pod_id());
                           return absl::OkStatus();
                         })
                  .ok());
  EXPECT_EQ(ids, (std::vector<std::string>{"ps-0", "ps-1"}));
  auto gone = (*store)->Get("gone");
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->has_value());
  std::filesystem::remove_all(dir);
}

TEST(MasterStoreTest, EmptyDirIsInvalid) {
  EXPECT_EQ(MasterStore::Open("").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps
