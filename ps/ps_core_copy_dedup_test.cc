// A vshard copy carries the source's push de-duplication state (ps_core_migrate.cc, the
// FINAL chunk): a pod filled by a copy and then made the vshards' owner (a follower copy
// promoted by a failover) answers a re-sent push the source applied before the copy as a
// duplicate, from memory and after a restart, instead of applying it twice.
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <utility>

#include "common/routing/hash.h"
#include "gtest/gtest.h"
#include "proto/packed.h"
#include "proto/wrong_shard.h"
#include "ps/ps_core.h"

namespace ps {
namespace {

constexpr uint32_t kVShards = 8;
constexpr uint32_t kDim = 4;

Assignment Owning(uint64_t epoch, bool all) {
  Assignment a;
  a.set_epoch(epoch);
  a.set_num_vshards(kVShards);
  for (uint32_t v = 0; all && v < kVShards; ++v) a.add_owned(v);
  return a;
}

// An assignment at `epoch` owning `owned`.
Assignment OwningOnly(uint64_t epoch, const std::vector<uint32_t>& owned) {
  Assignment a = Owning(epoch, false);
  for (uint32_t v : owned) a.add_owned(v);
  return a;
}

// Every vshard but `moved`.
std::vector<uint32_t> AllBut(const std::vector<uint32_t>& moved) {
  std::vector<uint32_t> rest;
  for (uint32_t v = 0; v < kVShards; ++v) {
    if (std::find(moved.begin(), moved.end(), v) == moved.end()) rest.push_back(v);
  }
  return rest;
}

// The first `n` ids of "emb" in vshard `v`.
std::vector<int64_t> IdsOf(uint32_t v, size_t n) {
  std::vector<int64_t> ids;
  for (int64_t id = 1; ids.size() < n; ++id) {
    if (VShardOf(RouteHash(NameHash("emb"), id), kVShards) == v) ids.push_back(id);
  }
  return ids;
}

PushRequest MakePush(const std::vector<int64_t>& ids, uint64_t worker, uint64_t seq) {
  PushRequest req;
  TableGrads* t = req.add_tables();
  t->set_table("emb");
  t->set_ids(Pack<int64_t>(ids));
  t->set_learning_rate(1.0f);
  t->set_grads(Pack<float>(std::vector<float>(ids.size() * kDim, -1.0f)));
  req.mutable_key()->set_worker_id(worker);
  req.mutable_key()->set_incarnation(1);
  req.mutable_key()->set_sequence(seq);
  return req;
}

std::map<int64_t, std::vector<float>> Rows(PsCore& core) {
  std::map<int64_t, std::vector<float>> rows;
  auto t = core.store().FindTable("emb");
  if (t == nullptr) return rows;
  t->ForEachRow(
      [&](const RowView& r) { rows[r.id] = std::vector<float>(r.weights, r.weights + kDim); });
  return rows;
}

class CopyDedupTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string templ = std::filesystem::temp_directory_path() / "ps_core_copy_dedup.XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    root_ = templ;
    a_ = Open("a");
    b_ = Open("b");
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
    CreateTableRequest req;
    req.mutable_spec()->set_name("emb");
    req.mutable_spec()->set_dim(kDim);
    req.mutable_spec()->mutable_optimizer()->set_kind(OptimizerSpec::SGD);
    req.mutable_spec()->mutable_optimizer()->set_learning_rate(1.0f);
    req.mutable_spec()->mutable_initializer()->set_kind(InitializerSpec::ZEROS);
    CreateTableResponse resp;
    ASSERT_TRUE(a_->CreateTable(req, &resp).ok());
    Apply(*a_, Owning(2, true));
    Apply(*b_, Owning(2, false));
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
    std::filesystem::remove_all(root_);
  }

  // `killable`: no round of its own and none at close, so that closing it leaves the disk
  // as a SIGKILL would.
  std::unique_ptr<PsCore> Open(const std::string& name, bool killable = false) {
    PsCoreOptions options;
    options.storage.db.dir = root_ + "/" + name;
    options.eviction_interval_ms = 0;
    if (killable) {
      options.storage.materialize_ms = 600000;
      options.storage.materialize_on_close = false;
    }
    auto core = PsCore::Open(options, *ShardOwnership::Create(kVShards, 0, {}));
    EXPECT_TRUE(core.ok()) << core.status();
    return core.ok() ? *std::move(core) : nullptr;
  }
  // b_ again on an empty disk, killable (as Open says), assigned nothing.
  void ReopenKillableB() {
    b_.reset();
    std::filesystem::remove_all(root_ + "/b");
    b_ = Open("b", /*killable=*/true);
    ASSERT_NE(b_, nullptr);
    Apply(*b_, Owning(2, false));
  }
  void Apply(PsCore& core, const Assignment& a) {
    ApplyAssignmentResponse resp;
    ASSERT_TRUE(core.ApplyAssignment(a, &resp).ok());
  }
  // Every vshard of a_, copied into b_ (snapshot, then the fenced final delta).
  void CopyAll() { Copy(1, AllBut({})); }
  // Move `move` of `vshards` from a_ into b_, up to FinishImport (the master commits next),
  // in chunks of `max_bytes` (0: the default); the FINAL phase's chunks go in `final`.
  void Copy(uint64_t move, const std::vector<uint32_t>& vshards, uint64_t max_bytes = 0,
            std::vector<MigrateExportResponse>* final = nullptr) {
    ASSERT_TRUE(b_->BeginImport(move, vshards).ok());
    MigrateBeginRequest begin;
    begin.set_move_id(move);
    for (uint32_t v : vshards) begin.add_vshards(v);
    MigrateBeginResponse begun;
    ASSERT_TRUE(a_->MigrateBegin(begin, &begun).ok());
    for (auto phase : {MigrateExportRequest::SNAPSHOT, MigrateExportRequest::FINAL}) {
      MigrateExportRequest ex;
      ex.set_move_id(move);
      ex.set_phase(phase);
      ex.set_max_bytes(max_bytes);
      for (;;) {
        MigrateExportResponse chunk;
        ASSERT_TRUE(a_->MigrateExport(ex, &chunk).ok());
        uint64_t rows = 0, bytes = 0;
        ASSERT_TRUE(b_->ImportChunk(chunk, &rows, &bytes).ok());
        if (final != nullptr && phase == MigrateExportRequest::FINAL) final->push_back(chunk);
        if (chunk.done()) break;
        ex.set_cursor(chunk.next_cursor());
      }
    }
    ASSERT_TRUE(b_->FinishImport().ok());
  }

  std::string root_;
  std::unique_ptr<PsCore> a_, b_;
};

TEST_F(CopyDedupTest, APushAppliedBeforeTheCopyIsADuplicateAtItsDestination) {
  const PushRequest pushed = MakePush({1, 2, 3}, 5, 1);
  PushResponse resp;
  ASSERT_TRUE(a_->Push(pushed, &resp).ok());
  ASSERT_TRUE(a_->Push(MakePush({3}, 6, 4), &resp).ok());
  CopyAll();
  // The source is lost and the destination leads the vshards; the first client never got
  // its answer and sends the same push there.
  a_.reset();
  Apply(*b_, Owning(3, true));
  const auto before = Rows(*b_);
  EXPECT_EQ(before.at(3), std::vector<float>(kDim, 2.0f));
  PushResponse retry;
  ASSERT_TRUE(b_->Push(pushed, &retry).ok());
  EXPECT_TRUE(retry.duplicate());
  EXPECT_EQ(Rows(*b_), before);
  // Stored with b's state: a restart after its next round still knows the key.
  ASSERT_TRUE(b_->storage()->Materialize().ok());
  b_.reset();
  b_ = Open("b");
  ASSERT_NE(b_, nullptr);
  Apply(*b_, Owning(4, true));
  PushResponse after_restart;
  ASSERT_TRUE(b_->Push(MakePush({3}, 6, 4), &after_restart).ok());
  EXPECT_TRUE(after_restart.duplicate());
  EXPECT_EQ(Rows(*b_), before);
  // A new push applies.
  PushResponse fresh;
  ASSERT_TRUE(b_->Push(MakePush({1}, 5, 2), &fresh).ok());
  EXPECT_FALSE(fresh.duplicate());
  EXPECT_EQ(Rows(*b_).at(1), std::vector<float>(kDim, 2.0f));
}

// The source's keys go in parts of at most a chunk's bytes, after the rows (the import's
// receive budget holds a chunk: migrate_import.cc), and every part counts: each writer's
// push is a duplicate at the destination. Before, the FINAL chunk carried the whole state
// (here ~560 bytes per writer, far more with layers), whatever the chunk size.
TEST_F(CopyDedupTest, TheSourcesKeysGoInPartsOfAChunksSize) {
  constexpr uint64_t kWriters = 300, kChunk = 8 << 10;
  for (uint64_t w = 1; w <= kWriters; ++w) {
    PushResponse resp;
    ASSERT_TRUE(a_->Push(MakePush({static_cast<int64_t>(w)}, w, 1), &resp).ok());
  }
  std::vector<MigrateExportResponse> final;
  Copy(1, AllBut({}), kChunk, &final);
  size_t parts = 0;
  for (const MigrateExportResponse& chunk : final) {
    // A chunk's bytes, a few bytes of framing, and one writer's entry beyond at most.
    EXPECT_LE(chunk.ByteSizeLong(), kChunk + 1024);
    parts += !chunk.push_dedup().empty();
    if (!chunk.push_dedup().empty()) EXPECT_TRUE(chunk.rows().empty());
  }
  EXPECT_GT(parts, kWriters * 536 / kChunk);
  a_.reset();
  Apply(*b_, Owning(3, true));
  const auto before = Rows(*b_);
  ASSERT_EQ(before.size(), kWriters);
  for (uint64_t w = 1; w <= kWriters; ++w) {
    PushResponse retry;
    ASSERT_TRUE(b_->Push(MakePush({static_cast<int64_t>(w)}, w, 1), &retry).ok());
    EXPECT_TRUE(retry.duplicate()) << "writer " << w;
  }
  EXPECT_EQ(Rows(*b_), before);
}

// Without replication, a push routed under an older map than the pod's is recorded for
// the vshards of its rows only, and stays so across a restart from the log alone (as
// after a SIGKILL): the rest of its part, re-routed here under the same key, applies.
// Before, recovery released every recovered key whole: the rest was answered "duplicate"
// and never applied (a lost push).
TEST_F(CopyDedupTest, AStaleRoutedPushsKeyStaysExactAcrossARestart) {
  a_.reset();
  a_ = Open("a", /*killable=*/true);
  ASSERT_NE(a_, nullptr);
  Apply(*a_, Owning(2, true));
  PushRequest first = MakePush(IdsOf(1, 2), 5, 1);
  first.set_epoch(1);  // routed under the map before the pod's
  PushResponse resp;
  ASSERT_TRUE(a_->Push(first, &resp).ok());
  a_.reset();
  a_ = Open("a", /*killable=*/true);
  ASSERT_NE(a_, nullptr);
  Apply(*a_, Owning(3, true));
  PushRequest rest = MakePush(IdsOf(2, 2), 5, 1);
  rest.set_epoch(3);
  PushResponse applied;
  ASSERT_TRUE(a_->Push(rest, &applied).ok());
  EXPECT_FALSE(applied.duplicate());
  EXPECT_EQ(Rows(*a_).size(), 4u);
  PushResponse again;
  ASSERT_TRUE(a_->Push(first, &again).ok());
  EXPECT_TRUE(again.duplicate());
  EXPECT_EQ(Rows(*a_).size(), 4u);
}

// A replicated primary without a write lease (the master unreachable) refuses a push it
// never saw with the NotApplied detail, so that the client knows its fate: without it, the
// client took the refusal as "maybe applied" and re-routed the push after a move with its
// key kept, under which a pod then answered "duplicate" from another part's record
// (migration_test MasterKilledMidRebalance/R2 lost a push so). A push it applied before is
// acknowledged as a duplicate, as under a move's fence.
TEST_F(CopyDedupTest, APrimaryWithoutAWriteLeaseSaysWhetherItApplied) {
  Assignment role = Owning(3, true);
  role.mutable_replication()->set_pod_id("a");
  role.mutable_replication()->set_factor(2);
  role.mutable_replication()->set_lease_ms(1000);
  Apply(*a_, role);
  PushResponse resp;
  absl::Status refused = a_->Push(MakePush({1, 2}, 7, 1), &resp);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_TRUE(IsNotApplied(refused)) << refused;
  EXPECT_TRUE(Rows(*a_).empty());

  a_->RenewWriteLease(absl::Now() + absl::Hours(1));
  ASSERT_TRUE(a_->Push(MakePush({1, 2}, 7, 1), &resp).ok());
  EXPECT_FALSE(resp.duplicate());
  a_->RenewWriteLease(absl::Now() - absl::Seconds(1));  // the lease ran out
  PushResponse retry;
  ASSERT_TRUE(a_->Push(MakePush({1, 2}, 7, 1), &retry).ok());
  EXPECT_TRUE(retry.duplicate());
  EXPECT_EQ(Rows(*a_).at(1), std::vector<float>(kDim, 1.0f));
  refused = a_->Push(MakePush({1}, 7, 2), &resp);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_TRUE(IsNotApplied(refused)) << refused;
  EXPECT_EQ(Rows(*a_).at(1), std::vector<float>(kDim, 1.0f));
}

// Vshard v's piece of `req` (its key with piece = v + 1), as the client re-routes a part
// whose fate was unknown.
PushRequest PieceOf(PushRequest req, uint32_t v) {
  req.mutable_key()->set_piece(v + 1);
  return req;
}

// A part of vshards 1 and 2 whose fate stayed unknown (its pod was lost before applying
// it) is re-routed as pieces with its key kept; a drain moves 1 and then 2 to b, so the
// pieces reach b one move apart. Each applies once there (before, the second was answered
// "duplicate" from the first and lost: keys were per pod).
TEST_F(CopyDedupTest, PiecesOfASplitPartApplyOnceEachAcrossMoves) {
  ReopenKillableB();
  const std::vector<int64_t> in1 = IdsOf(1, 2), in2 = IdsOf(2, 2);
  Copy(1, {1});
  Apply(*a_, OwningOnly(3, AllBut({1})));
  Apply(*b_, OwningOnly(3, {1}));
  PushResponse resp;
  ASSERT_TRUE(b_->Push(PieceOf(MakePush(in1, 9, 1), 1), &resp).ok());
  EXPECT_FALSE(resp.duplicate());
  Copy(2, {2});
  Apply(*a_, OwningOnly(4, AllBut({1, 2})));
  Apply(*b_, OwningOnly(4, {1, 2}));
  ASSERT_TRUE(b_->Push(PieceOf(MakePush(in2, 9, 1), 2), &resp).ok());
  EXPECT_FALSE(resp.duplicate());
  // Retries of either piece are duplicates; a piece with a row of another vshard is refused.
  for (const auto& [ids, v] : {std::pair(in1, 1u), std::pair(in2, 2u)}) {
    PushResponse retry;
    ASSERT_TRUE(b_->Push(PieceOf(MakePush(ids, 9, 1), v), &retry).ok());
    EXPECT_TRUE(retry.duplicate());
  }
  EXPECT_EQ(b_->Push(PieceOf(MakePush({in1[0], in2[0]}, 9, 2), 1), &resp).code(),
            absl::StatusCode::kInvalidArgument);
  const auto rows = Rows(*b_);
  for (int64_t id : {in1[0], in1[1], in2[0], in2[1]}) {
    EXPECT_EQ(rows.at(id), std::vector<float>(kDim, 1.0f)) << id;
  }
  // The pieces are in b's log only: after a crash, each is still a duplicate.
  b_.reset();
  b_ = Open("b", /*killable=*/true);
  ASSERT_NE(b_, nullptr);
  Apply(*b_, OwningOnly(5, {1, 2}));
  PushResponse after;
  ASSERT_TRUE(b_->Push(PieceOf(MakePush(in2, 9, 1), 2), &after).ok());
  EXPECT_TRUE(after.duplicate());
  EXPECT_EQ(Rows(*b_), rows);
}

// The original pod applied the part whole before its vshards moved: the copy carries the
// key, and every piece re-routed to the destination is a duplicate there.
TEST_F(CopyDedupTest, PiecesOfAPartAppliedWholeBeforeTheCopyAreDuplicates) {
  const std::vector<int64_t> in1 = IdsOf(1, 2), in2 = IdsOf(2, 2);
  std::vector<int64_t> both = in1;
  both.insert(both.end(), in2.begin(), in2.end());
  PushResponse resp;
  ASSERT_TRUE(a_->Push(MakePush(both, 9, 1), &resp).ok());
  Copy(1, {1, 2});
  Apply(*a_, OwningOnly(3, AllBut({1, 2})));
  Apply(*b_, OwningOnly(3, {1, 2}));
  const auto before = Rows(*b_);
  for (const auto& [ids, v] : {std::pair(in1, 1u), std::pair(in2, 2u)}) {
    PushResponse piece;
    ASSERT_TRUE(b_->Push(PieceOf(MakePush(ids, 9, 1), v), &piece).ok());
    EXPECT_TRUE(piece.duplicate());
  }
  EXPECT_EQ(Rows(*b_), before);
  EXPECT_EQ(before.at(in2[0]), std::vector<float>(kDim, 1.0f));
}

// A piece applied at a (vshard 2) does not travel with a copy of vshard 1: at b the key is
// not applied for vshard 2, whose rows the copy did not carry.
TEST_F(CopyDedupTest, ACopyCarriesOnlyThePiecesOfItsVShards) {
  const std::vector<int64_t> in2 = IdsOf(2, 1);
  PushResponse resp;
  ASSERT_TRUE(a_->Push(PieceOf(MakePush(in2, 9, 1), 2), &resp).ok());
  Copy(1, {1});
  Apply(*a_, OwningOnly(3, AllBut({1})));
  Apply(*b_, OwningOnly(3, {1, 2}));
  PushResponse piece;
  ASSERT_TRUE(b_->Push(PieceOf(MakePush(in2, 9, 1), 2), &piece).ok());
  EXPECT_FALSE(piece.duplicate());
}

// The keys a copy carries are on the destination's disk once FinishImport returns (the
// master commits the move next): a crash of the destination right after the commit does
// not forget them (before, they were stored at its next round only, and the retry of a
// push the copy held applied twice after the crash).
TEST_F(CopyDedupTest, CopiedKeysSurviveACrashRightAfterTheCopy) {
  ReopenKillableB();
  const PushRequest pushed = MakePush({1, 2, 3}, 5, 1);
  PushResponse resp;
  ASSERT_TRUE(a_->Push(pushed, &resp).ok());
  CopyAll();
  Apply(*b_, Owning(3, true));
  b_.reset();  // killed: no round ran since the copy
  b_ = Open("b", /*killable=*/true);
  ASSERT_NE(b_, nullptr);
  Apply(*b_, Owning(4, true));
  const auto before = Rows(*b_);
  ASSERT_EQ(before.at(1), std::vector<float>(kDim, 1.0f));
  PushResponse retry;
  ASSERT_TRUE(b_->Push(pushed, &retry).ok());
  EXPECT_TRUE(retry.duplicate());
  EXPECT_EQ(Rows(*b_), before);
}

}  // namespace
}  // namespace ps
