// The pod's Prometheus series, read at scrape time from the counters PsCore keeps anyway
// (PsCore::Stats, the tables' sizes, the ownership): nothing is counted twice.
#pragma once

#include "common/metrics/metrics.h"
#include "ps/ps_core.h"

namespace ps {

// Adds a collector of `core`'s series to `registry`. `core` must outlive every Render.
// The series are listed in docs/operations.md ("Metrics").
void AddPsCoreMetrics(PsCore* core, MetricsRegistry* registry);

}  // namespace ps
