// Export and import on one pod (PsCore, no transport): an exported pod's files hold
// every row exactly; installs are durable (recovered bit for bit after a crash, also when
// interleaved with pushes and materialization), idempotent, and validated like pushes.
// Incremental exports: a delta since a cursor, applied to the export that printed the
// cursor, equals a new full export, across a crash and a vshard move; a cursor the pod does
// not know exports whole; one older than the change journal keeps is refused; one from
// before a journal merge gets a larger delta that is still exact once applied; one of the
// database's older journal identity stays valid.
#include "ps/pod_transfer.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "absl/strings/match.h"
#include "common/base/status_macros.h"
#include "common/routing/hash.h"
#include "proto/export_file.h"
#include "proto/packed.h"
#include "ps/replica_test_pods.h"

namespace ps {
namespace {

using replica_test::ImportRows;
using replica_test::MakePush;
using replica_test::Placement;
using Rows = std::map<int64_t, std::vector<float>>;  // weights, slots, step

TableSpec Spec() {
  TableSpec spec;
  spec.set_name("emb");
  spec.set_dim(4);
  spec.mutable_initializer()->set_kind(InitializerSpec::NORMAL);
  spec.mutable_initializer()->set_stddev(0.1f);
  spec.mutable_optimizer()->set_kind(OptimizerSpec::ADAM);
  return spec;
}

class PodTransferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pod_transfer_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::unique_ptr<PsCore> Open(const std::string& name, bool materialize_on_close,
                               ShardOwnership own = ShardOwnership::All(16),
                               uint64_t journal_bytes = uint64_t{1} << 30) {
    PsCoreOptions options;
    options.storage.journal = journal_;
    options.storage.journal.max_bytes = journal_bytes;
    options.storage.db.dir = root_ + "/" + name;
    options.storage.materialize_ms = 600000;
    options.storage.materialize_on_close = materialize_on_close;
    auto core = PsCore::Open(options, std::move(own));
    EXPECT_TRUE(core.ok()) << core.status();
    if (!core.ok()) return nullptr;
    CreateTableRequest req;
    *req.mutable_spec() = Spec();
    CreateTableResponse resp;
    EXPECT_TRUE((*core)->CreateTable(req, &resp).ok());
    return *std::move(core);
  }

  // n pushes of 8 random ids of [0, 60]; the ids pushed go into *pushed.
  static void PushSome(PsCore& core, uint64_t first_seq, int n, uint32_t seed,
                       std::set<int64_t>* pushed = nullptr) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int64_t> id(0, 60);
    std::normal_distribution<float> g;
    for (uint64_t s = first_seq; s < first_seq + n; ++s) {
      std::vector<int64_t> ids(8);
      for (auto& x : ids) x = id(rng);
      if (pushed != nullptr) pushed->insert(ids.begin(), ids.end());
      std::vector<float> grads(ids.size() * 4);
      for (float& x : grads) x = g(rng);
      PushResponse resp;
      ASSERT_TRUE(core.Push(MakePush(ids, grads, 5, s), &resp).ok());
    }
  }

  static Rows Snapshot(PsCore& core) {
    Rows rows;
    auto t = core.store().FindTable("emb");
    t->ForEachRow([&](const RowView& r) {
      std::vector<float> v(r.weights, r.weights + 4);
      v.insert(v.end(), r.slots, r.slots + t->slot_floats());
      v.push_back(static_cast<float>(r.step));
      rows[r.id] = v;
    });
    return rows;
  }

  // The rows of an exported part directory as one ImportRowsRequest.
  static ImportRowsRequest ReadPart(const std::string& dir) {
    ImportRowsRequest req;
    for (const auto& f : std::filesystem::directory_iterator(dir)) {
      if (f.path().extension() != ".psx") continue;
      auto r = ExportFileReader::Open(f.path());
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok() || (*r)->kind() != ExportKind::kTableRows) continue;
      TableRows* rows = req.add_tables();
      TableSpec spec;
      spec.ParseFromString((*r)->spec_bytes());
      rows->set_table(spec.name());
      ExportBlock b;
      for (;;) {
        auto more = (*r)->Next(&b);
        EXPECT_TRUE(more.ok()) << more.status();
        if (!more.ok() || !*more) break;
        rows->mutable_ids()->append(Pack<int64_t>(b.ids));
        rows->mutable_steps()->append(Pack<uint64_t>(b.steps));
        rows->mutable_values()->append(Pack<float>(b.values));
      }
    }
    return req;
  }

  // The table rows (kind 1) and deleted ids (kind 3) of the export parts in `dirs`.
  struct Part {
    Rows rows;
    std::set<int64_t> deleted;
  };
  static Part ReadRows(const std::vector<std::string>& dirs) {
    Part part;
    for (const std::string& dir : dirs) {
      for (const auto& f : std::filesystem::directory_iterator(dir)) {
        if (f.path().extension() != ".psx") continue;
        auto r = ExportFileReader::Open(f.path());
        EXPECT_TRUE(r.ok()) << r.status();
        if (!r.ok()) continue;
        const ExportKind kind = (*r)->kind();
        const size_t floats = (*r)->dim() + (*r)->slot_floats();
        ExportBlock b;
        for (;;) {
          auto more = (*r)->Next(&b);
          EXPECT_TRUE(more.ok()) << more.status();
          if (!more.ok() || !*more) break;
          for (size_t i = 0; i < b.ids.size(); ++i) {
            if (kind == ExportKind::kDeletedIds) {
              part.deleted.insert(b.ids[i]);
              continue;
            }
            EXPECT_EQ(kind, ExportKind::kTableRows);
            std::vector<float> v(b.values.begin() + i * floats,
                                 b.values.begin() + (i + 1) * floats);
            v.push_back(static_cast<float>(b.steps[i]));
            EXPECT_TRUE(part.rows.emplace(b.ids[i], v).second) << "id " << b.ids[i] << " twice";
          }
        }
      }
    }
    return part;
  }

  // What ps-transfer import does with a delta on top of `base`: deletions first, then the
  // install rule (a row is installed if missing or at a lower step).
  static Rows ApplyDelta(Rows base, const Part& delta) {
    for (int64_t id : delta.deleted) base.erase(id);
    for (const auto& [id, v] : delta.rows) {
      auto it = base.find(id);
      if (it == base.end() || it->second.back() < v.back()) base[id] = v;
    }
    return base;
  }

  static absl::StatusOr<ExportResponse> Export(PsCore& core, const std::string& dir,
                                               const std::string& since = "") {
    ExportRequest req;
    req.set_dir(dir);
    req.set_since(since);
    ExportResponse resp;
    RETURN_IF_ERROR(ExportPod(core, req, &resp));
    return resp;
  }

  // Exports `core` whole to <root>/e1: the delta `d1` applied to the full export `e0` must
  // give that export, which must hold the pod's rows. Its cursor and rows in *cursor, *e1.
  void ExpectDeltaGivesANewExport(PsCore& core, const Part& e0, const Part& d1, std::string* cursor,
                                  Rows* e1) {
    auto full1 = Export(core, root_ + "/e1");
    ASSERT_TRUE(full1.ok()) << full1.status();
    *cursor = full1->cursor();
    *e1 = ReadRows({root_ + "/e1"}).rows;
    EXPECT_EQ(ApplyDelta(e0.rows, d1), *e1);
    EXPECT_EQ(*e1, Snapshot(core));
  }

  // The import's side: the full export <root>/e0, then the delta `d1`'s deletions (the
  // answer in *deleted), then its rows (<root>/d1; the answer in *installed).
  void ImportFullThenDelta(PsCore& core, const Part& d1, ImportRowsResponse* deleted,
                           ImportRowsResponse* installed) {
    ImportRowsResponse full;
    ASSERT_TRUE(ImportRows(core, ReadPart(root_ + "/e0"), &full).ok());
    ImportRowsRequest deletes;
    TableRows* t = deletes.add_deletes();
    t->set_table("emb");
    t->set_ids(Pack<int64_t>(std::vector<int64_t>(d1.deleted.begin(), d1.deleted.end())));
    ASSERT_TRUE(ImportRows(core, deletes, deleted).ok());
    ASSERT_TRUE(ImportRows(core, ReadPart(root_ + "/d1"), installed).ok());
  }

  std::string root_;
  ChangeJournalOptions journal_;  // what Open gives pods (but max_bytes)
};

TEST_F(PodTransferTest, ADeltaOnThePreviousExportEqualsANewExportAcrossACrash) {
  auto a = Open("a", /*materialize_on_close=*/false);
  PushSome(*a, 1, 30, 1);
  ASSERT_TRUE(a->storage()->Materialize().ok());
  PushSome(*a, 31, 10, 2);  // in the log only at the export
  auto full = Export(*a, root_ + "/e0");
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_TRUE(absl::StartsWith(full->cursor(), "v1:")) << full->cursor();
  const Part e0 = ReadRows({root_ + "/e0"});
  ASSERT_EQ(e0.rows.size(), full->rows());

  // A few changes, materialized or only logged, then a crash: the cursor survives.
  std::set<int64_t> changed;
  PushSome(*a, 41, 1, 3, &changed);
  ASSERT_TRUE(a->storage()->Materialize().ok());
  PushSome(*a, 42, 1, 4, &changed);
  a.reset();  // nothing materialized at close: as a kill -9 leaves it
  a = Open("a", false);
  PushSome(*a, 43, 1, 5, &changed);  // in the recovered pod's log only

  auto delta = Export(*a, root_ + "/d1", full->cursor());
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_FALSE(delta->whole());
  EXPECT_EQ(delta->deleted(), 0u);
  const Part d1 = ReadRows({root_ + "/d1"});
  std::set<int64_t> ids;
  for (const auto& [id, v] : d1.rows) ids.insert(id);
  EXPECT_EQ(ids, changed);  // exactly what changed: nothing else, nothing less
  EXPECT_LT(d1.rows.size(), e0.rows.size());

  std::string cursor1;
  Rows e1;
  ExpectDeltaGivesANewExport(*a, e0, d1, &cursor1, &e1);
  if (HasFatalFailure()) return;

  // Nothing changed since the last cursor: an empty delta.
  auto none = Export(*a, root_ + "/d2", cursor1);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->whole());
  EXPECT_EQ(none->rows(), 0u);
  // Each export's cursor moves on only when rows were written.
  EXPECT_EQ(none->cursor(), cursor1);
}

// Pushes gradient `g` to `ids` of "emb" under key (5, 1, seq).
void PushIds(PsCore& core, uint64_t seq, const std::vector<int64_t>& ids, float g) {
  PushResponse resp;
  ASSERT_TRUE(core.Push(MakePush(ids, std::vector<float>(ids.size() * 4, g), 5, seq), &resp).ok());
}

// Deleted rows (eviction's path, PsCore::DeleteRows) are listed as deleted, also a row
// deleted and created again before a round wrote either (the round writes it as a row
// only): applied to the previous export, the delta must drop the old row's higher step.
TEST_F(PodTransferTest, ADeltaListsDeletionsAlsoOfRowsCreatedAgain) {
  auto a = Open("a", /*materialize_on_close=*/false);
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < 30; ++id) ids.push_back(id);
  for (uint64_t seq = 1; seq <= 3; ++seq) PushIds(*a, seq, ids, 0.25f);  // every row at step 3
  auto full = Export(*a, root_ + "/e0");
  ASSERT_TRUE(full.ok()) << full.status();
  const Part e0 = ReadRows({root_ + "/e0"});

  ASSERT_TRUE(a->DeleteRows("emb", {1, 2, 3}).ok());
  ASSERT_TRUE(a->DeleteRows("emb", {4}).ok());
  PushIds(*a, 4, {4}, 1.0f);  // created again at step 1, in the same round
  ASSERT_TRUE(a->storage()->Materialize().ok());
  ASSERT_TRUE(a->DeleteRows("emb", {5}).ok());
  ASSERT_TRUE(a->DeleteRows("emb", {6}).ok());
  PushIds(*a, 5, {6}, 1.0f);
  a.reset();  // a crash: the last deletions are in the log only
  a = Open("a", false);

  auto delta = Export(*a, root_ + "/d1", full->cursor());
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_FALSE(delta->whole());
  const Part d1 = ReadRows({root_ + "/d1"});
  EXPECT_EQ(d1.deleted, (std::set<int64_t>{1, 2, 3, 4, 5, 6}));
  ASSERT_EQ(d1.rows.count(4), 1u);
  ASSERT_EQ(d1.rows.count(6), 1u);
  EXPECT_EQ(d1.rows.at(4).back(), 1.0f);  // its step: a new row
  EXPECT_EQ(d1.rows.size(), 2u);
  EXPECT_EQ(delta->deleted(), 6u);

  std::string cursor1;
  Rows e1;
  ExpectDeltaGivesANewExport(*a, e0, d1, &cursor1, &e1);
  if (HasFatalFailure()) return;
  EXPECT_EQ(e1.size(), e0.rows.size() - 4);

  // The import's side: the delta's deletions through ImportRows, then its rows.
  auto b = Open("b", false);
  ImportRowsResponse deleted, installed;
  ImportFullThenDelta(*b, d1, &deleted, &installed);
  if (HasFatalFailure()) return;
  EXPECT_EQ(deleted.deleted(), 6u);
  EXPECT_EQ(installed.installed(), 2u);
  EXPECT_EQ(Snapshot(*b), e1);
  b.reset();  // the deletions and installs are durable
  b = Open("b", false);
  EXPECT_EQ(Snapshot(*b), e1);
}

TEST_F(PodTransferTest, ADeltaFollowsAVShardMove) {
  constexpr uint32_t kV = replica_test::kVShards;  // Placement's
  auto a = Open("a", false, *ShardOwnership::Create(kV, 0, {}));
  auto b = Open("b", false, *ShardOwnership::Create(kV, 0, {}));
  ASSERT_TRUE(a && b);
  std::vector<uint32_t> all, moving = {1, 5, 9}, rest;
  for (uint32_t v = 0; v < kV; ++v) {
    all.push_back(v);
    if (v != 1 && v != 5 && v != 9) rest.push_back(v);
  }
  ApplyAssignmentResponse ar;
  ASSERT_TRUE(a->ApplyAssignment(Placement(1, all, {}, {}), &ar).ok());
  ASSERT_TRUE(b->ApplyAssignment(Placement(1, {}, {}, {}), &ar).ok());
  PushSome(*a, 1, 20, 1);
  auto ea = Export(*a, root_ + "/e0a");
  auto eb = Export(*b, root_ + "/e0b");
  ASSERT_TRUE(ea.ok() && eb.ok());
  // The cluster's cursor: every part's position.
  auto pa = ParseExportCursor(ea->cursor());
  auto pb = ParseExportCursor(eb->cursor());
  ASSERT_TRUE(pa.ok() && pb.ok());
  std::vector<ExportCursorEntry> entries = *pa;
  entries.insert(entries.end(), pb->begin(), pb->end());
  const std::string cursor = FormatExportCursor(entries);
  ASSERT_EQ(*ParseExportCursor(cursor), entries);

  // Move vshards 1, 5, 9 from A to B (as the master runs it), then train on both.
  ASSERT_TRUE(a->ApplyAssignment(Placement(2, all, {}, moving), &ar).ok());
  ASSERT_TRUE(b->ApplyAssignment(Placement(2, {}, moving, {}), &ar).ok());
  ASSERT_TRUE(replica_test::BeginMove(*a, *b, 3, moving).ok());
  for (auto phase : {MigrateExportRequest::SNAPSHOT, MigrateExportRequest::FINAL}) {
    ASSERT_TRUE(replica_test::CopyPhase(*a, *b, 3, phase).ok());
  }
  ASSERT_TRUE(b->FinishImport().ok());
  ASSERT_TRUE(b->ApplyAssignment(Placement(3, moving, {}, {}), &ar).ok());
  ASSERT_TRUE(a->ApplyAssignment(Placement(3, rest, {}, {}), &ar).ok());
  // Pushes go to the owner of each id now (a client routes them so).
  std::mt19937 rng(9);
  for (uint64_t seq = 100; seq < 104; ++seq) {
    std::vector<int64_t> on_a, on_b;
    for (int i = 0; i < 16; ++i) {
      const int64_t id = rng() % 80;
      const uint32_t v = VShardOf(RouteHash(NameHash("emb"), id), kV);
      (std::count(moving.begin(), moving.end(), v) ? on_b : on_a).push_back(id);
    }
    for (auto [core, ids] :
         {std::pair<PsCore*, std::vector<int64_t>*>{a.get(), &on_a}, {b.get(), &on_b}}) {
      if (ids->empty()) continue;
      PushResponse resp;
      ASSERT_TRUE(
          core->Push(MakePush(*ids, std::vector<float>(ids->size() * 4, 0.5f), 6, seq), &resp)
              .ok());
    }
  }
  auto da = Export(*a, root_ + "/d1a", cursor);
  auto db = Export(*b, root_ + "/d1b", cursor);
  ASSERT_TRUE(da.ok() && db.ok()) << da.status() << db.status();
  EXPECT_FALSE(da->whole());
  EXPECT_FALSE(db->whole());
  auto fa = Export(*a, root_ + "/e1a");
  auto fb = Export(*b, root_ + "/e1b");
  ASSERT_TRUE(fa.ok() && fb.ok());
  const Part e0 = ReadRows({root_ + "/e0a", root_ + "/e0b"});
  const Part d1 = ReadRows({root_ + "/d1a", root_ + "/d1b"});
  const Part e1 = ReadRows({root_ + "/e1a", root_ + "/e1b"});
  EXPECT_EQ(ApplyDelta(e0.rows, d1), e1.rows);
  EXPECT_LT(d1.rows.size(), e1.rows.size());

  // A pod the cursor does not name (a new pod, a lost disk) writes every row it holds.
  auto c = Open("c", false, *ShardOwnership::Create(kV, 0, {}));
  ASSERT_TRUE(c->ApplyAssignment(Placement(1, all, {}, {}), &ar).ok());
  PushSome(*c, 1, 5, 4);
  auto whole = Export(*c, root_ + "/d1c", cursor);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE(whole->whole());
  EXPECT_EQ(ReadRows({root_ + "/d1c"}).rows, Snapshot(*c));
}

// A cursor from before rounds that the journal merged (it keeps only the newest round as
// written): the delta may name more ids than changed, never fewer, and applied to the
// cursor's full export it equals a new full export: deletions, rows created after the
// cursor and deleted again, rows deleted and created again, across a crash.
TEST_F(PodTransferTest, ADeltaFromBeforeAJournalMergeIsExactAcrossACrash) {
  journal_.keep_rounds = 1;
  journal_.merge_min_bytes = 1;
  auto a = Open("a", /*materialize_on_close=*/false);
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < 30; ++id) ids.push_back(id);
  for (uint64_t seq = 1; seq <= 3; ++seq) PushIds(*a, seq, ids, 0.25f);  // every row at step 3
  ASSERT_TRUE(a->storage()->Materialize().ok());
  auto full = Export(*a, root_ + "/e0");
  ASSERT_TRUE(full.ok()) << full.status();
  const Part e0 = ReadRows({root_ + "/e0"});
  auto at = ParseExportCursor(full->cursor());
  ASSERT_TRUE(at.ok() && at->size() == 1u) << full->cursor();
  const uint64_t cursor_seq = (*at)[0].seq;

  std::set<int64_t> changed = {1, 2, 3, 40, 41, 5, 6, 7, 8, 9};
  ASSERT_TRUE(a->DeleteRows("emb", {1, 2}).ok());
  PushIds(*a, 4, {3, 40}, 0.5f);
  ASSERT_TRUE(a->storage()->Materialize().ok());
  ASSERT_TRUE(a->DeleteRows("emb", {3}).ok());
  PushIds(*a, 5, {3}, 1.0f);  // created again, in the same round
  ASSERT_TRUE(a->storage()->Materialize().ok());
  PushIds(*a, 6, {41, 5}, 1.0f);
  ASSERT_TRUE(a->DeleteRows("emb", {6}).ok());
  ASSERT_TRUE(a->storage()->Materialize().ok());
  ASSERT_TRUE(a->DeleteRows("emb", {40}).ok());  // created after the cursor, deleted again
  ASSERT_TRUE(a->storage()->Materialize().ok());
  PushIds(*a, 7, {7}, 1.0f);
  ASSERT_TRUE(a->storage()->Materialize().ok());
  const ChangeJournal::Stats merged = a->storage()->journal().stats();
  EXPECT_GT(merged.merges, 0u);
  EXPECT_GT(merged.merged_through, cursor_seq);  // the cursor lies before a merged range
  a.reset();                                     // a crash: nothing materialized at close
  a = Open("a", false);
  ASSERT_TRUE(a->DeleteRows("emb", {8}).ok());
  PushIds(*a, 8, {9, 6}, 1.0f);  // 6 created again; in the recovered pod's log only
  EXPECT_EQ(a->storage()->journal().stats().merged_through, merged.merged_through);

  auto delta = Export(*a, root_ + "/d1", full->cursor());
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_FALSE(delta->whole());
  const Part d1 = ReadRows({root_ + "/d1"});
  const std::set<int64_t> deleted = {1, 2, 3, 6, 8, 40};
  EXPECT_TRUE(std::includes(d1.deleted.begin(), d1.deleted.end(), deleted.begin(), deleted.end()));
  std::set<int64_t> named = d1.deleted;
  for (const auto& [id, v] : d1.rows) named.insert(id);
  EXPECT_TRUE(std::includes(named.begin(), named.end(), changed.begin(), changed.end()));
  for (int64_t id : {3, 41, 5, 6, 7, 9}) EXPECT_EQ(d1.rows.count(id), 1u) << id;
  EXPECT_EQ(d1.rows.count(40), 0u);
  EXPECT_EQ(d1.rows.at(3).back(), 1.0f);  // its step: a new row

  std::string cursor1;
  Rows e1;
  ExpectDeltaGivesANewExport(*a, e0, d1, &cursor1, &e1);
  if (HasFatalFailure()) return;

  // The import's side: the full export, the delta's deletions, then its rows.
  auto b = Open("b", false);
  ImportRowsResponse deletes, installs;
  ImportFullThenDelta(*b, d1, &deletes, &installs);
  if (HasFatalFailure()) return;
  EXPECT_EQ(Snapshot(*b), e1);
}

// A database an older version wrote has a second identity ("journal_id") that its cursors
// carry: they stay valid. New cursors carry the storage id's first 64 bits.
TEST_F(PodTransferTest, ACursorOfTheDatabasesOlderJournalIdentityStaysValid) {
  auto a = Open("a", /*materialize_on_close=*/false);
  PushSome(*a, 1, 5, 1);
  ASSERT_TRUE(a->storage()->Materialize().ok());
  const std::string storage_id = a->storage()->storage_id();
  a.reset();
  const uint64_t legacy = 0x0123456789abcdefu;
  {
    StorageDbOptions o;
    o.dir = root_ + "/a";
    auto db = StorageDb::Open(o);
    ASSERT_TRUE(db.ok()) << db.status();
    std::string v;
    for (int i = 7; i >= 0; --i) v.push_back(static_cast<char>(legacy >> (8 * i)));
    ASSERT_TRUE((*db)->WriteMeta({{"journal_id", v}}, {}, true).ok());
  }
  a = Open("a", false);
  auto full = Export(*a, root_ + "/e0");
  ASSERT_TRUE(full.ok()) << full.status();
  const Part e0 = ReadRows({root_ + "/e0"});
  EXPECT_TRUE(absl::StartsWith(full->cursor(), "v1:" + storage_id.substr(0, 16) + "."))
      << full->cursor() << " " << storage_id;
  std::set<int64_t> changed;
  PushSome(*a, 6, 2, 2, &changed);
  ASSERT_TRUE(a->storage()->Materialize().ok());

  auto entries = *ParseExportCursor(full->cursor());
  entries[0].identity = legacy;  // as the older version printed it
  auto delta = Export(*a, root_ + "/d1", FormatExportCursor(entries));
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_FALSE(delta->whole());
  const Part d1 = ReadRows({root_ + "/d1"});
  std::set<int64_t> got;
  for (const auto& [id, v] : d1.rows) got.insert(id);
  EXPECT_EQ(got, changed);
  EXPECT_EQ(ApplyDelta(e0.rows, d1), Snapshot(*a));
  // Another database's cursor: written whole, as before.
  entries[0].identity = legacy + 1;
  auto other = Export(*a, root_ + "/d2", FormatExportCursor(entries));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(other->whole());
}

TEST_F(PodTransferTest, ACursorOlderThanTheJournalIsRefused) {
  // A journal that keeps only its newest entry.
  auto a = Open("a", false, ShardOwnership::All(16), /*journal_bytes=*/0);
  PushSome(*a, 1, 5, 1);
  auto e0 = Export(*a, root_ + "/e0");
  ASSERT_TRUE(e0.ok()) << e0.status();
  PushSome(*a, 6, 5, 2);
  auto e1 = Export(*a, root_ + "/e1");  // its round drops e0's entry
  ASSERT_TRUE(e1.ok()) << e1.status();
  auto old = Export(*a, root_ + "/d0", e0->cursor());
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition) << old.status();
  EXPECT_NE(old.status().message().find("take a full export"), std::string::npos);
  EXPECT_TRUE(Export(*a, root_ + "/d1", e1->cursor()).ok());
  // Not a cursor at all.
  EXPECT_EQ(Export(*a, root_ + "/d2", "yesterday").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Export(*a, root_ + "/d3", "v1:12.3.4").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(PodTransferTest, ExportThenImportIsExactAndDurable) {
  Rows source;
  {
    auto a = Open("a", /*materialize_on_close=*/false);
    PushSome(*a, 1, 30, 1);
    ASSERT_TRUE(a->storage()->Materialize().ok());
    PushSome(*a, 31, 20, 2);  // half in the log only: the export's snapshot replays it
    source = Snapshot(*a);
    ExportRequest req;
    req.set_dir(root_ + "/export");
    ExportResponse resp;
    ASSERT_TRUE(ExportPod(*a, req, &resp).ok());
    EXPECT_EQ(resp.rows(), source.size());
    EXPECT_TRUE(resp.consistent());
    EXPECT_FALSE(std::filesystem::exists(root_ + "/export/.snapshot"));
    EXPECT_EQ(ExportPod(*a, req, &resp).code(), absl::StatusCode::kAlreadyExists);
  }
  const ImportRowsRequest req = ReadPart(root_ + "/export");
  {
    auto b = Open("b", /*materialize_on_close=*/false);
    ImportRowsResponse resp;
    ASSERT_TRUE(ImportRows(*b, req, &resp).ok());
    EXPECT_EQ(resp.installed(), source.size());
    EXPECT_EQ(Snapshot(*b), source);
    // Again: everything is already there.
    ASSERT_TRUE(ImportRows(*b, req, &resp).ok());
    EXPECT_EQ(resp.installed(), 0u);
    EXPECT_EQ(resp.skipped(), source.size());
  }  // a crash: nothing materialized, the installs are only in the log
  auto b = Open("b", false);
  EXPECT_EQ(Snapshot(*b), source);
}

TEST_F(PodTransferTest, InstallsInterleavedWithPushesRecoverExactly) {
  auto a = Open("a", true);
  PushSome(*a, 1, 40, 3);
  ExportRequest ereq;
  ereq.set_dir(root_ + "/export");
  ExportResponse eresp;
  ASSERT_TRUE(ExportPod(*a, ereq, &eresp).ok());
  const ImportRowsRequest req = ReadPart(root_ + "/export");

  Rows expected;
  {
    auto b = Open("b", false);
    PushSome(*b, 1, 5, 4);  // some rows exist with few steps: the import overwrites them
    ASSERT_TRUE(b->storage()->Materialize().ok());
    ImportRowsResponse resp;
    ASSERT_TRUE(ImportRows(*b, req, &resp).ok());
    EXPECT_GT(resp.installed(), 0u);
    PushSome(*b, 100, 10, 5);  // on top of the installed rows
    ASSERT_TRUE(b->storage()->Materialize().ok());
    PushSome(*b, 200, 10, 6);
    expected = Snapshot(*b);
  }
  auto b = Open("b", false);
  EXPECT_EQ(Snapshot(*b), expected);
}

TEST_F(PodTransferTest, ImportIsValidatedWhole) {
  auto own = ShardOwnership::Create(16, 1, {0});
  ASSERT_TRUE(own.ok());
  auto b = Open("b", false, *own);
  std::vector<float> row(4 + 8, 0.5f);  // Adam: weights, m, v
  // An owned id and one that is not.
  int64_t owned = -1, foreign = -1;
  const uint64_t h = NameHash("emb");
  for (int64_t id = 0; owned < 0 || foreign < 0; ++id) {
    (VShardOf(RouteHash(h, id), 16) == 0 ? owned : foreign) = id;
  }
  auto request = [&](std::vector<int64_t> ids, size_t floats_per_row, float value) {
    ImportRowsRequest req;
    TableRows* t = req.add_tables();
    t->set_table("emb");
    *t->mutable_ids() = Pack<int64_t>(ids);
    *t->mutable_steps() = Pack<uint64_t>(std::vector<uint64_t>(ids.size(), 3));
    *t->mutable_values() = Pack<float>(std::vector<float>(ids.size() * floats_per_row, value));
    return req;
  };
  ImportRowsResponse resp;
  EXPECT_EQ(ImportRows(*b, request({owned, foreign}, 12, 1), &resp).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ImportRows(*b, request({owned}, 11, 1), &resp).code(),
            absl::StatusCode::kInvalidArgument);
  ImportRowsRequest unknown = request({owned}, 12, 1);
  unknown.mutable_tables(0)->set_table("nope");
  EXPECT_EQ(ImportRows(*b, unknown, &resp).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b->store().FindTable("emb")->rows(), 0u);  // nothing was installed
  ASSERT_TRUE(ImportRows(*b, request({owned}, 12, 1), &resp).ok());
  EXPECT_EQ(resp.installed(), 1u);
  // An older state (lower step) never replaces a newer one.
  ImportRowsRequest older = request({owned}, 12, 2);
  *older.mutable_tables(0)->mutable_steps() = Pack<uint64_t>(std::vector<uint64_t>{2});
  ASSERT_TRUE(ImportRows(*b, older, &resp).ok());
  EXPECT_EQ(resp.skipped(), 1u);
  b->store().FindTable("emb")->Inspect(owned, [](const RowView& r) {
    EXPECT_EQ(r.weights[0], 1.0f);
    EXPECT_EQ(r.step, 3u);
  });
}

// Issue 15, item 3: import refused a whole batch for one non-finite row ("non-finite
// value"), good rows included, while export wrote such rows. Now an import installs every
// valid row and skips, counts and names each row no update could have left (non-finite,
// beyond ±kMaxValue, a negative accumulator); an export leaves those rows out (below).
TEST_F(PodTransferTest, ImportSkipsAndNamesRowsThatAreNoValidState) {
  auto b = Open("b", false);
  const float nan = std::nanf("");
  // Adam rows: 4 weights, m (4), v (4).
  auto row = [](float w, float m, float v) {
    std::vector<float> r(4, w);
    r.insert(r.end(), 4, m);
    r.insert(r.end(), 4, v);
    return r;
  };
  const std::vector<int64_t> ids = {10, 11, 12, 13, 14};
  std::vector<float> values;
  for (const auto& r : {row(0.5f, 0.1f, 0.2f), row(nan, 0, 0), row(0.25f, 0, -1.0f),
                        row(0.125f, 3e15f, 0), row(1, 1, 1)}) {
    values.insert(values.end(), r.begin(), r.end());
  }
  ImportRowsRequest req;
  TableRows* t = req.add_tables();
  t->set_table("emb");
  *t->mutable_ids() = Pack<int64_t>(ids);
  *t->mutable_steps() = Pack<uint64_t>(std::vector<uint64_t>(ids.size(), 4));
  *t->mutable_values() = Pack<float>(values);
  DenseState* d = req.add_dense();
  d->set_name("missing-is-still-an-error");
  ImportRowsResponse resp;
  EXPECT_EQ(ImportRows(*b, req, &resp).code(), absl::StatusCode::kNotFound);
  req.clear_dense();

  ASSERT_TRUE(ImportRows(*b, req, &resp).ok());
  EXPECT_EQ(resp.installed(), 2u);
  EXPECT_EQ(resp.invalid(), 3u);
  ASSERT_EQ(resp.invalid_rows_size(), 3);
  EXPECT_EQ(resp.invalid_rows(0),
            "table 'emb' id 11: weight[0] = nan is not finite or beyond +-1e+15");
  EXPECT_EQ(resp.invalid_rows(1), "table 'emb' id 12: slot1[0] = -1 is a negative accumulator");
  EXPECT_EQ(resp.invalid_rows(2),
            "table 'emb' id 13: slot0[0] = 3e+15 is not finite or beyond +-1e+15");
  auto table = b->store().FindTable("emb");
  EXPECT_EQ(table->rows(), 2u);
  for (int64_t id : {11, 12, 13}) EXPECT_FALSE(table->Inspect(id, [](const RowView&) {})) << id;
  table->Inspect(14, [](const RowView& r) {
    EXPECT_EQ(r.weights[3], 1.0f);
    EXPECT_EQ(r.step, 4u);
  });
  EXPECT_EQ(b->refusals().invalid_import_rows, 3u);
  // Only invalid rows: nothing installed, still answered (and logged on this durable pod).
  ImportRowsRequest only_bad;
  TableRows* bad = only_bad.add_tables();
  bad->set_table("emb");
  *bad->mutable_ids() = Pack<int64_t>(std::vector<int64_t>{20});
  *bad->mutable_steps() = Pack<uint64_t>(std::vector<uint64_t>{1});
  *bad->mutable_values() = Pack<float>(row(std::numeric_limits<float>::infinity(), 0, 0));
  ASSERT_TRUE(ImportRows(*b, only_bad, &resp).ok());
  EXPECT_EQ(resp.installed(), 0u);
  EXPECT_EQ(resp.invalid(), 1u);
}

// What export writes, import accepts: rows that are no valid state (made by an older
// version, before updates saturated) are left out of an export and counted, on a durable
// pod (rows streamed from its database) and an in-memory one (rows from memory).
TEST_F(PodTransferTest, ExportLeavesOutRowsAnImportWouldRefuse) {
  for (bool durable : {true, false}) {
    SCOPED_TRACE(durable ? "durable" : "in memory");
    std::unique_ptr<PsCore> a;
    if (durable) {
      a = Open(durable ? "a" : "m", /*materialize_on_close=*/false);
    } else {
      a = std::make_unique<PsCore>(PsCoreOptions(), ShardOwnership::All(16));
      CreateTableRequest req;
      *req.mutable_spec() = Spec();
      CreateTableResponse cr;
      ASSERT_TRUE(a->CreateTable(req, &cr).ok());
    }
    PushSome(*a, 1, 10, 7);
    auto t = a->store().FindTable("emb");
    const size_t good = t->rows();
    // Installed straight into the table, as a pod before this version could hold them.
    std::vector<float> weights(4, 0.5f), slots(8, 0.0f);
    weights[2] = -std::numeric_limits<float>::infinity();
    ASSERT_TRUE(t->Install(1001, weights.data(), slots.data(), 9));
    weights[2] = 0.5f;
    slots[5] = -2.0f;  // a negative second moment
    ASSERT_TRUE(t->Install(1002, weights.data(), slots.data(), 9));
    if (durable) {
      ASSERT_TRUE(a->storage()->Materialize().ok());  // the stored-rows path
    }
    const std::string dir = root_ + (durable ? "/export-durable" : "/export-memory");
    ExportRequest ereq;
    ereq.set_dir(dir);
    ExportResponse eresp;
    ASSERT_TRUE(ExportPod(*a, ereq, &eresp).ok());
    EXPECT_EQ(eresp.rows(), good);
    EXPECT_EQ(eresp.invalid(), 2u);

    auto b = Open(durable ? "b-durable" : "b-memory", false);
    ImportRowsResponse resp;
    ASSERT_TRUE(ImportRows(*b, ReadPart(dir), &resp).ok());
    EXPECT_EQ(resp.installed(), good);
    EXPECT_EQ(resp.invalid(), 0u);
  }
}

}  // namespace
}  // namespace ps
