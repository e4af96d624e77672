// PsCore: live vshard migration (the protocol is described in proto/ps.proto).
//
// Source side: MigrateBegin installs an OutgoingMove; from then on every change (a push,
// an import) that touches one of its vshards records the rows it changed, after applying
// them, under migrate_mu_ shared (PsCore::ApplyChange). Exports read rows as they are now:
// the SNAPSHOT phase every row present at MigrateBegin, each DELTA phase the rows touched
// since the previous phase began, and FINAL the same after fencing. A row read after its
// last change is current, and every change after a read is recorded for the next phase,
// so after the fence the destination holds exactly the source's rows.
//
// Deletions (eviction, an imported deletion) run during a move too: a DELETE change
// records its ids as deleted BEFORE it deletes them (RecordDeleted) and as touched after.
// A phase sends the deletions recorded since the previous phase began before its rows,
// and with every row it reads, the row's deletion if one was recorded since this phase
// began: a row read after a deletion (say, evicted and re-created at a lower step) then
// reaches the destination after that deletion, never over an older copy of the row. The
// destination deletes a chunk's ids before it installs the chunk's rows.
//
// Destination side: ImportChunk installs each chunk through the same path as the source's
// changes (ApplyChange: logged on a durable pod, as an import is), while the vshards are
// being received; FinishImport waits until every chunk is durable.
#include <glog/logging.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/routing/hash.h"
#include "proto/packed.h"
#include "ps/deposed_outcome.h"
#include "ps/ps_core.h"

namespace ps {

struct PsCore::OutgoingMove {
  uint64_t move_id = 0;
  std::vector<bool> vshards;  // indexed by vshard
  std::vector<uint32_t> list;
  // Guarded by PsCore::migrate_mu_ (written exclusively, read shared).
  bool fenced = false;
  absl::Time fence_start;

  bool Has(uint32_t v) const { return v < vshards.size() && vshards[v]; }

  // Rows changed, and ids deleted, since the current phase began.
  using IdsOfTable =
      absl::flat_hash_map<EmbeddingTable*,
                          std::pair<std::shared_ptr<EmbeddingTable>, absl::flat_hash_set<int64_t>>>;
  absl::Mutex touched_mu;
  IdsOfTable touched ABSL_GUARDED_BY(touched_mu);
  IdsOfTable deleted ABSL_GUARDED_BY(touched_mu);
  absl::flat_hash_set<std::string> touched_dense ABSL_GUARDED_BY(touched_mu);

  // The phase being exported (one destination, one call at a time): its deletions, sent
  // first (cursors [0, deletes.size())), then its rows.
  absl::Mutex export_mu;
  MigrateExportRequest::Phase phase ABSL_GUARDED_BY(export_mu) = MigrateExportRequest::SNAPSHOT;
  std::vector<std::pair<std::shared_ptr<EmbeddingTable>, int64_t>> deletes
      ABSL_GUARDED_BY(export_mu);
  std::vector<std::pair<std::shared_ptr<EmbeddingTable>, int64_t>> rows ABSL_GUARDED_BY(export_mu);
  std::vector<std::string> dense ABSL_GUARDED_BY(export_mu);
  // FINAL: the vshards' push keys (PushDedup::SerializeParts, each part at most the
  // request's max_bytes), sent after the rows, one part per response (cursors
  // [rows, rows + parts)).
  std::vector<std::string> dedup_parts ABSL_GUARDED_BY(export_mu);
};

namespace {

std::string VShardList(const std::vector<uint32_t>& v) {
  if (v.size() <= 8) return absl::StrJoin(v, ",");
  return absl::StrCat(v.front(), "..", v.back(), " (", v.size(), ")");
}

// The most an assignment's epoch may lead the pod's. The master bumps the epoch once per
// map change (a few per move), so a real cluster never gets near this; an epoch beyond it
// (2^64-1, say) would make the pod ignore every later assignment as older.
constexpr uint64_t kMaxEpochJump = uint64_t{1} << 32;

// How long a primary's final export waits for its followers to hold what it applied before
// the fence: longer than a healthy follower ever lags, short of the export's deadline. A
// follower this far behind is one the master is about to drop: the move is retried then.
constexpr absl::Duration kFollowersHeldTimeout = absl::Seconds(10);

std::vector<bool> BitsOf(absl::Span<const uint32_t> vshards, uint32_t n) {
  std::vector<bool> bits(n, false);
  for (uint32_t v : vshards) {
    if (v < n) bits[v] = true;
  }
  return bits;
}

}  // namespace

void PsCore::RecordTouched(OutgoingMove* out, const Change& change) {
  const uint32_t n = static_cast<uint32_t>(out->vshards.size());
  absl::MutexLock lock(&out->touched_mu);
  for (const auto& [table, ids] : change.rows) {
    const uint64_t h = table->name_hash();
    std::pair<std::shared_ptr<EmbeddingTable>, absl::flat_hash_set<int64_t>>* entry = nullptr;
    for (int64_t id : ids) {
      if (!out->Has(VShardOf(RouteHash(h, id), n))) continue;
      if (entry == nullptr) {
        entry = &out->touched[table.get()];
        entry->first = table;
      }
      entry->second.insert(id);
    }
  }
  for (absl::string_view name : change.dense) {
    if (out->Has(DenseVShard(name, n))) out->touched_dense.emplace(name);
  }
}

void PsCore::RecordDeleted(OutgoingMove* out, const std::shared_ptr<EmbeddingTable>& t,
                           absl::Span<const int64_t> ids) {
  const uint32_t n = static_cast<uint32_t>(out->vshards.size());
  const uint64_t h = t->name_hash();
  absl::MutexLock lock(&out->touched_mu);
  absl::flat_hash_set<int64_t>* set = nullptr;
  for (int64_t id : ids) {
    if (!out->Has(VShardOf(RouteHash(h, id), n))) continue;
    if (set == nullptr) {
      auto& entry = out->deleted[t.get()];
      entry.first = t;
      set = &entry.second;
    }
    set->insert(id);
  }
}

absl::Status PsCore::CheckFence(const OutgoingMove& out, const Change& change) {
  if (!out.fenced) return absl::OkStatus();
  const uint32_t n = static_cast<uint32_t>(out.vshards.size());
  auto refused = [&](uint32_t v) {
    return absl::UnavailableError(absl::StrCat("vshard ", v, " is moving to another pod (move ",
                                               out.move_id, "); retry shortly"));
  };
  for (const auto& [table, ids] : change.rows) {
    const uint64_t h = table->name_hash();
    for (int64_t id : ids) {
      if (const uint32_t v = VShardOf(RouteHash(h, id), n); out.Has(v)) return refused(v);
    }
  }
  for (absl::string_view name : change.dense) {
    if (const uint32_t v = DenseVShard(name, n); out.Has(v)) return refused(v);
  }
  return absl::OkStatus();
}

absl::Status PsCore::ApplyAssignment(const Assignment& req, ApplyAssignmentResponse* resp) {
  auto current = ownership();
  if (req.num_vshards() != current->num_vshards()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "assignment for ", req.num_vshards(), " vshards; this pod has ", current->num_vshards()));
  }
  const uint32_t n = current->num_vshards();
  std::vector<uint32_t> owned(req.owned().begin(), req.owned().end());
  ASSIGN_OR_RETURN(ShardOwnership next, ShardOwnership::Create(n, req.epoch(), owned));
  const std::vector<bool> moving_in = BitsOf(req.moving_in(), n);
  const std::vector<bool> moving_out = BitsOf(req.moving_out(), n);
  if (req.replication().followers_size() > 0 && replicator_ == nullptr) {
    return absl::FailedPreconditionError(
        "the assignment names followers, but this pod was built without a replica sender");
  }
  std::vector<uint32_t> drop;
  std::shared_ptr<OutgoingMove> ended;
  RoleChange role;
  bool failed_over = false;
  {
    absl::WriterMutexLock fence(&migrate_mu_);
    current = ownership();
    if (assigned_ && req.epoch() < current->epoch()) {  // an older answer arriving late
      resp->set_epoch(current->epoch());
      return absl::OkStatus();
    }
    if (req.epoch() > current->epoch() && req.epoch() - current->epoch() > kMaxEpochJump) {
      LOG(WARNING) << "refused an assignment at epoch " << req.epoch() << ": this pod is at epoch "
                   << current->epoch();
      return absl::InvalidArgumentError(absl::StrCat(
          "assignment epoch ", req.epoch(), " is absurdly far (more than 2^32) beyond this pod's ",
          current->epoch(), "; the master bumps it by a few per change"));
    }
    if (outgoing_ != nullptr) {
      for (uint32_t v : outgoing_->list) {
        if (!moving_out[v]) ended = outgoing_;
      }
      if (ended != nullptr) outgoing_.reset();
    }
    if (req.moving_out_size() > 0) {
      bool covered = outgoing_ != nullptr;
      for (uint32_t v : req.moving_out()) covered = covered && outgoing_->Has(v);
      if (!covered) {
        // A move of these vshards is under way, but this pod has no record of its rows
        // being tracked (it restarted, or MigrateBegin has not come yet): refuse pushes to
        // them, or a push applied here now could be missing on the destination.
        auto placeholder = std::make_shared<OutgoingMove>();
        placeholder->list.assign(req.moving_out().begin(), req.moving_out().end());
        placeholder->vshards = moving_out;
        placeholder->fenced = true;
        placeholder->fence_start = absl::Now();
        outgoing_ = std::move(placeholder);
      }
    }
    // Vshards this pod led and loses other than by a committed move of its own (whose
    // fence waited until the followers held everything): a failover deposed it.
    for (uint32_t v = 0; v < n; ++v) {
      if (current->Owns(v) && !next.Owns(v) && (ended == nullptr || !ended->Has(v))) {
        failed_over = true;
      }
    }
    role = ApplyRole(req, *current, next);
    // A follower new to this pod gets its stream before this section ends, which is when
    // an ended move's fence (reset above) lifts and new ownership takes effect (a follower
    // filled by a copy, master/rereplicator.h; a moved primary's followers): no change can
    // apply between the copy's fenced final delta and the stream, so the follower
    // receives every later record.
    if (replicator_ != nullptr && !role.followers.empty()) {
      replicator_->AddFollowers(req.replication().pod_id(), req.epoch(), role.followers);
    }
    // The first assignment after a restart: the recovered log's records before any new one.
    if (storage_ != nullptr) ResolveRecoveredLog(next);
    if (current->epoch() != next.epoch() || current->Bitmap() != next.Bitmap()) {
      LOG(INFO) << "shard map epoch " << next.epoch() << ": owning " << next.owned_count() << " of "
                << n << " vshards";
      absl::MutexLock lock(&mu_);
      ownership_ = std::make_shared<const ShardOwnership>(std::move(next));
    }
    if (!assigned_) {
      held_.assign(n, true);  // recovered rows may be of any vshard
      assigned_ = true;
    }
    incoming_ = moving_in;
    auto own = ownership();
    for (uint32_t v = 0; v < n; ++v) {
      if (own->Owns(v) || moving_in[v] || !role_.primary_of[v].empty()) {
        if (own->Owns(v) || !role_.primary_of[v].empty()) held_[v] = true;
        continue;
      }
      if (held_[v]) drop.push_back(v);
      held_[v] = false;
    }
  }
  if (ended != nullptr) {
    // Still owned after the move: an abort, or a copy that made the destination a follower.
    const bool committed = !ownership()->Owns(ended->list.front());
    if (ended->fenced) {
      LOG(INFO) << "move " << ended->move_id << " of vshards " << VShardList(ended->list) << " "
                << (committed ? "committed" : "ended (this pod keeps them)")
                << "; pushes were fenced for "
                << absl::ToDoubleMilliseconds(absl::Now() - ended->fence_start) << " ms";
    } else {
      LOG(INFO) << "move " << ended->move_id << " of vshards " << VShardList(ended->list)
                << (committed ? " committed" : " ended before its fence (this pod keeps them)");
    }
  }
  if (!drop.empty() && ownership()->owned_count() == 0 &&
      std::find(moving_in.begin(), moving_in.end(), true) == moving_in.end()) {
    LOG(WARNING) << "ALL VSHARDS DROPPED: the assignment at epoch " << req.epoch()
                 << " leaves this pod no vshard; erasing the rows of the " << drop.size()
                 << " vshards it held (" << VShardList(drop)
                 << ") from memory and disk. Expected only when the pod was drained.";
  }
  if (replicator_ != nullptr) {
    // A deposed primary's changes still waiting for followers fail for the vshards it no
    // longer leads: the new primary may not hold them (their clients retry there with the
    // same keys). For those it still leads (its sole copies, kept when the others fail
    // over) its rows are the ones that count: they stay applied under their keys, so a
    // retry is a duplicate here, not applied twice; the followers it keeps still get them.
    if (role.deposed && failed_over) {
      // Records applied before this assignment are shipped once written: wait for that,
      // or one shipped after Depose would get no outcome from it.
      if (storage_ != nullptr) {
        if (absl::Status s = storage_->WaitApplied(); !s.ok()) {
          LOG(WARNING) << "deposed with a failed log (its unwritten records are not shipped): "
                       << s;
        }
      }
      const absl::Status why = absl::UnavailableError(
          absl::StrCat("this pod is no longer the primary at epoch ", req.epoch(), "; retry"));
      replicator_->Depose(req.replication().pod_id(), req.epoch(), role.followers,
                          [own = ownership(), why](const std::string& record) {
                            return DeposedOutcome(record, *own, why);
                          });
      // Recovered records still waiting for followers (ResolveRecoveredLog): their rows go
      // with the vshards, so their keys are forgotten; the new primary decides.
      if (storage_ != nullptr && storage_->holds_recovered_log()) {
        const size_t keys = dedup_.ReleaseAll(/*applied=*/false);
        storage_->ReleaseRecoveredLog();
        LOG(WARNING) << "deposed before the followers held the recovered log: " << keys
                     << " push keys forgotten";
      }
    } else {
      replicator_->SetFollowers(req.replication().pod_id(), req.epoch(), role.followers);
    }
  }
  if (!drop.empty()) RETURN_IF_ERROR(DropVShards(drop));
  resp->set_epoch(ownership()->epoch());
  return absl::OkStatus();
}

absl::Status PsCore::DropVShards(const std::vector<uint32_t>& requested) {
  absl::MutexLock lock(&drop_mu_);
  const absl::Time start = absl::Now();
  const uint32_t n = ownership()->num_vshards();
  // A copy may have begun filling a vshard since the assignment chose to drop it (a
  // follower copy starts as soon as a restarted pod registers): its rows stay. BeginImport
  // waits for a drop under way (drop_mu_), so no copied row is erased here.
  std::vector<uint32_t> vshards;
  {
    absl::ReaderMutexLock fence(&migrate_mu_);
    for (uint32_t v : requested) {
      if (v < held_.size() && !held_[v]) vshards.push_back(v);
    }
  }
  if (vshards.empty()) return absl::OkStatus();
  const std::vector<bool> bits = BitsOf(vshards, n);
  std::vector<std::pair<std::string, std::vector<int64_t>>> rows;
  size_t erased = 0;
  for (const auto& t : store_.Tables()) {
    std::vector<int64_t> ids;
    const uint64_t h = t->name_hash();
    t->ForEachRow([&](const RowView& r) {
      if (bits[VShardOf(RouteHash(h, r.id), n)]) ids.push_back(r.id);
    });
    if (t->admission() != nullptr) t->admission()->Clear(vshards);
    if (ids.empty()) continue;
    erased += t->Erase(ids);
    rows.emplace_back(t->spec().name(), std::move(ids));
  }
  std::vector<std::string> dense;
  for (const auto& d : store_.DenseTensors()) {
    if (bits[DenseVShard(d->spec().name(), n)]) dense.push_back(d->spec().name());
  }
  // Their push keys go with the rows: a retry of a push whose rows were dropped here
  // applies again once this pod holds the vshards again (by a copy, which brings the
  // source's keys of them).
  dedup_.Forget(vshards);
  if (storage_ != nullptr && (!rows.empty() || !dense.empty())) {
    RETURN_IF_ERROR(storage_->DropRows(rows, dense));
  }
  if (erased > 0) {
    LOG(INFO) << "dropped " << erased << " rows of vshards " << VShardList(vshards)
              << ", which this pod no longer owns, in "
              << absl::ToDoubleMilliseconds(absl::Now() - start) << " ms";
  }
  return absl::OkStatus();
}

absl::Status PsCore::MigrateBegin(const MigrateBeginRequest& req, MigrateBeginResponse* resp) {
  auto own = ownership();
  const uint32_t n = own->num_vshards();
  if (req.vshards_size() == 0) return absl::InvalidArgumentError("move names no vshards");
  if (options_.table.evictable) {
    // A move copies rows from memory; evicted rows are only in the database.
    return absl::FailedPreconditionError(
        "this pod runs with --memory_budget_mb: moving vshards away from it is not supported "
        "yet");
  }
  if (storage_ != nullptr && !storage_->rows_loaded()) {
    // A lazy start: rows not loaded yet are only in the database, and a move copies rows
    // from memory.
    return absl::UnavailableError(
        "this pod is still loading its stored rows (--lazy_start); retry the move later");
  }
  for (uint32_t v : req.vshards()) {
    if (v >= n || !own->Owns(v)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot move vshard ", v, " away: this pod does not own it at epoch ", own->epoch()));
    }
  }
  auto move = std::make_shared<OutgoingMove>();
  move->move_id = req.move_id();
  move->list.assign(req.vshards().begin(), req.vshards().end());
  move->vshards = BitsOf(move->list, n);
  std::shared_ptr<OutgoingMove> retried;
  {
    absl::WriterMutexLock fence(&migrate_mu_);
    if (outgoing_ != nullptr && outgoing_->move_id == req.move_id()) retried = outgoing_;
  }
  if (retried != nullptr) {  // export_mu is never taken under migrate_mu_
    absl::MutexLock lock(&retried->export_mu);
    resp->set_rows(retried->rows.size());
    return absl::OkStatus();
  }
  {
    absl::WriterMutexLock fence(&migrate_mu_);
    if (outgoing_ != nullptr && outgoing_->move_id != 0) {  // 0: the fence before a begin
      LOG(WARNING) << "move " << outgoing_->move_id << " replaced by move " << req.move_id();
    }
    outgoing_ = move;  // tracking starts before the snapshot below
  }
  absl::MutexLock lock(&move->export_mu);
  for (const auto& t : store_.Tables()) {
    const uint64_t h = t->name_hash();
    t->ForEachRow([&](const RowView& r) {
      if (move->Has(VShardOf(RouteHash(h, r.id), n))) move->rows.emplace_back(t, r.id);
    });
  }
  for (const auto& d : store_.DenseTensors()) {
    if (move->Has(DenseVShard(d->spec().name(), n))) move->dense.push_back(d->spec().name());
  }
  move->phase = MigrateExportRequest::SNAPSHOT;
  resp->set_rows(move->rows.size());
  LOG(INFO) << "move " << req.move_id() << ": sending vshards " << VShardList(move->list) << " ("
            << move->rows.size() << " rows, " << move->dense.size() << " dense tensors)";
  return absl::OkStatus();
}

absl::Status PsCore::MigrateExport(const MigrateExportRequest& req, MigrateExportResponse* resp) {
  std::shared_ptr<OutgoingMove> out;
  {
    absl::ReaderMutexLock fence(&migrate_mu_);
    out = outgoing_;
  }
  if (out == nullptr || out->move_id != req.move_id()) {
    return absl::NotFoundError(
        absl::StrCat("move ", req.move_id(), " is not in progress on this pod"));
  }
  absl::MutexLock lock(&out->export_mu);
  if (req.cursor() == 0) {
    if (req.phase() == MigrateExportRequest::FINAL) {
      {
        absl::WriterMutexLock fence(&migrate_mu_);
        if (outgoing_ != out) return absl::AbortedError("the move ended while fencing");
        out->fenced = true;
        out->fence_start = absl::Now();
      }
      // Every push applied to the vshards is durable before its rows leave: a client
      // whose push was applied here retries it here, and finds it a duplicate.
      if (storage_ != nullptr) RETURN_IF_ERROR(storage_->WaitApplied());
      // With followers, every change applied to the vshards is held by the ack set too:
      // after the commit the new owner streams to the same followers, which must then hold
      // exactly the rows it copied (and a record shipped later must not fail with the
      // deposed primary's stream).
      if (replicator_ != nullptr) {
        RETURN_IF_ERROR(replicator_->WaitHeld(absl::Now() + kFollowersHeldTimeout));
      }
    }
    if (req.phase() != MigrateExportRequest::SNAPSHOT) {
      absl::MutexLock t(&out->touched_mu);
      out->deletes.clear();
      out->rows.clear();
      out->dense.clear();
      for (auto& [ptr, entry] : out->deleted) {
        for (int64_t id : entry.second) out->deletes.emplace_back(entry.first, id);
      }
      out->deleted.clear();
      for (auto& [ptr, entry] : out->touched) {
        for (int64_t id : entry.second) out->rows.emplace_back(entry.first, id);
      }
      out->dense.assign(out->touched_dense.begin(), out->touched_dense.end());
      out->touched.clear();
      out->touched_dense.clear();
    } else {
      for (const auto& t : store_.Tables()) *resp->add_tables() = t->spec();
      for (const auto& d : store_.DenseTensors()) *resp->add_dense() = d->spec();
    }
    out->phase = req.phase();
  } else if (req.phase() != out->phase) {
    return absl::FailedPreconditionError(absl::StrCat("move ", req.move_id(), ": export of phase ",
                                                      req.phase(), " at cursor ", req.cursor(),
                                                      " but the current phase is ", out->phase));
  }
  const uint64_t max_bytes = req.max_bytes() > 0 ? req.max_bytes() : uint64_t{4} << 20;
  uint64_t bytes = 0;
  size_t i = req.cursor();
  const size_t total = out->deletes.size() + out->rows.size();
  absl::flat_hash_map<EmbeddingTable*, MigratedRows*> entry_of;
  auto entry_for = [&](const std::shared_ptr<EmbeddingTable>& table) {
    MigratedRows*& entry = entry_of[table.get()];
    if (entry == nullptr) {
      entry = resp->add_rows();
      entry->set_table(table->spec().name());
    }
    return entry;
  };
  for (; i < total && bytes < max_bytes; ++i) {
    if (i < out->deletes.size()) {
      const auto& [table, id] = out->deletes[i];
      entry_for(table)->mutable_deleted_ids()->append(reinterpret_cast<const char*>(&id),
                                                      sizeof(id));
      bytes += sizeof(id);
      continue;
    }
    const auto& [table, id] = out->rows[i - out->deletes.size()];
    MigratedRows* entry = entry_for(table);
    const uint32_t dim = table->dim(), slots = table->slot_floats();
    table->Inspect(id, [&](const RowView& r) {
      entry->mutable_ids()->append(reinterpret_cast<const char*>(&r.id), sizeof(r.id));
      entry->mutable_steps()->append(reinterpret_cast<const char*>(&r.step), sizeof(r.step));
      entry->mutable_values()->append(reinterpret_cast<const char*>(r.weights),
                                      dim * sizeof(float));
      entry->mutable_values()->append(reinterpret_cast<const char*>(r.slots),
                                      slots * sizeof(float));
      bytes += 16 + (dim + slots) * sizeof(float);
    });
  }
  {
    // The rows just read that were deleted since this phase began: their deletion goes
    // first (the destination deletes a chunk's ids before installing its rows), as the
    // row read may be a later state than the copy there (re-created at a lower step).
    // Checked after reading, because a deletion is recorded before it applies.
    absl::MutexLock t(&out->touched_mu);
    for (auto& [ptr, entry] : entry_of) {
      auto d = out->deleted.find(ptr);
      if (d == out->deleted.end()) continue;
      const std::string& ids = entry->ids();
      for (size_t k = 0; k + sizeof(int64_t) <= ids.size(); k += sizeof(int64_t)) {
        int64_t id;
        std::memcpy(&id, ids.data() + k, sizeof(id));
        if (d->second.second.contains(id)) {
          entry->mutable_deleted_ids()->append(reinterpret_cast<const char*>(&id), sizeof(id));
        }
      }
    }
  }
  const bool final_phase = req.phase() == MigrateExportRequest::FINAL;
  if (req.cursor() == 0 && final_phase) {
    // Fenced, and every push applied to the vshards is durable (and held by the followers):
    // their keys go after the rows, so a retry of one at the destination is a duplicate.
    // Keys applied whole name every vshard of their part; pieces only their own vshard,
    // so only the moving vshards' pieces go (push_dedup.h). In parts of at most a chunk's
    // bytes: a copy's keys may hold up to max_layers layers and many pieces per writer,
    // far more than one message should (the importer's receive budget, migrate_import.cc).
    out->dedup_parts = dedup_.SerializeParts(&out->vshards, max_bytes);
    // Fenced: the admission counters of the vshards count nothing more here.
    for (const auto& t : store_.Tables()) {
      if (t->admission() == nullptr) continue;
      MigratedAdmission* a = resp->add_admission();
      a->set_table(t->spec().name());
      a->set_counters(t->admission()->SerializeVShards(out->list));
    }
  }
  if (req.cursor() == 0) {
    std::vector<float> values;
    for (const std::string& name : out->dense) {
      auto d = store_.FindDense(name);
      uint64_t step;
      if (d == nullptr || !d->Snapshot(/*always=*/true, &values, &step)) continue;
      MigratedDense* md = resp->add_dense_values();
      md->set_name(name);
      md->set_step(step);
      md->set_values(Pack<float>(values));
    }
  }
  resp->set_next_cursor(i);
  resp->set_done(i >= total);
  resp->set_phase_rows(total);
  if (final_phase && req.cursor() >= total) {
    // The rows are sent: the next part of the keys, alone (rows and a part never share a
    // response, so each stays within max_bytes).
    const uint64_t part = req.cursor() - total;
    if (part >= out->dedup_parts.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "move ", req.move_id(), ": export of FINAL at cursor ", req.cursor(), ", beyond its ",
          total, " rows and ", out->dedup_parts.size(), " parts of push keys"));
    }
    resp->set_push_dedup(out->dedup_parts[part]);
    resp->set_next_cursor(req.cursor() + 1);
    resp->set_done(part + 1 == out->dedup_parts.size());
  } else if (final_phase) {
    resp->set_done(false);  // the keys follow
  }
  return absl::OkStatus();
}

absl::Status PsCore::BeginImport(uint64_t move_id, absl::Span<const uint32_t> vshards) {
  if (options_.table.evictable) {
    return absl::FailedPreconditionError(
        "this pod runs with --memory_budget_mb: moving vshards onto it is not supported yet");
  }
  if (storage_ != nullptr && !storage_->rows_loaded()) {
    return absl::UnavailableError(
        "this pod is still loading its stored rows (--lazy_start); retry the move later");
  }
  // A drop of rows this pod no longer holds (DropVShards) finishes before a copy fills
  // any vshard, so it never erases a copied row.
  absl::MutexLock drop(&drop_mu_);
  absl::WriterMutexLock fence(&migrate_mu_);
  const uint32_t n = ownership()->num_vshards();
  if (incoming_.size() != n) incoming_.assign(n, false);
  if (held_.size() != n) held_.assign(n, true);
  for (uint32_t v : vshards) {
    if (v >= n) return absl::InvalidArgumentError(absl::StrCat("vshard ", v, " out of range"));
  }
  for (uint32_t v : vshards) {
    incoming_[v] = true;
    held_[v] = true;
  }
  // The copy replaces whatever this pod knew of these vshards, keys included: the FINAL
  // chunk brings the source's keys of exactly them (PushDedup::Merge).
  std::vector<uint32_t> sorted(vshards.begin(), vshards.end());
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  dedup_.Forget(sorted);
  {
    absl::MutexLock lock(&import_mu_);
    import_error_ = absl::OkStatus();
    keys_imported_ = false;
  }
  LOG(INFO) << "move " << move_id << ": receiving vshards "
            << VShardList(std::vector<uint32_t>(vshards.begin(), vshards.end()));
  return absl::OkStatus();
}

absl::Status PsCore::CheckImporting(absl::Span<const uint32_t> vshards) {
  absl::ReaderMutexLock fence(&migrate_mu_);
  for (uint32_t v : vshards) {
    if (v >= incoming_.size() || !incoming_[v]) {
      return absl::AbortedError(absl::StrCat("vshard ", v, " is no longer moving to this pod"));
    }
  }
  return absl::OkStatus();
}

absl::Status PsCore::CheckReceiving(const Installs& in) {
  const uint32_t n = ownership()->num_vshards();
  auto check = [&](uint32_t v) {
    if (v < incoming_.size() && incoming_[v]) return absl::OkStatus();
    return absl::AbortedError(absl::StrCat("vshard ", v, " is no longer moving to this pod"));
  };
  for (const Installs::Rows& r : in.rows) {
    const uint64_t h = r.table->name_hash();
    for (int64_t id : r.ids) RETURN_IF_ERROR(check(VShardOf(RouteHash(h, id), n)));
  }
  for (const Installs::Dense& d : in.dense) {
    RETURN_IF_ERROR(check(DenseVShard(d.tensor->spec().name(), n)));
  }
  return absl::OkStatus();
}

absl::Status PsCore::ImportChunk(const MigrateExportResponse& chunk, uint64_t* rows,
                                 uint64_t* bytes) {
  // The source's catalog (the snapshot's first chunk), before the rows that need it.
  for (const TableSpec& spec : chunk.tables()) {
    CreateTableRequest req;
    *req.mutable_spec() = spec;
    CreateTableResponse ignored;
    RETURN_IF_ERROR(CreateTable(req, &ignored));
  }
  for (const DenseSpec& spec : chunk.dense()) {
    CreateDenseRequest req;
    *req.mutable_spec() = spec;
    CreateDenseResponse ignored;
    RETURN_IF_ERROR(CreateDense(req, &ignored));
  }
  Installs in;
  in.rows.resize(chunk.rows_size());
  for (int i = 0; i < chunk.rows_size(); ++i) {
    const MigratedRows& e = chunk.rows(i);
    Installs::Rows& r = in.rows[i];
    r.table = store_.FindTable(e.table());
    if (r.table == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("imported rows of table '", e.table(), "', which the source did not send"));
    }
    RETURN_IF_ERROR(ParseRows("imported rows of", e.ids(), e.steps(), e.values(), &r));
  }
  // The source's deletions (only `table` and `ids` of each entry are used).
  Installs deletions;
  for (int i = 0; i < chunk.rows_size(); ++i) {
    const MigratedRows& e = chunk.rows(i);
    if (e.deleted_ids().empty()) continue;
    Installs::Rows& r = deletions.rows.emplace_back();
    r.table = in.rows[i].table;
    ASSIGN_OR_RETURN(
        r.ids, PackedView<int64_t>(e.deleted_ids(), &r.id_scratch, "deleted ids of", e.table()));
  }
  in.dense.resize(chunk.dense_values_size());
  for (int i = 0; i < chunk.dense_values_size(); ++i) {
    const MigratedDense& e = chunk.dense_values(i);
    Installs::Dense& d = in.dense[i];
    d.tensor = store_.FindDense(e.name());
    if (d.tensor == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("imported dense tensor '", e.name(), "', which the source did not send"));
    }
    RETURN_IF_ERROR(ParseDense("imported", e.values(), &d));
    d.step = e.step();
  }

  // Held from the receiving check until applied, as a push holds it from its ownership
  // check: an assignment that ends the receiving (an aborted move) comes before this chunk
  // (refused) or after it (its rows are dropped with the rest).
  absl::ReaderMutexLock fence(&migrate_mu_);
  RETURN_IF_ERROR(CheckReceiving(in));
  RETURN_IF_ERROR(CheckReceiving(deletions));
  auto failed = [this](absl::Status s) {
    if (s.ok()) return;
    absl::MutexLock lock(&import_mu_);
    if (import_error_.ok()) import_error_ = s;
  };
  // Deletions before the chunk's rows, each table's as a DELETE change of its own (the
  // record of a change replays its installs before its deletions).
  for (const Installs::Rows& r : deletions.rows) {
    ApplyDelete(r.table, r.ids, UINT32_MAX, /*ship=*/false, nullptr, failed);
  }
  Change change;
  AddTouches(in, &change);
  // Install, not Restore: a chunk's row replaces this pod's copy only if the copy has fewer
  // updates (or is missing). That is the rule the log replays (installs in step order,
  // idempotent), so a restart recovers what memory held. And it leaves exactly the
  // source's rows: while the source owns the vshards a row only gains updates, and (id,
  // step) names one state of it; each phase reads a row after the phase before did, so a
  // chunk carries every row at least as new as any earlier chunk; and this pod holds no
  // other copy of a vshard it receives (it drops the rows of vshards it neither owns nor
  // receives, and refuses pushes and imports to them). A chunk older than the copy here
  // breaks that (a copy that outlived a failed drop, a source restored from an older
  // checkpoint): the import fails, rather than commit rows that differ from the source's,
  // and the aborted move drops the copy.
  auto newer_here = [&in]() -> absl::Status {
    for (const Installs::Rows& r : in.rows) {
      for (size_t i = 0; i < r.ids.size(); ++i) {
        uint64_t here = 0;
        if (r.table->Inspect(r.ids[i], [&](const RowView& row) { here = row.step; }) &&
            here > r.steps[i]) {
          return absl::FailedPreconditionError(
              absl::StrCat("row ", r.ids[i], " of '", r.table->spec().name(), "' has ", here,
                           " updates here but ", r.steps[i],
                           " in the move's copy: this pod holds a stale copy "
                           "of the vshard; the move must be aborted"));
        }
      }
    }
    for (const Installs::Dense& d : in.dense) {
      if (const uint64_t here = d.tensor->step(); here > d.step) {
        return absl::FailedPreconditionError(absl::StrCat(
            "dense tensor '", d.tensor->spec().name(), "' has ", here, " updates here but ", d.step,
            " in the move's copy; the move must be aborted"));
      }
    }
    return absl::OkStatus();
  };
  // The admission counters of the vshards (the FINAL chunk), checked before anything is
  // applied: counters of this pod's shape (vshard count).
  std::vector<std::pair<std::shared_ptr<EmbeddingTable>, const std::string*>> admission;
  for (const MigratedAdmission& a : chunk.admission()) {
    auto t = store_.FindTable(a.table());
    if (t == nullptr || t->admission() == nullptr) continue;  // admission off here: drop
    AdmissionSketch check(ownership()->num_vshards());
    if (absl::Status s = check.Restore(a.counters(), /*with_totals=*/false); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("move's admission counters of '", a.table(), "': ", s.message()));
    }
    admission.emplace_back(std::move(t), &a.counters());
  }
  uint64_t installed = 0, skipped = 0;
  auto apply = [&](LogRecordBuilder* record) -> absl::Status {
    RETURN_IF_ERROR(newer_here());
    RETURN_IF_ERROR(ApplyInstalls(in, record, &installed, &skipped));
    for (const auto& [t, counters] : admission) {
      RETURN_IF_ERROR(t->admission()->Restore(*counters, /*with_totals=*/false));
      if (record != nullptr) record->AddAdmissionInstall(t->spec().name(), *counters);
    }
    return absl::OkStatus();
  };
  // Not waiting for the record's write: FinishImport waits for every chunk's.
  ApplyChange(change, apply, failed);
  absl::MutexLock lock(&import_mu_);
  RETURN_IF_ERROR(import_error_);
  if (!chunk.push_dedup().empty()) {
    // After the rows: the keys of the pushes they hold (the FINAL chunk). Stored by
    // FinishImport, before the move can commit.
    if (absl::Status s = dedup_.Merge(chunk.push_dedup()); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the move's push de-duplication state: ", s.message()));
    }
    keys_imported_ = true;
  }
  for (const MigratedRows& e : chunk.rows()) {
    *rows += e.ids().size() / sizeof(int64_t);
    *bytes += e.ids().size() + e.steps().size() + e.values().size();
  }
  for (const MigratedDense& e : chunk.dense_values()) *bytes += e.values().size();
  return absl::OkStatus();
}

absl::Status PsCore::FinishImport() {
  // Every chunk's record was appended by ImportChunk; wait for the writes (and fsync them
  // in periodic mode), so the copy survives a crash of this pod once reported.
  if (storage_ != nullptr) RETURN_IF_ERROR(storage_->SyncApplied());
  bool store_keys = false;
  {
    absl::MutexLock lock(&import_mu_);
    RETURN_IF_ERROR(import_error_);
    store_keys = std::exchange(keys_imported_, false);
  }
  // The copied keys are not in this pod's log (only the rows are): a round stores them
  // now, so that a crash right after the commit does not forget them (a retry of a push
  // the copy holds would then apply twice). The round skips the store only if this pod's
  // own followers lag (its truncation gate), and the next round stores them.
  if (store_keys && storage_ != nullptr) RETURN_IF_ERROR(storage_->Materialize());
  return absl::OkStatus();
}

}  // namespace ps
