#include "embedding/embedding_table.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "common/routing/hash.h"
#include "embedding/spec.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

TableSpec Spec(uint32_t dim, OptimizerSpec::Kind opt = OptimizerSpec::SGD) {
  TableSpec t;
  t.set_name("emb");
  t.set_dim(dim);
  t.mutable_initializer()->set_kind(InitializerSpec::UNIFORM);
  t.mutable_initializer()->set_low(-1);
  t.mutable_initializer()->set_high(1);
  t.mutable_optimizer()->set_kind(opt);
  t.mutable_optimizer()->set_learning_rate(1.0f);
  return t;
}

std::unique_ptr<EmbeddingTable> Make(const TableSpec& spec, int stripes = 256) {
  TableOptions options;
  options.num_stripes = stripes;
  auto t = EmbeddingTable::Create(spec, options);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(t).value();
}

std::vector<float> Initial(const TableSpec& spec, int64_t id) {
  std::vector<float> out(spec.dim());
  Initializer(*NormalizeInitializer(spec.initializer()))
      .Fill(NameHash(spec.name()), id, out.data(), spec.dim());
  return out;
}

TEST(EmbeddingTableTest, PullCreatesRowsAtTheirInitialValue) {
  auto t = Make(Spec(5));
  std::vector<int64_t> ids = {3, -7, 3, 1LL << 60};
  std::vector<float> out(ids.size() * 5);
  t->Pull(ids, out.data(), /*read_only=*/false);
  EXPECT_EQ(t->rows(), 3u);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(std::vector<float>(out.begin() + i * 5, out.begin() + (i + 1) * 5),
              Initial(t->spec(), ids[i]));
  }
}

TEST(EmbeddingTableTest, EraseRemovesRowsAndTheirSlotsAreReused) {
  const TableSpec spec = Spec(4, OptimizerSpec::SGD);
  auto t = Make(spec, /*stripes=*/1);  // one stripe: the re-created rows reuse the slots
  std::vector<int64_t> ids = {1, 2, 3, 4};
  std::vector<float> grads(ids.size() * 4, 1.0f);
  t->Push(ids, grads.data(), 0);
  EXPECT_EQ(t->Erase({2, 4, 99}), 2u);  // 99 never existed
  EXPECT_EQ(t->rows(), 2u);
  std::vector<int64_t> seen;
  t->ForEachRow([&](const RowView& r) { seen.push_back(r.id); });
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 3}));
  EXPECT_FALSE(t->Inspect(2, [](const RowView&) {}));
  // Created again, an erased row starts over at its initial value; others are untouched.
  const uint64_t before = t->memory_bytes();
  std::vector<float> out(8);
  t->Pull({2, 5}, out.data(), /*read_only=*/false);
  EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + 4), Initial(spec, 2));
  EXPECT_EQ(t->rows(), 4u);
  EXPECT_EQ(t->memory_bytes(), before);  // the freed slots took them
  std::vector<float> one(4);
  t->Pull({1}, one.data(), false);
  std::vector<float> expected = Initial(spec, 1);
  for (float& v : expected) v -= 1.0f;
  EXPECT_EQ(one, expected);
}

TEST(EmbeddingTableTest, ReadOnlyPullDoesNotCreate) {
  auto t = Make(Spec(4));
  std::vector<int64_t> ids = {10, 11};
  std::vector<float> out(8);
  t->Pull(ids, out.data(), /*read_only=*/true);
  EXPECT_EQ(t->rows(), 0u);
  EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + 4), Initial(t->spec(), 10));
}

TEST(EmbeddingTableTest, PushAppliesInOrderIncludingDuplicates) {
  auto t = Make(Spec(2));
  std::vector<int64_t> ids = {1, 1, 2};
  std::vector<float> grads = {0.5f, 1.0f, 0.25f, 0.25f, -1.0f, 2.0f};
  t->Push(ids, grads.data(), 0);
  std::vector<float> out(4);
  std::vector<int64_t> pull = {1, 2};
  t->Pull(pull, out.data(), false);
  auto i1 = Initial(t->spec(), 1), i2 = Initial(t->spec(), 2);
  EXPECT_FLOAT_EQ(out[0], i1[0] - 0.75f);
  EXPECT_FLOAT_EQ(out[1], i1[1] - 1.25f);
  EXPECT_FLOAT_EQ(out[2], i2[0] + 1.0f);
  EXPECT_FLOAT_EQ(out[3], i2[1] - 2.0f);
  t->Inspect(1, [](const RowView& row) { EXPECT_EQ(row.step, 2u); });
}

TEST(EmbeddingTableTest, OptimizerStateLivesBesideTheRow) {
  TableSpec spec = Spec(3, OptimizerSpec::ADAGRAD);
  spec.mutable_optimizer()->set_initial_accumulator(0.5f);
  auto t = Make(spec);
  std::vector<int64_t> ids = {42};
  std::vector<float> grads = {1.0f, 2.0f, 0.0f};
  t->Push(ids, grads.data(), 0);
  bool found = t->Inspect(42, [](const RowView& row) {
    EXPECT_FLOAT_EQ(row.slots[0], 1.5f);
    EXPECT_FLOAT_EQ(row.slots[1], 4.5f);
    EXPECT_FLOAT_EQ(row.slots[2], 0.5f);
    EXPECT_EQ(row.step, 1u);
  });
  EXPECT_TRUE(found);
  EXPECT_FALSE(t->Inspect(43, [](const RowView&) {}));
}

TEST(EmbeddingTableTest, ManyRowsAcrossBlocksKeepTheirValues) {
  auto t = Make(Spec(64), 4);  // few stripes: many blocks per stripe
  const int n = 20000;
  std::vector<int64_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = i * 7919LL;
  std::vector<float> grads(n * 64);
  for (int i = 0; i < n * 64; ++i) grads[i] = static_cast<float>(i % 97);
  t->Push(ids, grads.data(), 0);
  EXPECT_EQ(t->rows(), static_cast<uint64_t>(n));
  std::vector<float> out(n * 64);
  t->Pull(ids, out.data(), false);
  for (int i = 0; i < n; i += 997) {
    auto init = Initial(t->spec(), ids[i]);
    for (int j = 0; j < 64; ++j) {
      ASSERT_FLOAT_EQ(out[i * 64 + j], init[j] - grads[i * 64 + j]) << i << "," << j;
    }
  }
  EXPECT_GT(t->memory_bytes(), static_cast<uint64_t>(n) * 64 * 4);
}

TEST(EmbeddingTableTest, ConcurrentPushAndPullFromManyThreads) {
  // 8 threads push +1 to every element of 1000 shared rows, 200 times each, while 2 more
  // pull and check that each row they see is whole (all elements moved together).
  TableSpec spec = Spec(16);
  spec.mutable_initializer()->set_kind(InitializerSpec::ZEROS);
  auto t = Make(spec, 8);
  const int kRows = 1000, kPushers = 8, kRounds = 200;
  std::vector<int64_t> ids(kRows);
  for (int i = 0; i < kRows; ++i) ids[i] = i;
  std::vector<float> minus_one(kRows * 16, -1.0f);
  std::atomic<bool> stop{false};
  std::atomic<int> torn{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < kPushers; ++p) {
    threads.emplace_back([&, p] {
      std::vector<int64_t> mine = ids;
      std::shuffle(mine.begin(), mine.end(), std::mt19937(p));
      for (int r = 0; r < kRounds; ++r) t->Push(mine, minus_one.data(), 1.0f);
    });
  }
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      std::vector<float> out(kRows * 16);
      while (!stop.load()) {
        t->Pull(ids, out.data(), false);
        for (int i = 0; i < kRows; ++i) {
          for (int j = 1; j < 16; ++j) {
            if (out[i * 16 + j] != out[i * 16]) torn.fetch_add(1);
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  stop = true;
  for (auto& th : readers) th.join();
  EXPECT_EQ(torn.load(), 0);
  std::vector<float> out(kRows * 16);
  t->Pull(ids, out.data(), false);
  for (float v : out) ASSERT_EQ(v, kPushers * kRounds);
  EXPECT_EQ(t->rows(), static_cast<uint64_t>(kRows));
}

// A pull copies rows without their lock, as a seqlock reader; it must still never return
// a row halfway through a push. One pusher updates a few wide rows as fast as it can
// while the main thread pulls them 20,000 times: every row pulled has all its elements
// equal. (Verified to fail when the pull skips its version check.)
TEST(EmbeddingTableTest, PullNeverSeesAHalfPushedRow) {
  constexpr uint32_t kDim = 1024;
  TableSpec spec = Spec(kDim);
  spec.mutable_initializer()->set_kind(InitializerSpec::ZEROS);
  auto t = Make(spec, 2);
  std::vector<int64_t> ids = {1, 2, 3, 4};
  std::vector<float> minus_one(ids.size() * kDim, -1.0f);
  std::vector<float> out(ids.size() * kDim);
  t->Pull(ids, out.data(), false);  // create the rows
  std::atomic<bool> stop{false};
  std::atomic<int> pushes{0};
  std::thread pusher([&] {
    while (!stop.load()) {
      t->Push(ids, minus_one.data(), 1.0f);
      pushes.fetch_add(1);
    }
  });
  while (pushes.load() == 0) std::this_thread::yield();
  int torn = 0;
  const int pulls = 20000;
  for (int p = 0; p < pulls; ++p) {
    t->Pull(ids, out.data(), false);
    for (size_t i = 0; i < ids.size(); ++i) {
      for (uint32_t j = 1; j < kDim; ++j) {
        if (out[i * kDim + j] != out[i * kDim]) {
          ++torn;
          break;
        }
      }
    }
  }
  stop = true;
  pusher.join();
  EXPECT_EQ(torn, 0) << "in " << pulls << " pulls, " << pushes.load() << " pushes";
  t->Pull(ids, out.data(), false);
  for (float v : out) ASSERT_EQ(v, static_cast<float>(pushes.load()));
}

// The rules of logged updates (embedding/row_rules.h, shared with a pod's lazy replay):
// a replayed gradient or an install applies only to a row with fewer updates than its
// step, and a new row takes an install at any step, step 0 included.
TEST(EmbeddingTableTest, ReplayAndInstallSkipWhatARowHasAlready) {
  TableSpec spec = Spec(2);
  spec.mutable_initializer()->set_kind(InitializerSpec::ZEROS);
  auto t = Make(spec);
  const std::vector<float> g = {-1.0f, -2.0f};
  t->Replay(1, g.data(), 1.0f, 1);  // creates row 1 and applies: step 1
  t->Replay(1, g.data(), 1.0f, 1);  // already has it
  t->Replay(1, g.data(), 1.0f, 2);  // step 2
  std::vector<float> out(2);
  t->Pull(std::vector<int64_t>{1}, out.data(), true);
  EXPECT_EQ(out, (std::vector<float>{2.0f, 4.0f}));
  const std::vector<float> w = {7.0f, 8.0f};
  EXPECT_FALSE(t->Install(1, w.data(), w.data(), 2));  // SGD: no slots. Has 2 updates
  EXPECT_TRUE(t->Install(1, w.data(), w.data(), 3));
  t->Pull(std::vector<int64_t>{1}, out.data(), true);
  EXPECT_EQ(out, w);
  EXPECT_TRUE(t->Install(2, w.data(), w.data(), 0));  // a new row, at step 0
  t->Pull(std::vector<int64_t>{2}, out.data(), true);
  EXPECT_EQ(out, w);
  bool seen = false;
  t->Inspect(1, [&](const RowView& row) {
    EXPECT_EQ(row.step, 3u);
    seen = true;
  });
  EXPECT_TRUE(seen);
}

// ReplayRows (a follower's batched replay) leaves every row bit-identical to the table
// that pushed, and to Replay one row at a time: updates in step order, duplicates within
// an entry in order, steps a row already has skipped, step 0 (admission dropped) no row.
TEST(EmbeddingTableTest, ReplayRowsMatchesThePushAndReplayOneByOne) {
  for (auto opt : {OptimizerSpec::ADAGRAD, OptimizerSpec::ADAM}) {
    const TableSpec spec = Spec(8, opt);
    auto pushed = Make(spec);
    auto batched = Make(spec, /*stripes=*/4);  // few stripes: groups share them
    auto single = Make(spec);
    std::mt19937_64 rng(7);
    for (int round = 0; round < 30; ++round) {
      std::vector<int64_t> ids(100);
      for (int64_t& id : ids) id = static_cast<int64_t>(rng() % 64);  // duplicates
      std::vector<float> grads(ids.size() * 8);
      for (float& g : grads) g = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 997;
      const float lr = 0.01f * static_cast<float>(round % 3 + 1);
      std::vector<uint64_t> steps(ids.size());
      pushed->Push(ids, grads.data(), lr, steps.data());
      steps.push_back(0);  // an admission-dropped push of a row never seen: no row
      ids.push_back(1000);
      grads.resize(ids.size() * 8, 1.0f);
      batched->ReplayRows(ids, grads.data(), lr, steps);
      if (round % 5 == 0) batched->ReplayRows(ids, grads.data(), lr, steps);  // again: no-op
      for (size_t i = 0; i < ids.size(); ++i) {
        single->Replay(ids[i], grads.data() + i * 8, lr, steps[i]);
      }
    }
    auto rows = [](EmbeddingTable& t) {
      std::map<int64_t, std::vector<float>> out;
      t.ForEachRow([&](const RowView& r) {
        std::vector<float>& v = out[r.id];
        v.assign(r.weights, r.weights + 8);
        v.insert(v.end(), r.slots, r.slots + t.slot_floats());
        v.push_back(static_cast<float>(r.step));
      });
      return out;
    };
    const auto want = rows(*pushed);
    ASSERT_EQ(want.size(), 64u);
    EXPECT_EQ(rows(*batched), want) << OptimizerSpec::Kind_Name(opt);
    EXPECT_EQ(rows(*single), want) << OptimizerSpec::Kind_Name(opt);
  }
}

// Delete removes rows and, with track_dirty, reports every deleted id once to the next
// CollectDirty, except one re-created since (its new row is reported as dirty instead).
TEST(EmbeddingTableTest, DeleteReportsDeletionsToTheNextCollection) {
  TableOptions options;
  options.track_dirty = true;
  auto t = *EmbeddingTable::Create(Spec(2, OptimizerSpec::ADAM), options);
  const std::vector<float> g = {1, 1};
  for (int64_t id : {1, 2, 3}) t->Push({id}, g.data(), 0.f);
  t->CollectDirty([](const RowView&) {});
  EXPECT_EQ(t->Delete({1, 2, 9}), 2u);
  EXPECT_EQ(t->rows(), 1u);
  uint64_t step = 99;
  t->Push({2}, g.data(), 0.f, &step);
  EXPECT_EQ(step, 1u);  // came back: counts from 0 again
  std::vector<int64_t> dirty, deleted;
  t->CollectDirty([&](const RowView& r) { dirty.push_back(r.id); }, nullptr,
                  [&](int64_t id) { deleted.push_back(id); });
  std::sort(deleted.begin(), deleted.end());
  EXPECT_EQ(dirty, std::vector<int64_t>{2});
  EXPECT_EQ(deleted, (std::vector<int64_t>{1, 9}));
  deleted.clear();
  t->CollectDirty([](const RowView&) {}, nullptr, [&](int64_t id) { deleted.push_back(id); });
  EXPECT_TRUE(deleted.empty());
  // The re-created row is a fresh row's state after one update.
  auto fresh = Make(Spec(2, OptimizerSpec::ADAM));
  fresh->Push({2}, g.data(), 0.f);
  float a[2], b[2];
  t->Pull({2}, a, true);
  fresh->Pull({2}, b, true);
  EXPECT_EQ(std::vector<float>(a, a + 2), std::vector<float>(b, b + 2));
}

// Admission (min_count 3): the first two pushes of an id are counted and dropped (step 0,
// no row), a training pull returns the initial value without creating the row, and the
// third push creates it and applies its gradient: the row a fresh table makes of that one
// push.
TEST(EmbeddingTableTest, AdmissionCreatesTheRowAtTheNthPush) {
  TableSpec spec = Spec(2, OptimizerSpec::ADAM);
  spec.mutable_admission()->set_min_count(3);
  auto t = Make(spec);
  ASSERT_NE(t->admission(), nullptr);
  const std::vector<float> g1 = {1, 2}, g2 = {3, 4}, g3 = {-1, 0.5f};
  uint64_t step = 99;
  t->Push({5}, g1.data(), 0.f, &step);
  EXPECT_EQ(step, 0u);
  float out[2];
  t->Pull({5}, out, /*read_only=*/false);  // a training pull
  EXPECT_EQ(std::vector<float>(out, out + 2), Initial(spec, 5));
  EXPECT_EQ(t->rows(), 0u);
  t->Push({5}, g2.data(), 0.f, &step);
  EXPECT_EQ(step, 0u);
  EXPECT_EQ(t->rows(), 0u);
  t->Push({5}, g3.data(), 0.f, &step);
  EXPECT_EQ(step, 1u);
  EXPECT_EQ(t->rows(), 1u);
  auto fresh = Make(Spec(2, OptimizerSpec::ADAM));
  fresh->Push({5}, g3.data(), 0.f);
  float a[2], b[2];
  t->Pull({5}, a, true);
  fresh->Pull({5}, b, true);
  EXPECT_EQ(std::vector<float>(a, a + 2), std::vector<float>(b, b + 2));
  t->Push({5}, g1.data(), 0.f, &step);  // admitted: every push applies
  EXPECT_EQ(step, 2u);
  t->Push({6}, g1.data(), 0.f, &step);
  EXPECT_EQ(t->admission()->admitted(), 1u);
  EXPECT_EQ(t->admission()->dropped(), 3u);
  EXPECT_EQ(t->admission()->pending(), 1u);  // id 6
  // A table without admission creates at the first push, and has no counters.
  EXPECT_EQ(fresh->admission(), nullptr);
}

// Each row block carries its rows' ids and last-update stamps: over many blocks of one
// stripe, through deletion and slot reuse, every row reports its own id and stamp, and
// DeleteStale goes by the stamps.
TEST(EmbeddingTableTest, IdsAndStampsFollowTheirRowsAcrossBlocks) {
  TableSpec spec = Spec(4, OptimizerSpec::SGD);
  spec.mutable_eviction()->set_max_rows(1000000);  // stamped rows
  int64_t now = 1000;
  TableOptions options;
  options.num_stripes = 1;  // every row in one stripe: about 744 rows a block here
  options.clock = [&now] { return now; };
  auto t = *EmbeddingTable::Create(spec, options);
  const std::vector<float> g(4, 0.5f);
  std::map<int64_t, uint32_t> expected;  // id -> stamp
  auto push = [&](int64_t first, int64_t count) {
    for (int64_t id = first; id < first + count; ++id) {
      t->Push({id * 7919}, g.data(), 0.f);
      expected[id * 7919] = t->now_stamp();
    }
  };
  auto check = [&] {
    std::map<int64_t, uint32_t> seen;
    t->ForEachRow([&](const RowView& r) {
      EXPECT_TRUE(seen.emplace(r.id, r.updated).second) << r.id;
      EXPECT_EQ(r.step, 1u) << r.id;
      const std::vector<float> init = Initial(spec, r.id);
      for (int j = 0; j < 4; ++j) ASSERT_FLOAT_EQ(r.weights[j], init[j] - 0.5f) << r.id;
    });
    EXPECT_EQ(seen, expected);
  };
  push(0, 2000);
  now += 10;
  push(2000, 2000);
  check();
  // The first 2000 are older than stamp 10: DeleteStale takes exactly those of a list
  // that mixes both.
  std::vector<int64_t> candidates, deleted;
  for (int64_t id = 1000; id < 3000; ++id) candidates.push_back(id * 7919);
  t->DeleteStale(candidates, /*updated_before=*/10, &deleted);
  EXPECT_EQ(deleted.size(), 1000u);
  for (int64_t id : deleted) {
    EXPECT_LT(expected.at(id), 10u) << id;
    expected.erase(id);
  }
  check();
  // New rows reuse the freed slots, in the first blocks, with their own ids and stamps.
  now += 10;
  push(5000, 1500);
  EXPECT_EQ(t->rows(), expected.size());
  check();
}

TEST(EmbeddingTableTest, RejectsBadStripeCount) {
  TableOptions options;
  options.num_stripes = 12;
  EXPECT_FALSE(EmbeddingTable::Create(Spec(4), options).ok());
}

}  // namespace
}  // namespace ps
