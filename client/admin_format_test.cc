#include "client/admin_format.h"

#include <tuple>
#include <utility>

#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(AdminFormatTest, ColumnsAlignAndRangesCompress) {
  EXPECT_EQ(FormatColumns({{"A", "BB"}, {"ccc", "d"}, {"e"}}), "A    BB\nccc  d\ne\n");
  EXPECT_EQ(FormatRanges({}), "-");
  EXPECT_EQ(FormatRanges({0, 1, 2, 3, 7, 9, 10}), "0-3,7,9-10");
}

TEST(AdminFormatTest, StatusShowsPodsWorkersJobsAndFailures) {
  StatusResponse s;
  s.set_epoch(3);
  s.set_num_vshards(16);
  PodInfo* p = s.add_pods();
  p->set_pod_id("ps-0");
  p->set_address("127.0.0.1:5000");
  p->set_state(PodInfo::LIVE);
  p->set_vshards(8);
  p->set_lease_remaining_ms(250);
  p = s.add_pods();
  p->set_pod_id("ps-1");
  p->set_state(PodInfo::LOST);
  p->set_lease_remaining_ms(-40);
  WorkerInfo* w = s.add_workers();
  w->set_worker_id(7);
  w->set_incarnation(2);
  w->set_state(WorkerInfo::LIVE);
  JobInfo* j = s.add_jobs();
  j->set_name("ctr");
  j->set_state(JobInfo::RUNNING);
  j->set_epochs(2);
  j->set_train_records_total(200);
  j->set_train_records_done(50);
  Task* t = s.add_failed_tasks();
  t->set_job("ctr");
  t->set_task_id(4);
  t->set_file("a.rec");
  t->set_end_record(10);
  t->set_last_error("bad record");
  StatsResponse stats;
  stats.set_rows(1234);
  stats.set_memory_bytes(3 << 20);
  stats.set_pull_requests(500);
  stats.set_uptime_seconds(10);
  const std::string out = FormatStatus(s, {{"ps-0", stats}});
  for (const char* want :
       {"epoch 3", "pods 1/2 live", "127.0.0.1:5000", "LOST", "expired 40 ms ago", "ctr", "25.0%",
        "FAILED TASKS", "a.rec[0,10)", "bad record", "1234", "3.0 MiB", "50.0"}) {
    EXPECT_NE(out.find(want), std::string::npos) << "missing '" << want << "' in:\n" << out;
  }
}

TEST(AdminFormatTest, ShardsListEachPodsRanges) {
  ShardMapResponse m;
  m.set_epoch(2);
  m.set_num_vshards(4);
  m.add_pods()->set_pod_id("ps-0");
  m.add_pods()->set_pod_id("ps-1");
  for (uint32_t o : {0, 0, 1, 0}) m.add_owner(o);
  const std::string out = FormatShards(m);
  EXPECT_NE(out.find("ps-0  -        UNKNOWN  3      0-1,3"), std::string::npos) << out;
  EXPECT_NE(out.find("ps-1  -        UNKNOWN  1      2"), std::string::npos) << out;
}

TEST(AdminFormatTest, StatusAndShardsShowMovesOperationsAndCheckpoints) {
  StatusResponse s;
  PodInfo* p = s.add_pods();
  p->set_pod_id("ps-2");
  p->set_state(PodInfo::DRAINED);
  MoveInfo* m = s.add_moves();
  m->set_move_id(9);
  m->add_vshards(4);
  m->add_vshards(5);
  m->set_source("ps-2");
  m->set_destination("ps-0");
  m->set_state(MoveInfo::COMMITTED);
  m->set_rows(1200);
  m->set_bytes(2500000);
  m->set_copy_seconds(0.25);
  m->set_fence_ms(3.5);
  s.mutable_operation()->set_operation_id(1);
  s.mutable_operation()->set_kind("drain ps-2");
  s.mutable_operation()->set_moves_total(3);
  s.mutable_operation()->set_moves_done(3);
  s.mutable_operation()->set_done(true);
  s.mutable_last_checkpoint()->set_checkpoint_id(2);
  s.mutable_last_checkpoint()->set_dir("/ckpt/ckpt-2");
  const std::string out = FormatStatus(s);
  for (const char* want : {"DRAINED", "drain ps-2: 3/3 moves done, finished", "4-5", "COMMITTED",
                           "1200", "2.5", "3.5", "last checkpoint 2: /ckpt/ckpt-2"}) {
    EXPECT_NE(out.find(want), std::string::npos) << want << " in\n" << out;
  }
  ShardMapResponse map;
  map.add_pods()->set_pod_id("ps-0");
  map.add_owner(0);
  MoveInfo* copying = map.add_moves();
  copying->set_move_id(10);
  copying->add_vshards(0);
  copying->set_state(MoveInfo::COPYING);
  const std::string shards = FormatShards(map);
  EXPECT_NE(shards.find("MOVES IN PROGRESS"), std::string::npos) << shards;
  EXPECT_NE(shards.find("COPYING"), std::string::npos) << shards;
}

TEST(AdminFormatTest, JobsShowTimesAndRetention) {
  StatusResponse s;
  s.mutable_retention()->set_job_retention_s(3600);
  s.mutable_retention()->set_max_finished_jobs(10);
  s.mutable_retention()->set_max_tasks_per_job(1000000);
  EXPECT_EQ(FormatJobList(s),
            "no jobs\nfinished jobs kept 3600 s, at most 10; at most 1000000 tasks per job\n");
  JobInfo* done = s.add_jobs();
  done->set_name("ctr");
  done->set_state(JobInfo::SUCCEEDED);
  done->set_tasks_done(4);
  done->set_tasks_total(4);
  done->set_created_unix_ms(1'700'000'000'000);
  done->set_finished_unix_ms(1'700'000'100'000);
  JobInfo* running = s.add_jobs();
  running->set_name("next");
  running->set_state(JobInfo::RUNNING);
  running->set_tasks_total(9);
  const std::string out = FormatJobList(s);
  for (const char* want :
       {"ctr", "SUCCEEDED", "4/4", "2023-11-14 22:13:20 UTC", "2023-11-14 22:15:00 UTC",
        "2023-11-14 23:15:00 UTC", "next", "RUNNING", "0/9"}) {
    EXPECT_NE(out.find(want), std::string::npos) << want << " in\n" << out;
  }
  s.mutable_retention()->set_job_retention_s(0);
  s.mutable_retention()->set_max_finished_jobs(0);
  EXPECT_NE(FormatJobList(s).find("finished jobs kept without time limit; at most 1000000"),
            std::string::npos)
      << FormatJobList(s);
  DeleteJobResponse deleted;
  *deleted.mutable_job() = *done;
  EXPECT_EQ(FormatDeletedJob(deleted),
            "job ctr deleted (was SUCCEEDED: 4/4 tasks done, 0 failed, 0 training records)\n");
}

TEST(AdminFormatTest, ShardsShowReplicasAndLag) {
  ShardMapResponse m;
  m.set_epoch(5);
  m.set_num_vshards(6);
  m.set_replication(2);
  m.set_failovers(1);
  for (const char* id : {"ps-0", "ps-1", "ps-2"}) m.add_pods()->set_pod_id(id);
  // 0-1: ps-0 -> ps-1; 2-3: ps-1 -> ps-2; 4: ps-2 -> ps-0; 5: ps-2 alone (under-replicated).
  const uint32_t owner[] = {0, 0, 1, 1, 2, 2};
  const int follower[] = {1, 1, 2, 2, 0, -1};
  for (int v = 0; v < 6; ++v) {
    m.add_owner(owner[v]);
    Followers* f = m.add_followers();
    if (follower[v] >= 0) f->add_pods(follower[v]);
  }
  ReplicaLag* lag = m.add_lags();
  lag->set_primary("ps-0");
  lag->mutable_lag()->set_follower("ps-1");
  lag->mutable_lag()->set_records(12);
  lag->mutable_lag()->set_bytes(2048);
  lag->mutable_lag()->set_lag_ms(35);
  const std::string out = FormatShards(m);
  for (const char* want :
       {"REPLICAS (R=2, 1 failovers", "0-1      ps-0     ps-1", "2/2",
        "ps-1: 12 records, 2.0 KB, 35 ms", "2-3      ps-1     ps-2", "ps-2: not reported",
        "4        ps-2     ps-0", "5        ps-2     -                    1/2"}) {
    EXPECT_NE(out.find(want), std::string::npos) << "missing '" << want << "' in:\n" << out;
  }
}

TEST(AdminFormatTest, StatusShowsReplication) {
  StatusResponse s;
  EXPECT_EQ(FormatReplication(s), "");
  EXPECT_EQ(FormatStatus(s).find("replication"), std::string::npos);
  ReplicationInfo* r = s.mutable_replication();
  r->set_factor(2);
  r->set_max_lag_ms(3000);
  r->set_failovers(2);
  r->set_removed_lease(8);
  r->set_removed_lag(4);
  r->set_removed_failover(5);
  r->set_removed_surplus(6);
  r->set_under_replicated_vshards(12);
  ReplicaLag* lag = r->add_lags();
  lag->set_primary("ps-0");
  lag->mutable_lag()->set_follower("ps-1");
  lag->mutable_lag()->set_records(3);
  lag->mutable_lag()->set_failed_calls(9);
  lag->mutable_lag()->set_held_records(100);
  lag->set_reported_ms_ago(120);
  const std::string out = FormatStatus(s);
  for (const char* want :
       {"replication: R=2, ack all, max lag 3000 ms; 12 vshards under-replicated; 2 failovers",
        "8 vshard copies lost (lease or data), 4 lagging, 5 left out by failovers (R>=3), 6 "
        "surplus trimmed",
        "PRIMARY", "ps-0", "ps-1", "3 records", "100", "9", "120 ms ago"}) {
    EXPECT_NE(out.find(want), std::string::npos) << "missing '" << want << "' in:\n" << out;
  }
  EXPECT_EQ(out.find("its last report"), std::string::npos) << out;  // ps-0 is not listed
}

// A primary that is gone reports no more: its rows are its last report, and say so; a
// live primary's are not marked.
TEST(AdminFormatTest, LagOfAPrimaryThatIsGoneIsMarkedAsItsLastReport) {
  StatusResponse s;
  for (auto [id, state] : {std::pair{"ps-0", PodInfo::LIVE}, std::pair{"ps-1", PodInfo::LOST}}) {
    PodInfo* p = s.add_pods();
    p->set_pod_id(id);
    p->set_state(state);
  }
  ReplicationInfo* r = s.mutable_replication();
  r->set_factor(2);
  for (auto [primary, follower, ago] :
       {std::tuple{"ps-0", "ps-2", 40}, std::tuple{"ps-1", "ps-0", 3199}}) {
    ReplicaLag* lag = r->add_lags();
    lag->set_primary(primary);
    lag->mutable_lag()->set_follower(follower);
    lag->set_reported_ms_ago(ago);
  }
  const std::string out = FormatReplication(s);
  EXPECT_NE(out.find("3199 ms ago (primary LOST: its last report)"), std::string::npos) << out;
  EXPECT_EQ(out.find("40 ms ago ("), std::string::npos) << out;
}

TEST(AdminFormatTest, TablesSumLifecycleCountersOverPods) {
  ListTablesResponse t;
  t.set_catalog_version(3);
  TableSpec* spec = t.add_tables();
  spec->set_name("emb");
  spec->set_dim(8);
  TableSpec* other = t.add_tables();
  other->set_name("fresh");
  other->set_dim(4);
  TableTotals totals;
  for (uint64_t k : {1, 10}) {
    DescribeResponse d;
    TableInfo* info = d.add_tables();
    info->mutable_spec()->set_name("emb");
    info->set_rows(100 * k);
    info->set_admitted(2 * k);
    info->set_pending_admission(3 * k);
    info->set_dropped_gradients(4 * k);
    info->set_evicted(5 * k);
    AddTableTotals(d, &totals);
  }
  StatusResponse s;
  s.mutable_replication()->set_factor(2);
  const std::string out = FormatTables(t, s, totals);
  for (const char* want : {"ADMITTED", "PENDING ADMISSION", "DROPPED GRADIENTS", "EVICTED",
                           "1100  22        33                 44                 55",
                           "sum over 2 pods (each row held by 2 of them)"}) {
    EXPECT_NE(out.find(want), std::string::npos) << "missing '" << want << "' in:\n" << out;
  }
  // A table no pod reported shows zeros.
  EXPECT_NE(out.find("0     0         0                  0                  0"), std::string::npos)
      << out;
}

}  // namespace
}  // namespace ps
