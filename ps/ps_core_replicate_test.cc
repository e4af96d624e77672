// Replication on the pod side, in process: a primary PsCore ships its records to a
// follower PsCore through an in-process sender. Rows are bit-identical after concurrent
// pushes (durable and in memory), a push is acknowledged only once the follower holds it,
// the de-duplication state travels with the records, a follower refuses a deposed
// primary, a follower dropped from the ack set no longer holds pushes back, and a
// primary whose write lease ran out takes no writes.
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/synchronization/notification.h"
#include "common/routing/hash.h"
#include "gtest/gtest.h"
#include "proto/packed.h"
#include "ps/ps_core.h"

namespace ps {
namespace {

constexpr uint32_t kVShards = 16;
constexpr uint32_t kDim = 4;

// Delivers batches to cores by address; a closed gate holds every batch back until opened.
class InProcessSender : public ReplicaSender {
 public:
  void Add(const std::string& address, PsCore* core) {
    absl::MutexLock lock(&mu_);
    cores_[address] = core;
  }
  void Close() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  absl::Status Send(const ReplicaPeer& follower, const ReplicateRecordsRequest& req,
                    ReplicateRecordsResponse* resp) override {
    PsCore* core;
    {
      absl::MutexLock lock(&mu_);
      ++calls_;
      if (!open_) return absl::UnavailableError("gate closed");
      core = cores_[follower.address()];
    }
    absl::Notification done;
    absl::Status result;
    core->ReplicateRecords(req, resp, [&](absl::Status s) {
      result = s;
      done.Notify();
    });
    done.WaitForNotification();
    return result;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, PsCore*> cores_ ABSL_GUARDED_BY(mu_);
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

std::vector<uint32_t> All() {
  std::vector<uint32_t> v;
  for (uint32_t i = 0; i < kVShards; ++i) v.push_back(i);
  return v;
}

Assignment Primary(uint64_t epoch, const std::vector<std::string>& followers,
                   bool ack_leader = false) {
  Assignment a;
  a.set_epoch(epoch);
  a.set_num_vshards(kVShards);
  for (uint32_t v : All()) a.add_owned(v);
  ReplicationRole* r = a.mutable_replication();
  r->set_pod_id("a");
  r->set_factor(2);
  r->set_ack_leader(ack_leader);
  for (const std::string& f : followers) {
    ReplicaPeer* p = r->add_followers();
    p->set_pod_id(f);
    p->set_address(f + ":1");
  }
  return a;
}

Assignment Follower(uint64_t epoch, const std::string& pod, const std::string& primary) {
  Assignment a;
  a.set_epoch(epoch);
  a.set_num_vshards(kVShards);
  ReplicationRole* r = a.mutable_replication();
  r->set_pod_id(pod);
  r->set_factor(2);
  FollowedVShards* f = r->add_following();
  f->set_primary(primary);
  for (uint32_t v : All()) f->add_vshards(v);
  return a;
}

PushRequest MakePush(const std::vector<int64_t>& ids, float g, uint64_t worker, uint64_t seq) {
  PushRequest req;
  TableGrads* t = req.add_tables();
  t->set_table("emb");
  t->set_ids(Pack<int64_t>(ids));
  std::vector<float> grads(ids.size() * kDim);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = g * static_cast<float>(i % 7 + 1) / 3.0f;
  t->set_grads(Pack<float>(grads));
  req.mutable_key()->set_worker_id(worker);
  req.mutable_key()->set_incarnation(1);
  req.mutable_key()->set_sequence(seq);
  return req;
}

// id -> the row's bytes: weights, slots and step.
std::map<int64_t, std::string> Rows(PsCore& core) {
  std::map<int64_t, std::string> rows;
  auto t = core.store().FindTable("emb");
  if (t == nullptr) return rows;
  t->ForEachRow([&](const RowView& r) {
    std::string& out = rows[r.id];
    out.append(reinterpret_cast<const char*>(r.weights), kDim * sizeof(float));
    out.append(reinterpret_cast<const char*>(r.slots), t->slot_floats() * sizeof(float));
    out.append(reinterpret_cast<const char*>(&r.step), sizeof(r.step));
  });
  return rows;
}

class ReplicateTest : public testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    std::string templ = std::filesystem::temp_directory_path() / "ps_core_replicate_test.XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    root_ = templ;
    sender_ = std::make_shared<InProcessSender>();
    a_ = Open("a");
    b_ = Open("b");
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
    sender_->Add("b:1", b_.get());
    sender_->Add("a:1", a_.get());
    for (PsCore* core : {a_.get(), b_.get()}) {
      CreateTableRequest req;
      req.mutable_spec()->set_name("emb");
      req.mutable_spec()->set_dim(kDim);
      req.mutable_spec()->mutable_optimizer()->set_kind(OptimizerSpec::ADAM);
      req.mutable_spec()->mutable_initializer()->set_kind(InitializerSpec::NORMAL);
      req.mutable_spec()->mutable_initializer()->set_stddev(0.1f);
      CreateTableResponse resp;
      ASSERT_TRUE(core->CreateTable(req, &resp).ok());
      core->RenewWriteLease(absl::Now() + absl::Hours(1));
    }
    ApplyAssignmentResponse resp;
    ASSERT_TRUE(b_->ApplyAssignment(Follower(2, "b", "a"), &resp).ok());
    ASSERT_TRUE(a_->ApplyAssignment(Primary(2, {"b"}), &resp).ok());
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
    std::filesystem::remove_all(root_);
  }

  std::unique_ptr<PsCore> Open(const std::string& name) {
    PsCoreOptions options;
    if (GetParam()) options.storage.db.dir = root_ + "/" + name;
    options.replica_sender = sender_;
    options.replicator.min_backoff = absl::Milliseconds(1);
    options.replicator.max_backoff = absl::Milliseconds(5);
    auto core = PsCore::Open(options, *ShardOwnership::Create(kVShards, 0, {}));
    EXPECT_TRUE(core.ok()) << core.status();
    return core.ok() ? *std::move(core) : nullptr;
  }

  std::string root_;
  std::shared_ptr<InProcessSender> sender_;
  std::unique_ptr<PsCore> a_, b_;
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
    CreateTableRequest req;
    req.mutable_spec()->set_name("ada");
    req.mutable_spec()->set_dim(kDim);
    req.mutable_spec()->mutable_optimizer()->set_kind(OptimizerSpec::ADAGRAD);
    CreateTableResponse resp;
    ASSERT_TRUE(core->CreateTable(req, &resp).ok());
  }
  auto rows_of = [](PsCore& core, const std::string& table) {
    std::map<int64_t, std::string> rows;
    auto t = core.store().FindTable(table);
    t->ForEachRow([&](const RowView& r) {
      std::string& out = rows[r.id];
      out.append(reinterpret_cast<const char*>(r.weights), kDim * sizeof(float));
      out.append(reinterpret_cast<const char*>(r.slots), t->slot_floats() * sizeof(float));
      out.append(reinterpret_cast<const char*>(&r.step), sizeof(r.step));
    });
    return rows;
  };
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
      const auto primary = rows_of(*a_, table);
      ASSERT_EQ(primary.size(), static_cast<size_t>(kRows));
      ASSERT_EQ(rows_of(*b_, table), primary) << table << " after round " << round;
    }
  }
  EXPECT_EQ(b_->replication_stats().records_applied,
            static_cast<uint64_t>(kRounds * kWriters * kPushes));
}

// A follower refuses (and applies nothing of) a record whose rows have another shape than
// its table's: it would read them at the table's stride, past the record's end.
TEST_P(ReplicateTest, FollowerRefusesARecordOfTheWrongShape) {
  LogRecordBuilder builder(PushKey(), 256);
  const std::vector<int64_t> ids = {1, 2};
  const std::vector<uint64_t> steps = {1, 1};
  const std::vector<float> grads(2 * (kDim - 1), 1.0f);
  builder.AddTable("emb", 0.1f, kDim - 1, ids, steps, grads.data());
  ReplicateRecordsRequest req;
  req.set_epoch(2);
  req.set_primary("a");
  req.add_records(builder.Finish());
  ReplicateRecordsResponse resp;
  absl::Status s = absl::UnknownError("not called");
  b_->ReplicateRecords(req, &resp, [&](absl::Status st) { s = st; });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(Rows(*b_).empty());
}

// Issue 17: deletions (the logged DELETE change) and admission decisions reach the
// follower through the same records: rows, including a deleted row that came back from
// its initial value, stay bit-identical, and so do the admission counters.
TEST_P(ReplicateTest, FollowerFollowsDeletionsAndAdmission) {
  for (PsCore* core : {a_.get(), b_.get()}) {
    CreateTableRequest req;
    req.mutable_spec()->set_name("adm");
    req.mutable_spec()->set_dim(kDim);
    req.mutable_spec()->mutable_optimizer()->set_kind(OptimizerSpec::ADAGRAD);
    req.mutable_spec()->mutable_admission()->set_min_count(2);
    CreateTableResponse resp;
    ASSERT_TRUE(core->CreateTable(req, &resp).ok());
  }
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
  PushResponse resp;
  absl::Notification acked;
  absl::Status result;
  a_->PushAsync(push, &resp, [&](absl::Status s) {
    result = s;
    acked.Notify();
  });
  // The sender keeps failing: the push waits, and a retry of its key is told to wait too.
  while (sender_->calls() < 3) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_FALSE(acked.HasBeenNotified());
  PushResponse retry_resp;
  EXPECT_EQ(a_->Push(push, &retry_resp).code(), absl::StatusCode::kAborted);
  sender_->Open();
  acked.WaitForNotification();
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
  Assignment promoted = Primary(5, {});
  promoted.mutable_replication()->set_pod_id("b");
  ASSERT_TRUE(b_->ApplyAssignment(promoted, &ar).ok());
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
  std::string record;
  {
    LogRecordBuilder builder(PushKey(), 64);
    const std::vector<int64_t> ids = {1};
    const std::vector<uint64_t> steps = {1};
    const std::vector<float> grads(kDim, 1.0f);
    builder.AddTable("emb", 0.1f, kDim, ids, steps, grads.data());
    record = builder.Finish();
  }
  for (uint64_t epoch : {4, 6}) {
    ReplicateRecordsRequest req;
    req.set_epoch(epoch);
    req.set_primary("a");
    req.add_records(record);
    ReplicateRecordsResponse resp;
    absl::Status s = absl::UnknownError("not called");
    b_->ReplicateRecords(req, &resp, [&](absl::Status st) { s = st; });
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << epoch << ": " << s;
  }
  EXPECT_TRUE(Rows(*b_).empty());
  // From c at the new epoch, the same record applies.
  ReplicateRecordsRequest req;
  req.set_epoch(5);
  req.set_primary("c");
  req.add_records(record);
  ReplicateRecordsResponse resp;
  absl::Notification done;
  absl::Status s;
  b_->ReplicateRecords(req, &resp, [&](absl::Status st) {
    s = st;
    done.Notify();
  });
  done.WaitForNotification();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(Rows(*b_).size(), 1u);
}

TEST_P(ReplicateTest, FollowerDroppedFromTheAckSetReleasesWaitingPushes) {
  sender_->Close();
  PushResponse resp;
  absl::Notification acked;
  absl::Status result;
  a_->PushAsync(MakePush({1}, 1.0f, 9, 1), &resp, [&](absl::Status s) {
    result = s;
    acked.Notify();
  });
  while (sender_->calls() < 2) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_FALSE(acked.HasBeenNotified());
  ApplyAssignmentResponse ar;
  ASSERT_TRUE(a_->ApplyAssignment(Primary(3, {}), &ar).ok());  // the master dropped b
  acked.WaitForNotification();
  EXPECT_TRUE(result.ok()) << result;
}

TEST_P(ReplicateTest, DeposedPrimaryFailsWaitingPushes) {
  sender_->Close();
  PushResponse resp;
  absl::Notification acked;
  absl::Status result;
  a_->PushAsync(MakePush({1}, 1.0f, 9, 1), &resp, [&](absl::Status s) {
    result = s;
    acked.Notify();
  });
  while (sender_->calls() < 2) absl::SleepFor(absl::Milliseconds(1));
  ApplyAssignmentResponse ar;
  ASSERT_TRUE(a_->ApplyAssignment(Follower(4, "a", "b"), &ar).ok());  // b was promoted
  acked.WaitForNotification();
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
                         [](const testing::TestParamInfo<bool>& p) {
                           return p.param ? "Durable" : "InMemory";
                         });

}  // namespace
}  // namespace ps
