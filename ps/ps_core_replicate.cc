// PsCore: replication. The primary's side (ApplyShipped: apply, log and ship in one order;
// acknowledge once the ack set holds the change; the write lease), the follower's side
// (ReplicateRecords) and the role an assignment gives (ApplyRole). The protocol is in
// proto/ps.proto, the design in docs/architecture.md, "Replication".
#include <glog/logging.h>

#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/routing/hash.h"
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
struct ParsedRecord {
  std::string bytes;  // owns what `view` points into
  LogRecordView view;
  std::vector<std::vector<int64_t>> table_ids, install_ids, delete_ids;
  std::vector<std::vector<uint64_t>> table_steps, install_steps;
};

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
  bool shipped = false;
  // The order lock: the next change applies only after this one's record is queued for
  // every follower, so each follower receives every row's updates in step order.
  absl::MutexLock order(&ship_mu_);
  auto ship = [&](const std::string& record) {
    shipped = true;
    replicator_->Ship(record, replicas);
  };
  if (storage_ != nullptr) {
    storage_->ApplyLogged(
        change.key != nullptr ? *change.key : PushKey(), change.record_bytes, apply,
        [gather](absl::Status s) { gather->Arrive(s); }, ship, change.exclusive);
  } else {
    LogRecordBuilder record(change.key != nullptr ? *change.key : PushKey(), change.record_bytes);
    absl::Status s = apply(&record);
    if (s.ok() && record.has_entries()) ship(record.Finish());
    gather->Arrive(s);
  }
  if (!shipped && !ack_leader) gather->Arrive(absl::OkStatus());  // nothing to replicate
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
  role_.ack_leader = r.ack_leader();
  role_.primary_of = std::move(primary_of);
  role_.followers = followers;
  out.followers = std::move(followers);
  return out;
}

bool PsCore::Follows(uint32_t v, absl::string_view pod) const {
  return v < role_.primary_of.size() && !pod.empty() && role_.primary_of[v] == pod;
}

void PsCore::ReplicateRecords(const ReplicateRecordsRequest& req, ReplicateRecordsResponse* resp,
                              Done done) {
  absl::MutexLock batch(&follow_mu_);
  absl::ReaderMutexLock fence(&migrate_mu_);
  auto own = ownership();
  resp->set_epoch(own->epoch());
  counters_.replicated_received.fetch_add(req.records_size(), std::memory_order_relaxed);
  auto refuse = [&](absl::Status s) {
    counters_.replicated_refused.fetch_add(1, std::memory_order_relaxed);
    done(s);
  };
  if (req.epoch() < role_.role_epoch) {
    return refuse(absl::FailedPreconditionError(
        absl::StrCat("records from ", req.primary(), " at epoch ", req.epoch(),
                     ": this pod's primaries changed at epoch ", role_.role_epoch)));
  }
  // Parse and check everything before applying anything.
  const uint32_t n = own->num_vshards();
  std::vector<ParsedRecord> records(req.records_size());
  for (int r = 0; r < req.records_size(); ++r) {
    ParsedRecord& p = records[r];
    p.bytes = req.records(r);
    absl::StatusOr<LogRecordView> view = ParseLogRecord(p.bytes);
    if (!view.ok()) return refuse(absl::InvalidArgumentError(view.status().message()));
    p.view = *std::move(view);
    auto check_rows = [&](absl::string_view table, uint32_t count, const LogArrayView& ids,
                          const LogArrayView& steps, std::vector<int64_t>* out_ids,
                          std::vector<uint64_t>* out_steps) -> absl::Status {
      auto t = store_.FindTable(std::string(table));
      if (t == nullptr) {
        // The catalog reaches this pod by heartbeat: the primary retries the batch.
        return absl::UnavailableError(
            absl::StrCat("table '", table, "' is not known here yet; retry"));
      }
      out_ids->resize(count);
      out_steps->resize(count);
      for (uint32_t i = 0; i < count; ++i) {
        (*out_ids)[i] = ids.Get<int64_t>(i);
        (*out_steps)[i] = steps.Get<uint64_t>(i);
        const uint32_t v = VShardOf(RouteHash(t->name_hash(), (*out_ids)[i]), n);
        if (!Follows(v, req.primary())) {
          return absl::FailedPreconditionError(absl::StrCat(
              "records from ", req.primary(), " touch vshard ", v, ", whose primary is '",
              role_.primary_of.size() > v ? role_.primary_of[v] : "", "' for this pod at epoch ",
              own->epoch()));
        }
      }
      return absl::OkStatus();
    };
    for (const LogTableView& t : p.view.tables) {
      p.table_ids.emplace_back();
      p.table_steps.emplace_back();
      if (absl::Status s =
              check_rows(t.table, t.n, t.ids, t.steps, &p.table_ids.back(), &p.table_steps.back());
          !s.ok()) {
        return refuse(s);
      }
    }
    for (const LogInstallView& t : p.view.installs) {
      p.install_ids.emplace_back();
      p.install_steps.emplace_back();
      if (absl::Status s = check_rows(t.table, t.n, t.ids, t.steps, &p.install_ids.back(),
                                      &p.install_steps.back());
          !s.ok()) {
        return refuse(s);
      }
    }
    for (const LogDeleteView& t : p.view.deletes) {
      // Deletions carry no steps: check their ids as any row's (the steps are ignored).
      std::vector<uint64_t> no_steps;
      const std::vector<char> zeros(size_t{t.n} * sizeof(uint64_t));
      p.delete_ids.emplace_back();
      if (absl::Status s = check_rows(t.table, t.n, t.ids, LogArrayView{zeros.data()},
                                      &p.delete_ids.back(), &no_steps);
          !s.ok()) {
        return refuse(s);
      }
    }
    auto check_dense = [&](absl::string_view name) -> absl::Status {
      if (store_.FindDense(std::string(name)) == nullptr) {
        return absl::UnavailableError(
            absl::StrCat("dense tensor '", name, "' is not known here yet; retry"));
      }
      if (!Follows(DenseVShard(name, n), req.primary())) {
        return absl::FailedPreconditionError(
            absl::StrCat("records from ", req.primary(), " touch dense tensor '", name,
                         "', which this pod does not follow from it at epoch ", own->epoch()));
      }
      return absl::OkStatus();
    };
    for (const LogDenseView& d : p.view.dense) {
      if (absl::Status s = check_dense(d.name); !s.ok()) return refuse(s);
    }
    for (const LogDenseInstallView& d : p.view.dense_installs) {
      if (absl::Status s = check_dense(d.name); !s.ok()) return refuse(s);
    }
  }
  // Apply in order; the first failure stops the batch (later records may build on it).
  auto wait = std::make_shared<Gather>(1, std::move(done));
  uint64_t applied = 0;
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
    for (const LogDenseView& d : p.view.dense) change.dense.push_back(d.name);
    for (const LogDenseInstallView& d : p.view.dense_installs) change.dense.push_back(d.name);
    change.record_bytes = p.bytes.size();
    const bool keyed = p.view.key.worker_id() != 0;
    change.key = keyed ? &p.view.key : nullptr;
    change.resp = &ignored;
    // The primary's updates at the primary's steps (Replay: the same kernels, and idempotent
    // when a batch comes again), logged here as the same entries.
    auto apply = [&](LogRecordBuilder* record) -> absl::Status {
      for (size_t i = 0; i < tables.size(); ++i) RETURN_IF_ERROR(tables[i]->Load(p.table_ids[i]));
      for (size_t i = 0; i < install_tables.size(); ++i) {
        RETURN_IF_ERROR(install_tables[i]->Load(p.install_ids[i]));
      }
      for (size_t i = 0; i < tables.size(); ++i) {
        const LogTableView& t = p.view.tables[i];
        EmbeddingTable& table = *tables[i];
        for (uint32_t k = 0; k < t.n; ++k) {
          table.Replay(p.table_ids[i][k], t.grad(k), t.lr, p.table_steps[i][k]);
          table.CountLogged(p.table_ids[i][k], p.table_steps[i][k]);  // admission
        }
        if (record != nullptr) {
          record->AddTable(t.table, t.lr, t.dim, p.table_ids[i], p.table_steps[i], t.grad(0));
        }
      }
      for (size_t i = 0; i < install_tables.size(); ++i) {
        const LogInstallView& t = p.view.installs[i];
        EmbeddingTable& table = *install_tables[i];
        const uint32_t dim = table.dim();
        for (uint32_t k = 0; k < t.n; ++k) {
          table.Install(p.install_ids[i][k], t.row(k), t.row(k) + dim, p.install_steps[i][k]);
        }
        if (record != nullptr) {
          record->AddInstall(t.table, t.row_floats, p.install_ids[i], p.install_steps[i],
                             absl::MakeConstSpan(t.row(0), size_t{t.n} * t.row_floats));
        }
      }
      // A record is either a deletion or updates (PsCore::DeleteRows logs one alone), so
      // the order of the two within it does not matter.
      for (size_t i = 0; i < delete_tables.size(); ++i) {
        delete_tables[i]->Delete(p.delete_ids[i]);
        if (record != nullptr) record->AddDelete(p.view.deletes[i].table, p.delete_ids[i]);
      }
      for (const LogDenseView& d : p.view.dense) {
        auto tensor = store_.FindDense(std::string(d.name));
        std::vector<float> grads(d.n);
        std::memcpy(grads.data(), d.grads, d.n * sizeof(float));
        tensor->Replay(grads.data(), d.lr, d.step);
        if (record != nullptr) record->AddDense(d.name, d.lr, d.step, grads);
      }
      for (const LogDenseInstallView& d : p.view.dense_installs) {
        auto tensor = store_.FindDense(std::string(d.name));
        std::vector<float> values(d.n);
        std::memcpy(values.data(), d.values, d.n * sizeof(float));
        RETURN_IF_ERROR(tensor->Install(values, d.step).status());
        if (record != nullptr) record->AddDenseInstall(d.name, d.step, values);
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
}

PsCore::ReplicationStats PsCore::replication_stats() const {
  ReplicationStats out;
  {
    absl::ReaderMutexLock lock(const_cast<absl::Mutex*>(&migrate_mu_));
    out.factor = role_.factor;
    for (const std::string& p : role_.primary_of) out.following += !p.empty();
  }
  if (replicator_ != nullptr) out.followers = replicator_->Stats();
  out.records_received = counters_.replicated_received.load();
  out.records_applied = counters_.replicated_applied.load();
  out.refused_batches = counters_.replicated_refused.load();
  out.lease_refusals = counters_.lease_refusals.load();
  return out;
}

}  // namespace ps
