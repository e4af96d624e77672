#include "master/cluster_config.h"

#include <glog/logging.h>

#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/routing/vshards.h"
#include "master/keys.h"

namespace ps {

absl::Status ValidateMasterOptions(const MasterOptions& options) {
  RETURN_IF_ERROR(CheckNumVShards(options.num_vshards));
  if (options.num_ps < 1 || options.num_ps > options.num_vshards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_ps = ", options.num_ps, " must be in [1, num_vshards = ", options.num_vshards, "]"));
  }
  if (options.lease <= absl::ZeroDuration() || options.max_task_failures < 1) {
    return absl::InvalidArgumentError(absl::StrCat("lease (", absl::FormatDuration(options.lease),
                                                   ") must be > 0 and max_task_failures (",
                                                   options.max_task_failures, ") >= 1"));
  }
  if (options.replication < 1 || options.replication > 8 || options.replication > options.num_ps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replication = ", options.replication, " must be in [1, min(8, num_ps = ", options.num_ps,
        ")]: copies go on distinct pods"));
  }
  if (options.vshards_per_move < 1) {
    return absl::InvalidArgumentError("vshards_per_move must be >= 1");
  }
  if (options.max_tasks_per_job < 1) {
    return absl::InvalidArgumentError("max_tasks_per_job must be >= 1");
  }
  if (options.job_retention < absl::ZeroDuration() ||
      options.worker_retention < absl::ZeroDuration() ||
      options.retention_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job_retention (", absl::FormatDuration(options.job_retention), "), worker_retention (",
        absl::FormatDuration(options.worker_retention), ") and retention_interval (",
        absl::FormatDuration(options.retention_interval), ") must be >= 0"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ClusterConfig> LoadOrCreateCluster(MasterStore& store,
                                                  const MasterOptions& options) {
  ASSIGN_OR_RETURN(std::optional<ClusterConfig> stored,
                   GetRecord<ClusterConfig>(store, keys::kConfig));
  if (stored.has_value()) {
    if (stored->num_vshards() != options.num_vshards) {
      return absl::FailedPreconditionError(absl::StrCat(
          "data dir ", options.data_dir, " holds a cluster of num_vshards = ",
          stored->num_vshards(), "; refusing to start with num_vshards = ", options.num_vshards));
    }
    const uint32_t stored_r = std::max(1u, stored->replication());
    if (stored_r != options.replication) {
      return absl::FailedPreconditionError(absl::StrCat(
          "data dir ", options.data_dir, " holds a cluster of replication = ", stored_r,
          "; refusing to start with replication = ", options.replication,
          " (changing it needs re-replication, not built yet)"));
    }
    if (stored->num_ps() != options.num_ps) {
      LOG(INFO) << "--num_ps = " << options.num_ps << " ignored: it sets the initial pods of a "
                << "new cluster, and this one started with " << stored->num_ps()
                << " (pods join by registering; ps-admin rebalance / drain move vshards)";
    }
    return *std::move(stored);
  }
  // A new cluster: the static map of num_ps pods, epoch 1.
  ClusterConfig config;
  config.set_num_vshards(options.num_vshards);
  config.set_num_ps(options.num_ps);
  if (options.replication > 1) config.set_replication(options.replication);
  ShardMapRecord map;
  map.set_epoch(1);
  for (uint32_t v = 0; v < options.num_vshards; ++v) {
    const uint32_t owner = StaticOwner(v, options.num_vshards, options.num_ps);
    map.add_owner(absl::StrCat("ps-", owner));
    if (options.replication < 2) continue;
    // The followers of ps-i are the next R-1 pods: every vshard of a primary has the same
    // followers, so it ships one stream to each.
    ReplicaSet* followers = map.add_followers();
    for (uint32_t k = 1; k < options.replication; ++k) {
      followers->add_pods(absl::StrCat("ps-", (owner + k) % options.num_ps));
    }
  }
  Counters counters;
  counters.set_next_worker_id(1);
  StoreBatch batch;
  batch.Put(std::string(keys::kConfig), config);
  batch.Put(std::string(keys::kMap), map);
  batch.Put(std::string(keys::kCounters), counters);
  RETURN_IF_ERROR(store.Write(batch));
  LOG(INFO) << "new cluster in " << options.data_dir << ": " << options.num_vshards
            << " vshards over " << options.num_ps << " pods, replication " << options.replication;
  return config;
}

}  // namespace ps
