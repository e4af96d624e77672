// Human-readable tables of the master's admin answers, for ps-admin. (--json output is the
// protobuf JSON mapping of the same messages and needs no code here.)
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "proto/master.pb.h"
#include "proto/ps.pb.h"

namespace ps {

// Renders rows as left-aligned columns separated by two spaces; the first row is the header.
// Rows shorter than the header are padded with empty cells.
std::string FormatColumns(const std::vector<std::vector<std::string>>& rows);

// "0-7,12,14-15" for the ascending vshard list; "-" when empty.
std::string FormatRanges(const std::vector<uint32_t>& vshards);

// Pod id -> the pod's own Stats, for the pods that answered.
using PodStats = std::map<std::string, StatsResponse>;
// Table name -> its TableInfo counters (rows, admitted, pending_admission,
// dropped_gradients, evicted) summed over the pods that answered Describe; `pods` is how
// many did.
struct TableTotals {
  std::map<std::string, TableInfo> tables;
  int pods = 0;
};
// Adds one pod's Describe answer to `totals`.
void AddTableTotals(const DescribeResponse& pod, TableTotals* totals);

// Each returns the text ps-admin prints for its command (ending in a newline).
// status: everything at a glance; `stats` adds rows, memory and request rates per pod.
std::string FormatStatus(const StatusResponse& s, const PodStats& stats = {});
std::string FormatPods(const StatusResponse& s, const PodStats& stats = {});  // part of status
std::string FormatShards(const ShardMapResponse& m);                          // shards
std::string FormatMoves(const google::protobuf::RepeatedPtrField<MoveInfo>& moves);
// tables: the catalog, each table's version, and its lifecycle counters over the pods.
std::string FormatTables(const ListTablesResponse& t, const StatusResponse& s,
                         const TableTotals& totals = {});
// The replication part of status (R >= 2: counters, under-replicated vshards, each
// follower's lag); "" without replication.
std::string FormatReplication(const StatusResponse& s);
std::string FormatWorkers(const StatusResponse& s);  // workers
std::string FormatTasks(const StatusResponse& s);    // tasks
// jobs: every job the master keeps, with its times and the retention that deletes it.
std::string FormatJobList(const StatusResponse& s);
// delete-job: what was deleted.
std::string FormatDeletedJob(const DeleteJobResponse& r);
// "2025-01-02 03:04:05 UTC" for a unix time in ms; "-" for 0.
std::string FormatUnixMillis(int64_t unix_ms);

}  // namespace ps
