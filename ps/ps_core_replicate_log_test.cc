// What a follower writes to its own log (ps_core_replicate.cc, ApplyReplicated). A record
// it keeps whole is logged as the primary encoded it (LogRecordBuilder::Adopt), byte for
// byte, and replays after a restart into the rows the primary holds; a record with rows of
// vshards it does not follow is logged with the kept rows only; a batch with a malformed
// record is refused whole and nothing of it reaches the log. Durable pods whose logs are
// never truncated (no materialization round, none at close), so a restart reads back
// every record.
#include <map>
#include <string>
#include <vector>

#include "common/routing/hash.h"
#include "gtest/gtest.h"
#include "ps/ps_core.h"
#include "ps/replica_test_pods.h"

namespace ps {
namespace {

using replica_test::kDim;
using replica_test::kVShards;
using replica_test::MakePush;
using replica_test::Range;
using replica_test::Replicate;
using replica_test::Role;
using replica_test::Rows;

// Every record `core`'s log recovered at its start, in log order.
std::vector<std::string> RecoveredRecords(PsCore& core) {
  std::vector<std::string> out;
  EXPECT_TRUE(core.storage()
                  ->ForEachRecoveredRecord([&](absl::string_view bytes) {
                    out.emplace_back(bytes);
                    return absl::OkStatus();
                  })
                  .ok());
  return out;
}

// A record of rows `ids` of "emb" at step 1, under key (9, 1, seq).
std::string Record(const std::vector<int64_t>& ids, uint64_t seq) {
  PushKey key;
  key.set_worker_id(9);
  key.set_incarnation(1);
  key.set_sequence(seq);
  LogRecordBuilder builder(key, 0);
  const std::vector<uint64_t> steps(ids.size(), 1);
  std::vector<float> grads(ids.size() * kDim);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.01f * static_cast<float>(i % 13);
  builder.AddTable("emb", 0.1f, kDim, ids, steps, grads.data());
  return builder.Finish();
}

uint32_t VShardOfEmb(int64_t id) { return VShardOf(RouteHash(NameHash("emb"), id), kVShards); }

class ReplicateLogTest : public replica_test::ReplicaPairFixture {
 protected:
  replica_test::ReplicaPairOptions Options() override {
    replica_test::ReplicaPairOptions options;
    options.durable = true;
    options.pod.storage.materialize_ms = 3600 * 1000;  // no round: the log stays whole
    options.pod.storage.materialize_on_close = false;  // nor at close
    options.pod.eviction_interval_ms = 0;
    return options;
  }

  void Apply(PsCore& core, const Assignment& a) {
    ApplyAssignmentResponse resp;
    ASSERT_TRUE(core.ApplyAssignment(a, &resp).ok());
  }
};

TEST_F(ReplicateLogTest, FollowerLogsThePrimarysRecordsAsTheyCameAndReplaysThem) {
  Apply(*b_, Role(2, "b", {}, {}, {{"a", Range(0, kVShards)}}));
  Apply(*a_, Role(2, "a", Range(0, kVShards), {"b"}, {}));
  for (uint64_t seq = 1; seq <= 30; ++seq) {
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < 40; ++i) ids.push_back((i * 3 + static_cast<int64_t>(seq)) % 64);
    PushResponse resp;
    ASSERT_TRUE(
        a_->Push(MakePush(ids, 0.1f * static_cast<float>(seq % 5 + 1), 4, seq), &resp).ok());
  }
  const auto rows = Rows(*a_);
  ASSERT_EQ(rows.size(), 64u);
  ASSERT_EQ(Rows(*b_), rows);  // acknowledged: the follower holds every push
  Stop("b");
  Stop("a");
  Restart("a");
  Restart("b");
  const std::vector<std::string> primary = RecoveredRecords(*a_);
  ASSERT_EQ(primary.size(), 30u);
  EXPECT_EQ(RecoveredRecords(*b_), primary);  // byte for byte, in the same order
  // Each pod replayed its own log: the same rows as before, bit for bit.
  EXPECT_EQ(Rows(*a_), rows);
  EXPECT_EQ(Rows(*b_), rows);
}

TEST_F(ReplicateLogTest, RecordWithRowsLeftOutIsLoggedWithTheKeptRowsOnly) {
  // `b` follows half of a's vshards; a's records may carry rows of the others.
  std::vector<uint32_t> followed;
  for (uint32_t v = 0; v < kVShards; v += 2) followed.push_back(v);
  Apply(*b_, Role(2, "b", {}, {}, {{"a", followed}}));
  std::vector<int64_t> ids, kept;
  for (int64_t id = 0; id < 64; ++id) {
    ids.push_back(id);
    if (VShardOfEmb(id) % 2 == 0) kept.push_back(id);
  }
  ASSERT_GT(kept.size(), 0u);
  ASSERT_LT(kept.size(), ids.size());
  const std::string whole = Record(kept, 1), mixed = Record(ids, 2);
  ASSERT_TRUE(Replicate(*b_, 2, "a", {whole, mixed}).ok());
  EXPECT_EQ(b_->replication_stats().rows_left_out, ids.size() - kept.size());
  const auto rows = Rows(*b_);
  ASSERT_EQ(rows.size(), kept.size());
  Stop("b");
  Restart("b");
  const std::vector<std::string> logged = RecoveredRecords(*b_);
  ASSERT_EQ(logged.size(), 2u);
  EXPECT_EQ(logged[0], whole);  // kept whole: as it came
  absl::StatusOr<LogRecord> second = DecodeLogRecord(logged[1]);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->key.sequence(), 2u);
  ASSERT_EQ(second->tables.size(), 1u);
  EXPECT_EQ(second->tables[0].ids, kept);  // only the rows this pod follows
  EXPECT_EQ(Rows(*b_), rows);
}

TEST_F(ReplicateLogTest, BatchWithAMalformedRecordIsRefusedAndNothingIsLogged) {
  Apply(*b_, Role(2, "b", {}, {}, {{"a", Range(0, kVShards)}}));
  const std::string good = Record({1, 2, 3}, 1);
  const std::string truncated = Record({4, 5, 6}, 2).substr(0, good.size() - 5);
  std::string bad_tag = Record({7}, 3);
  bad_tag[LogRecordBuilder::kHeaderBytes] = 99;  // no such entry kind
  for (const std::string& bad : {truncated, bad_tag}) {
    const absl::Status s = Replicate(*b_, 2, "a", {good, bad});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_FALSE(s.message().empty());
  }
  EXPECT_TRUE(Rows(*b_).empty());
  EXPECT_EQ(b_->storage()->log_stats().records, 0u);
  // The same good record alone is applied and logged.
  ASSERT_TRUE(Replicate(*b_, 2, "a", {good}).ok());
  EXPECT_EQ(Rows(*b_).size(), 3u);
  Stop("b");
  Restart("b");
  EXPECT_EQ(RecoveredRecords(*b_), std::vector<std::string>{good});
}

}  // namespace
}  // namespace ps
