// PsCore: replication. The primary's side (ApplyShipped: apply, log and ship in one order,
// each record shipped once this pod's log holds it;
// acknowledge once the ack set holds the change; the write lease), the follower's side
// (ReplicateRecords) and the role an assignment gives (ApplyRole). The protocol is in
// proto/ps.proto, the design in docs/architecture.md, "Replication".
#include <glog/logging.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/routing/hash.h"
#include "ps/deposed_outcome.h"
#include "ps/ps_core.h"

namespace ps {
namespace {

// Calls `done` with the first error once every part has arrived: `parts` at first, one
// more per Add.
class Gather {
 public:
  Gather(int parts, PsCore::Done done) : remaining_(parts), done_(std::move(done)) {}
  void Add() { remaining_.fetch_add(1); }
  bool failed() const { return failed_.load(); }
  void Arrive(const absl::Status& s) {
    if (!s.ok()) {
      failed_.store(true);
      absl::MutexLock lock(&mu_);
      if (error_.ok()) error_ = s;
    }
    if (remaining_.fetch_sub(1) != 1) return;
    absl::Status result;
    {
      absl::MutexLock lock(&mu_);
      result = error_;
    }
    done_(result);
  }

 private:
  std::atomic<int> remaining_;
  std::atomic<bool> failed_{false};
  PsCore::Done done_;
  absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

// One replicated record, parsed, with its ids and steps copied out aligned (the change's
// spans point at them).
// Rows of vshards the follower does not follow from the sender are left out (see
// ReplicateRecords): then `*_data` holds the kept rows' floats (else empty: the view's).
struct ParsedRecord {
  const std::string* owned = nullptr;  // the request's record
  absl::string_view bytes;             // the same, which `view` points into
  LogRecordView view;
  // No row or tensor was left out: the record is logged here as it came (the primary's
  // bytes, LogRecordBuilder::Adopt), not encoded again.
  bool whole = true;
  std::vector<std::vector<int64_t>> table_ids, install_ids, delete_ids;
  std::vector<std::vector<uint64_t>> table_steps, install_steps;
  std::vector<std::vector<float>> table_data, install_data;
  std::vector<bool> dense_kept, dense_install_kept;
};

// Whether a record keeps any entry here after the rows of unfollowed vshards are left out.
bool KeptAny(const ParsedRecord& p) {
  auto any = [](const auto& lists) {
    for (const auto& l : lists) {
      if (!l.empty()) return true;
    }
    return false;
  };
  auto any_true = [](const std::vector<bool>& kept) {
    return std::find(kept.begin(), kept.end(), true) != kept.end();
  };
  return any(p.table_ids) || any(p.install_ids) || any(p.delete_ids) || any_true(p.dense_kept) ||
         any_true(p.dense_install_kept);
}

// The kept rows' floats of a record entry, contiguous: the view's own when none was left out.
const float* KeptData(const std::vector<float>& copied, const char* view_data) {
  return copied.empty() ? reinterpret_cast<const float*>(view_data) : copied.data();
}

// The vshards of a logged record's rows and tensors, sorted and distinct (rows of a table
// not known here are skipped).
std::vector<uint32_t> VShardsOfRecord(ModelStore& store, const LogRecordView& rec, uint32_t n) {
  std::vector<uint32_t> out;
  auto note_ids = [&](absl::string_view table, uint32_t count, auto id_of) {
    auto t = store.FindTable(std::string(table));
    if (t == nullptr) return;
    for (uint32_t i = 0; i < count; ++i)
      out.push_back(VShardOf(RouteHash(t->name_hash(), id_of(i)), n));
  };
  for (const LogTableView& t : rec.tables)
    note_ids(t.table, t.n, [&](uint32_t i) { return t.id(i); });
  for (const LogInstallView& t : rec.installs) {
    note_ids(t.table, t.n, [&](uint32_t i) { return t.id(i); });
  }
  for (const LogDeleteView& t : rec.deletes) {
    note_ids(t.table, t.n, [&](uint32_t i) { return t.id(i); });
  }
  for (const LogDenseView& d : rec.dense) out.push_back(DenseVShard(d.name, n));
  for (const LogDenseInstallView& d : rec.dense_installs) out.push_back(DenseVShard(d.name, n));
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

void PsCore::RenewWriteLease(absl::Time deadline) {
  write_lease_ns_.store(absl::ToUnixNanos(deadline), std::memory_order_relaxed);
}

absl::Status PsCore::CheckWriteLease() {
  if (role_.factor < 2) return absl::OkStatus();
  const int64_t end = write_lease_ns_.load(std::memory_order_relaxed);
  if (absl::ToUnixNanos(absl::Now()) < end) return absl::OkStatus();
  counters_.lease_refusals.fetch_add(1, std::memory_order_relaxed);
  return absl::UnavailableError(
      "this pod has not heard from the master within its lease: it may no longer be the "
      "primary, so it takes no writes; retry (the client follows the map)");
}

void PsCore::ApplyShipped(const Change& change, ApplyFn apply, Done done) {
  const bool ack_leader = role_.ack_leader;
  auto gather = std::make_shared<Gather>(2, std::move(done));
  auto replicas = [gather, ack_leader](absl::Status s) {
    if (ack_leader && !s.ok()) LOG(WARNING) << "a record did not reach every follower: " << s;
    if (!ack_leader) gather->Arrive(s);
  };
  if (ack_leader) gather->Arrive(absl::OkStatus());  // only this pod's copy counts
  // Called once this pod's log holds the record (PodStorage::ApplyLogged's `ship`: after
  // its write, except in periodic mode), or with the error that kept it out.
  auto ship = [this, replicas](const std::shared_ptr<const std::string>& record,
                               absl::Status written) {
    if (!written.ok()) return replicas(std::move(written));  // not durable here: not shipped
    replicator_->Ship(record, replicas);
  };
  bool logged = false;  // whether the change has a record, which `ship` then gets
  auto apply_noting = [&](LogRecordBuilder* record) -> absl::Status {
    RETURN_IF_ERROR(apply(record));
    logged = record->has_entries();
    return absl::OkStatus();
  };
  // The order lock, over the apply and the append: the log holds this pod's shipped
  // records in their apply order, and the writer ships them in log order, so each follower
  // receives every row's updates in step order.
  absl::MutexLock order(&ship_mu_);
  if (storage_ != nullptr) {
    storage_->ApplyLogged(
        change.key != nullptr ? *change.key : PushKey(), change.record_bytes, apply_noting,
        [gather](absl::Status s) { gather->Arrive(s); }, ship, change.exclusive);
  } else {
    LogRecordBuilder record(change.key != nullptr ? *change.key : PushKey(), change.record_bytes);
    absl::Status s = apply_noting(&record);
    if (s.ok() && logged) {
      ship(std::make_shared<const std::string>(record.Finish()), absl::OkStatus());
    }
    gather->Arrive(s);
  }
  if (!logged && !ack_leader) gather->Arrive(absl::OkStatus());  // nothing to replicate
}

PsCore::RoleChange PsCore::ApplyRole(const Assignment& req, const ShardOwnership& before,
                                     const ShardOwnership& after) {
  RoleChange out;
  const ReplicationRole& r = req.replication();
  const uint32_t n = after.num_vshards();
  std::vector<std::string> primary_of(n);
  for (const FollowedVShards& f : r.following()) {
    for (uint32_t v : f.vshards()) {
      if (v < n) primary_of[v] = f.primary();
    }
  }
  std::vector<ReplicaPeer> followers(r.followers().begin(), r.followers().end());
  if (primary_of != role_.primary_of) role_.role_epoch = req.epoch();
  auto same_peers = [](const std::vector<ReplicaPeer>& a, const std::vector<ReplicaPeer>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].pod_id() != b[i].pod_id() || a[i].address() != b[i].address()) return false;
    }
    return true;
  };
  out.changed = !same_peers(followers, role_.followers) || role_.pod_id != r.pod_id();
  for (uint32_t v = 0; v < n && role_.factor >= 2; ++v) {
    if (before.Owns(v) && !after.Owns(v)) out.deposed = true;
  }
  if (r.factor() != role_.factor || out.deposed || out.changed || primary_of != role_.primary_of) {
    uint32_t following = 0;
    for (const std::string& p : primary_of) following += !p.empty();
    LOG(INFO) << "replication at epoch " << req.epoch() << ": factor " << std::max(1u, r.factor())
              << ", " << followers.size() << " followers of this pod's vshards, following "
              << following << " vshards" << (r.ack_leader() ? " (ack leader)" : "")
              << (out.deposed ? "; no longer the primary of some vshards" : "");
  }
  role_.pod_id = r.pod_id();
  role_.factor = std::max(1u, r.factor());
  // Its rows have copies elsewhere: materialization rounds may be further apart.
  if (storage_ != nullptr) storage_->SetReplicated(role_.factor >= 2);
  role_.ack_leader = r.ack_leader();
  role_.max_lag = absl::Milliseconds(r.max_lag_ms());
  role_.primary_of = std::move(primary_of);
  role_.followers = followers;
  std::vector<bool> sole_copy(n, false);
  for (uint32_t v : r.sole_copy()) {
    if (v < n && after.Owns(v)) sole_copy[v] = true;
  }
  const bool any_sole_copy = std::find(sole_copy.begin(), sole_copy.end(), true) != sole_copy.end();
  if (any_sole_copy != role_.any_sole_copy && storage_ != nullptr &&
      storage_->durability() == Durability::kPeriodic) {
    if (any_sole_copy) {
      LOG(WARNING) << "epoch " << req.epoch() << ": this pod holds the only copy of "
                   << r.sole_copy_size()
                   << " vshards (no follower in their ack set): their pushes are acknowledged "
                      "once the log is fsynced, until re-replication gives them a follower";
    } else {
      LOG(INFO) << "epoch " << req.epoch()
                << ": every vshard this pod leads has a follower again: pushes are "
                   "acknowledged without waiting for an fsync";
    }
  }
  role_.sole_copy = std::move(sole_copy);
  role_.any_sole_copy = any_sole_copy;
  out.followers = std::move(followers);
  return out;
}

PsCore::Done PsCore::AckWhenDurable(const Change& change, Done done) {
  // Only a periodic pod acknowledges before its log is durable, and only a pod with a
  // master (a role, R >= 2) can be told a vshard has no follower.
  if (synced_acks_ == nullptr || !change.ship || !role_.any_sole_copy) return done;
  const uint32_t n = static_cast<uint32_t>(role_.sole_copy.size());
  bool touches = false;
  for (const auto& [table, ids] : change.rows) {
    const uint64_t h = table->name_hash();
    for (int64_t id : ids) {
      if (role_.sole_copy[VShardOf(RouteHash(h, id), n)]) {
        touches = true;
        break;
      }
    }
    if (touches) break;
  }
  for (absl::string_view name : change.dense) {
    touches = touches || role_.sole_copy[DenseVShard(name, n)];
  }
  if (!touches) return done;
  return [acks = synced_acks_.get(), done = std::move(done)](absl::Status s) mutable {
    if (s.ok()) return acks->Add(std::move(done));
    if (!KeptVShards(s).has_value()) return done(s);
    // A deposed primary's kept rows count as applied (FinishPushKey): once fsynced.
    acks->Add([s, done = std::move(done)](absl::Status synced) { done(synced.ok() ? s : synced); });
  };
}

bool PsCore::Follows(uint32_t v, absl::string_view pod) const {
  return v < role_.primary_of.size() && !pod.empty() && role_.primary_of[v] == pod;
}

void PsCore::ReplicateRecords(const ReplicateRecordsRequest& req, ReplicateRecordsResponse* resp,
                              Done done) {
  ReplicateRecords(std::make_shared<const ReplicateRecordsRequest>(req), resp, std::move(done));
}

void PsCore::ReplicateRecords(std::shared_ptr<const ReplicateRecordsRequest> shared,
                              ReplicateRecordsResponse* resp, Done done) {
  // The response outlives `done` (the gRPC call, or the in-process sender).
  const ReplicateRecordsRequest& req = *shared;
  replica_order_.Submit(req.primary(), req.stream(), req.first(), req.records_size(), req.restart(),
                        [this, shared, resp, done = std::move(done)](absl::Status turn) {
                          if (!turn.ok()) {
                            counters_.replicated_refused.fetch_add(1, std::memory_order_relaxed);
                            done(turn);
                            return uint64_t{0};
                          }
                          return ApplyReplicated(shared, resp, done);
                        });
}

uint64_t PsCore::ApplyReplicated(const std::shared_ptr<const ReplicateRecordsRequest>& shared,
                                 ReplicateRecordsResponse* resp, Done done) {
  const ReplicateRecordsRequest& req = *shared;
  absl::MutexLock batch(&follow_mu_);
  absl::ReaderMutexLock fence(&migrate_mu_);
  auto own = ownership();
  resp->set_epoch(own->epoch());
  counters_.replicated_received.fetch_add(req.records_size(), std::memory_order_relaxed);
  auto refuse = [&](absl::Status s) {
    counters_.replicated_refused.fetch_add(1, std::memory_order_relaxed);
    done(s);
    return uint64_t{0};
  };
  if (req.epoch() < role_.role_epoch) {
    return refuse(absl::FailedPreconditionError(
        absl::StrCat("records from ", req.primary(), " at epoch ", req.epoch(),
                     ": this pod's primaries changed at epoch ", role_.role_epoch)));
  }
  // Parse and check everything before applying anything. A sender that is this pod's
  // primary of no vshard is refused. Rows of vshards it is not this pod's primary of are
  // left out when the batch is no newer than this pod's map: they are of vshards this pod
  // is not (yet) in the ack set of, e.g. being filled by a copy that already holds them
  // (master/rereplicator.h). In a newer batch they are refused (UNAVAILABLE, retried)
  // until this pod's own assignment says whether it follows them.
  const uint32_t n = own->num_vshards();
  const bool sender_known = std::find(role_.primary_of.begin(), role_.primary_of.end(),
                                      req.primary()) != role_.primary_of.end();
  if (!sender_known) {
    return refuse(absl::FailedPreconditionError(
        absl::StrCat("records from ", req.primary(), ", which is not the primary of any vshard ",
                     "this pod follows at epoch ", own->epoch())));
  }
  const bool newer_map = req.epoch() > own->epoch();
  uint64_t left_out = 0;
  // Whether vshard v's entries are applied; an error for a newer batch's unfollowed vshard.
  auto keep = [&](uint32_t v, bool* kept) -> absl::Status {
    *kept = Follows(v, req.primary());
    if (*kept) return absl::OkStatus();
    if (newer_map) {
      return absl::UnavailableError(absl::StrCat(
          "records from ", req.primary(), " at epoch ", req.epoch(), " touch vshard ", v,
          ", which this pod does not follow at its epoch ", own->epoch(), " yet; retry"));
    }
    ++left_out;
    return absl::OkStatus();
  };
  std::vector<ParsedRecord> records(req.records_size());
  for (int r = 0; r < req.records_size(); ++r) {
    ParsedRecord& p = records[r];
    p.owned = &req.records(r);
    p.bytes = *p.owned;  // the request outlives the batch's apply: no copy
    const uint64_t left_out_before = left_out;
    absl::StatusOr<LogRecordView> view = ParseLogRecord(p.bytes);
    if (!view.ok()) return refuse(absl::InvalidArgumentError(view.status().message()));
    p.view = *std::move(view);
    // `install`: whole rows (weights and slots) rather than gradients.
    auto check_rows = [&](absl::string_view table, uint32_t count, const LogArrayView& ids,
                          const LogArrayView& steps, uint32_t row_floats, const char* data,
                          bool install, std::vector<int64_t>* out_ids,
                          std::vector<uint64_t>* out_steps,
                          std::vector<float>* out_data) -> absl::Status {
      auto t = store_.FindTable(std::string(table));
      if (t == nullptr) {
        // The catalog reaches this pod by heartbeat: the primary retries the batch.
        return absl::UnavailableError(
            absl::StrCat("table '", table, "' is not known here yet; retry"));
      }
      // The rows are read at this table's stride: a record of another shape is refused
      // rather than read past its end.
      const uint32_t expected = install ? t->dim() + t->slot_floats() : t->dim();
      if (row_floats != expected) {
        return absl::InvalidArgumentError(
            absl::StrCat("a record from ", req.primary(), " has rows of ", row_floats,
                         " floats for table '", table, "', whose rows here have ", expected));
      }
      out_ids->reserve(count);
      out_steps->reserve(count);
      std::vector<uint32_t> kept_rows;
      for (uint32_t i = 0; i < count; ++i) {
        const int64_t id = ids.Get<int64_t>(i);
        bool kept;
        RETURN_IF_ERROR(keep(VShardOf(RouteHash(t->name_hash(), id), n), &kept));
        if (!kept) continue;
        out_ids->push_back(id);
        out_steps->push_back(steps.Get<uint64_t>(i));
        kept_rows.push_back(i);
      }
      if (kept_rows.size() < count) {
        out_data->resize(kept_rows.size() * size_t{row_floats});
        for (size_t k = 0; k < kept_rows.size(); ++k) {
          std::memcpy(out_data->data() + k * row_floats,
                      data + size_t{kept_rows[k]} * row_floats * sizeof(float),
                      row_floats * sizeof(float));
        }
      }
      return absl::OkStatus();
    };
    for (const LogTableView& t : p.view.tables) {
      p.table_ids.emplace_back();
      p.table_steps.emplace_back();
      p.table_data.emplace_back();
      if (absl::Status s =
              check_rows(t.table, t.n, t.ids, t.steps, t.dim, t.grads, /*install=*/false,
                         &p.table_ids.back(), &p.table_steps.back(), &p.table_data.back());
          !s.ok()) {
        return refuse(s);
      }
    }
    for (const LogInstallView& t : p.view.installs) {
      p.install_ids.emplace_back();
      p.install_steps.emplace_back();
      p.install_data.emplace_back();
      if (absl::Status s =
              check_rows(t.table, t.n, t.ids, t.steps, t.row_floats, t.values, /*install=*/true,
                         &p.install_ids.back(), &p.install_steps.back(), &p.install_data.back());
          !s.ok()) {
        return refuse(s);
      }
    }
    for (const LogDeleteView& t : p.view.deletes) {
      // Deletions carry no steps or values: their ids are kept by the same rule.
      auto table = store_.FindTable(std::string(t.table));
      if (table == nullptr) {
        return refuse(absl::UnavailableError(
            absl::StrCat("table '", t.table, "' is not known here yet; retry")));
      }
      std::vector<int64_t>& ids = p.delete_ids.emplace_back();
      for (uint32_t i = 0; i < t.n; ++i) {
        bool kept;
        if (absl::Status s = keep(VShardOf(RouteHash(table->name_hash(), t.id(i)), n), &kept);
            !s.ok()) {
          return refuse(s);
        }
        if (kept) ids.push_back(t.id(i));
      }
    }
    auto check_dense = [&](absl::string_view name, std::vector<bool>* kept_list) -> absl::Status {
      if (store_.FindDense(std::string(name)) == nullptr) {
        return absl::UnavailableError(
            absl::StrCat("dense tensor '", name, "' is not known here yet; retry"));
      }
      bool kept;
      RETURN_IF_ERROR(keep(DenseVShard(name, n), &kept));
      kept_list->push_back(kept);
      return absl::OkStatus();
    };
    for (const LogDenseView& d : p.view.dense) {
      if (absl::Status s = check_dense(d.name, &p.dense_kept); !s.ok()) return refuse(s);
    }
    for (const LogDenseInstallView& d : p.view.dense_installs) {
      if (absl::Status s = check_dense(d.name, &p.dense_install_kept); !s.ok()) return refuse(s);
    }
    p.whole = left_out == left_out_before;
  }
  if (left_out > 0) counters_.replicated_left_out.fetch_add(left_out, std::memory_order_relaxed);
  // Apply in order; the first failure stops the batch (later records may build on it).
  auto wait = std::make_shared<Gather>(1, std::move(done));
  uint64_t applied = 0;
  // The vshards this pod follows from the sender: what a record of which it left rows out
  // counts as applied for (made at the first such record).
  std::shared_ptr<const std::vector<uint32_t>> followed_of_sender;
  for (ParsedRecord& p : records) {
    Change change;
    PushResponse ignored;
    std::vector<std::shared_ptr<EmbeddingTable>> tables, install_tables;
    for (size_t i = 0; i < p.view.tables.size(); ++i) {
      tables.push_back(store_.FindTable(std::string(p.view.tables[i].table)));
      change.rows.emplace_back(tables.back(), p.table_ids[i]);
    }
    for (size_t i = 0; i < p.view.installs.size(); ++i) {
      install_tables.push_back(store_.FindTable(std::string(p.view.installs[i].table)));
      change.rows.emplace_back(install_tables.back(), p.install_ids[i]);
    }
    std::vector<std::shared_ptr<EmbeddingTable>> delete_tables;
    for (size_t i = 0; i < p.view.deletes.size(); ++i) {
      delete_tables.push_back(store_.FindTable(std::string(p.view.deletes[i].table)));
      change.rows.emplace_back(delete_tables.back(), p.delete_ids[i]);
    }
    change.exclusive = !delete_tables.empty();  // see PodStorage::ApplyLogged
    for (size_t i = 0; i < p.view.dense.size(); ++i) {
      if (p.dense_kept[i]) change.dense.push_back(p.view.dense[i].name);
    }
    for (size_t i = 0; i < p.view.dense_installs.size(); ++i) {
      if (p.dense_install_kept[i]) change.dense.push_back(p.view.dense_installs[i].name);
    }
    // A whole record is adopted: the builder's own buffer would go unused.
    change.record_bytes = p.whole ? 0 : p.bytes.size();
    // The key only if some of the record's rows are kept here: a follower that left them
    // all out does not hold the push, and must not answer its retry "duplicate" once it
    // leads those vshards (or a copy carries its keys there).
    const bool keyed = p.view.key.worker_id() != 0 && KeptAny(p);
    change.key = keyed ? &p.view.key : nullptr;
    // Recorded exactly by the primary (sent under an older map): the same here, for the
    // vshards of the rows kept (before, whole: this pod claimed it for vshards whose rows
    // the push never held, and led by it, answered their retry "duplicate").
    change.key_exact = keyed && p.view.key_exact;
    // Some rows left out: the key counts here for the vshards this pod follows from the
    // sender only (of the part's, those it kept), so that a retry of the others, once this
    // pod leads them, applies (PushDedup, "Per vshard").
    if (keyed && !p.whole) {
      if (followed_of_sender == nullptr) {
        auto followed = std::make_shared<std::vector<uint32_t>>();
        for (uint32_t v = 0; v < n; ++v) {
          if (Follows(v, req.primary())) followed->push_back(v);
        }
        followed_of_sender = std::move(followed);
      }
      change.key_part = followed_of_sender;
    }
    change.resp = &ignored;
    // The primary's updates at the primary's steps (Replay: the same kernels, and idempotent
    // when a batch comes again), logged here as the same entries.
    auto apply = [&](LogRecordBuilder* logged) -> absl::Status {
      // A whole record is logged as it came (below); one with rows left out is encoded
      // again from what was kept.
      LogRecordBuilder* const record = p.whole ? nullptr : logged;
      for (size_t i = 0; i < tables.size(); ++i) RETURN_IF_ERROR(tables[i]->Load(p.table_ids[i]));
      for (size_t i = 0; i < install_tables.size(); ++i) {
        RETURN_IF_ERROR(install_tables[i]->Load(p.install_ids[i]));
      }
      for (size_t i = 0; i < tables.size(); ++i) {
        const LogTableView& t = p.view.tables[i];
        EmbeddingTable& table = *tables[i];
        const float* grads = KeptData(p.table_data[i], t.grads);
        const std::vector<int64_t>& ids = p.table_ids[i];
        table.ReplayRows(ids, grads, t.lr, p.table_steps[i]);
        // A record whose key was applied here before (mostly a batch sent again) has its
        // rows replayed all the same (ApplyChange), but its admission counts are in already.
        if (table.admission() != nullptr &&
            !(keyed && dedup_.Peek(p.view.key) == PushDedup::Claim::kDuplicate)) {
          for (size_t k = 0; k < ids.size(); ++k) table.CountLogged(ids[k], p.table_steps[i][k]);
        }
        if (record != nullptr && !ids.empty()) {
          record->AddTable(t.table, t.lr, t.dim, ids, p.table_steps[i], grads);
        }
      }
      for (size_t i = 0; i < install_tables.size(); ++i) {
        const LogInstallView& t = p.view.installs[i];
        EmbeddingTable& table = *install_tables[i];
        const uint32_t dim = table.dim();
        const float* values = KeptData(p.install_data[i], t.values);
        const std::vector<int64_t>& ids = p.install_ids[i];
        for (size_t k = 0; k < ids.size(); ++k) {
          const float* row = values + k * t.row_floats;
          table.Install(ids[k], row, row + dim, p.install_steps[i][k]);
        }
        if (record != nullptr && !ids.empty()) {
          record->AddInstall(t.table, t.row_floats, ids, p.install_steps[i],
                             absl::MakeConstSpan(values, ids.size() * t.row_floats));
        }
      }
      // A record is either a deletion or updates (PsCore::DeleteRows logs one alone), so
      // the order of the two within it does not matter.
      for (size_t i = 0; i < delete_tables.size(); ++i) {
        if (p.delete_ids[i].empty()) continue;
        delete_tables[i]->Delete(p.delete_ids[i]);
        if (record != nullptr) record->AddDelete(p.view.deletes[i].table, p.delete_ids[i]);
      }
      for (size_t i = 0; i < p.view.dense.size(); ++i) {
        if (!p.dense_kept[i]) continue;
        const LogDenseView& d = p.view.dense[i];
        auto tensor = store_.FindDense(std::string(d.name));
        std::vector<float> grads(d.n);
        std::memcpy(grads.data(), d.grads, d.n * sizeof(float));
        tensor->Replay(grads.data(), d.lr, d.step);
        if (record != nullptr) record->AddDense(d.name, d.lr, d.step, grads);
      }
      for (size_t i = 0; i < p.view.dense_installs.size(); ++i) {
        if (!p.dense_install_kept[i]) continue;
        const LogDenseInstallView& d = p.view.dense_installs[i];
        auto tensor = store_.FindDense(std::string(d.name));
        std::vector<float> values(d.n);
        std::memcpy(values.data(), d.values, d.n * sizeof(float));
        RETURN_IF_ERROR(tensor->Install(values, d.step).status());
        if (record != nullptr) record->AddDenseInstall(d.name, d.step, values);
      }
      if (p.whole && logged != nullptr) {
        // The request's own string, shared with the request (no copy): the log holds it
        // until written.
        logged->Adopt(std::shared_ptr<const std::string>(shared, p.owned));
      }
      return absl::OkStatus();
    };
    wait->Add();
    ApplyChange(change, apply, [wait](absl::Status s) { wait->Arrive(s); });
    if (wait->failed()) break;  // later records may build on this one: the batch comes again
    ++applied;
  }
  counters_.replicated_applied.fetch_add(applied, std::memory_order_relaxed);
  resp->set_applied(applied);
  wait->Arrive(absl::OkStatus());
  return applied;
}

void PsCore::StartReplicatedStorage() {
  if (storage_->durability() == Durability::kPeriodic) {
    // Group commit for the changes of vshards without a follower (AckWhenDurable).
    synced_acks_ = std::make_unique<SyncedAcks>([this] { return storage_->SyncApplied(); });
  }
  // A record leaves the log only once every follower holds it: a restart re-ships its log
  // (ResolveRecoveredLog), not what a round truncated. A round whose followers lag skips
  // the truncation (the log grows until they catch up or leave the ack set).
  storage_->SetTruncateGate([this]() -> absl::Status {
    if (replicator_ == nullptr || !replicator_->active()) return absl::OkStatus();
    return replicator_->WaitHeld(absl::Now() + absl::Seconds(1));
  });
  if (!storage_->holds_recovered_log()) return;
  // A pod with a master starts owning nothing and learns its role from its first
  // assignment; one with a static shard, or without a replica sender, never has followers.
  if (replicator_ == nullptr || ownership()->owned_count() > 0) {
    ConfirmRecoveredKeys(ownership()->num_vshards());
    return;
  }
  absl::WriterMutexLock fence(&migrate_mu_);
  recovered_unresolved_ = true;
}

void PsCore::ConfirmRecoveredKeys(uint32_t num_vshards) {
  if (num_vshards > 0) {
    // A key recorded exactly (sent under an older map) counts for its record's vshards
    // only, as before the restart. Before, it was confirmed whole, and the rest of its
    // part, re-routed here under the same key, was answered "duplicate" (a lost push).
    absl::Status walked =
        storage_->ForEachRecoveredRecord([&](absl::string_view bytes) -> absl::Status {
          ASSIGN_OR_RETURN(LogRecordView rec, ParseLogRecord(bytes));
          if (rec.key_exact) {
            dedup_.ReleaseExact(rec.key, VShardsOfRecord(store_, rec, num_vshards));
          }
          return absl::OkStatus();
        });
    if (!walked.ok()) {
      LOG(ERROR) << "could not read back the recovered log; its keys are confirmed whole: "
                 << walked;
    }
  }
  const size_t keys = dedup_.ReleaseAll(/*applied=*/true);
  storage_->ReleaseRecoveredLog();
  VLOG(1) << "recovered log released (no followers): " << keys << " push keys applied";
}

void PsCore::ResolveRecoveredLog(const ShardOwnership& own) {
  if (!recovered_unresolved_) return;
  recovered_unresolved_ = false;
  const uint32_t n = own.num_vshards();
  if (role_.factor < 2) return ConfirmRecoveredKeys(n);
  // Shipped records finish on sender threads: the last one releases the log, unless one
  // failed (this pod was deposed or is stopping; ApplyAssignment then forgets the keys).
  struct Reship {
    std::atomic<uint64_t> pending{1};
    std::atomic<bool> failed{false};
  };
  auto reship = std::make_shared<Reship>();
  // `exact`: the record's vshards, for a key recorded exactly (else empty).
  auto finish = [this, reship](const PushKey& key, const std::vector<uint32_t>& exact,
                               const absl::Status& s) {
    if (s.ok() && !exact.empty()) {
      dedup_.ReleaseExact(key, exact);
    } else if (s.ok()) {
      dedup_.Release(key, /*applied=*/true);
    } else {
      reship->failed.store(true);
    }
    if (reship->pending.fetch_sub(1) != 1) return;
    if (reship->failed.load()) {
      LOG(WARNING) << "recovered log records did not all reach the followers; their keys stay "
                      "held and the log is kept";
      return;
    }
    storage_->ReleaseRecoveredLog();
    LOG(INFO) << "the followers hold every record of the recovered log";
  };
  uint64_t shipped = 0, kept = 0, forgotten = 0;
  std::map<std::string, std::vector<uint32_t>> followed_of;  // by primary
  // Ordered before every change under this assignment (the caller holds migrate_mu_
  // exclusively): each follower receives the recovered records first, then the new ones,
  // each row's updates in step order; replay skips what a follower already holds.
  absl::MutexLock order(&ship_mu_);
  absl::Status walked =
      storage_->ForEachRecoveredRecord([&](absl::string_view bytes) -> absl::Status {
        ASSIGN_OR_RETURN(LogRecordView rec, ParseLogRecord(bytes));
        bool leads = false, follows = false;
        const std::vector<uint32_t> touched = VShardsOfRecord(store_, rec, n);
        for (uint32_t v : touched) {
          leads = leads || own.Owns(v);
          follows = follows || (v < role_.primary_of.size() && !role_.primary_of[v].empty());
        }
        // A key its primary recorded exactly (LogRecordView::key_exact) counts for the
        // record's vshards only, here as it did before the restart.
        const std::vector<uint32_t> exact = rec.key_exact ? touched : std::vector<uint32_t>();
        if (leads) {
          ++shipped;
          reship->pending.fetch_add(1);
          replicator_->Ship(std::string(bytes), [finish, key = rec.key, exact](absl::Status s) {
            finish(key, exact, s);
          });
        } else if (follows) {
          ++kept;  // its primary logged it first
          // For the vshards it follows from the record's primary only: the record holds
          // the rows this pod kept of its part, perhaps not all (ApplyReplicated, key_part).
          std::string primary;
          for (uint32_t v : touched) {
            if (v < role_.primary_of.size() && !role_.primary_of[v].empty()) {
              primary = role_.primary_of[v];
              break;
            }
          }
          std::vector<uint32_t>& followed = followed_of[primary];
          if (followed.empty()) {
            for (uint32_t v = 0; v < role_.primary_of.size(); ++v) {
              if (role_.primary_of[v] == primary) followed.push_back(v);
            }
          }
          if (rec.key_exact) {
            dedup_.ReleaseExact(rec.key, exact);
          } else {
            dedup_.ReleaseFor(rec.key, followed);
          }
        } else {
          ++forgotten;  // its vshards' rows are dropped here: their primary decides
          dedup_.Release(rec.key, /*applied=*/false);
        }
        return absl::OkStatus();
      });
  if (!walked.ok()) {
    // Keys stay held (a retry is told to wait, never "duplicate") and the log is kept.
    LOG(ERROR) << "could not read back the recovered log to re-ship it: " << walked;
    return;
  }
  LOG(INFO) << "recovered log: " << shipped << " records of vshards this pod leads re-shipped to "
            << role_.followers.size() << " followers (their keys wait for them), " << kept
            << " of vshards it follows kept, " << forgotten << " of vshards it left forgotten";
  PushKey none;
  finish(none, {}, absl::OkStatus());
}

PsCore::ReplicationStats PsCore::replication_stats() const {
  ReplicationStats out;
  {
    absl::ReaderMutexLock lock(const_cast<absl::Mutex*>(&migrate_mu_));
    out.factor = role_.factor;
    out.max_lag = role_.max_lag;
    for (const std::string& p : role_.primary_of) out.following += !p.empty();
    for (bool sole : role_.sole_copy) out.sole_copy += sole;
  }
  if (synced_acks_ != nullptr) {
    const SyncedAcks::Stats acks = synced_acks_->stats();
    out.sole_copy_synced_acks = acks.acks;
    out.sole_copy_syncs = acks.syncs;
    out.sole_copy_sync_time = acks.sync_time;
    out.sole_copy_ack_wait = acks.ack_wait;
  }
  if (replicator_ != nullptr) out.followers = replicator_->Stats();
  out.records_received = counters_.replicated_received.load();
  out.records_applied = counters_.replicated_applied.load();
  out.refused_batches = counters_.replicated_refused.load();
  out.rows_left_out = counters_.replicated_left_out.load();
  out.lease_refusals = counters_.lease_refusals.load();
  return out;
}

}  // namespace ps
