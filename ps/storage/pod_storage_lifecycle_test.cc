// The feature lifecycle on a durable pod (issue 17): deleted rows (PsCore::DeleteRows, the
// logged DELETE change) stay deleted through a crash (log replay), a materialization round
// (a RocksDB delete) and both, and a row that comes back starts from its initial value.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <map>
#include <memory>
#include <random>

#include "common/routing/hash.h"
#include "proto/packed.h"
#include "ps/ps_core.h"
#include "ps/storage/pod_storage.h"

namespace ps {
namespace {

class PodStorageLifecycleTest : public ::testing::Test {
 public:
  void SetUp() override {
    char tmpl[] = "/tmp/pod_storage_lifecycle_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/db";
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // A pod on dir_ that never materializes by itself and, closed, leaves the log as a
  // kill -9 would.
  std::unique_ptr<PsCore> Open(bool lazy_start = false) {
    PsCoreOptions options;
    options.storage.db.dir = dir_;
    options.storage.materialize_ms = 600000;
    options.storage.materialize_on_close = false;
    options.storage.lazy_start = lazy_start;
    options.storage.lazy_replay = lazy_start;
    auto core = PsCore::Open(options, ShardOwnership::All(16));
    EXPECT_TRUE(core.ok()) << core.status();
    return core.ok() ? *std::move(core) : nullptr;
  }

  static TableSpec Spec() {
    TableSpec spec;
    spec.set_name("emb");
    spec.set_dim(4);
    spec.mutable_initializer()->set_kind(InitializerSpec::NORMAL);
    spec.mutable_initializer()->set_stddev(0.1f);
    spec.mutable_optimizer()->set_kind(OptimizerSpec::ADAM);  // bias correction: the step
    return spec;
  }

  static void CreateTable(PsCore& core, uint32_t min_count = 0) {
    CreateTableRequest req;
    *req.mutable_spec() = Spec();
    req.mutable_spec()->mutable_admission()->set_min_count(min_count);
    CreateTableResponse resp;
    ASSERT_TRUE(core.CreateTable(req, &resp).ok());
  }

  static PushRequest MakePush(const std::vector<int64_t>& ids, uint64_t seq) {
    std::mt19937 rng(seq);
    PushRequest req;
    req.mutable_key()->set_worker_id(11);
    req.mutable_key()->set_incarnation(1);
    req.mutable_key()->set_sequence(seq);
    TableGrads* t = req.add_tables();
    t->set_table("emb");
    *t->mutable_ids() = Pack<int64_t>(ids);
    std::normal_distribution<float> g;
    std::vector<float> grads(ids.size() * 4);
    for (float& x : grads) x = g(rng);
    *t->mutable_grads() = Pack<float>(grads);
    return req;
  }

  static void Push(PsCore& core, const std::vector<int64_t>& ids, uint64_t seq) {
    PushResponse resp;
    absl::Status s = core.Push(MakePush(ids, seq), &resp);
    ASSERT_TRUE(s.ok()) << s;
  }

  // Every row of "emb" as weights, slots, step.
  static std::map<int64_t, std::vector<float>> Snapshot(PsCore& core) {
    std::map<int64_t, std::vector<float>> rows;
    auto t = core.store().FindTable("emb");
    t->ForEachRow([&](const RowView& r) {
      std::vector<float> v(r.weights, r.weights + 4);
      v.insert(v.end(), r.slots, r.slots + t->slot_floats());
      v.push_back(static_cast<float>(r.step));
      rows[r.id] = v;
    });
    return rows;
  }

  std::map<int64_t, uint64_t> StoredSteps(PsCore& core) {
    std::map<int64_t, uint64_t> steps;
    EXPECT_TRUE(core.storage()
                    ->ForEachStoredRow("emb",
                                       [&](const StoredRow& r) {
                                         steps[r.id] = r.step;
                                         return absl::OkStatus();
                                       })
                    .ok());
    return steps;
  }

  std::string root_, dir_;
};

TEST_F(PodStorageLifecycleTest, DeletedRowsStayDeletedAndComeBackNew) {
  std::map<int64_t, std::vector<float>> before;
  {
    auto core = Open();
    CreateTable(*core);
    for (uint64_t s = 1; s <= 5; ++s) Push(*core, {1, 2, 3, 4}, s);
    ASSERT_TRUE(core->storage()->Materialize().ok());                // stored at step 5
    for (uint64_t s = 6; s <= 8; ++s) Push(*core, {1, 2, 3, 4}, s);  // in the log only
    uint64_t deleted = 0;
    ASSERT_TRUE(core->DeleteRows("emb", {1, 2, 3, 999}, &deleted).ok());
    EXPECT_EQ(deleted, 3u);
    Push(*core, {1}, 9);  // comes back: step 1, from its initial value
    before = Snapshot(*core);
    ASSERT_EQ(before.size(), 2u);
    EXPECT_EQ(before.at(1).back(), 1.0f);
    EXPECT_EQ(before.at(4).back(), 8.0f);
  }  // killed: the deletion and the re-creation are only in the log
  {
    auto core = Open();
    EXPECT_EQ(Snapshot(*core), before);
    EXPECT_EQ(core->storage()->recovery().rows, 4u);  // rows 1-4 as stored at step 5
    ASSERT_TRUE(core->storage()->Materialize().ok());
    // The round wrote the deletions: rows 2 and 3 are gone from disk, row 1 is new.
    EXPECT_EQ(StoredSteps(*core), (std::map<int64_t, uint64_t>{{1, 1}, {4, 8}}));
    EXPECT_EQ(core->storage()->stats().deleted_rows, 3u);  // 2, 3 and 999 (never stored)
  }                                                        // killed after the round
  auto core = Open();
  EXPECT_EQ(core->storage()->recovery().log_records, 0u);
  EXPECT_EQ(Snapshot(*core), before);

  // The row that came back is what a fresh table makes of the same one push.
  PsCore fresh(PsCoreOptions(), ShardOwnership::All(16));
  CreateTable(fresh);
  Push(fresh, {1}, 9);
  EXPECT_EQ(Snapshot(fresh).at(1), before.at(1));
  // A deleted row reads as its initial value and is not read back from disk.
  float got[4], want[4];
  core->store().FindTable("emb")->Pull({2}, got, /*read_only=*/true);
  fresh.store().FindTable("emb")->Pull({2}, want, /*read_only=*/true);
  EXPECT_EQ(std::vector<float>(got, got + 4), std::vector<float>(want, want + 4));
}

// Deleted, then re-created and stored in the same stretch of log: recovery from the stored
// new row plus the log (old updates, the deletion, the new updates) gives the new row.
TEST_F(PodStorageLifecycleTest, RowStoredAfterComingBackRecoversExactly) {
  std::map<int64_t, std::vector<float>> before;
  {
    auto core = Open();
    CreateTable(*core);
    for (uint64_t s = 1; s <= 6; ++s) Push(*core, {7, 8}, s);
    ASSERT_TRUE(core->DeleteRows("emb", {7}).ok());
    for (uint64_t s = 7; s <= 8; ++s) Push(*core, {7, 8}, s);
    ASSERT_TRUE(core->storage()->Materialize().ok());
    for (uint64_t s = 9; s <= 10; ++s) Push(*core, {7, 8}, s);
    ASSERT_TRUE(core->DeleteRows("emb", {8}).ok());
    Push(*core, {8}, 11);
    before = Snapshot(*core);
    EXPECT_EQ(before.at(7).back(), 4.0f);
    EXPECT_EQ(before.at(8).back(), 1.0f);
  }
  auto core = Open();
  EXPECT_EQ(Snapshot(*core), before);
}

// A lazy start whose log holds a deletion replays before serving (a lazy replay would
// apply the deleted row's older updates when it is read back).
TEST_F(PodStorageLifecycleTest, LazyStartWithADeletionInTheLog) {
  std::map<int64_t, std::vector<float>> before;
  {
    auto core = Open();
    CreateTable(*core);
    for (uint64_t s = 1; s <= 4; ++s) Push(*core, {1, 2}, s);
    ASSERT_TRUE(core->storage()->Materialize().ok());
    Push(*core, {1, 2}, 5);
    ASSERT_TRUE(core->DeleteRows("emb", {1}).ok());
    before = Snapshot(*core);
  }
  {
    auto core = Open(/*lazy_start=*/true);
    EXPECT_FALSE(core->storage()->recovery().lazy_replay);
    float got[4], want[4];
    core->store().FindTable("emb")->Pull({1}, got, /*read_only=*/true);
    PsCore fresh(PsCoreOptions(), ShardOwnership::All(16));
    CreateTable(fresh);
    fresh.store().FindTable("emb")->Pull({1}, want, /*read_only=*/true);
    EXPECT_EQ(std::vector<float>(got, got + 4), std::vector<float>(want, want + 4));
    ASSERT_TRUE(core->storage()->Materialize().ok());
    EXPECT_EQ(StoredSteps(*core), (std::map<int64_t, uint64_t>{{2, 5}}));
  }
  auto core = Open();
  EXPECT_EQ(Snapshot(*core), before);
}

// Admission state (the counters per vshard, with a decay, and the lifecycle counts) and
// the rows it admitted are the same after a crash, recovered from the stored counters
// (as of the round's cut) plus the log's counts after it.
TEST_F(PodStorageLifecycleTest, AdmissionSurvivesACrashExactly) {
  auto range = [](int64_t from, int64_t to) {
    std::vector<int64_t> ids;
    for (int64_t id = from; id < to; ++id) ids.push_back(id);
    return ids;
  };
  // Enough ids of vshard 0 to make its counters due for a decay.
  std::vector<int64_t> many;
  const uint64_t h = NameHash("emb");
  for (int64_t id = 1000000; many.size() < AdmissionSketch::kDecayEvery; ++id) {
    if (VShardOf(RouteHash(h, id), 16) == 0) many.push_back(id);
  }
  std::map<int64_t, std::vector<float>> rows;
  std::string counters;
  auto state = [](PsCore& core) {
    DescribeResponse d;
    EXPECT_TRUE(core.Describe(DescribeRequest(), &d).ok());
    const TableInfo& t = d.tables(0);
    return std::vector<uint64_t>{t.rows(), t.admitted(), t.pending_admission(),
                                 t.dropped_gradients()};
  };
  std::vector<uint64_t> counts;
  {
    auto core = Open();
    CreateTable(*core, /*min_count=*/2);
    Push(*core, range(0, 100), 1);
    Push(*core, range(0, 50), 2);  // admits 0..49
    Push(*core, many, 3);
    AdmissionSketch* sketch = core->store().FindTable("emb")->admission();
    EXPECT_EQ(sketch->DueForDecay(), std::vector<uint32_t>{0});
    ASSERT_TRUE(core->storage()->Materialize().ok());
    EXPECT_TRUE(sketch->DueForDecay().empty());  // decayed at the round's cut
    Push(*core, range(25, 75), 4);               // admits 50..74
    Push(*core, range(100, 150), 5);
    Push(*core, range(0, 10), 6);
    rows = Snapshot(*core);
    counters = sketch->Serialize();
    counts = state(*core);
    // Every row was created by admission (ids of vshard 0 may share counters with the
    // many: an estimate is never below the true count, sometimes above).
    EXPECT_GE(rows.size(), 75u);
    EXPECT_EQ(counts[0], rows.size());
    EXPECT_EQ(counts[1], rows.size());
    EXPECT_GE(counts[3], 100u + 50);
  }
  for (int restart = 0; restart < 2; ++restart) {
    auto core = Open();
    EXPECT_EQ(Snapshot(*core), rows) << restart;
    EXPECT_EQ(core->store().FindTable("emb")->admission()->Serialize(), counters) << restart;
    EXPECT_EQ(state(*core), counts) << restart;
    ASSERT_TRUE(core->storage()->Materialize().ok());  // the second start: from the store
  }
}

}  // namespace
}  // namespace ps
