// The pod's Prometheus series (ps_metrics.cc), rendered from in-process pods
// (replica_test_pods.h): the sole-copy acknowledgements. A durable pod in periodic mode
// whose timed fsync never comes within the test (an hour) leads every vshard with an empty
// ack set, so each push it acknowledges waited for an fsync of its log (ps/synced_acks.h).
#include "ps/ps_metrics.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ps/replica_test_pods.h"

namespace ps {
namespace {

using replica_test::kVShards;
using replica_test::Range;

class PsMetricsTest : public replica_test::ReplicaPairFixture {
 protected:
  replica_test::ReplicaPairOptions Options() override {
    replica_test::ReplicaPairOptions options;
    options.durable = true;
    replica_test::SetPeriodicUntimed(&options.pod);
    return options;
  }
  // The value of the sample line that starts with `name` + " " (-1 if there is none).
  double Sample(const std::string& name) {
    const std::string text = "\n" + registry_.Render();
    const size_t at = text.find("\n" + name + " ");
    if (at == std::string::npos) return -1;
    return std::stod(text.substr(at + name.size() + 2));
  }

  MetricsRegistry registry_;
};

TEST_F(PsMetricsTest, SoleCopyAcknowledgementsAreExported) {
  AddPsCoreMetrics(a_.get(), &registry_);
  EXPECT_EQ(Sample("ps_sole_copy_vshards"), 0);
  EXPECT_EQ(Sample("ps_sole_copy_synced_acks_total"), 0);
  // `a` leads every vshard, each the only copy (no follower in its ack set).
  Assignment role = replica_test::Role(1, "a", Range(0, kVShards), {}, {});
  for (uint32_t v = 0; v < kVShards; ++v) role.mutable_replication()->add_sole_copy(v);
  Apply(*a_, role);
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    PushResponse resp;
    ASSERT_TRUE(a_->Push(replica_test::MakePush({1, 2}, 0.5f, 7, seq), &resp).ok());
  }
  EXPECT_EQ(Sample("ps_sole_copy_vshards"), kVShards) << registry_.Render();
  EXPECT_EQ(Sample("ps_sole_copy_synced_acks_total"), 3);
  // One fsync a push at most (each waited for its own answer): grouped, never more.
  EXPECT_GE(Sample("ps_sole_copy_syncs_total"), 1);
  EXPECT_LE(Sample("ps_sole_copy_syncs_total"), 3);
  // The times are real (not asserted on): exported, and never negative.
  EXPECT_GE(Sample("ps_sole_copy_sync_seconds_total"), 0);
  EXPECT_GE(Sample("ps_sole_copy_ack_wait_seconds_total"), 0);
}

}  // namespace
}  // namespace ps
