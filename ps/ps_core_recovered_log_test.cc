// A replicated pod back with its disk (ps_core_replicate.cc, ResolveRecoveredLog): the
// records its log recovered may be missing on its followers (its ship queue died with it).
// In process, a primary `a` logs a push its follower `b` never receives (the sender's gate
// is closed), stops and reopens on its data dir. Until it knows its role a retry of that
// push is told to wait; back as the primary it re-ships the record, answers the retry only
// once `b` holds it, and both end bit-identical with the push applied once; deposed, it
// forgets the key (the new primary decides) instead of answering "duplicate".
#include <stdlib.h>

#include <filesystem>
#include <map>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "proto/packed.h"
#include "ps/ps_core.h"

namespace ps {
namespace {

constexpr uint32_t kVShards = 8;
constexpr uint32_t kDim = 4;

// Delivers batches to cores by address; while closed, every batch fails (retried).
class GatedSender : public ReplicaSender {
 public:
  void Add(const std::string& address, PsCore* core) {
    absl::MutexLock lock(&mu_);
    cores_[address] = core;
  }
  void SetOpen(bool open) {
    absl::MutexLock lock(&mu_);
    open_ = open;
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
      auto it = cores_.find(follower.address());
      if (!open_ || it == cores_.end()) return absl::UnavailableError("gate closed");
      core = it->second;
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

// `pod` owns every vshard (if `owns`) with `followers`, or follows every vshard of `primary`.
Assignment Role(uint64_t epoch, const std::string& pod, bool owns,
                const std::vector<std::string>& followers, const std::string& primary = "") {
  Assignment a;
  a.set_epoch(epoch);
  a.set_num_vshards(kVShards);
  ReplicationRole* r = a.mutable_replication();
  r->set_pod_id(pod);
  r->set_factor(2);
  FollowedVShards* f = primary.empty() ? nullptr : r->add_following();
  if (f != nullptr) f->set_primary(primary);
  for (uint32_t v = 0; v < kVShards; ++v) {
    if (owns) a.add_owned(v);
    if (f != nullptr) f->add_vshards(v);
  }
  for (const std::string& name : followers) {
    ReplicaPeer* p = r->add_followers();
    p->set_pod_id(name);
    p->set_address(name + ":1");
  }
  return a;
}

PushRequest MakePush(const std::vector<int64_t>& ids, uint64_t seq) {
  PushRequest req;
  TableGrads* t = req.add_tables();
  t->set_table("emb");
  t->set_ids(Pack<int64_t>(ids));
  t->set_learning_rate(1.0f);
  t->set_grads(Pack<float>(std::vector<float>(ids.size() * kDim, -1.0f)));
  req.mutable_key()->set_worker_id(7);
  req.mutable_key()->set_incarnation(1);
  req.mutable_key()->set_sequence(seq);
  return req;
}

// id -> weights and step.
std::map<int64_t, std::pair<std::vector<float>, uint64_t>> Rows(PsCore& core) {
  std::map<int64_t, std::pair<std::vector<float>, uint64_t>> rows;
  auto t = core.store().FindTable("emb");
  if (t == nullptr) return rows;
  t->ForEachRow([&](const RowView& r) {
    rows[r.id] = {std::vector<float>(r.weights, r.weights + kDim), r.step};
  });
  return rows;
}

class RecoveredLogTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string templ = std::filesystem::temp_directory_path() / "ps_core_recovered_log.XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    root_ = templ;
    sender_ = std::make_shared<GatedSender>();
    a_ = Open("a");
    b_ = Open("b");
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
    sender_->Add("b:1", b_.get());
    for (PsCore* core : {a_.get(), b_.get()}) {
      CreateTableRequest req;
      req.mutable_spec()->set_name("emb");
      req.mutable_spec()->set_dim(kDim);
      req.mutable_spec()->mutable_optimizer()->set_kind(OptimizerSpec::SGD);
      req.mutable_spec()->mutable_optimizer()->set_learning_rate(1.0f);
      req.mutable_spec()->mutable_initializer()->set_kind(InitializerSpec::ZEROS);
      CreateTableResponse resp;
      ASSERT_TRUE(core->CreateTable(req, &resp).ok());
      core->RenewWriteLease(absl::Now() + absl::Hours(1));
    }
    Apply(*b_, Role(2, "b", false, {}, "a"));
    Apply(*a_, Role(2, "a", true, {"b"}));
    // Acknowledged: both hold it.
    PushResponse resp;
    ASSERT_TRUE(a_->Push(MakePush({1, 2}, 1), &resp).ok());
    // Logged on `a` only: its follower never answers, and `a` stops (as if killed: the
    // push was never acknowledged).
    sender_->SetOpen(false);
    a_->PushAsync(push_, &pending_resp_, [this](absl::Status s) {
      pending_result_ = s;
      pending_done_.Notify();
    });
    while (sender_->calls() < 3) absl::SleepFor(absl::Milliseconds(1));
    ASSERT_FALSE(pending_done_.HasBeenNotified());
    a_.reset();
    ASSERT_TRUE(pending_done_.HasBeenNotified());
    EXPECT_FALSE(pending_result_.ok());
    a_ = Open("a");
    ASSERT_NE(a_, nullptr);
    a_->RenewWriteLease(absl::Now() + absl::Hours(1));
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
    std::filesystem::remove_all(root_);
  }

  std::unique_ptr<PsCore> Open(const std::string& name) {
    PsCoreOptions options;
    options.storage.db.dir = root_ + "/" + name;
    options.storage.materialize_ms = 1;  // rounds all the time: the log must survive them
    options.replica_sender = sender_;
    options.replicator.min_backoff = absl::Milliseconds(1);
    options.replicator.max_backoff = absl::Milliseconds(5);
    options.eviction_interval_ms = 0;
    auto core = PsCore::Open(options, *ShardOwnership::Create(kVShards, 0, {}));
    EXPECT_TRUE(core.ok()) << core.status();
    return core.ok() ? *std::move(core) : nullptr;
  }
  void Apply(PsCore& core, const Assignment& a) {
    ApplyAssignmentResponse resp;
    ASSERT_TRUE(core.ApplyAssignment(a, &resp).ok());
  }

  std::string root_;
  std::shared_ptr<GatedSender> sender_;
  std::unique_ptr<PsCore> a_, b_;
  const PushRequest push_ = MakePush({2, 3}, 2);
  PushResponse pending_resp_;
  absl::Status pending_result_;
  absl::Notification pending_done_;
};

TEST_F(RecoveredLogTest, PrimaryBackWithItsDiskReshipsBeforeAnsweringDuplicate) {
  PushResponse resp;
  // Before its role is known, the retry waits (not "duplicate": b lacks the record).
  EXPECT_EQ(a_->Push(push_, &resp).code(), absl::StatusCode::kAborted);
  // Still the primary (back within its lease); b is still unreachable: still waiting.
  Apply(*a_, Role(3, "a", true, {"b"}));
  EXPECT_EQ(a_->Push(push_, &resp).code(), absl::StatusCode::kAborted);
  sender_->SetOpen(true);
  absl::Status s;
  while ((s = a_->Push(push_, &resp)).code() == absl::StatusCode::kAborted) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(resp.duplicate());
  // Applied once, on both: row 2 took two pushes (SGD, lr 1, gradient -1), row 3 one.
  const auto rows = Rows(*a_);
  EXPECT_EQ(rows.at(1).first, std::vector<float>(kDim, 1.0f));
  EXPECT_EQ(rows.at(2).first, std::vector<float>(kDim, 2.0f));
  EXPECT_EQ(rows.at(3).first, std::vector<float>(kDim, 1.0f));
  EXPECT_EQ(Rows(*b_), rows);
  // The log of the re-shipped record may now be truncated, and a later push goes through.
  PushResponse later;
  ASSERT_TRUE(a_->Push(MakePush({3}, 3), &later).ok());
  EXPECT_FALSE(later.duplicate());
  EXPECT_EQ(Rows(*b_), Rows(*a_));
}

TEST_F(RecoveredLogTest, DeposedPodForgetsTheKeyInsteadOfAnsweringDuplicate) {
  // b was promoted while a was down; a comes back leading nothing.
  Apply(*b_, Role(3, "b", true, {}));
  b_->RenewWriteLease(absl::Now() + absl::Hours(1));
  Apply(*a_, Role(3, "a", false, {}));
  // A client with an old map asks a: refused (retry at the owner), never "duplicate".
  PushResponse resp;
  EXPECT_EQ(a_->Push(push_, &resp).code(), absl::StatusCode::kFailedPrecondition);
  // The owner never had it: it applies it, once.
  ASSERT_TRUE(b_->Push(push_, &resp).ok());
  EXPECT_FALSE(resp.duplicate());
  const auto rows = Rows(*b_);
  EXPECT_EQ(rows.at(2).first, std::vector<float>(kDim, 2.0f));
  EXPECT_EQ(rows.at(3).first, std::vector<float>(kDim, 1.0f));
  EXPECT_TRUE(Rows(*a_).empty());  // its rows went with the vshards
}

}  // namespace
}  // namespace ps
