// Live migration on the pod side, in process: de-duplication before ownership, a move from
// one PsCore to another (snapshot, catch-up, fence, commit, drop), durability of what the
// destination received, an aborted move, and imports (ps-transfer) during a move, which
// take the same path as pushes.
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>

#include "absl/synchronization/notification.h"
#include "common/routing/hash.h"
#include "gtest/gtest.h"
#include "proto/packed.h"
#include "ps/pod_transfer.h"
#include "ps/ps_core.h"
#include "ps/replica_test_pods.h"

namespace ps {
namespace {

constexpr uint32_t kVShards = 16;

PushRequest MakePush(const std::vector<int64_t>& ids, float g, uint64_t seq) {
  PushRequest req;
  TableGrads* t = req.add_tables();
  t->set_table("emb");
  t->set_ids(Pack<int64_t>(ids));
  t->set_grads(Pack<float>(std::vector<float>(ids.size() * 2, g)));
  req.mutable_key()->set_worker_id(7);
  req.mutable_key()->set_incarnation(1);
  req.mutable_key()->set_sequence(seq);
  return req;
}

uint32_t VShardOfId(int64_t id) { return VShardOf(RouteHash(NameHash("emb"), id), kVShards); }

Assignment Assign(uint64_t epoch, std::vector<uint32_t> owned, std::vector<uint32_t> in = {},
                  std::vector<uint32_t> out = {}) {
  Assignment a;
  a.set_epoch(epoch);
  a.set_num_vshards(kVShards);
  for (uint32_t v : owned) a.add_owned(v);
  for (uint32_t v : in) a.add_moving_in(v);
  for (uint32_t v : out) a.add_moving_out(v);
  return a;
}

std::vector<uint32_t> Range(uint32_t begin, uint32_t end) {
  std::vector<uint32_t> v;
  for (uint32_t i = begin; i < end; ++i) v.push_back(i);
  return v;
}

class MigrateTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string templ = std::filesystem::temp_directory_path() / "ps_core_migrate_test.XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    root_ = templ;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::unique_ptr<PsCore> Open(const std::string& name, int eviction_interval_ms = 1000) {
    PsCoreOptions options;
    options.eviction_interval_ms = eviction_interval_ms;
    options.storage.db.dir = root_ + "/" + name;
    options.storage.materialize_ms = 600000;
    options.storage.materialize_on_close = false;  // as a kill -9 would leave it
    auto core = PsCore::Open(options, *ShardOwnership::Create(kVShards, 0, {}));
    EXPECT_TRUE(core.ok()) << core.status();
    return core.ok() ? *std::move(core) : nullptr;
  }

  static void CreateTable(PsCore& core, uint64_t max_rows = 0) {
    CreateTableRequest req;
    req.mutable_spec()->set_name("emb");
    req.mutable_spec()->set_dim(2);
    req.mutable_spec()->mutable_eviction()->set_max_rows(max_rows);
    req.mutable_spec()->mutable_optimizer()->set_kind(OptimizerSpec::ADAGRAD);
    req.mutable_spec()->mutable_optimizer()->set_learning_rate(0.5f);
    CreateTableResponse resp;
    ASSERT_TRUE(core.CreateTable(req, &resp).ok());
  }

  // Every export chunk of a phase from `a`, imported into `b`; `between(chunk)` (if set)
  // runs after each chunk but the last is imported.
  static void Copy(PsCore& a, PsCore& b, uint64_t move, MigrateExportRequest::Phase phase,
                   const std::function<void(const MigrateExportResponse&)>& between = nullptr) {
    MigrateExportRequest req;
    req.set_move_id(move);
    req.set_phase(phase);
    req.set_max_bytes(64);  // a few rows per chunk: exercises the cursor
    for (;;) {
      MigrateExportResponse chunk;
      ASSERT_TRUE(a.MigrateExport(req, &chunk).ok());
      uint64_t rows = 0, bytes = 0;
      absl::Status imported = b.ImportChunk(chunk, &rows, &bytes);
      ASSERT_TRUE(imported.ok()) << imported;
      if (chunk.done()) return;
      if (between) between(chunk);
      req.set_cursor(chunk.next_cursor());
    }
  }

  // id -> (weights, slots, step) of every row in `vshards`.
  static std::map<int64_t, std::vector<float>> Rows(PsCore& core, const std::vector<uint32_t>& vs) {
    std::map<int64_t, std::vector<float>> rows;
    auto t = core.store().FindTable("emb");
    if (t == nullptr) return rows;
    t->ForEachRow([&](const RowView& r) {
      if (std::find(vs.begin(), vs.end(), VShardOfId(r.id)) == vs.end()) return;
      std::vector<float> v(r.weights, r.weights + 2);
      v.insert(v.end(), r.slots, r.slots + t->slot_floats());
      v.push_back(static_cast<float>(r.step));
      rows[r.id] = v;
    });
    return rows;
  }

  // Whole rows of "emb" (dim 2, Adagrad: 4 floats a row) at `step`, every float `value`.
  static ImportRowsRequest MakeImport(const std::vector<int64_t>& ids, uint64_t step, float value) {
    ImportRowsRequest req;
    TableRows* t = req.add_tables();
    t->set_table("emb");
    t->set_ids(Pack<int64_t>(ids));
    t->set_steps(Pack<uint64_t>(std::vector<uint64_t>(ids.size(), step)));
    t->set_values(Pack<float>(std::vector<float>(ids.size() * 4, value)));
    return req;
  }

  // A, owning every vshard, with rows 0..99 pushed once; B, owning none; and a move of
  // `moving` from A to B begun (tracking on A, receiving on B), before any copy.
  void StartMove(const std::vector<uint32_t>& moving, uint64_t move_id) {
    a_ = Open("a");
    b_ = Open("b");
    ASSERT_TRUE(a_ && b_);
    ApplyAssignmentResponse ar;
    ASSERT_TRUE(a_->ApplyAssignment(Assign(1, Range(0, kVShards)), &ar).ok());
    ASSERT_TRUE(b_->ApplyAssignment(Assign(1, {}), &ar).ok());
    CreateTable(*a_);
    std::vector<int64_t> ids;
    for (int64_t id = 0; id < 100; ++id) ids.push_back(id);
    PushResponse resp;
    ASSERT_TRUE(a_->Push(MakePush(ids, 1, 1), &resp).ok());
    ASSERT_TRUE(a_->ApplyAssignment(Assign(2, Range(0, kVShards), {}, moving), &ar).ok());
    ASSERT_TRUE(b_->ApplyAssignment(Assign(2, {}, moving), &ar).ok());
    MigrateBeginRequest begin;
    begin.set_move_id(move_id);
    for (uint32_t v : moving) begin.add_vshards(v);
    MigrateBeginResponse begun;
    ASSERT_TRUE(a_->MigrateBegin(begin, &begun).ok());
    ASSERT_TRUE(b_->BeginImport(move_id, moving).ok());
  }

  // The first id in 0..99 whose vshard is (or is not) in `vshards`.
  static int64_t IdIn(const std::vector<uint32_t>& vshards, bool in) {
    for (int64_t id = 0; id < 100; ++id) {
      if ((std::count(vshards.begin(), vshards.end(), VShardOfId(id)) > 0) == in) return id;
    }
    return -1;
  }

  std::string root_;
  std::unique_ptr<PsCore> a_, b_;
};

// A move carries the moving vshards' admission counters (issue 17) exactly, durably on
// the destination, so an id pushed once on the source is admitted at its second push on
// the destination.
TEST_F(MigrateTest, MoveCarriesAdmissionCountersExactly) {
  auto a = Open("a");
  auto b = Open("b");
  ASSERT_TRUE(a && b);
  ApplyAssignmentResponse ar;
  ASSERT_TRUE(a->ApplyAssignment(Assign(1, Range(0, kVShards)), &ar).ok());
  ASSERT_TRUE(b->ApplyAssignment(Assign(1, {}), &ar).ok());
  CreateTableRequest create;
  create.mutable_spec()->set_name("emb");
  create.mutable_spec()->set_dim(2);
  create.mutable_spec()->mutable_optimizer()->set_kind(OptimizerSpec::ADAGRAD);
  create.mutable_spec()->mutable_admission()->set_min_count(2);
  CreateTableResponse cr;
  ASSERT_TRUE(a->CreateTable(create, &cr).ok());
  std::vector<int64_t> once, twice;
  for (int64_t id = 0; id < 400; ++id) (id < 200 ? twice : once).push_back(id);
  uint64_t seq = 1;
  PushResponse resp;
  ASSERT_TRUE(a->Push(MakePush(twice, 1, seq++), &resp).ok());
  ASSERT_TRUE(a->Push(MakePush(twice, 1, seq++), &resp).ok());
  ASSERT_TRUE(a->Push(MakePush(once, 1, seq++), &resp).ok());

  const std::vector<uint32_t> moving = {1, 5, 9};
  ASSERT_TRUE(a->ApplyAssignment(Assign(2, Range(0, kVShards), {}, moving), &ar).ok());
  ASSERT_TRUE(b->ApplyAssignment(Assign(2, {}, moving), &ar).ok());
  MigrateBeginRequest begin;
  begin.set_move_id(4);
  for (uint32_t v : moving) begin.add_vshards(v);
  MigrateBeginResponse begun;
  ASSERT_TRUE(a->MigrateBegin(begin, &begun).ok());
  ASSERT_TRUE(b->BeginImport(4, moving).ok());
  Copy(*a, *b, 4, MigrateExportRequest::SNAPSHOT);
  // Counted during the copy: only the fenced FINAL copy has it.
  ASSERT_TRUE(a->Push(MakePush({1000, 1001, 1002, 1003}, 1, seq++), &resp).ok());
  Copy(*a, *b, 4, MigrateExportRequest::FINAL);
  ASSERT_TRUE(b->FinishImport().ok());
  const std::string counters = a->store().FindTable("emb")->admission()->SerializeVShards(moving);
  EXPECT_EQ(Rows(*b, moving), Rows(*a, moving));
  EXPECT_EQ(b->store().FindTable("emb")->admission()->SerializeVShards(moving), counters);
  b.reset();  // killed: the counters come back from B's log
  b = Open("b");
  ASSERT_TRUE(b->ApplyAssignment(Assign(3, moving), &ar).ok());
  EXPECT_EQ(b->store().FindTable("emb")->admission()->SerializeVShards(moving), counters);
  int64_t id = -1;
  for (int64_t x : once) {
    if (std::count(moving.begin(), moving.end(), VShardOfId(x)) > 0) {
      id = x;
      break;
    }
  }
  ASSERT_GE(id, 0);
  ASSERT_TRUE(b->Push(MakePush({id}, 1, seq++), &resp).ok());
  b->store().FindTable("emb")->Inspect(id, [](const RowView& r) { EXPECT_EQ(r.step, 1u); });
  EXPECT_TRUE(b->store().FindTable("emb")->Inspect(id, [](const RowView&) {}));
}

TEST_F(MigrateTest, DuplicateIsAnsweredEvenAfterOwnershipMovedAway) {
  PsCore core(PsCoreOptions(), ShardOwnership::All(kVShards));
  CreateTable(core);
  PushResponse resp;
  ASSERT_TRUE(core.Push(MakePush({1, 2, 3}, 1, 5), &resp).ok());
  EXPECT_FALSE(resp.duplicate());
  core.SetOwnership(*ShardOwnership::Create(kVShards, 2, {}));
  // The same key: applied here before, so a duplicate, not "wrong shard".
  PushResponse again;
  ASSERT_TRUE(core.Push(MakePush({1, 2, 3}, 1, 5), &again).ok());
  EXPECT_TRUE(again.duplicate());
  // A new key: nothing applied, FAILED_PRECONDITION (the client re-routes it).
  PushResponse fresh;
  absl::Status s = core.Push(MakePush({1, 2, 3}, 1, 6), &fresh);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("does not own"), std::string::npos) << s;
}

TEST_F(MigrateTest, MoveCopiesExactlyAndSurvivesADestinationCrash) {
  auto a = Open("a");
  auto b = Open("b");
  ASSERT_TRUE(a && b);
  ApplyAssignmentResponse ar;
  ASSERT_TRUE(a->ApplyAssignment(Assign(1, Range(0, kVShards)), &ar).ok());
  ASSERT_TRUE(b->ApplyAssignment(Assign(1, {}), &ar).ok());
  CreateTable(*a);
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < 400; ++id) ids.push_back(id);
  uint64_t seq = 1;
  PushResponse resp;
  ASSERT_TRUE(a->Push(MakePush(ids, 1, seq++), &resp).ok());

  const std::vector<uint32_t> moving = {1, 5, 9};
  ASSERT_TRUE(a->ApplyAssignment(Assign(2, Range(0, kVShards), {}, moving), &ar).ok());
  ASSERT_TRUE(b->ApplyAssignment(Assign(2, {}, moving), &ar).ok());
  MigrateBeginRequest begin;
  begin.set_move_id(3);
  for (uint32_t v : moving) begin.add_vshards(v);
  MigrateBeginResponse begun;
  ASSERT_TRUE(a->MigrateBegin(begin, &begun).ok());
  EXPECT_GT(begun.rows(), 0u);
  ASSERT_TRUE(b->BeginImport(3, moving).ok());
  Copy(*a, *b, 3, MigrateExportRequest::SNAPSHOT);
  // Pushes during the copy: caught up by the delta rounds.
  ASSERT_TRUE(a->Push(MakePush({1, 2, 3, 4, 500}, 2, seq++), &resp).ok());
  Copy(*a, *b, 3, MigrateExportRequest::DELTA);
  const uint64_t last_applied = seq;
  ASSERT_TRUE(a->Push(MakePush({5, 6, 7, 501}, 3, seq++), &resp).ok());
  Copy(*a, *b, 3, MigrateExportRequest::FINAL);
  // Fenced: a new push touching a moving vshard is refused as retryable and applies
  // nothing; a retry of an applied key is a duplicate; other vshards still take pushes.
  int64_t moving_id = -1, staying_id = -1;
  for (int64_t id = 0; id < 400 && (moving_id < 0 || staying_id < 0); ++id) {
    const bool m = std::count(moving.begin(), moving.end(), VShardOfId(id)) > 0;
    (m ? moving_id : staying_id) = id;
  }
  EXPECT_EQ(a->Push(MakePush({staying_id, moving_id}, 9, seq++), &resp).code(),
            absl::StatusCode::kUnavailable);
  PushResponse dup;
  ASSERT_TRUE(a->Push(MakePush({5, 6, 7, 501}, 3, last_applied), &dup).ok());
  EXPECT_TRUE(dup.duplicate());
  ASSERT_TRUE(a->Push(MakePush({staying_id}, 1, seq++), &resp).ok());
  ASSERT_TRUE(b->FinishImport().ok());
  const auto expected = Rows(*a, moving);
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(Rows(*b, moving), expected);

  // B is killed right after it reported the copy durable: a restart still has the rows.
  b.reset();
  b = Open("b");
  ASSERT_TRUE(b);
  EXPECT_EQ(Rows(*b, moving), expected);

  // Commit: B owns the vshards, A drops them (memory and disk).
  std::vector<uint32_t> a_owned, b_owned = moving;
  for (uint32_t v = 0; v < kVShards; ++v) {
    if (std::count(moving.begin(), moving.end(), v) == 0) a_owned.push_back(v);
  }
  ASSERT_TRUE(b->ApplyAssignment(Assign(3, b_owned), &ar).ok());
  ASSERT_TRUE(a->ApplyAssignment(Assign(3, a_owned), &ar).ok());
  EXPECT_TRUE(Rows(*a, moving).empty());
  EXPECT_EQ(Rows(*b, moving), expected);
  // A retry of a key A applied before the move is still a duplicate there; a new push
  // for a moved id is refused (the client sends it to B under a new key).
  ASSERT_TRUE(a->Push(MakePush({5, 6, 7, 501}, 3, last_applied), &dup).ok());
  EXPECT_TRUE(dup.duplicate());
  EXPECT_EQ(a->Push(MakePush({moving_id}, 1, seq++), &resp).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(b->Push(MakePush({moving_id}, 1, 1000), &resp).ok());
  // A restart of A does not bring the dropped rows back.
  a.reset();
  a = Open("a");
  ASSERT_TRUE(a);
  EXPECT_TRUE(Rows(*a, moving).empty());
}

TEST_F(MigrateTest, AbortedMoveUnfencesTheSourceAndDropsTheCopy) {
  auto a = Open("a");
  auto b = Open("b");
  ASSERT_TRUE(a && b);
  ApplyAssignmentResponse ar;
  ASSERT_TRUE(a->ApplyAssignment(Assign(1, Range(0, kVShards)), &ar).ok());
  ASSERT_TRUE(b->ApplyAssignment(Assign(1, {}), &ar).ok());
  CreateTable(*a);
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < 100; ++id) ids.push_back(id);
  PushResponse resp;
  ASSERT_TRUE(a->Push(MakePush(ids, 1, 1), &resp).ok());
  const std::vector<uint32_t> moving = {2, 3};
  ASSERT_TRUE(a->ApplyAssignment(Assign(2, Range(0, kVShards), {}, moving), &ar).ok());
  ASSERT_TRUE(b->ApplyAssignment(Assign(2, {}, moving), &ar).ok());
  MigrateBeginRequest begin;
  begin.set_move_id(4);
  for (uint32_t v : moving) begin.add_vshards(v);
  MigrateBeginResponse begun;
  ASSERT_TRUE(a->MigrateBegin(begin, &begun).ok());
  ASSERT_TRUE(b->BeginImport(4, moving).ok());
  Copy(*a, *b, 4, MigrateExportRequest::SNAPSHOT);
  Copy(*a, *b, 4, MigrateExportRequest::FINAL);
  ASSERT_FALSE(Rows(*b, moving).empty());
  EXPECT_EQ(a->Push(MakePush(ids, 1, 2), &resp).code(), absl::StatusCode::kUnavailable);
  // Aborted (e.g. the master restarted): A keeps and serves the vshards, B drops its copy.
  ASSERT_TRUE(a->ApplyAssignment(Assign(3, Range(0, kVShards)), &ar).ok());
  ASSERT_TRUE(b->ApplyAssignment(Assign(3, {}), &ar).ok());
  EXPECT_TRUE(a->Push(MakePush(ids, 1, 2), &resp).ok());
  EXPECT_TRUE(Rows(*b, moving).empty());
  // An older assignment arriving late (a slow heartbeat answer) changes nothing.
  ASSERT_TRUE(a->ApplyAssignment(Assign(2, Range(0, kVShards), {}, moving), &ar).ok());
  EXPECT_EQ(ar.epoch(), 3u);
  EXPECT_TRUE(a->Push(MakePush(ids, 1, 3), &resp).ok());
  // A pod told of a move it has no state for (it restarted mid-move) refuses pushes to
  // those vshards until the move ends.
  ASSERT_TRUE(a->ApplyAssignment(Assign(4, Range(0, kVShards), {}, moving), &ar).ok());
  EXPECT_EQ(a->Push(MakePush(ids, 1, 4), &resp).code(), absl::StatusCode::kUnavailable);
}

// An import (ps-transfer import) that lands on the source while a move tracks its vshards
// is recorded as touched like a push, so the catch-up copies it: the destination ends with
// exactly the source's rows.
TEST_F(MigrateTest, ImportDuringAMoveIsCopiedByTheCatchUp) {
  const std::vector<uint32_t> moving = {2, 3};
  StartMove(moving, 5);
  if (HasFatalFailure()) return;
  Copy(*a_, *b_, 5, MigrateExportRequest::SNAPSHOT);
  const int64_t moved = IdIn(moving, true);
  ASSERT_GE(moved, 0);
  ImportRowsResponse imported;
  ASSERT_TRUE(replica_test::ImportRows(*a_, MakeImport({moved}, 1000, 0.25f), &imported).ok());
  ASSERT_EQ(imported.installed(), 1u);
  Copy(*a_, *b_, 5, MigrateExportRequest::DELTA);
  Copy(*a_, *b_, 5, MigrateExportRequest::FINAL);
  ASSERT_TRUE(b_->FinishImport().ok());
  const auto expected = Rows(*a_, moving);
  ASSERT_EQ(expected.at(moved).back(), 1000.0f);  // the imported step
  EXPECT_EQ(Rows(*b_, moving), expected);
}

// Once a move has fenced its vshards, an import touching them is refused with a retryable
// code and applies nothing, as a push is; an import of other vshards still lands.
TEST_F(MigrateTest, ImportIntoFencedVShardsIsRefusedAsAPushIs) {
  const std::vector<uint32_t> moving = {4, 5};
  StartMove(moving, 6);
  if (HasFatalFailure()) return;
  Copy(*a_, *b_, 6, MigrateExportRequest::SNAPSHOT);
  Copy(*a_, *b_, 6, MigrateExportRequest::FINAL);
  const int64_t moved = IdIn(moving, true), staying = IdIn(moving, false);
  ASSERT_TRUE(moved >= 0 && staying >= 0);
  const auto before = Rows(*a_, moving);
  ImportRowsResponse resp;
  absl::Status s = replica_test::ImportRows(*a_, MakeImport({staying, moved}, 1000, 0.25f), &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(Rows(*a_, moving), before);
  EXPECT_EQ(Rows(*a_, {VShardOfId(staying)}).at(staying).back(), 1.0f);  // nothing applied
  ASSERT_TRUE(replica_test::ImportRows(*a_, MakeImport({staying}, 1000, 0.25f), &resp).ok());
  EXPECT_EQ(resp.installed(), 1u);
}

// A chunk that arrives after the destination stopped receiving the vshards (the master
// gave up on the move) is refused and leaves no rows behind.
TEST_F(MigrateTest, ChunkAfterTheMoveWasAbortedIsRefused) {
  const std::vector<uint32_t> moving = {6, 7};
  StartMove(moving, 8);
  if (HasFatalFailure()) return;
  MigrateExportRequest req;
  req.set_move_id(8);
  req.set_phase(MigrateExportRequest::SNAPSHOT);
  MigrateExportResponse chunk;
  ASSERT_TRUE(a_->MigrateExport(req, &chunk).ok());
  ASSERT_GT(chunk.rows_size(), 0);
  ApplyAssignmentResponse ar;
  ASSERT_TRUE(b_->ApplyAssignment(Assign(3, {}), &ar).ok());  // aborted
  uint64_t rows = 0, bytes = 0;
  EXPECT_EQ(b_->ImportChunk(chunk, &rows, &bytes).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(Rows(*b_, moving).empty());
}

// Chunks are installed only over older copies: a chunk older than what the destination
// holds (it has a copy the source does not) fails the import, so the move is aborted
// rather than committed with rows that differ from the source's.
TEST_F(MigrateTest, ChunkOlderThanTheDestinationsCopyFailsTheImport) {
  auto b = Open("b");
  ASSERT_TRUE(b);
  const std::vector<uint32_t> moving = {9};
  ASSERT_TRUE(b->BeginImport(9, moving).ok());
  int64_t id = 0;
  while (VShardOfId(id) != 9) ++id;
  auto chunk = [&](uint64_t step, float value) {
    MigrateExportResponse c;
    TableSpec* spec = c.add_tables();
    spec->set_name("emb");
    spec->set_dim(2);
    spec->mutable_optimizer()->set_kind(OptimizerSpec::ADAGRAD);
    spec->mutable_optimizer()->set_learning_rate(0.5f);
    MigratedRows* r = c.add_rows();
    r->set_table("emb");
    r->set_ids(Pack<int64_t>({id}));
    r->set_steps(Pack<uint64_t>({step}));
    r->set_values(Pack<float>(std::vector<float>(4, value)));
    return c;
  };
  uint64_t rows = 0, bytes = 0;
  ASSERT_TRUE(b->ImportChunk(chunk(5, 1), &rows, &bytes).ok());
  ASSERT_TRUE(b->ImportChunk(chunk(5, 1), &rows, &bytes).ok());  // the same state again
  ASSERT_TRUE(b->ImportChunk(chunk(7, 2), &rows, &bytes).ok());
  EXPECT_EQ(b->ImportChunk(chunk(6, 3), &rows, &bytes).code(),
            absl::StatusCode::kFailedPrecondition);
  // The import as a whole failed; the refused chunk applied nothing.
  EXPECT_EQ(b->FinishImport().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Rows(*b, moving).at(id), (std::vector<float>{2, 2, 2, 2, 7}));
}

// Evictions and deletions while a move runs are copied too: the destination ends with
// exactly the source's rows, deletions included, also after a restart (its log replays
// each deletion before the rows installed after it). Rows deleted and re-created at a
// lower step than the destination's copy, between two phases and within one, reach it
// after their deletion (else the import fails: a row older than the copy there).
TEST_F(MigrateTest, MoveDuringEvictionsCopiesTheDeletions) {
  auto a = Open("a", /*eviction_interval_ms=*/0);  // EvictOnce only
  auto b = Open("b", 0);
  ASSERT_TRUE(a && b);
  ApplyAssignmentResponse ar;
  ASSERT_TRUE(a->ApplyAssignment(Assign(1, Range(0, kVShards)), &ar).ok());
  ASSERT_TRUE(b->ApplyAssignment(Assign(1, {}), &ar).ok());
  CreateTable(*a, /*max_rows=*/200);
  const std::vector<uint32_t> moving = {1, 5, 9, 12};
  auto is_moving = [&](int64_t id) {
    return std::count(moving.begin(), moving.end(), VShardOfId(id)) > 0;
  };
  std::vector<int64_t> all, hot, hot_moving;
  for (int64_t id = 0; id < 400; ++id) all.push_back(id);
  for (int64_t id = 0; id < 100; ++id) {
    hot.push_back(id);
    if (is_moving(id)) hot_moving.push_back(id);
  }
  ASSERT_GE(hot_moving.size(), 3u);
  uint64_t seq = 1;
  PushResponse resp;
  ASSERT_TRUE(a->Push(MakePush(all, 1, seq++), &resp).ok());
  for (int k = 0; k < 2; ++k) ASSERT_TRUE(a->Push(MakePush(hot, 1, seq++), &resp).ok());

  ASSERT_TRUE(a->ApplyAssignment(Assign(2, Range(0, kVShards), {}, moving), &ar).ok());
  ASSERT_TRUE(b->ApplyAssignment(Assign(2, {}, moving), &ar).ok());
  MigrateBeginRequest begin;
  begin.set_move_id(8);
  for (uint32_t v : moving) begin.add_vshards(v);
  MigrateBeginResponse begun;
  ASSERT_TRUE(a->MigrateBegin(begin, &begun).ok());
  ASSERT_TRUE(b->BeginImport(8, moving).ok());
  Copy(*a, *b, 8, MigrateExportRequest::SNAPSHOT);
  const auto copied = Rows(*b, moving);

  // Eviction during the copy (LFU: the rows updated once go, down to the cap), and a hot
  // row (3 updates on B) deleted and re-created at 1 update.
  EXPECT_GT(a->EvictOnce(), 100u);
  const int64_t x = hot_moving[0];
  ASSERT_TRUE(a->DeleteRows("emb", {x}).ok());
  ASSERT_TRUE(a->Push(MakePush({x}, 2, seq++), &resp).ok());
  ASSERT_TRUE(a->Push(MakePush(hot, 1, seq++), &resp).ok());  // B: 4 updates after this phase
  Copy(*a, *b, 8, MigrateExportRequest::DELTA);

  // Within a phase: after its first chunk, a hot row it has not sent yet is deleted and
  // re-created; the phase sends it with its deletion.
  ASSERT_TRUE(a->Push(MakePush(hot, 1, seq++), &resp).ok());
  int chunks = 0;
  int64_t y = -1;
  Copy(*a, *b, 8, MigrateExportRequest::DELTA, [&](const MigrateExportResponse& chunk) {
    if (chunks++ > 0) return;
    std::vector<int64_t> sent;
    for (const MigratedRows& e : chunk.rows()) {
      std::vector<int64_t> ids(e.ids().size() / sizeof(int64_t));
      std::memcpy(ids.data(), e.ids().data(), e.ids().size());
      sent.insert(sent.end(), ids.begin(), ids.end());
    }
    for (int64_t id : hot_moving) {
      if (id == x || std::count(sent.begin(), sent.end(), id) > 0) continue;
      y = id;
      ASSERT_TRUE(a->DeleteRows("emb", {y}).ok());
      ASSERT_TRUE(a->Push(MakePush({y}, 2, seq++), &resp).ok());
      return;
    }
    FAIL() << "every hot row of the moving vshards was in the first chunk";
  });
  EXPECT_GT(chunks, 1);
  Copy(*a, *b, 8, MigrateExportRequest::FINAL);
  ASSERT_TRUE(b->FinishImport().ok());

  const auto expected = Rows(*a, moving);
  size_t evicted = 0;
  for (const auto& [id, row] : copied) evicted += expected.count(id) == 0 ? 1 : 0;
  EXPECT_GT(evicted, 10u) << "the test must evict rows of the moving vshards";
  // x re-created: 1 update, then 2 of every hot row (which have 5); y re-created last.
  EXPECT_EQ(expected.at(x).back(), 3.0f);
  EXPECT_EQ(expected.at(y).back(), 1.0f);
  for (int64_t id : hot_moving) {
    if (id != x && id != y) EXPECT_EQ(expected.at(id).back(), 5.0f) << id;
  }
  EXPECT_EQ(Rows(*b, moving), expected);
  b.reset();  // as kill -9: the log replays deletions and installs in their order
  b = Open("b", 0);
  ASSERT_TRUE(b);
  EXPECT_EQ(Rows(*b, moving), expected);
}

}  // namespace
}  // namespace ps
