// Durability of a pod through PsCore: what is pushed survives close and reopen, through
// the stored rows, the log replay, or both, bit for bit, and retried keys stay applied
// once.
#include "ps/storage/pod_storage.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <random>

#include "absl/time/clock.h"
#include "common/routing/hash.h"
#include "embedding/spec.h"
#include "proto/packed.h"
#include "ps/pod_transfer.h"
#include "ps/ps_core.h"

namespace ps {
namespace {

class PodStorageTest : public ::testing::Test {
 public:
  void SetUp() override {
    char tmpl[] = "/tmp/pod_storage_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/db";
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::unique_ptr<PsCore> Open(bool materialize_on_close, int materialize_ms = 600000) {
    PsCoreOptions options;
    options.storage.db.dir = dir_;
    options.storage.materialize_ms = materialize_ms;
    options.storage.materialize_on_close = materialize_on_close;
    auto core = PsCore::Open(options, ShardOwnership::All(16));
    EXPECT_TRUE(core.ok()) << core.status();
    return core.ok() ? *std::move(core) : nullptr;
  }

  static TableSpec Spec(OptimizerSpec::Kind kind) {
    TableSpec spec;
    spec.set_name("emb");
    spec.set_dim(4);
    spec.mutable_initializer()->set_kind(InitializerSpec::NORMAL);
    spec.mutable_initializer()->set_stddev(0.1f);
    spec.mutable_optimizer()->set_kind(kind);
    return spec;
  }

  static PushRequest MakePush(const std::vector<int64_t>& ids, std::mt19937* rng, uint64_t seq) {
    PushRequest req;
    req.mutable_key()->set_worker_id(11);
    req.mutable_key()->set_incarnation(1);
    req.mutable_key()->set_sequence(seq);
    TableGrads* t = req.add_tables();
    t->set_table("emb");
    *t->mutable_ids() = Pack<int64_t>(ids);
    std::normal_distribution<float> g;
    std::vector<float> grads(ids.size() * 4);
    for (float& x : grads) x = g(*rng);
    *t->mutable_grads() = Pack<float>(grads);
    return req;
  }

  // Every row of "emb" as (weights, slots, step), by id.
  static std::map<int64_t, std::vector<float>> Snapshot(PsCore& core) {
    std::map<int64_t, std::vector<float>> rows;
    core.store().FindTable("emb")->ForEachRow([&](const RowView& r) {
      std::vector<float> v(r.weights, r.weights + 4);
      v.insert(v.end(), r.slots, r.slots + core.store().FindTable("emb")->slot_floats());
      v.push_back(static_cast<float>(r.step));
      rows[r.id] = v;
    });
    return rows;
  }

  std::string root_, dir_;
};

// Pushes overlapping ids (so rows see several updates each), sequences
// [first_seq, first_seq + n).
void PushSome(PsCore& core, int first_seq, int n, std::mt19937* rng) {
  std::uniform_int_distribution<int64_t> id(0, 50);
  for (int s = first_seq; s < first_seq + n; ++s) {
    std::vector<int64_t> ids(8);
    for (auto& x : ids) x = id(*rng);
    PushResponse resp;
    absl::Status st = core.Push(PodStorageTest::MakePush(ids, rng, s), &resp);
    EXPECT_TRUE(st.ok()) << st;
  }
}

TEST_F(PodStorageTest, RecoversFromLogAloneBitForBit) {
  std::mt19937 rng(1);
  std::map<int64_t, std::vector<float>> before;
  {
    auto core = Open(/*materialize_on_close=*/false);
    CreateTableResponse cr;
    CreateTableRequest req;
    *req.mutable_spec() = Spec(OptimizerSpec::ADAM);
    ASSERT_TRUE(core->CreateTable(req, &cr).ok());
    PushSome(*core, 1, 40, &rng);
    before = Snapshot(*core);
  }
  auto core = Open(false);
  EXPECT_EQ(core->storage()->recovery().log_records, 40u);
  EXPECT_EQ(core->storage()->recovery().rows, 0u);
  EXPECT_EQ(Snapshot(*core), before);
}

TEST_F(PodStorageTest, RecoversFromStoredRowsPlusLog) {
  std::mt19937 rng(2);
  std::map<int64_t, std::vector<float>> before;
  {
    auto core = Open(false);
    CreateTableRequest req;
    *req.mutable_spec() = Spec(OptimizerSpec::ADAGRAD);
    CreateTableResponse cr;
    ASSERT_TRUE(core->CreateTable(req, &cr).ok());
    PushSome(*core, 1, 30, &rng);
    ASSERT_TRUE(core->storage()->Materialize().ok());
    PushSome(*core, 31, 30, &rng);
    before = Snapshot(*core);
  }
  auto core = Open(false);
  EXPECT_GT(core->storage()->recovery().rows, 0u);
  EXPECT_EQ(core->storage()->recovery().log_records, 30u);  // the first 30 were truncated
  EXPECT_EQ(Snapshot(*core), before);

  // Keys of both halves stay applied once: retries are acknowledged as duplicates.
  for (uint64_t seq : {5u, 45u}) {
    PushResponse resp;
    ASSERT_TRUE(core->Push(MakePush({1}, &rng, seq), &resp).ok());
    EXPECT_TRUE(resp.duplicate()) << "sequence " << seq;
  }
  EXPECT_EQ(Snapshot(*core), before);
}

TEST_F(PodStorageTest, CleanCloseMaterializesAndKeepsDenseTensors) {
  std::mt19937 rng(3);
  std::map<int64_t, std::vector<float>> before;
  std::vector<float> dense_before(6);
  {
    auto core = Open(/*materialize_on_close=*/true);
    CreateTableRequest req;
    *req.mutable_spec() = Spec(OptimizerSpec::FTRL);
    CreateTableResponse cr;
    ASSERT_TRUE(core->CreateTable(req, &cr).ok());
    CreateDenseRequest dreq;
    dreq.mutable_spec()->set_name("w");
    dreq.mutable_spec()->add_shape(2);
    dreq.mutable_spec()->add_shape(3);
    dreq.mutable_spec()->mutable_optimizer()->set_kind(OptimizerSpec::MOMENTUM);
    CreateDenseResponse dresp;
    ASSERT_TRUE(core->CreateDense(dreq, &dresp).ok());
    PushSome(*core, 1, 20, &rng);
    for (int s = 0; s < 3; ++s) {
      DensePushRequest push;
      push.mutable_key()->set_worker_id(11);
      push.mutable_key()->set_incarnation(1);
      push.mutable_key()->set_sequence(100 + s);
      DenseGrads* g = push.add_tensors();
      g->set_name("w");
      *g->mutable_grads() = Pack<float>(std::vector<float>{1, 2, 3, 4, 5, 6});
      PushResponse resp;
      ASSERT_TRUE(core->PushDense(push, &resp).ok());
    }
    before = Snapshot(*core);
    core->store().FindDense("w")->Pull(dense_before.data());
  }
  auto core = Open(false);
  EXPECT_EQ(core->storage()->recovery().log_records, 0u);
  EXPECT_EQ(Snapshot(*core), before);
  std::vector<float> dense_after(6);
  ASSERT_NE(core->store().FindDense("w"), nullptr);
  core->store().FindDense("w")->Pull(dense_after.data());
  EXPECT_EQ(dense_after, dense_before);
  EXPECT_EQ(core->store().FindDense("w")->step(), 3u);
  // The catalog came back with the normalized spec.
  EXPECT_EQ(core->store().FindTable("emb")->spec().SerializeAsString(),
            NormalizeTableSpec(Spec(OptimizerSpec::FTRL))->SerializeAsString());
}

// A full disk (injected ENOSPC on every database write): the push whose log write fails
// is refused with UNAVAILABLE, as is every later one, even once space is back; nothing
// is materialized after the failure (memory holds an update that is not durable), and a
// restart on the same directory recovers exactly the acknowledged pushes.
TEST_F(PodStorageTest, DiskFullFailsPushesAndRestartRecoversAcknowledged) {
  std::mt19937 rng(9);
  auto full = std::make_shared<std::atomic<bool>>(false);
  std::map<int64_t, std::vector<float>> acknowledged;
  const PushRequest failed = MakePush({1, 2, 3}, &rng, 31);
  {
    PsCoreOptions options;
    options.storage.db.dir = dir_;
    options.storage.materialize_ms = 600000;
    options.storage.db.inject_write_error = [full] { return full->load(); };
    auto opened = PsCore::Open(options, ShardOwnership::All(16));
    ASSERT_TRUE(opened.ok()) << opened.status();
    PsCore& core = **opened;
    CreateTableRequest req;
    *req.mutable_spec() = Spec(OptimizerSpec::ADAM);
    CreateTableResponse cr;
    ASSERT_TRUE(core.CreateTable(req, &cr).ok());
    PushSome(core, 1, 20, &rng);
    ASSERT_TRUE(core.storage()->Materialize().ok());
    PushSome(core, 21, 10, &rng);
    acknowledged = Snapshot(core);

    full->store(true);
    PushResponse resp;
    absl::Status s = core.Push(failed, &resp);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    full->store(false);  // space is back; the pod still refuses until restarted
    s = core.Push(MakePush({4}, &rng, 32), &resp);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    s = core.Push(failed, &resp);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_FALSE(core.storage()->Materialize().ok());
  }  // closing (materialize_on_close) must not store the unlogged update either
  auto core = Open(false);
  EXPECT_EQ(Snapshot(*core), acknowledged);
  // The refused push was never acknowledged: its retry applies now, once.
  PushResponse resp;
  ASSERT_TRUE(core->Push(failed, &resp).ok());
  EXPECT_FALSE(resp.duplicate());
  ASSERT_TRUE(core->Push(failed, &resp).ok());
  EXPECT_TRUE(resp.duplicate());
}

// A full disk during materialization (rows write and flush fail): whatever pushes do then
// (refused, or acknowledged once space is back), a restart recovers every acknowledged
// push exactly.
TEST_F(PodStorageTest, DiskFullDuringMaterializationLosesNothingAcknowledged) {
  std::mt19937 rng(10);
  auto full = std::make_shared<std::atomic<bool>>(false);
  std::map<int64_t, std::vector<float>> acknowledged;
  {
    PsCoreOptions options;
    options.storage.db.dir = dir_;
    options.storage.materialize_ms = 600000;
    options.storage.materialize_on_close = false;
    options.storage.db.inject_write_error = [full] { return full->load(); };
    auto opened = PsCore::Open(options, ShardOwnership::All(16));
    ASSERT_TRUE(opened.ok()) << opened.status();
    PsCore& core = **opened;
    CreateTableRequest req;
    *req.mutable_spec() = Spec(OptimizerSpec::ADAGRAD);
    CreateTableResponse cr;
    ASSERT_TRUE(core.CreateTable(req, &cr).ok());
    PushSome(core, 1, 20, &rng);
    full->store(true);
    EXPECT_FALSE(core.storage()->Materialize().ok());
    full->store(false);
    acknowledged = Snapshot(core);
    int refused = 0;
    for (uint64_t seq = 21; seq < 31; ++seq) {
      PushResponse resp;
      absl::Status s = core.Push(MakePush({static_cast<int64_t>(seq % 7), 50}, &rng, seq), &resp);
      if (!s.ok()) {
        EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
        ++refused;
        continue;
      }
      EXPECT_EQ(refused, 0) << "a push was acknowledged after one was refused";
      acknowledged = Snapshot(core);
    }
  }
  auto core = Open(false);
  EXPECT_EQ(Snapshot(*core), acknowledged);
}

// A table five times the memory budget: pushes spread over every row (so most of them
// are evicted and read back many times) give exactly the rows of an in-memory pod, the
// resident rows stay within the budget plus what one batch adds, and a restart with the
// budget (stored rows load lazily, the log replays over rows read back) is exact too.
TEST_F(PodStorageTest, TableFiveTimesTheBudgetTrainsExactly) {
  constexpr uint64_t kBudget = 2 << 20;
  constexpr int kRows = 100000;  // Adagrad dim 8: 104 bytes a row, 10.4 MB in all
  constexpr int kBatch = 20000;
  auto open = [&] {
    PsCoreOptions options;
    options.storage.db.dir = dir_;
    options.storage.materialize_ms = 600000;
    options.storage.materialize_on_close = false;
    options.storage.memory_budget_bytes = kBudget;
    options.table.num_stripes = 16;
    auto core = PsCore::Open(options, ShardOwnership::All(16));
    EXPECT_TRUE(core.ok()) << core.status();
    return core.ok() ? *std::move(core) : nullptr;
  };
  PsCore reference(PsCoreOptions(), ShardOwnership::All(16));
  CreateTableRequest create;
  *create.mutable_spec() = Spec(OptimizerSpec::ADAGRAD);
  create.mutable_spec()->set_dim(8);
  CreateTableResponse cr;
  ASSERT_TRUE(reference.CreateTable(create, &cr).ok());
  std::mt19937 rng(12);
  uint64_t seq = 1;
  // One pass of pushes over every row, in batches, to both pods; the durable one
  // materializes (and so evicts) after every batch.
  auto pass = [&](PsCore& core, bool materialize) {
    std::vector<int64_t> order(kRows);
    for (int i = 0; i < kRows; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    auto table = core.store().FindTable("emb");
    for (int b = 0; b < kRows; b += kBatch) {
      PushRequest req;
      req.mutable_key()->set_worker_id(3);
      req.mutable_key()->set_incarnation(1);
      req.mutable_key()->set_sequence(seq++);
      TableGrads* t = req.add_tables();
      t->set_table("emb");
      std::vector<int64_t> ids(order.begin() + b, order.begin() + b + kBatch);
      std::vector<float> grads(ids.size() * 8);
      for (float& g : grads) g = std::uniform_real_distribution<float>(-1, 1)(rng);
      *t->mutable_ids() = Pack<int64_t>(ids);
      *t->mutable_grads() = Pack<float>(grads);
      PushResponse resp;
      ASSERT_TRUE(core.Push(req, &resp).ok());
      ASSERT_TRUE(reference.Push(req, &resp).ok());
      if (!materialize) continue;
      ASSERT_TRUE(core.storage()->Materialize().ok());
      EXPECT_LE(table->rows() * table->row_bytes(), kBudget) << "batch " << b;
    }
  };
  auto compare = [&](PsCore& core) {
    std::vector<int64_t> ids(kRows);
    for (int i = 0; i < kRows; ++i) ids[i] = i;
    PullRequest req;
    TableIds* t = req.add_tables();
    t->set_table("emb");
    *t->mutable_ids() = Pack<int64_t>(ids);
    PullResponse got, want;
    ASSERT_TRUE(core.Pull(req, &got).ok());
    ASSERT_TRUE(reference.Pull(req, &want).ok());
    ASSERT_EQ(got.tables(0).values().size(), want.tables(0).values().size());
    EXPECT_TRUE(got.tables(0).values() == want.tables(0).values()) << "rows differ";
  };
  {
    auto core = open();
    ASSERT_TRUE(core->CreateTable(create, &cr).ok());
    for (int p = 0; p < 3; ++p) pass(*core, true);
    if (HasFatalFailure()) return;
    auto table = core->store().FindTable("emb");
    EXPECT_GT(core->storage()->stats().evicted_rows, uint64_t{kRows});
    // Row storage and index: bounded by the budget plus a batch, not by the table.
    EXPECT_LT(table->memory_bytes(), uint64_t{7} << 20);
    compare(*core);  // reads most rows back
    pass(*core, false);
  }  // a crash: the last pass (not materialized) is in the log only
  auto core = open();
  EXPECT_TRUE(core->storage()->recovery().lazy);
  compare(*core);
  pass(*core, true);
  compare(*core);
}

// A lazy start serves at once: pulls and pushes of rows not loaded yet read them from the
// database (never a fresh initializer), and once the background load is done every row
// equals an eager start's, with the same pushes applied.
TEST_F(PodStorageTest, LazyStartServesStoredRowsWhileLoading) {
  std::mt19937 rng(13);
  {
    auto core = Open(/*materialize_on_close=*/false);
    CreateTableRequest req;
    *req.mutable_spec() = Spec(OptimizerSpec::ADAM);
    CreateTableResponse cr;
    ASSERT_TRUE(core->CreateTable(req, &cr).ok());
    PushSome(*core, 1, 40, &rng);
    ASSERT_TRUE(core->storage()->Materialize().ok());
    // In the log only: few rows, else the lazy start loads eagerly (one scan is cheaper).
    PushSome(*core, 41, 1, &rng);
  }
  const std::string eager_dir = root_ + "/eager";
  std::filesystem::copy(dir_, eager_dir, std::filesystem::copy_options::recursive);
  auto open = [&](const std::string& dir, bool lazy, bool background_load = true) {
    PsCoreOptions options;
    options.storage.db.dir = dir;
    options.storage.materialize_ms = 600000;
    options.storage.lazy_start = lazy;
    options.storage.background_load = background_load;
    auto core = PsCore::Open(options, ShardOwnership::All(16));
    EXPECT_TRUE(core.ok()) << core.status();
    return core.ok() ? *std::move(core) : nullptr;
  };
  auto eager = open(eager_dir, false);
  // First with the background load held back: every row not in the log is read from the
  // database on touch.
  auto lazy = open(dir_, true, /*background_load=*/false);
  EXPECT_TRUE(lazy->storage()->recovery().lazy);
  EXPECT_FALSE(lazy->storage()->rows_loaded());
  EXPECT_LT(lazy->store().FindTable("emb")->rows(), eager->store().FindTable("emb")->rows());
  std::vector<int64_t> ids(51);
  for (int i = 0; i < 51; ++i) ids[i] = i;
  // Straight away: pulls see the stored rows, a push applies to them.
  PullRequest pull;
  pull.add_tables()->set_table("emb");
  *pull.mutable_tables(0)->mutable_ids() = Pack<int64_t>(ids);
  PullResponse got, want;
  ASSERT_TRUE(lazy->Pull(pull, &got).ok());
  ASSERT_TRUE(eager->Pull(pull, &want).ok());
  EXPECT_TRUE(got.tables(0).values() == want.tables(0).values());
  const PushRequest push = MakePush({3, 7, 50, 20}, &rng, 100);
  PushResponse resp;
  ASSERT_TRUE(lazy->Push(push, &resp).ok());
  ASSERT_TRUE(eager->Push(push, &resp).ok());
  EXPECT_FALSE(lazy->storage()->rows_loaded());
  // Then a clean restart with the background load: every row, as the eager pod has it.
  lazy.reset();
  eager.reset();
  eager = open(eager_dir, false);
  lazy = open(dir_, true);
  for (int i = 0; i < 1000 && !lazy->storage()->rows_loaded(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(lazy->storage()->rows_loaded());
  EXPECT_EQ(Snapshot(*lazy), Snapshot(*eager));
}

// Lazy replay: the pod serves before applying its log. A row read back applies its logged
// updates (on the stored row, or on the initial value of a row only the log has), so pulls
// and pushes see exactly what an eager start has; the background load then stores those
// rows, after which the log may be truncated and an eager restart finds every row.
TEST_F(PodStorageTest, LazyReplayServesRecoveredRowsBeforeApplyingTheLog) {
  std::mt19937 rng(17);
  {
    auto core = Open(/*materialize_on_close=*/false);
    CreateTableRequest req;
    *req.mutable_spec() = Spec(OptimizerSpec::ADAM);  // step-dependent: order matters
    CreateTableResponse cr;
    ASSERT_TRUE(core->CreateTable(req, &cr).ok());
    PushSome(*core, 1, 40, &rng);
    ASSERT_TRUE(core->storage()->Materialize().ok());
    PushSome(*core, 41, 40, &rng);  // stored rows updated again, in the log only
    PushResponse resp;
    ASSERT_TRUE(core->Push(MakePush({100, 101, 100}, &rng, 81), &resp).ok());  // log only
    // Whole rows installed by an import (logged installs): over a stored row, a new row
    // then pushed again, and a new row at step 0 (a row exported before any push: a new
    // row takes an install whatever its step).
    ImportRowsRequest import;
    TableRows* rows = import.add_tables();
    rows->set_table("emb");
    *rows->mutable_ids() = Pack<int64_t>({3, 300, 400});
    *rows->mutable_steps() = Pack<uint64_t>({1000, 5, 0});
    std::vector<float> values(3 * 12);  // dim 4 + Adam's 8 slot floats
    for (size_t i = 0; i < values.size(); ++i) values[i] = 0.01f * static_cast<float>(i + 1);
    *rows->mutable_values() = Pack<float>(values);
    ImportRowsResponse imported;
    std::promise<absl::Status> done;
    core->ImportRows(import, &imported, [&done](absl::Status s) { done.set_value(s); });
    ASSERT_TRUE(done.get_future().get().ok());
    ASSERT_EQ(imported.installed(), 3u);
    ASSERT_TRUE(core->Push(MakePush({300, 3}, &rng, 82), &resp).ok());
  }
  const std::string eager_dir = root_ + "/eager";
  std::filesystem::copy(dir_, eager_dir, std::filesystem::copy_options::recursive);
  auto open = [&](const std::string& dir, bool lazy, bool background_load,
                  bool materialize_on_close = true) {
    PsCoreOptions options;
    options.storage.db.dir = dir;
    options.storage.materialize_ms = 600000;
    options.storage.materialize_on_close = materialize_on_close;
    options.storage.lazy_start = lazy;
    options.storage.lazy_replay = lazy;
    options.storage.background_load = background_load;
    auto core = PsCore::Open(options, ShardOwnership::All(16));
    EXPECT_TRUE(core.ok()) << core.status();
    return core.ok() ? *std::move(core) : nullptr;
  };
  std::vector<int64_t> ids;
  for (int64_t i = 0; i <= 51; ++i) ids.push_back(i);  // 51: never pushed
  ids.push_back(100);
  ids.push_back(101);
  ids.push_back(300);
  ids.push_back(400);
  PullRequest pull;
  pull.add_tables()->set_table("emb");
  *pull.mutable_tables(0)->mutable_ids() = Pack<int64_t>(ids);
  const PushRequest push = MakePush({3, 7, 100, 51, 20}, &rng, 200);
  {
    auto eager = open(eager_dir, false, true);
    auto lazy = open(dir_, true, /*background_load=*/false);
    EXPECT_TRUE(lazy->storage()->recovery().lazy_replay);
    EXPECT_GT(lazy->storage()->recovery().replayed_updates, 300u);
    EXPECT_EQ(lazy->store().FindTable("emb")->rows(), 0u);  // nothing applied yet
    PullResponse got, want;
    ASSERT_TRUE(lazy->Pull(pull, &got).ok());
    ASSERT_TRUE(eager->Pull(pull, &want).ok());
    EXPECT_TRUE(got.tables(0).values() == want.tables(0).values());
    PushResponse resp;
    ASSERT_TRUE(lazy->Push(push, &resp).ok());
    EXPECT_FALSE(resp.duplicate());
    ASSERT_TRUE(eager->Push(push, &resp).ok());
    // A logged push is known as applied: its retry is a duplicate.
    ASSERT_TRUE(lazy->Push(MakePush({1}, &rng, 60), &resp).ok());
    EXPECT_TRUE(resp.duplicate());
    // A round stores what was pushed but keeps the log: rows not read yet need it.
    ASSERT_TRUE(lazy->storage()->Materialize().ok());
  }
  // Restart (twice lazily, the second time with the background load), then eagerly.
  auto eager = open(eager_dir, false, true);
  {
    auto lazy = open(dir_, true, /*background_load=*/true, /*materialize_on_close=*/false);
    for (int i = 0; i < 1000 && !lazy->storage()->rows_loaded(); ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    ASSERT_TRUE(lazy->storage()->rows_loaded());
    EXPECT_EQ(Snapshot(*lazy), Snapshot(*eager));
    ASSERT_TRUE(lazy->storage()->Materialize().ok());  // now truncates the log
  }
  auto again = open(dir_, false, true);
  EXPECT_EQ(again->storage()->recovery().replayed_updates, 0u);
  EXPECT_EQ(Snapshot(*again), Snapshot(*eager));
}

// lazy_start_rows: a pod that was not asked to start lazily does so anyway (with lazy
// replay) once its database holds that many rows; below it, it starts eagerly.
TEST_F(PodStorageTest, BigDatabaseStartsLazilyByItself) {
  std::mt19937 rng(21);
  {
    auto core = Open(/*materialize_on_close=*/false);
    CreateTableRequest req;
    *req.mutable_spec() = Spec(OptimizerSpec::ADAGRAD);
    CreateTableResponse cr;
    ASSERT_TRUE(core->CreateTable(req, &cr).ok());
    PushSome(*core, 1, 20, &rng);
    ASSERT_TRUE(core->storage()->Materialize().ok());
    PushSome(*core, 21, 5, &rng);  // in the log only
  }
  const std::string copy = root_ + "/copy";
  std::filesystem::copy(dir_, copy, std::filesystem::copy_options::recursive);
  auto open = [&](const std::string& dir, uint64_t lazy_start_rows) {
    PsCoreOptions options;
    options.storage.db.dir = dir;
    options.storage.materialize_ms = 600000;
    options.storage.materialize_on_close = false;
    options.storage.lazy_start_rows = lazy_start_rows;
    auto core = PsCore::Open(options, ShardOwnership::All(16));
    EXPECT_TRUE(core.ok()) << core.status();
    return core.ok() ? *std::move(core) : nullptr;
  };
  auto eager = open(copy, /*lazy_start_rows=*/1000000);
  EXPECT_FALSE(eager->storage()->recovery().lazy);
  auto lazy = open(dir_, /*lazy_start_rows=*/10);
  EXPECT_TRUE(lazy->storage()->recovery().lazy);
  EXPECT_TRUE(lazy->storage()->recovery().lazy_replay);
  for (int i = 0; i < 1000 && !lazy->storage()->rows_loaded(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(lazy->storage()->rows_loaded());
  EXPECT_EQ(Snapshot(*lazy), Snapshot(*eager));
}

// A vshard move's destination logs what it installs, as an import does: after FinishImport
// a kill -9 of the destination loses nothing, the rows come back from the push log (no
// stored row yet), and once a round has stored them they come back from the rows.
TEST_F(PodStorageTest, MovedRowsSurviveARestartOfTheDestinationFromTheLog) {
  constexpr uint32_t kVShards = 16;
  const std::vector<uint32_t> moving = {1, 6, 11};
  PsCore source(PsCoreOptions(), ShardOwnership::All(kVShards));
  CreateTableRequest create;
  *create.mutable_spec() = Spec(OptimizerSpec::ADAM);
  CreateTableResponse cr;
  ASSERT_TRUE(source.CreateTable(create, &cr).ok());
  CreateDenseRequest dense;
  dense.mutable_spec()->set_name("w");
  dense.mutable_spec()->add_shape(3);
  dense.mutable_spec()->mutable_optimizer()->set_kind(OptimizerSpec::MOMENTUM);
  CreateDenseResponse dr;
  ASSERT_TRUE(source.CreateDense(dense, &dr).ok());
  std::mt19937 rng(23);
  PushSome(source, 1, 30, &rng);
  // Anonymous (no push key): a copy that brings keys is stored at FinishImport at once
  // (ps_core_copy_dedup_test), and this test is about the log path.
  DensePushRequest dpush;
  DenseGrads* g = dpush.add_tensors();
  g->set_name("w");
  *g->mutable_grads() = Pack<float>(std::vector<float>{1, 2, 3});
  PushResponse pr;
  ASSERT_TRUE(source.PushDense(dpush, &pr).ok());
  // The dense tensor routes to one vshard: move that one too.
  std::vector<uint32_t> vshards = moving;
  vshards.push_back(DenseVShard("w", kVShards));
  MigrateBeginRequest begin;
  begin.set_move_id(1);
  for (uint32_t v : vshards) begin.add_vshards(v);
  MigrateBeginResponse begun;
  ASSERT_TRUE(source.MigrateBegin(begin, &begun).ok());
  ASSERT_GT(begun.rows(), 0u);

  auto moved_rows = [&](PsCore& core) {
    std::map<int64_t, std::vector<float>> rows;
    const uint64_t h = NameHash("emb");
    for (const auto& [id, row] : Snapshot(core)) {
      const uint32_t v = VShardOf(RouteHash(h, id), kVShards);
      if (std::count(vshards.begin(), vshards.end(), v) > 0) rows[id] = row;
    }
    return rows;
  };
  auto dense_of = [](PsCore& core) {
    std::vector<float> v(3);
    core.store().FindDense("w")->Pull(v.data());
    v.push_back(static_cast<float>(core.store().FindDense("w")->step()));
    return v;
  };
  const auto expected = moved_rows(source);
  const auto expected_dense = dense_of(source);
  {
    auto b = Open(/*materialize_on_close=*/false);
    ASSERT_TRUE(b->BeginImport(1, vshards).ok());
    for (auto phase : {MigrateExportRequest::SNAPSHOT, MigrateExportRequest::FINAL}) {
      MigrateExportRequest req;
      req.set_move_id(1);
      req.set_phase(phase);
      req.set_max_bytes(256);
      for (;;) {
        MigrateExportResponse chunk;
        ASSERT_TRUE(source.MigrateExport(req, &chunk).ok());
        uint64_t rows = 0, bytes = 0;
        ASSERT_TRUE(b->ImportChunk(chunk, &rows, &bytes).ok());
        if (chunk.done()) break;
        req.set_cursor(chunk.next_cursor());
      }
    }
    ASSERT_TRUE(b->FinishImport().ok());
    EXPECT_EQ(moved_rows(*b), expected);
  }  // killed: nothing materialized
  {
    auto b = Open(/*materialize_on_close=*/false);
    // FinishImport stores a copy that carries a de-duplication state at once (a round:
    // ps_core_copy_dedup_test), so the rows come back from the log or the stored rows.
    EXPECT_GT(b->storage()->recovery().rows + b->storage()->recovery().log_records, 0u);
    EXPECT_EQ(moved_rows(*b), expected);
    EXPECT_EQ(dense_of(*b), expected_dense);
    ASSERT_TRUE(b->storage()->Materialize().ok());
  }
  auto b = Open(/*materialize_on_close=*/false);
  EXPECT_EQ(b->storage()->recovery().rows, expected.size());
  EXPECT_EQ(b->storage()->recovery().log_records, 0u);
  EXPECT_EQ(moved_rows(*b), expected);
  EXPECT_EQ(dense_of(*b), expected_dense);
}

TEST_F(PodStorageTest, RefusesDirectoriesThatAreNotAPodDatabase) {
  std::filesystem::create_directories(dir_);
  std::ofstream(dir_ + "/stray.txt") << "not a database";
  PsCoreOptions options;
  options.storage.db.dir = dir_;
  auto core = PsCore::Open(options, ShardOwnership::All(16));
  ASSERT_FALSE(core.ok());
  EXPECT_EQ(core.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(core.status().message().find("no CURRENT"), std::string::npos) << core.status();

  // A real database with a damaged MANIFEST is refused, not silently recreated.
  std::filesystem::remove_all(dir_);
  { auto ok = Open(false); }
  for (const auto& f : std::filesystem::directory_iterator(dir_)) {
    if (f.path().filename().string().rfind("MANIFEST", 0) == 0) {
      std::ofstream(f.path(), std::ios::trunc) << "garbage";
    }
  }
  core = PsCore::Open(options, ShardOwnership::All(16));
  ASSERT_FALSE(core.ok());
  EXPECT_NE(core.status().code(), absl::StatusCode::kOk);
}

}  // namespace
}  // namespace ps
