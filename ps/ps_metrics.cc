#include "ps/ps_metrics.h"

#include <string>

namespace ps {
namespace {

void One(MetricsWriter* w, const char* name, const char* help, MetricType type, double v) {
  w->Family(name, help, type);
  w->Sample({}, v);
}

// Replication (issue 16): the primary's stream to each follower (labelled by follower;
// its counters start again when the stream does), the follower's side, the write lease.
void AddReplication(const PsCore::ReplicationStats& r, MetricsWriter* w) {
  constexpr MetricType C = MetricType::kCounter, G = MetricType::kGauge;
  One(w, "ps_replication_factor", "Copies of each vshard in the cluster (1: no replication).", G,
      r.factor);
  One(w, "ps_replication_following_vshards", "Vshards this pod holds as a follower.", G,
      r.following);
  One(w, "ps_replication_followers", "Followers this pod ships its records to (its ack set).", G,
      r.followers.size());
  using F = Replicator::FollowerStats;
  auto family = [&](const char* name, const char* help, MetricType type, auto value) {
    w->Family(name, help, type);
    for (const F& f : r.followers) w->Sample({{"follower", f.pod_id}}, value(f));
  };
  family("ps_replication_lag_records", "Records shipped to a follower and not yet acknowledged.", G,
         [](const F& f) { return static_cast<double>(f.queued_records); });
  family("ps_replication_lag_bytes", "Bytes of those records.", G,
         [](const F& f) { return static_cast<double>(f.queued_bytes); });
  family("ps_replication_lag_seconds",
         "How long the oldest record not yet acknowledged by a follower has waited.", G,
         [](const F& f) { return absl::ToDoubleSeconds(f.lag); });
  family("ps_replication_batches_total", "ReplicateRecords calls a follower answered.", C,
         [](const F& f) { return static_cast<double>(f.sent_calls); });
  family("ps_replication_sent_bytes_total", "Record bytes a follower acknowledged.", C,
         [](const F& f) { return static_cast<double>(f.sent_bytes); });
  family("ps_replication_acked_records_total", "Records a follower acknowledged.", C,
         [](const F& f) { return static_cast<double>(f.held_records); });
  family("ps_replication_failed_calls_total",
         "ReplicateRecords calls to a follower that failed (each retried).", C,
         [](const F& f) { return static_cast<double>(f.failed_calls); });
  One(w, "ps_replicated_records_received_total", "Records received from primaries (follower).", C,
      r.records_received);
  One(w, "ps_replicated_records_applied_total",
      "Records applied from primaries (follower; a batch sent again is not applied twice).", C,
      r.records_applied);
  One(w, "ps_replicated_batches_refused_total",
      "Batches refused from primaries: not the primary this pod follows, an older epoch, a "
      "table not yet known.",
      C, r.refused_batches);
  One(w, "ps_write_lease_refusals_total",
      "Changes refused because this primary's master lease ran out.", C, r.lease_refusals);
  // Sole copies (periodic durability, a vshard led with an empty ack set): their changes
  // are acknowledged only once the log is fsynced (ps/synced_acks.h).
  One(w, "ps_sole_copy_vshards",
      "Vshards this pod leads with no follower in their ack set (the only copy).", G, r.sole_copy);
  One(w, "ps_sole_copy_synced_acks_total",
      "Changes of sole-copy vshards acknowledged only after an fsync of the log.", C,
      r.sole_copy_synced_acks);
  One(w, "ps_sole_copy_syncs_total", "Log fsyncs those acknowledgements waited for (grouped).", C,
      r.sole_copy_syncs);
  One(w, "ps_sole_copy_sync_seconds_total", "Time spent in those fsyncs.", C,
      absl::ToDoubleSeconds(r.sole_copy_sync_time));
  One(w, "ps_sole_copy_ack_wait_seconds_total",
      "Time those acknowledgements waited for their fsync, summed (divide by "
      "ps_sole_copy_synced_acks_total for the mean).",
      C, absl::ToDoubleSeconds(r.sole_copy_ack_wait));
}

}  // namespace

void AddPsCoreMetrics(PsCore* core, MetricsRegistry* registry) {
  registry->AddCollector([core](MetricsWriter* w) {
    StatsResponse s;
    if (!core->Stats(StatsRequest(), &s).ok()) return;
    constexpr MetricType C = MetricType::kCounter, G = MetricType::kGauge;
    One(w, "ps_pull_requests_total", "Pull requests served (including failed ones).", C,
        s.pull_requests());
    One(w, "ps_push_requests_total", "Push requests received.", C, s.push_requests());
    One(w, "ps_pulled_rows_total", "Rows returned by pulls.", C, s.pulled_rows());
    One(w, "ps_pushed_rows_total", "Gradient rows applied by pushes.", C, s.pushed_rows());
    One(w, "ps_duplicate_pushes_total",
        "Pushes recognised as retries of an applied push and not applied again.", C,
        s.duplicate_pushes());
    const PsCore::Refusals r = core->refusals();
    w->Family("ps_rejected_total", "Requests or ids refused, by reason.", C);
    w->Sample({{"reason", "nonfinite_gradient"}}, s.rejected_nonfinite());
    w->Sample({{"reason", "gradient_too_large"}}, r.gradient_too_large);
    w->Sample({{"reason", "answer_too_large"}}, r.answer_too_large);
    w->Sample({{"reason", "wrong_shard"}}, s.rejected_wrong_shard());
    One(w, "ps_import_invalid_rows_total",
        "Rows and dense tensors an import left out: no state an optimizer can hold "
        "(non-finite, beyond +-1e15, a negative accumulator).",
        C, r.invalid_import_rows);
    One(w, "ps_rows", "Embedding rows held in memory, all tables.", G, s.rows());
    One(w, "ps_memory_bytes", "Bytes held by rows, optimizer state and dense tensors.", G,
        s.memory_bytes());
    One(w, "ps_uptime_seconds", "Seconds since the pod started.", G, s.uptime_seconds());

    const auto tables = core->store().Tables();
    w->Family("ps_table_rows", "Rows per embedding table.", G);
    for (const auto& t : tables) w->Sample({{"table", t->spec().name()}}, t->rows());
    w->Family("ps_table_memory_bytes", "Memory per embedding table.", G);
    for (const auto& t : tables) w->Sample({{"table", t->spec().name()}}, t->memory_bytes());

    const auto own = core->ownership();
    One(w, "ps_shard_map_epoch", "Epoch of the shard map the pod serves.", G, own->epoch());
    One(w, "ps_owned_vshards", "Virtual shards this pod owns.", G, own->owned_count());
    AddReplication(core->replication_stats(), w);

    if (core->storage() == nullptr) return;
    One(w, "ps_log_records_total", "Push records written to the durable log.", C, s.log_records());
    One(w, "ps_log_groups_total", "Group commits (writes) of the durable log.", C, s.log_groups());
    One(w, "ps_log_bytes_total", "Bytes written to the durable log.", C, s.log_bytes());
    One(w, "ps_log_pending_bytes", "Log bytes queued and not yet written (durability lag).", G,
        s.log_pending_bytes());
    One(w, "ps_log_max_lag_seconds", "Longest a log record waited for its write.", G,
        s.log_max_lag_ms() / 1000.0);
    One(w, "ps_materialize_rounds_total", "Rounds writing changed rows to the database.", C,
        s.materialize_rounds());
    One(w, "ps_materialized_rows_total", "Rows written to the database by those rounds.", C,
        s.materialized_rows());
    One(w, "ps_last_materialize_seconds", "Duration of the last materialization round.", G,
        s.last_materialize_ms() / 1000.0);
    One(w, "ps_disk_bytes", "Live SST bytes of the pod's database.", G, s.disk_bytes());
    One(w, "ps_recovery_seconds", "How long the last start took to recover.", G,
        s.recovery_seconds());
    One(w, "ps_recovered_rows", "Rows loaded by the last recovery.", G, s.recovered_rows());
    One(w, "ps_recovered_log_records", "Log records replayed by the last recovery.", G,
        s.recovered_log_records());
  });
}

}  // namespace ps
