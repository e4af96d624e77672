// The master's Prometheus series, read at scrape time from MasterCore::Status and its
// lease-loss counters: nothing is counted twice. A scrape costs O(pods + vshards + workers
// + jobs + tasks in progress): each job's counts are kept as its tasks change, and
// retention bounds the jobs and workers kept.
#pragma once

#include "common/metrics/metrics.h"
#include "master/master_core.h"

namespace ps {

// Adds a collector of `core`'s series to `registry`. `core` must outlive every Render.
// The series are listed in docs/operations.md ("Metrics").
void AddMasterMetrics(MasterCore* core, MetricsRegistry* registry);

}  // namespace ps
