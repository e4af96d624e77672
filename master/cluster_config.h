// The cluster's shape (ClusterConfig: num_vshards, num_ps), fixed the first time a master
// starts on a data dir.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "master/master_options.h"
#include "master/master_store.h"
#include "proto/master_state.pb.h"

namespace ps {

// OK, or INVALID_ARGUMENT naming the first bad option (num_vshards not a power of two in
// [1, 65536], num_ps outside [1, num_vshards], lease <= 0, max_task_failures or
// vshards_per_move < 1).
absl::Status ValidateMasterOptions(const MasterOptions& options);

// The stored config of the cluster in `store`. For a new store (no config yet) it first
// writes, in one synced batch, the config from `options`, the static map of num_ps pods at
// epoch 1 and the first counters. FAILED_PRECONDITION when the store holds a cluster of
// another num_vshards (another num_ps is logged and ignored); store errors as they come.
// Not thread-safe: call before anything else uses the store.
absl::StatusOr<ClusterConfig> LoadOrCreateCluster(MasterStore& store, const MasterOptions& options);

}  // namespace ps
