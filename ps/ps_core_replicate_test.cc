// Replication on the pod side, in process: a primary PsCore ships its records to a
// follower PsCore through an in-process sender. Rows are bit-identical after concurrent
// pushes (durable and in memory), a push is acknowledged only once the follower holds it,
// the de-duplication state travels with the records, a follower refuses a deposed
// primary, a follower dropped from the ack set no longer holds pushes back, and a
// primary whose write lease ran out takes no writes.
#include <map>
#include <thread>

#include "common/routing/hash.h"
#include "gtest/gtest.h"
#include "proto/packed.h"
#include "ps/ps_core.h"
#include "ps/replica_test_pods.h"

namespace ps {
namespace {

using replica_test::CreateTable;
using replica_test::kDim;
using replica_test::kVShards;
using replica_test::MakePush;
using replica_test::PendingPush;
using replica_test::Range;
using replica_test::Replicate;
using replica_test::Role;
using replica_test::Rows;
using replica_test::SpecOf;

// `a` leads every vshard, followed by `followers`.
Assignment Primary(uint64_t epoch, const std::vector<std::string>& followers,
                   bool ack_leader = false) {
  Assignment a = Role(epoch, "a", Range(0, kVShards), followers, {});
  a.mutable_replication()->set_ack_leader(ack_leader);
  return a;
}

// `pod` follows every vshard of `primary`.
Assignment Follower(uint64_t epoch, const std::string& pod, const std::string& primary) {
  return Role(epoch, pod, {}, {}, {{primary, Range(0, kVShards)}});
}

// A record for ReplicateRecords: rows `ids` of "emb", `dim` floats each, at step 1.
std::string Record(const std::vector<int64_t>& ids, uint32_t dim) {
  LogRecordBuilder builder(PushKey(), 64 + ids.size() * dim * sizeof(float));
  const std::vector<uint64_t> steps(ids.size(), 1);
  const std::vector<float> grads(ids.size() * dim, 1.0f);
  builder.AddTable("emb", 0.1f, dim, ids, steps, grads.data());
  return builder.Finish();
}

// The pair with `a` leading every vshard and `b` following them all, at epoch 2.
class ReplicateTest : public replica_test::ReplicaPairTest {
 protected:
  void SetUp() override {
    ReplicaPairTest::SetUp();
    if (HasFatalFailure()) return;
    ApplyAssignmentResponse resp;
    ASSERT_TRUE(b_->ApplyAssignment(Follower(2, "b", "a"), &resp).ok());
    ASSERT_TRUE(a_->ApplyAssignment(Primary(2, {"b"}), &resp).ok());
  }
};

TEST_P(ReplicateTest, FollowerRowsAreBitIdenticalAfterConcurrentPushes) {
  // Four writers push overlapping ids at once: each row's updates interleave across them.
  std::vector<std::thread> writers;
  for (uint64_t w = 1; w <= 4; ++w) {
    writers.emplace_back([this, w] {
      for (uint64_t seq = 1; seq <= 40; ++seq) {
        std::vector<int64_t> ids;
        for (int64_t i = 0; i < 24; ++i) ids.push_back((i * 7 + seq * w) % 50);
        PushResponse resp;
        ASSERT_TRUE(a_->Push(MakePush(ids, 0.01f * w, w, seq), &resp).ok());
      }
    });
  }
  for (auto& t : writers) t.join();
  const auto primary = Rows(*a_);
  ASSERT_EQ(primary.size(), 50u);
  EXPECT_EQ(Rows(*b_), primary);  // acknowledged, so already applied on the follower
  EXPECT_EQ(b_->replication_stats().records_applied, 160u);
}

// The order the primary applies and ships in: many rounds of writers pushing at once to
// the same few rows of an Adagrad and an Adam table (one request, both tables), whose
// updates do not commute. After each round (every push acknowledged, so held by the
// follower) both pods hold the same bytes for every row, steps included. Fails if two
// changes can reach the follower in another order than their steps on the primary.
TEST_P(ReplicateTest, SameRowsPushedConcurrentlyStayBitIdenticalRoundAfterRound) {
  for (PsCore* core : {a_.get(), b_.get()}) {
    ASSERT_TRUE(CreateTable(*core, SpecOf("ada", OptimizerSpec::ADAGRAD)).ok());
  }
  constexpr int kRounds = 8, kWriters = 4, kPushes = 25, kRows = 16;
  uint64_t seq = 1;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::thread> writers;
    for (uint64_t w = 1; w <= kWriters; ++w) {
      writers.emplace_back([&, w, first = seq] {
        for (uint64_t k = 0; k < kPushes; ++k) {
          // Every row in every push, in an order of its own, some twice.
          std::vector<int64_t> ids;
          for (int64_t i = 0; i < kRows + 4; ++i) ids.push_back((i * 5 + k + w) % kRows);
          PushRequest push = MakePush(ids, 0.01f * static_cast<float>(w + k % 3), w, first + k);
          *push.add_tables() = push.tables(0);
          push.mutable_tables(1)->set_table("ada");
          PushResponse resp;
          ASSERT_TRUE(a_->Push(push, &resp).ok());
        }
      });
    }
    for (auto& t : writers) t.join();
    seq += kPushes;
    for (const std::string table : {"emb", "ada"}) {
      const auto primary = Rows(*a_, table);
      ASSERT_EQ(primary.size(), static_cast<size_t>(kRows));
      ASSERT_EQ(Rows(*b_, table), primary) << table << " after round " << round;
    }
  }
  EXPECT_EQ(b_->replication_stats().records_applied,
            static_cast<uint64_t>(kRounds * kWriters * kPushes));
}

// A follower refuses (and applies nothing of) a record whose rows have another shape than
// its table's: it would read them at the table's stride, past the record's end.
TEST_P(ReplicateTest, FollowerRefusesARecordOfTheWrongShape) {
  const absl::Status s = Replicate(*b_, 2, "a", {Record({1, 2}, kDim - 1)});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(Rows(*b_).empty());
}

// Issue 17: deletions (the logged DELETE change) and admission decisions reach the
// follower through the same records: rows, including a deleted row that came back from
// its initial value, stay bit-identical, and so do the admission counters.
TEST_P(ReplicateTest, FollowerFollowsDeletionsAndAdmission) {
  TableSpec adm = SpecOf("adm", OptimizerSpec::ADAGRAD);
  adm.mutable_admission()->set_min_count(2);
  for (PsCore* core : {a_.get(), b_.get()}) ASSERT_TRUE(CreateTable(*core, adm).ok());
  uint64_t seq = 1;
  PushResponse resp;
  for (int k = 0; k < 3; ++k) {
    ASSERT_TRUE(a_->Push(MakePush({1, 2, 3, 4, 5}, 0.5f, 3, seq++), &resp).ok());
  }
  uint64_t deleted = 0;
  ASSERT_TRUE(a_->DeleteRows("emb", {2, 4, 77}, &deleted).ok());
  EXPECT_EQ(deleted, 2u);
  ASSERT_TRUE(a_->Push(MakePush({2}, 0.25f, 3, seq++), &resp).ok());  // back at step 1
  for (int64_t first : {10, 10, 20}) {
    PushRequest push = MakePush({first, first + 1}, 0.5f, 3, seq++);
    push.mutable_tables(0)->set_table("adm");
    ASSERT_TRUE(a_->Push(push, &resp).ok());
  }
  const auto primary = Rows(*a_);
  ASSERT_EQ(primary.size(), 4u);
  EXPECT_EQ(Rows(*b_), primary);
  auto adm_rows = [](PsCore& core) {
    std::map<int64_t, uint64_t> rows;
    core.store().FindTable("adm")->ForEachRow([&](const RowView& r) { rows[r.id] = r.step; });
    return rows;
  };
  EXPECT_EQ(adm_rows(*a_), (std::map<int64_t, uint64_t>{{10, 1}, {11, 1}}));
  EXPECT_EQ(adm_rows(*b_), adm_rows(*a_));
  EXPECT_EQ(b_->store().FindTable("adm")->admission()->Serialize(),
            a_->store().FindTable("adm")->admission()->Serialize());
  // The follower does not delete by itself: it owns nothing.
  EXPECT_EQ(b_->DeleteRows("emb", {1}).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_P(ReplicateTest, PushIsAcknowledgedOnlyOnceTheFollowerHoldsIt) {
  sender_->Close();
  const PushRequest push = MakePush({1, 2, 3}, 1.0f, 9, 1);
  PendingPush pending(*a_, push);
  // The sender keeps failing: the push waits, and a retry of its key is told to wait too.
  while (sender_->calls() < 3) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_FALSE(pending.done());
  PushResponse retry_resp;
  EXPECT_EQ(a_->Push(push, &retry_resp).code(), absl::StatusCode::kAborted);
  sender_->Open();
  const absl::Status result = pending.Wait();
  ASSERT_TRUE(result.ok()) << result;
  EXPECT_EQ(Rows(*b_), Rows(*a_));
  ASSERT_TRUE(a_->Push(push, &retry_resp).ok());
  EXPECT_TRUE(retry_resp.duplicate());
}

TEST_P(ReplicateTest, AckLeaderDoesNotWaitForTheFollower) {
  ApplyAssignmentResponse ar;
  ASSERT_TRUE(a_->ApplyAssignment(Primary(3, {"b"}, /*ack_leader=*/true), &ar).ok());
  sender_->Close();
  PushResponse resp;
  ASSERT_TRUE(a_->Push(MakePush({1, 2}, 1.0f, 9, 1), &resp).ok());
  sender_->Open();
}

TEST_P(ReplicateTest, DeDuplicationTravelsToTheFollower) {
  const PushRequest push = MakePush({4, 5, 6}, 0.5f, 11, 1);
  PushResponse resp;
  ASSERT_TRUE(a_->Push(push, &resp).ok());
  const auto before = Rows(*b_);
  // The follower becomes the primary (a failover); the client retries the same key there.
  ApplyAssignmentResponse ar;
  ASSERT_TRUE(b_->ApplyAssignment(Role(5, "b", Range(0, kVShards), {}, {}), &ar).ok());
  b_->RenewWriteLease(absl::Now() + absl::Hours(1));
  PushResponse retry;
  ASSERT_TRUE(b_->Push(push, &retry).ok());
  EXPECT_TRUE(retry.duplicate());
  EXPECT_EQ(Rows(*b_), before);
}

TEST_P(ReplicateTest, FollowerRefusesADeposedPrimary) {
  // b now follows c at epoch 5: a's records are refused, whatever epoch a names.
  ApplyAssignmentResponse ar;
  ASSERT_TRUE(b_->ApplyAssignment(Follower(5, "b", "c"), &ar).ok());
  const std::string record = Record({1}, kDim);
  for (uint64_t epoch : {4, 6}) {
    const absl::Status s = Replicate(*b_, epoch, "a", {record});
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << epoch << ": " << s;
  }
  EXPECT_TRUE(Rows(*b_).empty());
  // From c at the new epoch, the same record applies.
  const absl::Status s = Replicate(*b_, 5, "c", {record});
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(Rows(*b_).size(), 1u);
}

TEST_P(ReplicateTest, FollowerDroppedFromTheAckSetReleasesWaitingPushes) {
  sender_->Close();
  PendingPush pending(*a_, MakePush({1}, 1.0f, 9, 1));
  while (sender_->calls() < 2) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_FALSE(pending.done());
  ApplyAssignmentResponse ar;
  ASSERT_TRUE(a_->ApplyAssignment(Primary(3, {}), &ar).ok());  // the master dropped b
  const absl::Status result = pending.Wait();
  EXPECT_TRUE(result.ok()) << result;
}

TEST_P(ReplicateTest, DeposedPrimaryFailsWaitingPushes) {
  sender_->Close();
  PendingPush pending(*a_, MakePush({1}, 1.0f, 9, 1));
  while (sender_->calls() < 2) absl::SleepFor(absl::Milliseconds(1));
  ApplyAssignmentResponse ar;
  ASSERT_TRUE(a_->ApplyAssignment(Follower(4, "a", "b"), &ar).ok());  // b was promoted
  const absl::Status result = pending.Wait();
  EXPECT_EQ(result.code(), absl::StatusCode::kUnavailable) << result;
}

TEST_P(ReplicateTest, PrimaryWithoutALeaseTakesNoWrites) {
  a_->RenewWriteLease(absl::Now() - absl::Seconds(1));
  PushResponse resp;
  EXPECT_EQ(a_->Push(MakePush({1}, 1.0f, 9, 1), &resp).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Rows(*a_).empty());
  EXPECT_TRUE(Rows(*b_).empty());
  a_->RenewWriteLease(absl::Now() + absl::Hours(1));
  EXPECT_TRUE(a_->Push(MakePush({1}, 1.0f, 9, 1), &resp).ok());
}

// Issue 16 / 17: a read-only pull may be served by a follower of the ids' vshards (the
// rows it holds are the primary's), a pull that could create rows may not, nor a read-only
// pull of a vshard the pod neither owns nor follows.
TEST_P(ReplicateTest, FollowerServesReadOnlyPullsOfWhatItFollows) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 30; ++i) ids.push_back(i * 13);
  PushResponse presp;
  ASSERT_TRUE(a_->Push(MakePush(ids, 0.5f, 3, 1), &presp).ok());
  PullRequest pull;
  TableIds* t = pull.add_tables();
  t->set_table("emb");
  t->set_ids(Pack<int64_t>(ids));
  pull.set_read_only(true);
  PullResponse from_primary, from_follower;
  ASSERT_TRUE(a_->Pull(pull, &from_primary).ok());
  ASSERT_TRUE(b_->Pull(pull, &from_follower).ok());
  EXPECT_EQ(from_follower.tables(0).values(), from_primary.tables(0).values());
  pull.set_value_type(BFLOAT16);  // compact pulls too
  from_follower.Clear();
  ASSERT_TRUE(b_->Pull(pull, &from_follower).ok());
  EXPECT_EQ(from_follower.tables(0).values().size(), from_primary.tables(0).values().size() / 2);

  pull.set_read_only(false);  // a training pull creates rows: the primary's alone
  EXPECT_EQ(b_->Pull(pull, &from_follower).code(), absl::StatusCode::kFailedPrecondition);

  // b now follows only vshards 0..7: a read-only pull of an id elsewhere is refused.
  Assignment half = Follower(3, "b", "a");
  half.mutable_replication()->mutable_following(0)->clear_vshards();
  for (uint32_t v = 0; v < kVShards / 2; ++v) {
    half.mutable_replication()->mutable_following(0)->add_vshards(v);
  }
  ApplyAssignmentResponse ar;
  ASSERT_TRUE(b_->ApplyAssignment(half, &ar).ok());
  pull.set_read_only(true);
  std::vector<int64_t> inside, outside;
  const uint64_t h = b_->store().FindTable("emb")->name_hash();
  for (int64_t id : ids) {
    (VShardOf(RouteHash(h, id), kVShards) < kVShards / 2 ? inside : outside).push_back(id);
  }
  ASSERT_FALSE(inside.empty());
  ASSERT_FALSE(outside.empty());
  t->set_ids(Pack<int64_t>(inside));
  EXPECT_TRUE(b_->Pull(pull, &from_follower).ok());
  t->set_ids(Pack<int64_t>(outside));
  EXPECT_EQ(b_->Pull(pull, &from_follower).code(), absl::StatusCode::kFailedPrecondition);
}

INSTANTIATE_TEST_SUITE_P(DurableAndInMemory, ReplicateTest, testing::Bool(),
                         replica_test::DurableOrInMemory);

}  // namespace
}  // namespace ps
