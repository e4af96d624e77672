#include "client/admin_format.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"

namespace ps {
namespace {

std::string Lease(int64_t remaining_ms) {
  if (remaining_ms >= 0) return absl::StrCat(remaining_ms, " ms");
  return absl::StrCat("expired ", -remaining_ms, " ms ago");
}

std::string Percent(uint64_t part, uint64_t whole) {
  if (whole == 0) return "-";
  return absl::StrFormat("%.1f%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

std::string TaskRange(const Task& t) {
  return absl::StrCat(t.file(), "[", t.first_record(), ",", t.end_record(), ")");
}

std::string FormatJobs(const StatusResponse& s) {
  if (s.jobs_size() == 0) return "no jobs\n";
  std::vector<std::vector<std::string>> rows = {{"JOB", "STATE", "EPOCH",
                                                 "TASKS todo/doing/done/failed", "TRAIN RECORDS",
                                                 "PROGRESS", "EVAL RECORDS"}};
  for (const JobInfo& j : s.jobs()) {
    rows.push_back({j.name(), JobInfo::State_Name(j.state()),
                    absl::StrCat(std::min(j.current_epoch() + 1, j.epochs()), "/", j.epochs()),
                    absl::StrCat(j.tasks_todo(), "/", j.tasks_doing(), "/", j.tasks_done(), "/",
                                 j.tasks_failed(), " of ", j.tasks_total()),
                    absl::StrCat(j.train_records_done(), "/", j.train_records_total()),
                    Percent(j.train_records_done(), j.train_records_total()),
                    absl::StrCat(j.eval_records_done())});
  }
  return FormatColumns(rows);
}

// "3 records, 1.2 KB, 40 ms behind" for a follower's lag.
std::string Behind(const FollowerLag& f) {
  return absl::StrCat(f.records(), " records, ", absl::StrFormat("%.1f KB", f.bytes() / 1024.0),
                      ", ", f.lag_ms(), " ms");
}

// Each follower's lag as its primary last reported it. A primary the master lists as LOST
// (or never registered) reports no more: its rows are its last report, marked so (the
// master keeps them until the pod is back).
std::string FormatLags(const StatusResponse& s) {
  std::map<std::string, PodInfo::State> state;
  for (const PodInfo& p : s.pods()) state[p.pod_id()] = p.state();
  std::vector<std::vector<std::string>> rows = {
      {"PRIMARY", "FOLLOWER", "BEHIND", "HELD", "FAILED CALLS", "REPORTED"}};
  for (const ReplicaLag& l : s.replication().lags()) {
    auto it = state.find(l.primary());
    const bool gone =
        it != state.end() && it->second != PodInfo::LIVE && it->second != PodInfo::DRAINED;
    rows.push_back({l.primary(), l.lag().follower(), Behind(l.lag()),
                    absl::StrCat(l.lag().held_records()), absl::StrCat(l.lag().failed_calls()),
                    absl::StrCat(l.reported_ms_ago(), " ms ago",
                                 gone ? absl::StrCat(" (primary ", PodInfo::State_Name(it->second),
                                                     ": its last report)")
                                      : "")});
  }
  return FormatColumns(rows);
}

std::string FormatTaskList(const google::protobuf::RepeatedPtrField<Task>& tasks, bool failed) {
  std::vector<std::vector<std::string>> rows = {{"JOB", "TASK", "KIND", "EPOCH", "RECORDS",
                                                 "ATTEMPT", "FAILURES",
                                                 failed ? "LAST ERROR" : "WORKER"}};
  for (const Task& t : tasks) {
    rows.push_back({t.job(), absl::StrCat(t.task_id()), Task::Kind_Name(t.kind()),
                    absl::StrCat(t.epoch()), TaskRange(t), absl::StrCat(t.attempt()),
                    absl::StrCat(t.failures()),
                    failed ? t.last_error()
                           : absl::StrCat(t.worker_id(), " (incarnation ", t.incarnation(), ")")});
  }
  return FormatColumns(rows);
}

}  // namespace

std::string FormatColumns(const std::vector<std::vector<std::string>>& rows) {
  if (rows.empty()) return "";
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size() && c < width.size(); ++c) {
      width[c] = std::max(width[c], row[c].size());
    }
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < width.size(); ++c) {
      const std::string cell = c < row.size() ? row[c] : "";
      absl::StrAppend(&line, cell);
      if (c + 1 < width.size()) line.append(width[c] - cell.size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

std::string FormatRanges(const std::vector<uint32_t>& v) {
  if (v.empty()) return "-";
  std::vector<std::string> parts;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    parts.push_back(i == j ? absl::StrCat(v[i]) : absl::StrCat(v[i], "-", v[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

std::string FormatPods(const StatusResponse& s, const PodStats& stats) {
  std::vector<std::vector<std::string>> rows = {
      {"POD", "ADDRESS", "STATE", "VSHARDS", "LEASE", "ROWS", "MEMORY", "PULLS/S", "PUSHES/S"}};
  for (const PodInfo& p : s.pods()) {
    std::vector<std::string> row = {
        p.pod_id(), p.address().empty() ? "-" : p.address(), PodInfo::State_Name(p.state()),
        absl::StrCat(p.vshards()),
        p.state() == PodInfo::NEVER_REGISTERED ? "-" : Lease(p.lease_remaining_ms())};
    auto it = stats.find(p.pod_id());
    if (it != stats.end()) {
      const StatsResponse& st = it->second;
      // Rates are averages over the pod's uptime (one sample per ps-admin run).
      const double up = std::max(st.uptime_seconds(), 1e-3);
      row.push_back(absl::StrCat(st.rows()));
      row.push_back(absl::StrFormat("%.1f MiB", st.memory_bytes() / 1048576.0));
      row.push_back(absl::StrFormat("%.1f", st.pull_requests() / up));
      row.push_back(absl::StrFormat("%.1f", st.push_requests() / up));
    }
    rows.push_back(std::move(row));
  }
  return FormatColumns(rows);
}

std::string FormatStatus(const StatusResponse& s, const PodStats& stats) {
  uint32_t live_pods = 0, live_workers = 0;
  for (const PodInfo& p : s.pods()) live_pods += p.state() == PodInfo::LIVE;
  for (const WorkerInfo& w : s.workers()) live_workers += w.state() == WorkerInfo::LIVE;
  std::string out = absl::StrFormat(
      "shard map epoch %d, %d vshards; pods %d/%d live; workers %d live; %d tasks done, %d "
      "records trained; lease %d ms; master up %.0f s\n\n",
      s.epoch(), s.num_vshards(), live_pods, s.pods_size(), live_workers, s.tasks_done(),
      s.records_trained(), s.lease_ms(), s.uptime_seconds());
  absl::StrAppend(&out, FormatPods(s, stats), "\n", FormatWorkers(s), "\n", FormatJobs(s));
  if (s.has_operation()) {
    const OperationInfo& op = s.operation();
    absl::StrAppend(&out, "\n", op.kind(), ": ", op.moves_done(), "/", op.moves_total(),
                    " moves done",
                    op.done() ? (op.error().empty() ? ", finished" : ", stopped: ") : ", running",
                    op.error(), "\n");
  }
  if (s.moves_size() > 0) absl::StrAppend(&out, "\nMOVES\n", FormatMoves(s.moves()));
  if (s.has_replication()) absl::StrAppend(&out, "\n", FormatReplication(s));
  if (s.has_last_checkpoint()) {
    const CheckpointInfo& c = s.last_checkpoint();
    absl::StrAppend(&out, "\nlast checkpoint ", c.checkpoint_id(), ": ", c.dir(), " (",
                    c.pods_size(), " pods, epoch ", c.epoch(),
                    absl::StrFormat(", %.1f s", c.seconds()), ")\n");
  }
  if (s.failed_tasks_size() > 0) {
    absl::StrAppend(&out, "\nFAILED TASKS\n", FormatTaskList(s.failed_tasks(), true));
  }
  return out;
}

std::string FormatMoves(const google::protobuf::RepeatedPtrField<MoveInfo>& moves) {
  std::vector<std::vector<std::string>> rows = {
      {"MOVE", "VSHARDS", "FROM", "TO", "STATE", "ROWS", "MB", "SECONDS", "FENCE_MS", "ERROR"}};
  for (const MoveInfo& m : moves) {
    std::vector<uint32_t> vs(m.vshards().begin(), m.vshards().end());
    const bool done = m.state() == MoveInfo::COMMITTED;
    rows.push_back({absl::StrCat(m.move_id()), FormatRanges(vs), m.source(), m.destination(),
                    MoveInfo::State_Name(m.state()), done ? absl::StrCat(m.rows()) : "-",
                    done ? absl::StrFormat("%.1f", m.bytes() / 1e6) : "-",
                    done ? absl::StrFormat("%.2f", m.copy_seconds()) : "-",
                    done ? absl::StrFormat("%.1f", m.fence_ms()) : "-",
                    m.error().empty() ? "-" : m.error()});
  }
  return FormatColumns(rows);
}

std::string FormatShards(const ShardMapResponse& m) {
  std::map<uint32_t, std::vector<uint32_t>> owned;
  for (int v = 0; v < m.owner_size(); ++v) owned[m.owner(v)].push_back(v);
  std::vector<std::vector<std::string>> rows = {{"POD", "ADDRESS", "STATE", "COUNT", "VSHARDS"}};
  for (int i = 0; i < m.pods_size(); ++i) {
    const PodInfo& p = m.pods(i);
    rows.push_back({p.pod_id(), p.address().empty() ? "-" : p.address(),
                    PodInfo::State_Name(p.state()), absl::StrCat(owned[i].size()),
                    FormatRanges(owned[i])});
  }
  std::string out =
      absl::StrCat("epoch ", m.epoch(), ", ", m.num_vshards(), " vshards\n", FormatColumns(rows));
  if (m.replication() >= 2) {
    // Consecutive vshards with the same primary and followers share a row.
    auto name = [&](uint32_t i) {
      return static_cast<int>(i) < m.pods_size() ? m.pods(i).pod_id() : absl::StrCat("#", i);
    };
    std::map<std::string, std::map<std::string, const FollowerLag*>> lag;  // primary, follower
    for (const ReplicaLag& l : m.lags()) lag[l.primary()][l.lag().follower()] = &l.lag();
    std::vector<std::vector<std::string>> reps = {
        {"VSHARDS", "PRIMARY", "FOLLOWERS (ACK SET)", "COPIES", "FOLLOWERS BEHIND"}};
    std::vector<uint32_t> run;
    std::vector<std::string> key;
    auto flush = [&] {
      if (run.empty()) return;
      std::vector<std::string> behind;
      for (size_t i = 1; i < key.size(); ++i) {
        auto p = lag.find(key[0]);
        const FollowerLag* f = nullptr;
        if (p != lag.end() && p->second.count(key[i]) > 0) f = p->second.at(key[i]);
        behind.push_back(absl::StrCat(key[i], ": ", f == nullptr ? "not reported" : Behind(*f)));
      }
      reps.push_back({FormatRanges(run), key[0],
                      key.size() > 1 ? absl::StrJoin(key.begin() + 1, key.end(), ",") : "-",
                      absl::StrCat(key.size(), "/", m.replication()),
                      behind.empty() ? "-" : absl::StrJoin(behind, "; ")});
      run.clear();
    };
    for (int v = 0; v < m.owner_size(); ++v) {
      std::vector<std::string> k = {name(m.owner(v))};
      if (v < m.followers_size()) {
        for (uint32_t f : m.followers(v).pods()) k.push_back(name(f));
      }
      if (k != key || (!run.empty() && run.back() + 1 != static_cast<uint32_t>(v))) flush();
      key = std::move(k);
      run.push_back(v);
    }
    flush();
    absl::StrAppend(&out, "\nREPLICAS (R=", m.replication(), ", ", m.failovers(),
                    " failovers since the master started)\n", FormatColumns(reps));
  }
  if (m.moves_size() > 0) absl::StrAppend(&out, "\nMOVES IN PROGRESS\n", FormatMoves(m.moves()));
  return out;
}

void AddTableTotals(const DescribeResponse& pod, TableTotals* totals) {
  ++totals->pods;
  for (const TableInfo& t : pod.tables()) {
    TableInfo& sum = totals->tables[t.spec().name()];
    sum.set_rows(sum.rows() + t.rows());
    sum.set_memory_bytes(sum.memory_bytes() + t.memory_bytes());
    sum.set_admitted(sum.admitted() + t.admitted());
    sum.set_pending_admission(sum.pending_admission() + t.pending_admission());
    sum.set_dropped_gradients(sum.dropped_gradients() + t.dropped_gradients());
    sum.set_evicted(sum.evicted() + t.evicted());
  }
}

std::string FormatTables(const ListTablesResponse& t, const StatusResponse& s,
                         const TableTotals& totals) {
  if (t.tables_size() == 0 && t.dense_size() == 0) {
    return absl::StrCat("catalog version ", t.catalog_version(), "\nno tables\n");
  }
  std::map<std::string, uint64_t> version;
  for (const TableProgress& p : s.tables()) version[p.name()] = p.version();
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "KIND", "SHAPE", "INITIALIZER", "OPTIMIZER", "LR", "VERSION", "ROWS", "ADMITTED",
       "PENDING ADMISSION", "DROPPED GRADIENTS", "EVICTED"}};
  for (const TableSpec& spec : t.tables()) {
    auto it = totals.tables.find(spec.name());
    const TableInfo none;
    const TableInfo& sum = it == totals.tables.end() ? none : it->second;
    rows.push_back({spec.name(), "embedding", absl::StrCat("dim ", spec.dim()),
                    InitializerSpec::Kind_Name(spec.initializer().kind()),
                    OptimizerSpec::Kind_Name(spec.optimizer().kind()),
                    absl::StrCat(spec.optimizer().learning_rate()),
                    absl::StrCat(version[spec.name()]), absl::StrCat(sum.rows()),
                    absl::StrCat(sum.admitted()), absl::StrCat(sum.pending_admission()),
                    absl::StrCat(sum.dropped_gradients()), absl::StrCat(sum.evicted())});
  }
  for (const DenseSpec& spec : t.dense()) {
    rows.push_back({spec.name(), "dense", absl::StrJoin(spec.shape(), "x"),
                    InitializerSpec::Kind_Name(spec.initializer().kind()),
                    OptimizerSpec::Kind_Name(spec.optimizer().kind()),
                    absl::StrCat(spec.optimizer().learning_rate()),
                    absl::StrCat(version[spec.name()])});
  }
  const uint32_t copies = std::max(1u, s.replication().factor());
  return absl::StrCat("catalog version ", t.catalog_version(), "\n", FormatColumns(rows),
                      "rows and counters: sum over ", totals.pods, " pods",
                      copies > 1 ? absl::StrCat(" (each row held by ", copies, " of them)") : "",
                      "\n");
}

std::string FormatReplication(const StatusResponse& s) {
  if (!s.has_replication()) return "";
  const ReplicationInfo& r = s.replication();
  std::string out = absl::StrCat(
      "replication: R=", r.factor(), ", ack ", r.ack_leader() ? "leader" : "all", ", max lag ",
      r.max_lag_ms(), " ms; ", r.under_replicated_vshards(), " vshards under-replicated; ",
      r.failovers(), " failovers; followers removed from ack sets: ", r.removed_lease(),
      " vshard copies lost (lease or data), ", r.removed_lag(), " lagging, ", r.removed_failover(),
      " left out by failovers (R>=3), ", r.removed_surplus(), " surplus trimmed\n");
  if (r.lags_size() > 0) absl::StrAppend(&out, FormatLags(s));
  return out;
}

std::string FormatWorkers(const StatusResponse& s) {
  if (s.workers_size() == 0) return "no workers\n";
  std::vector<std::vector<std::string>> rows = {
      {"WORKER", "INCARNATION", "STATE", "TASKS", "LEASE"}};
  for (const WorkerInfo& w : s.workers()) {
    rows.push_back({absl::StrCat(w.worker_id()), absl::StrCat(w.incarnation()),
                    WorkerInfo::State_Name(w.state()), absl::StrCat(w.tasks_doing()),
                    w.state() == WorkerInfo::LIVE ? Lease(w.lease_remaining_ms()) : "-"});
  }
  return FormatColumns(rows);
}

std::string FormatUnixMillis(int64_t unix_ms) {
  if (unix_ms == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMillis(unix_ms),
                          absl::UTCTimeZone());
}

std::string FormatJobList(const StatusResponse& s) {
  const RetentionInfo& r = s.retention();
  std::string policy = absl::StrCat(
      "finished jobs kept ",
      r.job_retention_s() > 0 ? absl::StrCat(r.job_retention_s(), " s") : "without time limit",
      r.max_finished_jobs() > 0 ? absl::StrCat(", at most ", r.max_finished_jobs()) : "",
      "; at most ", r.max_tasks_per_job(), " tasks per job\n");
  if (s.jobs_size() == 0) return absl::StrCat("no jobs\n", policy);
  std::vector<std::vector<std::string>> rows = {{"JOB", "STATE", "TASKS done/total", "FAILED",
                                                 "TRAIN RECORDS", "CREATED", "FINISHED",
                                                 "DELETED AFTER"}};
  for (const JobInfo& j : s.jobs()) {
    const bool finished = j.state() != JobInfo::RUNNING && j.finished_unix_ms() > 0;
    rows.push_back({j.name(), JobInfo::State_Name(j.state()),
                    absl::StrCat(j.tasks_done(), "/", j.tasks_total()),
                    absl::StrCat(j.tasks_failed()),
                    absl::StrCat(j.train_records_done(), "/", j.train_records_total()),
                    FormatUnixMillis(j.created_unix_ms()), FormatUnixMillis(j.finished_unix_ms()),
                    finished && r.job_retention_s() > 0
                        ? FormatUnixMillis(j.finished_unix_ms() + r.job_retention_s() * 1000)
                        : "-"});
  }
  return absl::StrCat(FormatColumns(rows), policy);
}

std::string FormatDeletedJob(const DeleteJobResponse& r) {
  const JobInfo& j = r.job();
  return absl::StrCat("job ", j.name(), " deleted (was ", JobInfo::State_Name(j.state()), ": ",
                      j.tasks_done(), "/", j.tasks_total(), " tasks done, ", j.tasks_failed(),
                      " failed, ", j.train_records_done(), " training records)\n");
}

std::string FormatTasks(const StatusResponse& s) {
  std::string out = FormatJobs(s);
  absl::StrAppend(&out, "\nIN PROGRESS\n",
                  s.doing_tasks_size() == 0 ? "none\n" : FormatTaskList(s.doing_tasks(), false));
  absl::StrAppend(&out, "\nFAILED\n",
                  s.failed_tasks_size() == 0 ? "none\n" : FormatTaskList(s.failed_tasks(), true));
  return out;
}

}  // namespace ps
