// A follower filled by a copy, on the pod side, in process: the primary `a` leads every
// vshard, `b` follows half of them (its stream from `a` carries records of all), and the
// other half is copied into `b` with the move machinery (snapshot, catch-up, fenced final
// delta) while writers push to every vshard throughout. At the commit `a` starts shipping
// those vshards' rows to `b` before its fence lifts. After it, `b` holds rows
// bit-identical to `a`'s: nothing missed between the copy and the stream, nothing applied
// twice, no row of the copied half applied from the stream before the copy held it.
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <thread>

#include "absl/synchronization/notification.h"
#include "common/base/status_macros.h"
#include "common/routing/hash.h"
#include "gtest/gtest.h"
#include "proto/packed.h"
#include "ps/ps_core.h"

namespace ps {
namespace {

constexpr uint32_t kVShards = 16;
constexpr uint32_t kDim = 4;

// Delivers batches to the core at each address.
class InProcessSender : public ReplicaSender {
 public:
  void Add(const std::string& address, PsCore* core) {
    absl::MutexLock lock(&mu_);
    cores_[address] = core;
  }
  absl::Status Send(const ReplicaPeer& follower, const ReplicateRecordsRequest& req,
                    ReplicateRecordsResponse* resp) override {
    PsCore* core;
    {
      absl::MutexLock lock(&mu_);
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
};

std::vector<uint32_t> Range(uint32_t begin, uint32_t end) {
  std::vector<uint32_t> v;
  for (uint32_t i = begin; i < end; ++i) v.push_back(i);
  return v;
}

// `a` leads every vshard, followed by `b` (when `followed`), moving out `copying`.
Assignment Primary(uint64_t epoch, bool followed, const std::vector<uint32_t>& copying) {
  Assignment a;
  a.set_epoch(epoch);
  a.set_num_vshards(kVShards);
  for (uint32_t v : Range(0, kVShards)) a.add_owned(v);
  for (uint32_t v : copying) a.add_moving_out(v);
  ReplicationRole* r = a.mutable_replication();
  r->set_pod_id("a");
  r->set_factor(2);
  if (followed) {
    ReplicaPeer* p = r->add_followers();
    p->set_pod_id("b");
    p->set_address("b:1");
  }
  return a;
}

// `b` follows `followed` from `a` and receives `copying`.
Assignment Follower(uint64_t epoch, const std::vector<uint32_t>& followed,
                    const std::vector<uint32_t>& copying) {
  Assignment a;
  a.set_epoch(epoch);
  a.set_num_vshards(kVShards);
  for (uint32_t v : copying) a.add_moving_in(v);
  ReplicationRole* r = a.mutable_replication();
  r->set_pod_id("b");
  r->set_factor(2);
  FollowedVShards* f = r->add_following();
  f->set_primary("a");
  for (uint32_t v : followed) f->add_vshards(v);
  return a;
}

// Any pod's assignment: what it owns, receives and sends, its followers and what it
// follows, by primary.
Assignment Role(uint64_t epoch, const std::string& pod, const std::vector<uint32_t>& owned,
                const std::vector<std::string>& followers,
                const std::map<std::string, std::vector<uint32_t>>& following,
                const std::vector<uint32_t>& in = {}, const std::vector<uint32_t>& out = {}) {
  Assignment a;
  a.set_epoch(epoch);
  a.set_num_vshards(kVShards);
  for (uint32_t v : owned) a.add_owned(v);
  for (uint32_t v : in) a.add_moving_in(v);
  for (uint32_t v : out) a.add_moving_out(v);
  ReplicationRole* r = a.mutable_replication();
  r->set_pod_id(pod);
  r->set_factor(2);
  for (const std::string& f : followers) {
    ReplicaPeer* p = r->add_followers();
    p->set_pod_id(f);
    p->set_address(f + ":1");
  }
  for (const auto& [primary, vshards] : following) {
    FollowedVShards* f = r->add_following();
    f->set_primary(primary);
    for (uint32_t v : vshards) f->add_vshards(v);
  }
  return a;
}

PushRequest MakePush(const std::vector<int64_t>& ids, float g, uint64_t worker, uint64_t seq) {
  PushRequest req;
  TableGrads* t = req.add_tables();
  t->set_table("emb");
  t->set_ids(Pack<int64_t>(ids));
  std::vector<float> grads(ids.size() * kDim);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = g * static_cast<float>(i % 5 + 1) / 3.0f;
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

class FillTest : public testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    std::string templ = std::filesystem::temp_directory_path() / "ps_core_fill_test.XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    root_ = templ;
    sender_ = std::make_shared<InProcessSender>();
    a_ = Open("a");
    b_ = Open("b");
    ASSERT_TRUE(a_ && b_);
    sender_->Add("b:1", b_.get());
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
  }
  void TearDown() override {
    StopWriters();
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
  // Every export chunk of a phase from `a`, imported into `b`.
  void Copy(uint64_t move, MigrateExportRequest::Phase phase) {
    MigrateExportRequest req;
    req.set_move_id(move);
    req.set_phase(phase);
    req.set_max_bytes(512);  // a few rows per chunk
    for (;;) {
      MigrateExportResponse chunk;
      ASSERT_TRUE(a_->MigrateExport(req, &chunk).ok());
      uint64_t rows = 0, bytes = 0;
      ASSERT_TRUE(b_->ImportChunk(chunk, &rows, &bytes).ok());
      if (chunk.done()) return;
      req.set_cursor(chunk.next_cursor());
    }
  }

  std::string root_;
  std::shared_ptr<InProcessSender> sender_;
  std::unique_ptr<PsCore> a_, b_;
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
  MigrateBeginRequest begin;
  begin.set_move_id(1);
  for (uint32_t v : copying) begin.add_vshards(v);
  MigrateBeginResponse begun;
  ASSERT_TRUE(a_->MigrateBegin(begin, &begun).ok());
  ASSERT_TRUE(b_->BeginImport(1, copying).ok());
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
  MigrateBeginRequest begin;
  begin.set_move_id(1);
  for (uint32_t v : copying) begin.add_vshards(v);
  MigrateBeginResponse begun;
  ASSERT_TRUE(a_->MigrateBegin(begin, &begun).ok());
  ASSERT_TRUE(b_->BeginImport(1, copying).ok());
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
  sender_->Add("a:1", a_.get());
  {
    CreateTableRequest req;
    req.mutable_spec()->set_name("emb");
    req.mutable_spec()->set_dim(kDim);
    req.mutable_spec()->mutable_optimizer()->set_kind(OptimizerSpec::ADAM);
    req.mutable_spec()->mutable_initializer()->set_kind(InitializerSpec::NORMAL);
    req.mutable_spec()->mutable_initializer()->set_stddev(0.1f);
    CreateTableResponse resp;
    ASSERT_TRUE(f->CreateTable(req, &resp).ok());
  }
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
  MigrateBeginRequest begin;
  begin.set_move_id(1);
  for (uint32_t v : moved) begin.add_vshards(v);
  MigrateBeginResponse begun;
  ASSERT_TRUE(a_->MigrateBegin(begin, &begun).ok());
  ASSERT_TRUE(b_->BeginImport(1, moved).ok());
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
                         [](const testing::TestParamInfo<bool>& p) {
                           return p.param ? "Durable" : "InMemory";
                         });

}  // namespace
}  // namespace ps
