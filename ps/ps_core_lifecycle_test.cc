// Feature eviction on the pod (issue 17), with a fake clock: rows not updated for the TTL
// go, a table over its share of max_rows evicts down to it (LFU or LRU), evictions are
// counted, a row that comes back starts from its initial value, and a durable pod's
// evictions survive a kill -9.
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <map>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "proto/packed.h"
#include "ps/ps_core.h"
#include "ps/storage/pod_storage.h"

namespace ps {
namespace {

constexpr uint32_t kVShards = 16;

class LifecycleTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string templ = std::filesystem::temp_directory_path() / "ps_core_lifecycle_test.XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    root_ = templ;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // A pod on the fake clock; durable (never materializing by itself, closing as kill -9
  // would) when `durable`.
  std::unique_ptr<PsCore> Open(bool durable, int eviction_interval_ms = 0) {
    PsCoreOptions options;
    options.eviction_interval_ms = eviction_interval_ms;  // 0: EvictOnce only
    options.table.clock = [this] { return now_.load(); };
    if (durable) {
      options.storage.db.dir = root_ + "/db";
      options.storage.materialize_ms = 600000;
      options.storage.materialize_on_close = false;
    }
    auto core = PsCore::Open(options, ShardOwnership::All(kVShards));
    EXPECT_TRUE(core.ok()) << core.status();
    return core.ok() ? *std::move(core) : nullptr;
  }

  static void CreateTable(PsCore& core, uint64_t ttl, uint64_t max_rows,
                          EvictionSpec::Policy policy = EvictionSpec::LFU, uint32_t dim = 2) {
    CreateTableRequest req;
    req.mutable_spec()->set_name("emb");
    req.mutable_spec()->set_dim(dim);
    req.mutable_spec()->mutable_optimizer()->set_kind(OptimizerSpec::ADAM);
    req.mutable_spec()->mutable_initializer()->set_kind(InitializerSpec::UNIFORM);
    req.mutable_spec()->mutable_initializer()->set_low(-0.1f);
    req.mutable_spec()->mutable_initializer()->set_high(0.1f);
    req.mutable_spec()->mutable_eviction()->set_ttl_seconds(ttl);
    req.mutable_spec()->mutable_eviction()->set_max_rows(max_rows);
    req.mutable_spec()->mutable_eviction()->set_policy(policy);
    CreateTableResponse resp;
    absl::Status s = core.CreateTable(req, &resp);
    ASSERT_TRUE(s.ok()) << s;
  }

  void Push(PsCore& core, const std::vector<int64_t>& ids, uint32_t dim = 2) {
    PushRequest req;
    TableGrads* t = req.add_tables();
    t->set_table("emb");
    t->set_ids(Pack<int64_t>(ids));
    t->set_grads(Pack<float>(std::vector<float>(ids.size() * dim, 0.5f)));
    req.mutable_key()->set_worker_id(5);
    req.mutable_key()->set_incarnation(1);
    req.mutable_key()->set_sequence(++seq_);
    PushResponse resp;
    ASSERT_TRUE(core.Push(req, &resp).ok());
  }

  static std::vector<int64_t> Range(int64_t from, int64_t to) {
    std::vector<int64_t> v;
    for (int64_t i = from; i < to; ++i) v.push_back(i);
    return v;
  }

  // id -> step of every row.
  static std::map<int64_t, uint64_t> Steps(PsCore& core) {
    std::map<int64_t, uint64_t> rows;
    core.store().FindTable("emb")->ForEachRow([&](const RowView& r) { rows[r.id] = r.step; });
    return rows;
  }

  static uint64_t Evicted(PsCore& core) {
    DescribeResponse d;
    EXPECT_TRUE(core.Describe(DescribeRequest(), &d).ok());
    return d.tables(0).evicted();
  }

  std::string root_;
  std::atomic<int64_t> now_{1000000};
  uint64_t seq_ = 0;
};

TEST_F(LifecycleTest, TtlEvictsRowsNotUpdatedForIt) {
  auto core = Open(/*durable=*/false);
  CreateTable(*core, /*ttl=*/100, /*max_rows=*/0);
  Push(*core, Range(0, 10));
  now_ += 50;
  Push(*core, Range(0, 5));
  now_ += 70;  // 120 s after the first push, 70 after the second
  EXPECT_EQ(core->EvictOnce(), 5u);
  EXPECT_EQ(Steps(*core), (std::map<int64_t, uint64_t>{{0, 2}, {1, 2}, {2, 2}, {3, 2}, {4, 2}}));
  EXPECT_EQ(Evicted(*core), 5u);
  EXPECT_EQ(core->EvictOnce(), 0u);
  now_ += 31;
  EXPECT_EQ(core->EvictOnce(), 5u);
  EXPECT_EQ(core->store().FindTable("emb")->rows(), 0u);
  EXPECT_EQ(Evicted(*core), 10u);
  // A row that comes back starts from its initial value: step 1 after one push.
  Push(*core, {3});
  EXPECT_EQ(Steps(*core), (std::map<int64_t, uint64_t>{{3, 1}}));
}

TEST_F(LifecycleTest, MaxRowsEvictsTheLeastFrequentlyUpdated) {
  auto core = Open(false);
  CreateTable(*core, 0, /*max_rows=*/10, EvictionSpec::LFU);
  for (int k = 0; k < 3; ++k) Push(*core, Range(0, 10));
  now_ += 5;
  Push(*core, Range(10, 25));  // newer, but updated once
  EXPECT_EQ(core->EvictOnce(), 15u);
  EXPECT_EQ(Steps(*core).size(), 10u);
  EXPECT_EQ(Steps(*core).begin()->first, 0);
  EXPECT_EQ(Steps(*core).rbegin()->first, 9);
}

TEST_F(LifecycleTest, MaxRowsEvictsTheLeastRecentlyUpdated) {
  auto core = Open(false);
  CreateTable(*core, 0, /*max_rows=*/10, EvictionSpec::LRU);
  for (int k = 0; k < 3; ++k) Push(*core, Range(0, 10));
  now_ += 5;
  Push(*core, Range(10, 25));
  EXPECT_EQ(core->EvictOnce(), 15u);
  // The ten most recently updated remain, whatever their update counts.
  std::map<int64_t, uint64_t> rows = Steps(*core);
  ASSERT_EQ(rows.size(), 10u);
  for (const auto& [id, step] : rows) EXPECT_GE(id, 10) << id;
}

// A table at its cap that keeps getting new ids keeps its memory: each pass's victims are
// spread over every lock stripe, whose free slots only its own new rows reuse. (When the
// victims were the first rows a pass met, it emptied the first stripes while new rows
// filled all of them: memory grew by half within five rounds.)
TEST_F(LifecycleTest, MemoryStaysFlatWhileNewIdsReplaceEvictedOnes) {
  constexpr uint32_t kDim = 64;  // 41 rows of Adam per 32 KiB block
  constexpr int64_t kCap = 20000;
  auto core = Open(false);
  CreateTable(*core, 0, kCap, EvictionSpec::LFU, kDim);
  auto table = core->store().FindTable("emb");
  int64_t next = 0;
  auto round = [&] {
    for (int64_t end = next + kCap; next < end; next += 1000)
      Push(*core, Range(next, next + 1000), kDim);
    core->EvictOnce();
    EXPECT_LE(table->rows(), static_cast<uint64_t>(kCap));
  };
  round();
  round();
  const uint64_t settled = table->memory_bytes();
  for (int k = 0; k < 5; ++k) round();
  EXPECT_LE(table->memory_bytes(), settled + settled / 10)
      << "settled at " << settled << " bytes, " << table->rows() << " rows";
}

// The eviction thread does not wait for its interval when a table passes its cap.
TEST_F(LifecycleTest, ATablePastItsCapIsEvictedBeforeTheInterval) {
  auto core = Open(false, /*eviction_interval_ms=*/3600 * 1000);
  CreateTable(*core, 0, /*max_rows=*/1000);
  Push(*core, Range(0, 3000));
  auto table = core->store().FindTable("emb");
  for (int i = 0; i < 6000 && table->rows() > 1000; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_LE(table->rows(), 1000u);
  EXPECT_GE(table->rows(), 1000u - 1000u / 32);  // down to 1/32 below the cap, no further
  EXPECT_EQ(Evicted(*core), 3000 - table->rows());
}

// Evictions are logged DELETE changes: a kill -9 before or after the materializer wrote
// them recovers exactly the rows that were left, and a row that came back after its
// eviction recovers at its new steps.
TEST_F(LifecycleTest, EvictionsSurviveAKill) {
  std::map<int64_t, uint64_t> before;
  {
    auto core = Open(/*durable=*/true);
    CreateTable(*core, /*ttl=*/100, 0);
    Push(*core, Range(0, 20));
    ASSERT_TRUE(core->storage()->Materialize().ok());  // all 20 stored
    now_ += 60;
    Push(*core, Range(0, 8));
    now_ += 60;
    EXPECT_EQ(core->EvictOnce(), 12u);
    Push(*core, {15});  // back, step 1
    before = Steps(*core);
    ASSERT_EQ(before.size(), 9u);
    EXPECT_EQ(before.at(15), 1u);
  }
  {
    auto core = Open(true);
    EXPECT_EQ(Steps(*core), before);
    ASSERT_TRUE(core->storage()->Materialize().ok());
  }
  auto core = Open(true);
  EXPECT_EQ(core->storage()->recovery().rows, 9u);
  EXPECT_EQ(Steps(*core), before);
}

}  // namespace
}  // namespace ps
