#include "master/master_metrics.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"

namespace ps {
namespace {

std::string Lower(const std::string& s) { return absl::AsciiStrToLower(s); }

}  // namespace

void AddMasterMetrics(MasterCore* core, MetricsRegistry* registry) {
  registry->AddCollector([core](MetricsWriter* w) {
    StatusResponse s;
    if (!core->Status(StatusRequest(), &s).ok()) return;
    constexpr MetricType C = MetricType::kCounter, G = MetricType::kGauge;

    w->Family("ps_master_shard_map_epoch", "Epoch of the vshard -> pod map.", G);
    w->Sample({}, s.epoch());
    w->Family("ps_master_vshards", "Virtual shards in the cluster.", G);
    w->Sample({}, s.num_vshards());
    w->Family("ps_master_uptime_seconds", "Seconds since the master started.", G);
    w->Sample({}, s.uptime_seconds());

    // Every state is exported (0 included), so a state's series exists before it happens.
    std::map<std::string, int> pods;
    for (int v = PodInfo::State_MIN; v <= PodInfo::State_MAX; ++v) {
      if (v != PodInfo::UNKNOWN) pods[Lower(PodInfo::State_Name(v))] = 0;
    }
    for (const PodInfo& p : s.pods()) ++pods[Lower(PodInfo::State_Name(p.state()))];
    w->Family("ps_master_pods", "PS pods known to the master, by state.", G);
    for (const auto& [state, n] : pods) w->Sample({{"state", state}}, n);
    w->Family("ps_master_pod_vshards", "Virtual shards assigned to each pod.", G);
    for (const PodInfo& p : s.pods()) w->Sample({{"pod", p.pod_id()}}, p.vshards());

    std::map<std::string, int> workers;
    for (int v = WorkerInfo::State_MIN; v <= WorkerInfo::State_MAX; ++v) {
      if (v != WorkerInfo::UNKNOWN) workers[Lower(WorkerInfo::State_Name(v))] = 0;
    }
    for (const WorkerInfo& wi : s.workers()) ++workers[Lower(WorkerInfo::State_Name(wi.state()))];
    w->Family("ps_master_workers", "Workers known to the master, by state.", G);
    for (const auto& [state, n] : workers) w->Sample({{"state", state}}, n);

    w->Family("ps_master_lease_losses_total", "Leases that ran out (no heartbeat), by kind.", C);
    w->Sample({{"kind", "pod"}}, core->pod_lease_losses());
    w->Sample({{"kind", "worker"}}, core->worker_lease_losses());

    // Re-replication (R >= 2): follower copies that filled a vshard short of R copies.
    const Rereplicator::Stats rr = core->rereplication_stats();
    w->Family("ps_master_rereplication_copies_total",
              "Follower copies run by re-replication, by outcome.", C);
    w->Sample({{"outcome", "committed"}}, rr.copies);
    w->Sample({{"outcome", "failed"}}, rr.failures);
    w->Family("ps_master_rereplication_rows_total", "Rows copied by committed follower copies.", C);
    w->Sample({}, rr.rows);
    // Replication (issue 16); the factor is 1 and the rest 0 without it.
    const ReplicationInfo& r = s.replication();
    w->Family("ps_master_replication_factor", "Copies of each vshard (1: no replication).", G);
    w->Sample({}, std::max(1u, r.factor()));
    w->Family("ps_master_failovers_total",
              "Primaries replaced by a follower since the master started (one per promoted "
              "pod and lease loss).",
              C);
    w->Sample({}, r.failovers());
    w->Family("ps_master_ack_set_removals_total",
              "Vshard copies taken out of ack sets since the master started, by cause: the "
              "follower was lost (its lease ran out, or it came back without its data), its "
              "primary reported it lagging or unreachable, the vshard had more than R "
              "copies (surplus), or its primary failed over to another follower (failover, "
              "R >= 3).",
              C);
    w->Sample({{"cause", "lost"}}, r.removed_lease());
    w->Sample({{"cause", "lag"}}, r.removed_lag());
    w->Sample({{"cause", "surplus"}}, r.removed_surplus());
    w->Sample({{"cause", "failover"}}, r.removed_failover());
    w->Family("ps_master_under_replicated_vshards", "Vshards with fewer copies than the factor.",
              G);
    w->Sample({}, r.under_replicated_vshards());
    // A LOST primary reports no more: its last report stays in status (marked there, for
    // ps-admin, and used to pick whom a failover promotes) but is not exported, or its
    // series would show a frozen lag for streams that no longer exist.
    std::set<std::string> lost;
    for (const PodInfo& p : s.pods()) {
      if (p.state() == PodInfo::LOST) lost.insert(p.pod_id());
    }
    std::vector<const ReplicaLag*> lags;
    for (const ReplicaLag& l : r.lags()) {
      if (lost.count(l.primary()) == 0) lags.push_back(&l);
    }
    w->Family("ps_master_replication_lag_seconds",
              "A follower's lag as its live primary last reported it (its oldest record not "
              "yet acknowledged).",
              G);
    for (const ReplicaLag* l : lags) {
      w->Sample({{"primary", l->primary()}, {"follower", l->lag().follower()}},
                l->lag().lag_ms() / 1000.0);
    }
    w->Family("ps_master_replication_lag_records",
              "Records a follower had not yet acknowledged, as its live primary last reported.", G);
    for (const ReplicaLag* l : lags) {
      w->Sample({{"primary", l->primary()}, {"follower", l->lag().follower()}}, l->lag().records());
    }

    // Vshard moves (live migration): in progress, and the last drain / rebalance.
    int copying = 0;
    double max_fence = 0;
    for (const MoveInfo& m : s.moves()) {
      if (m.state() == MoveInfo::COPYING) ++copying;
      if (m.state() == MoveInfo::COMMITTED) max_fence = std::max(max_fence, m.fence_ms() / 1000);
    }
    w->Family("ps_master_moves_in_progress", "Vshard moves being copied.", G);
    w->Sample({}, copying);
    w->Family("ps_master_recent_move_max_fence_seconds",
              "Longest fence (pushes to moving vshards refused) among the recent committed "
              "moves.",
              G);
    w->Sample({}, max_fence);
    w->Family("ps_master_operation_moves",
              "Moves of the last drain or rebalance: planned (total) and finished (done).", G);
    w->Sample({{"state", "total"}}, s.operation().moves_total());
    w->Sample({{"state", "done"}}, s.operation().moves_done());
    w->Family("ps_master_operation_running", "1 while a drain or rebalance runs.", G);
    w->Sample({}, s.operation().operation_id() != 0 && !s.operation().done() ? 1 : 0);

    // Jobs the master keeps (retention deletes finished ones), by state.
    std::map<std::string, int> jobs;
    for (int v = JobInfo::State_MIN; v <= JobInfo::State_MAX; ++v) {
      if (v != JobInfo::UNKNOWN) jobs[Lower(JobInfo::State_Name(v))] = 0;
    }
    for (const JobInfo& j : s.jobs()) ++jobs[Lower(JobInfo::State_Name(j.state()))];
    w->Family("ps_master_jobs", "Jobs the master keeps, by state.", G);
    for (const auto& [state, n] : jobs) w->Sample({{"state", state}}, n);

    // Per job: counts kept as its tasks change (no walk over the tasks at scrape time).
    w->Family("ps_master_tasks", "Tasks per job and state.", G);
    for (const JobInfo& j : s.jobs()) {
      w->Sample({{"job", j.name()}, {"state", "todo"}}, j.tasks_todo());
      w->Sample({{"job", j.name()}, {"state", "doing"}}, j.tasks_doing());
      w->Sample({{"job", j.name()}, {"state", "done"}}, j.tasks_done());
      w->Sample({{"job", j.name()}, {"state", "failed"}}, j.tasks_failed());
    }
    w->Family("ps_master_job_records_trained", "Training records done per job.", G);
    for (const JobInfo& j : s.jobs()) w->Sample({{"job", j.name()}}, j.train_records_done());
    w->Family("ps_master_job_running", "1 while a job has unfinished tasks.", G);
    for (const JobInfo& j : s.jobs()) {
      w->Sample({{"job", j.name()}}, j.state() == JobInfo::RUNNING ? 1 : 0);
    }
    w->Family("ps_master_records_trained_total", "Training records done, all jobs.", C);
    w->Sample({}, s.records_trained());
    w->Family("ps_master_tasks_done_total", "Tasks done, all jobs (the global step).", C);
    w->Sample({}, s.tasks_done());
    w->Family("ps_master_table_version", "Pushes reported by finished tasks, per table.", C);
    for (const TableProgress& t : s.tables()) w->Sample({{"table", t.name()}}, t.version());
  });
}

}  // namespace ps
