// A follower filled by a copy, on the pod side, in process: the primary `a` leads every
// vshard, `b` follows half of them (its stream from `a` carries records of all), and the
// other half is copied into `b` with the move machinery (snapshot, catch-up, fenced final
// delta) while writers push to every vshard throughout. At the commit `a` starts shipping
// those vshards' rows to `b` before its fence lifts. After it, `b` holds rows
// bit-identical to `a`'s: nothing missed between the copy and the stream, nothing applied
// twice, no row of the copied half applied from the stream before the copy held it.

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <thread>

#include "common/base/status_macros.h"
#include "common/routing/hash.h"
#include "gtest/gtest.h"
#include "proto/packed.h"
#include "ps/ps_core.h"
#include "ps/replica_test_pods.h"

namespace ps {
namespace {

using replica_test::kDim;
using replica_test::kVShards;
using replica_test::MakePush;
using replica_test::Range;
using replica_test::Role;
using replica_test::Rows;

// `a` leads every vshard, followed by `b` (when `followed`), moving out `copying`.
Assignment Primary(uint64_t epoch, bool followed, const std::vector<uint32_t>& copying) {
  return Role(epoch, "a", Range(0, kVShards),
              followed ? std::vector<std::string>{"b"} : std::vector<std::string>{}, {}, {},
              copying);
}

// `b` follows `followed` from `a` and receives `copying`.
Assignment Follower(uint64_t epoch, const std::vector<uint32_t>& followed,
                    const std::vector<uint32_t>& copying) {
  return Role(epoch, "b", {}, {}, {{"a", followed}}, copying);
}

class FillTest : public replica_test::ReplicaPairTest {
 protected:
  void TearDown() override {
    StopWriters();
    ReplicaPairTest::TearDown();
  }

  // Writers push overlapping ids of every vshard until stopped, each push retried with its
  // key while refused as retryable (the fence: "moving; retry").
  using PushFn = std::function<absl::Status(const PushRequest&, PushResponse*)>;
  void StartWriters(PushFn push = nullptr) {
    if (push == nullptr) {
      push = [this](const PushRequest& req, PushResponse* resp) { return a_->Push(req, resp); };
    }
    for (uint64_t w = 1; w <= 3; ++w) {
      writers_.emplace_back([this, w, push] {
        for (uint64_t seq = 1; !stop_.load(); ++seq) {
          std::vector<int64_t> ids;
          for (int64_t i = 0; i < 16; ++i) ids.push_back((i * 13 + seq * w) % 120);
          const PushRequest req = MakePush(ids, 0.01f * w, w, seq);
          for (;;) {
            PushResponse resp;
            const absl::Status s = push(req, &resp);
            if (s.ok()) break;
            ASSERT_TRUE(absl::IsUnavailable(s) || absl::IsAborted(s)) << s;
            absl::SleepFor(absl::Milliseconds(1));
          }
          acked_.fetch_add(1);
        }
      });
    }
  }
  void StopWriters() {
    stop_.store(true);
    for (auto& t : writers_) t.join();
    writers_.clear();
  }
  void FillAndCompare(const std::vector<uint32_t>& followed);
  void WaitForPushes(uint64_t n) {
    const uint64_t target = acked_.load() + n;
    while (acked_.load() < target) absl::SleepFor(absl::Milliseconds(1));
  }
  // Every export chunk of a phase from `a`, a few rows each, imported into `b`.
  void Copy(uint64_t move, MigrateExportRequest::Phase phase) {
    ASSERT_TRUE(replica_test::CopyPhase(*a_, *b_, move, phase, /*max_bytes=*/512).ok());
  }

  std::vector<std::thread> writers_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> acked_{0};
};

// b follows `followed` from a (a streams to b when not empty); the other vshards are
// copied into b while the writers push; then b must hold exactly a's rows.
void FillTest::FillAndCompare(const std::vector<uint32_t>& followed) {
  std::vector<uint32_t> copying;
  for (uint32_t v : Range(0, kVShards)) {
    if (std::find(followed.begin(), followed.end(), v) == followed.end()) copying.push_back(v);
  }
  const bool streaming = !followed.empty();
  ApplyAssignmentResponse ar;
  ASSERT_TRUE(b_->ApplyAssignment(Follower(2, followed, {}), &ar).ok());
  ASSERT_TRUE(a_->ApplyAssignment(Primary(2, streaming, {}), &ar).ok());
  StartWriters();
  WaitForPushes(20);
  if (streaming) {
    // The stream already carried rows of vshards b does not follow: left out, not refused.
    EXPECT_GT(b_->replication_stats().rows_left_out, 0u);
  }
  // The copy's record (epoch 3): b receives the rest, a sends them.
  ASSERT_TRUE(b_->ApplyAssignment(Follower(3, followed, copying), &ar).ok());
  ASSERT_TRUE(a_->ApplyAssignment(Primary(3, streaming, copying), &ar).ok());
  ASSERT_TRUE(replica_test::BeginMove(*a_, *b_, 1, copying).ok());
  Copy(1, MigrateExportRequest::SNAPSHOT);
  WaitForPushes(20);
  Copy(1, MigrateExportRequest::DELTA);
  Copy(1, MigrateExportRequest::FINAL);  // a is fenced from here to the commit
  ASSERT_TRUE(b_->FinishImport().ok());
  // The commit (epoch 4): b follows everything. a learns first, so its batches at epoch 4
  // may reach b while b is still at epoch 3: refused (retried), never left out. (The
  // pushes wait for b meanwhile, so no push count is awaited here.)
  ASSERT_TRUE(a_->ApplyAssignment(Primary(4, true, {}), &ar).ok());
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(b_->ApplyAssignment(Follower(4, Range(0, kVShards), {}), &ar).ok());
  WaitForPushes(30);
  StopWriters();
  // Every push was acknowledged once b held it: the rows are already identical.
  const auto primary = Rows(*a_);
  ASSERT_EQ(primary.size(), 120u);
  EXPECT_EQ(Rows(*b_), primary);
}

TEST_P(FillTest, AFollowerFilledByCopyAndItsStreamHoldsThePrimarysRows) {
  FillAndCompare(Range(0, 8));
}

TEST_P(FillTest, ANewFollowerFilledByCopyAndANewStreamHoldsThePrimarysRows) { FillAndCompare({}); }

TEST_P(FillTest, AnAbortedCopyLeavesTheFollowerItsOwnVShardsOnly) {
  const std::vector<uint32_t> followed = Range(0, 8), copying = Range(8, 16);
  ApplyAssignmentResponse ar;
  ASSERT_TRUE(b_->ApplyAssignment(Follower(2, followed, {}), &ar).ok());
  ASSERT_TRUE(a_->ApplyAssignment(Primary(2, true, {}), &ar).ok());
  StartWriters();
  ASSERT_TRUE(b_->ApplyAssignment(Follower(3, followed, copying), &ar).ok());
  ASSERT_TRUE(a_->ApplyAssignment(Primary(3, true, copying), &ar).ok());
  ASSERT_TRUE(replica_test::BeginMove(*a_, *b_, 1, copying).ok());
  Copy(1, MigrateExportRequest::SNAPSHOT);
  Copy(1, MigrateExportRequest::FINAL);
  // The master gives up (epoch 4): a unfences and keeps serving; b drops the copy.
  ASSERT_TRUE(a_->ApplyAssignment(Primary(4, true, {}), &ar).ok());
  ASSERT_TRUE(b_->ApplyAssignment(Follower(4, followed, {}), &ar).ok());
  WaitForPushes(20);
  StopWriters();
  const uint64_t name_hash = NameHash("emb");
  std::map<int64_t, std::string> expected;
  for (const auto& [id, row] : Rows(*a_)) {
    if (VShardOf(RouteHash(name_hash, id), kVShards) < 8) expected[id] = row;
  }
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(Rows(*b_), expected);
}

// R = 2: a leads everything, f follows it all; vshards 8-15 move to b (not a follower)
// while writers push. a's fence waits until f holds what a applied; from the commit b
// streams those vshards to f. f then holds exactly a's and b's rows.
TEST_P(FillTest, APrimaryMovedAtTwoCopiesKeepsItsFollowerExact) {
  auto f = Open("f");
  ASSERT_NE(f, nullptr);
  sender_->Add("f:1", f.get());
  ASSERT_TRUE(replica_test::CreateEmbTable(*f).ok());
  const std::vector<uint32_t> all = Range(0, kVShards), kept = Range(0, 8), moved = Range(8, 16);
  ApplyAssignmentResponse ar;
  ASSERT_TRUE(f->ApplyAssignment(Role(2, "f", {}, {}, {{"a", all}}), &ar).ok());
  ASSERT_TRUE(b_->ApplyAssignment(Role(2, "b", {}, {}, {}), &ar).ok());
  ASSERT_TRUE(a_->ApplyAssignment(Role(2, "a", all, {"f"}, {}), &ar).ok());
  // Each push is split by vshard: the kept part goes to a, the moved part (its own key) to
  // a, and once a refuses it as not its own, to b.
  PsCore* b = b_.get();
  std::atomic<PsCore*> owner_of_moved{a_.get()};
  // However the test ends: the writers stop, and a and b (which ship to f) close before f.
  struct AtExit {
    std::function<void()> fn;
    ~AtExit() { fn(); }
  } close_first{[this] {
    StopWriters();
    a_.reset();
    b_.reset();
  }};
  StartWriters([&, b](const PushRequest& req, PushResponse*) -> absl::Status {
    const TableGrads& t = req.tables(0);
    std::vector<int64_t> ids(t.ids().size() / sizeof(int64_t));
    std::memcpy(ids.data(), t.ids().data(), t.ids().size());
    std::vector<float> grads(t.grads().size() / sizeof(float));
    std::memcpy(grads.data(), t.grads().data(), t.grads().size());
    PushRequest part[2];
    for (int k = 0; k < 2; ++k) {
      part[k] = req;
      part[k].mutable_tables(0)->clear_ids();
      part[k].mutable_tables(0)->clear_grads();
      part[k].mutable_key()->set_worker_id(req.key().worker_id() + 100 * k);
    }
    std::vector<int64_t> part_ids[2];
    std::vector<float> part_grads[2];
    for (size_t i = 0; i < ids.size(); ++i) {
      const int k = VShardOf(RouteHash(NameHash("emb"), ids[i]), kVShards) >= 8 ? 1 : 0;
      part_ids[k].push_back(ids[i]);
      part_grads[k].insert(part_grads[k].end(), grads.begin() + i * kDim,
                           grads.begin() + (i + 1) * kDim);
    }
    for (int k = 0; k < 2; ++k) {
      if (part_ids[k].empty()) continue;
      part[k].mutable_tables(0)->set_ids(Pack<int64_t>(part_ids[k]));
      part[k].mutable_tables(0)->set_grads(Pack<float>(part_grads[k]));
      PushResponse resp;
      absl::Status s = (k == 0 ? a_.get() : owner_of_moved.load())->Push(part[k], &resp);
      if (k == 1 && absl::IsFailedPrecondition(s)) {
        owner_of_moved.store(b);
        s = b->Push(part[k], &resp);
      }
      RETURN_IF_ERROR(s);  // retried whole: a part already applied is a duplicate
    }
    return absl::OkStatus();
  });
  WaitForPushes(20);
  ASSERT_TRUE(b_->ApplyAssignment(Role(3, "b", {}, {}, {}, moved), &ar).ok());
  ASSERT_TRUE(a_->ApplyAssignment(Role(3, "a", all, {"f"}, {}, {}, moved), &ar).ok());
  ASSERT_TRUE(replica_test::BeginMove(*a_, *b_, 1, moved).ok());
  Copy(1, MigrateExportRequest::SNAPSHOT);
  WaitForPushes(20);
  Copy(1, MigrateExportRequest::FINAL);
  ASSERT_TRUE(b_->FinishImport().ok());
  // The commit (epoch 4), b first: its first records may reach f before f's assignment.
  ASSERT_TRUE(b_->ApplyAssignment(Role(4, "b", moved, {"f"}, {}), &ar).ok());
  ASSERT_TRUE(a_->ApplyAssignment(Role(4, "a", kept, {"f"}, {}), &ar).ok());
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(f->ApplyAssignment(Role(4, "f", {}, {}, {{"a", kept}, {"b", moved}}), &ar).ok());
  WaitForPushes(30);
  StopWriters();
  std::map<int64_t, std::string> expected = Rows(*a_);
  const auto on_b = Rows(*b_);
  ASSERT_FALSE(on_b.empty());
  for (const auto& [id, row] : on_b) EXPECT_TRUE(expected.emplace(id, row).second) << id;
  ASSERT_EQ(expected.size(), 120u);
  EXPECT_EQ(Rows(*f), expected);
  EXPECT_EQ(owner_of_moved.load(), b);
}

INSTANTIATE_TEST_SUITE_P(DurableAndInMemory, FillTest, testing::Bool(),
                         replica_test::DurableOrInMemory);

}  // namespace
}  // namespace ps
