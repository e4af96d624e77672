// The pipelined follower stream, end to end in one process: primary `a` leads every vshard,
// `b` follows all of them, batches go from a's Replicator to b's ReplicateRecords through a
// scripted sender that reorders, loses, fails or holds calls. Whatever the sender does, b
// ends with rows bit-identical to a's (steps included), every acknowledged push counted
// once, and a stalled follower holds at most the window in flight.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
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

// Delivers every batch to one follower core, as scripted. Thread-safe.
class ScriptedSender : public ReplicaSender {
 public:
  // The follower (null: every call fails UNAVAILABLE, as a pod that is down).
  // Returns once no call is inside the previous target's ReplicateRecords (its batches
  // still waiting there are answered when it is destroyed).
  void SetTarget(PsCore* core) {
    absl::MutexLock lock(&mu_);
    target_ = core;
    mu_.Await(absl::Condition(
        +[](int* n) { return *n == 0; }, &entering_));
  }
  // The next `n` calls wait until all `n` have arrived, then reach the follower newest
  // (highest record number) first.
  void HoldGroup(int n) {
    absl::MutexLock lock(&mu_);
    hold_ = n;
  }
  // While stalled, calls wait (the follower does not answer).
  void Stall(bool stalled) {
    absl::MutexLock lock(&mu_);
    stalled_ = stalled;
  }
  // Call k (from 1) fails without reaching the follower when k % drop == 0, and reaches it
  // but loses its answer when k % lose == 0 (0: never).
  void Fail(int drop, int lose) {
    absl::MutexLock lock(&mu_);
    drop_ = drop;
    lose_ = lose;
  }
  int max_in_flight() {
    absl::MutexLock lock(&mu_);
    return max_in_flight_;
  }
  int in_flight() {
    absl::MutexLock lock(&mu_);
    return in_flight_;
  }
  std::vector<uint64_t> delivered() {  // the batches' first record numbers, as delivered
    absl::MutexLock lock(&mu_);
    return delivered_;
  }

  absl::Status Send(const ReplicaPeer&, const ReplicateRecordsRequest& req,
                    ReplicateRecordsResponse* resp) override {
    PsCore* core;
    bool lose = false;
    {
      absl::MutexLock lock(&mu_);
      max_in_flight_ = std::max(max_in_flight_, ++in_flight_);
      const int call = ++calls_;
      mu_.Await(absl::Condition(
          +[](bool* stalled) { return !*stalled; }, &stalled_));
      if (hold_ > 0) {
        held_.insert(req.first());
        --hold_;
        auto my_turn = [this, &req]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return hold_ == 0 && *held_.rbegin() == req.first();
        };
        mu_.Await(absl::Condition(&my_turn));
      }
      core = target_;
      if (core == nullptr || (drop_ > 0 && call % drop_ == 0)) {
        held_.erase(req.first());
        --in_flight_;
        return absl::UnavailableError("dropped");
      }
      lose = lose_ > 0 && call % lose_ == 0;
      delivered_.push_back(req.first());
      ++entering_;
    }
    absl::Notification done;
    absl::Status result;
    // Returns once the batch ran, or once it is parked behind the ones before it.
    core->ReplicateRecords(req, resp, [&](absl::Status s) {
      result = s;
      done.Notify();
    });
    {
      absl::MutexLock lock(&mu_);
      held_.erase(req.first());  // the next of a held group goes
      --entering_;
    }
    done.WaitForNotification();
    absl::MutexLock lock(&mu_);
    --in_flight_;
    if (lose && result.ok()) return absl::UnavailableError("answer lost");
    return result;
  }

 private:
  absl::Mutex mu_;
  PsCore* target_ ABSL_GUARDED_BY(mu_) = nullptr;
  int hold_ ABSL_GUARDED_BY(mu_) = 0;
  std::multiset<uint64_t> held_ ABSL_GUARDED_BY(mu_);
  bool stalled_ ABSL_GUARDED_BY(mu_) = false;
  int drop_ ABSL_GUARDED_BY(mu_) = 0, lose_ ABSL_GUARDED_BY(mu_) = 0;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  int entering_ ABSL_GUARDED_BY(mu_) = 0;  // calls inside the target's ReplicateRecords
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0, max_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> delivered_ ABSL_GUARDED_BY(mu_);
};

constexpr int kWindow = 4;

// GetParam(): (durable, optimizer kind).
class WindowTest : public testing::TestWithParam<std::tuple<bool, OptimizerSpec::Kind>> {
 protected:
  void SetUp() override {
    std::string templ = std::filesystem::temp_directory_path() / "ps_window_test.XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    root_ = templ;
    sender_ = std::make_shared<ScriptedSender>();
    a_ = Open("a");
    b_ = Open("b");
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
    for (PsCore* core : {a_.get(), b_.get()}) ASSERT_TRUE(CreateTable(*core).ok());
    a_->RenewWriteLease(absl::Now() + absl::Hours(1));
    ASSERT_TRUE(Follow(*b_, 2).ok());
    ApplyAssignmentResponse ar;
    ASSERT_TRUE(a_->ApplyAssignment(Role(2, "a", Range(0, kVShards), {"b"}, {}), &ar).ok());
    sender_->SetTarget(b_.get());
  }
  void TearDown() override {
    sender_->Stall(false);
    a_.reset();
    b_.reset();
    std::filesystem::remove_all(root_);
  }

  std::unique_ptr<PsCore> Open(const std::string& name) {
    PsCoreOptions options;
    if (std::get<0>(GetParam())) options.storage.db.dir = root_ + "/" + name;
    options.replica_sender = sender_;
    options.replicator.window = kWindow;
    options.replicator.max_batch_bytes = 1;  // one record a batch: many batches in flight
    options.replicator.min_backoff = absl::Milliseconds(1);
    options.replicator.max_backoff = absl::Milliseconds(5);
    auto core = PsCore::Open(options, *ShardOwnership::Create(kVShards, 0, {}));
    EXPECT_TRUE(core.ok()) << core.status();
    return core.ok() ? *std::move(core) : nullptr;
  }
  absl::Status CreateTable(PsCore& core) {
    CreateTableRequest req;
    req.mutable_spec()->set_name("emb");
    req.mutable_spec()->set_dim(kDim);
    req.mutable_spec()->mutable_optimizer()->set_kind(std::get<1>(GetParam()));
    req.mutable_spec()->mutable_initializer()->set_kind(InitializerSpec::NORMAL);
    req.mutable_spec()->mutable_initializer()->set_stddev(0.1f);
    CreateTableResponse resp;
    absl::Status s = core.CreateTable(req, &resp);
    return s.ok() || absl::IsAlreadyExists(s) ? absl::OkStatus() : s;
  }
  static absl::Status Follow(PsCore& core, uint64_t epoch) {
    ApplyAssignmentResponse ar;
    return core.ApplyAssignment(Role(epoch, "b", {}, {}, {{"a", Range(0, kVShards)}}), &ar);
  }
  // Pushes until acknowledged (a retry keeps the key); counts each id's pushes.
  void PushAcked(const std::vector<int64_t>& ids, float g, uint64_t worker, uint64_t seq) {
    const PushRequest req = MakePush(ids, g, worker, seq);
    for (;;) {
      PushResponse resp;
      const absl::Status s = a_->Push(req, &resp);
      if (s.ok()) break;
      ASSERT_TRUE(absl::IsUnavailable(s) || absl::IsAborted(s)) << s;
      absl::SleepFor(absl::Milliseconds(1));
    }
    absl::MutexLock lock(&count_mu_);
    for (int64_t id : ids) ++pushes_of_[id];
  }
  // Every row of `a` has one step per acknowledged push of it (none lost, none doubled),
  // and b's rows are bit-identical to a's.
  void ExpectIdentical() {
    const auto rows_a = Rows(*a_);
    std::map<int64_t, uint64_t> steps;
    for (const auto& [id, bytes] : rows_a) {
      uint64_t step;
      std::memcpy(&step, bytes.data() + bytes.size() - sizeof(step), sizeof(step));
      steps[id] = step;
    }
    {
      absl::MutexLock lock(&count_mu_);
      EXPECT_EQ(steps, pushes_of_);
    }
    EXPECT_EQ(Rows(*b_), rows_a);
  }

  std::string root_;
  std::shared_ptr<ScriptedSender> sender_;
  std::unique_ptr<PsCore> a_, b_;
  absl::Mutex count_mu_;
  std::map<int64_t, uint64_t> pushes_of_ ABSL_GUARDED_BY(count_mu_);
};

TEST_P(WindowTest, BatchesDeliveredOutOfOrderApplyInOrder) {
  PushAcked({1, 2, 3}, 0.5f, 1, 1);  // opens the stream (its first batch goes alone)
  // A window of pushes to the same rows, each its own batch, reaching b newest first:
  // applied in arrival order, the older updates would be skipped as already in the rows.
  sender_->HoldGroup(kWindow);
  std::vector<PushResponse> resps(kWindow);
  std::vector<PushRequest> reqs;
  for (int i = 0; i < kWindow; ++i) reqs.push_back(MakePush({1, 2, 3}, 0.1f * (i + 1), 1, i + 2));
  std::atomic<int> acked{0};
  absl::Notification all;
  for (int i = 0; i < kWindow; ++i) {
    a_->PushAsync(reqs[i], &resps[i], [&](absl::Status s) {
      EXPECT_TRUE(s.ok()) << s;
      if (acked.fetch_add(1) + 1 == kWindow) all.Notify();
    });
  }
  all.WaitForNotification();
  {
    absl::MutexLock lock(&count_mu_);
    for (int64_t id : {1, 2, 3}) pushes_of_[id] += kWindow;
  }
  const std::vector<uint64_t> delivered = sender_->delivered();
  ASSERT_EQ(delivered.size(), 1u + kWindow);
  EXPECT_EQ(delivered, (std::vector<uint64_t>{0, 4, 3, 2, 1}));
  ExpectIdentical();
}

TEST_P(WindowTest, CallsFailingMidWindowAreResentAndAppliedOnce) {
  // Some calls never reach b, others reach it and lose their answer; the stream resends
  // from what b holds, and b replays what it already has idempotently.
  sender_->Fail(/*drop=*/5, /*lose=*/7);
  std::vector<std::thread> writers;
  for (uint64_t w = 1; w <= 3; ++w) {
    writers.emplace_back([this, w] {
      for (uint64_t seq = 1; seq <= 40; ++seq) {
        std::vector<int64_t> ids;
        for (int64_t i = 0; i < 8; ++i) ids.push_back((i * 13 + seq * w) % 50);
        std::sort(ids.begin(), ids.end());
        ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
        PushAcked(ids, 0.01f * w, w, seq);
      }
    });
  }
  for (auto& t : writers) t.join();
  ExpectIdentical();
}

TEST_P(WindowTest, AFollowerThatRestartsMidWindowEndsIdentical) {
  if (!std::get<0>(GetParam())) GTEST_SKIP() << "a restart keeps only a durable follower's rows";
  std::atomic<bool> stop{false};
  std::atomic<int> acked{0};
  std::vector<std::thread> writers;
  for (uint64_t w = 1; w <= 3; ++w) {
    writers.emplace_back([this, w, &stop, &acked] {
      for (uint64_t seq = 1; !stop.load(); ++seq) {
        std::vector<int64_t> ids;
        for (int64_t i = 0; i < 8; ++i) ids.push_back((i * 13 + seq * w) % 50);
        std::sort(ids.begin(), ids.end());
        ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
        PushAcked(ids, 0.01f * w, w, seq);
        acked.fetch_add(1);
      }
    });
  }
  auto wait_acked = [&](int n) {
    while (acked.load() < n) absl::SleepFor(absl::Milliseconds(1));
  };
  wait_acked(30);
  // b goes down with calls in flight and comes back, a new process on the same data: it
  // knows no stream, so a's next batches are refused until a resends with restart.
  sender_->SetTarget(nullptr);
  b_.reset();
  b_ = Open("b");
  ASSERT_NE(b_, nullptr);
  ASSERT_TRUE(CreateTable(*b_).ok());
  ASSERT_TRUE(Follow(*b_, 2).ok());
  sender_->SetTarget(b_.get());
  const int before = acked.load();
  wait_acked(before + 30);
  stop.store(true);
  for (auto& t : writers) t.join();
  ExpectIdentical();
}

TEST_P(WindowTest, AStalledFollowerHoldsTheWindowInFlightAndNoMore) {
  PushAcked({1}, 0.5f, 1, 1);
  sender_->Stall(true);
  constexpr int kPushes = 3 * kWindow;
  std::vector<PushRequest> reqs;
  std::vector<PushResponse> resps(kPushes);
  for (int i = 0; i < kPushes; ++i) reqs.push_back(MakePush({1, 2}, 0.1f, 1, i + 2));
  std::atomic<int> acked{0};
  absl::Notification all;
  for (int i = 0; i < kPushes; ++i) {
    a_->PushAsync(reqs[i], &resps[i], [&](absl::Status s) {
      EXPECT_TRUE(s.ok()) << s;
      if (acked.fetch_add(1) + 1 == kPushes) all.Notify();
    });
  }
  // Every sender thread of the stream ends up waiting in a call, and every record is
  // queued for b, its lag, reported (a durable primary ships a record once its log
  // writer wrote it, after PushAsync returned).
  auto queued = [this] {
    auto followers = a_->replication_stats().followers;
    return followers.size() == 1 ? followers[0].queued_records : 0;
  };
  while (sender_->in_flight() < kWindow || queued() < static_cast<uint64_t>(kPushes)) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(queued(), static_cast<uint64_t>(kPushes));
  EXPECT_EQ(acked.load(), 0);
  // The master takes b out of the ack set: the pushes no longer wait for it.
  ApplyAssignmentResponse ar;
  ASSERT_TRUE(a_->ApplyAssignment(Role(3, "a", Range(0, kVShards), {}, {}), &ar).ok());
  all.WaitForNotification();
  EXPECT_EQ(sender_->max_in_flight(), kWindow);
  EXPECT_TRUE(a_->replication_stats().followers.empty());
}

INSTANTIATE_TEST_SUITE_P(DurableOrNotByOptimizer, WindowTest,
                         testing::Combine(testing::Bool(), testing::Values(OptimizerSpec::ADAM,
                                                                           OptimizerSpec::ADAGRAD)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "Durable" : "InMemory") +
                                  (std::get<1>(info.param) == OptimizerSpec::ADAM ? "Adam"
                                                                                  : "Adagrad");
                         });

}  // namespace
}  // namespace ps
