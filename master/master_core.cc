// MasterCore: opening and loading the parts, and the RPCs handed to them.
#include "master/master_core.h"

#include <glog/logging.h>

#include <set>

#include "absl/memory/memory.h"
#include "common/base/status_macros.h"
#include "master/cluster_config.h"

namespace ps {

MasterCore::MasterCore(const MasterOptions& options, std::unique_ptr<MasterStore> store,
                       const ClusterConfig& config)
    : options_(options),
      started_(CurrentTime(options)),
      store_(std::move(store)),
      counters_(store_.get()),
      membership_(options_, config, store_.get(), &counters_),
      catalog_(store_.get(), &counters_),
      jobs_(options_, store_.get(), &counters_),
      moves_(options_, &membership_),
      checkpoints_(options_, store_.get(), &counters_, &membership_, &operation_mu_),
      balancer_(options_, &membership_, &moves_, &operation_mu_),
      rereplicator_(options_, &membership_, &moves_, &operation_mu_) {}

absl::StatusOr<std::unique_ptr<MasterCore>> MasterCore::Open(const MasterOptions& options) {
  RETURN_IF_ERROR(ValidateMasterOptions(options));
  MasterOptions with_defaults = options;
  if (with_defaults.pod_control == nullptr) with_defaults.pod_control = NewGrpcPodControl();
  ASSIGN_OR_RETURN(std::unique_ptr<MasterStore> store, MasterStore::Open(options.data_dir));
  ASSIGN_OR_RETURN(ClusterConfig config, LoadOrCreateCluster(*store, options));
  auto core = absl::WrapUnique(new MasterCore(with_defaults, std::move(store), config));
  RETURN_IF_ERROR(core->Load());
  core->balancer_.StartAutoRebalance();
  if (config.replication() >= 2 && options.rereplicate_interval > absl::ZeroDuration()) {
    core->rereplicator_.Start(options.rereplicate_interval);
  }
  if (options.retention_interval > absl::ZeroDuration()) {
    MasterCore* raw = core.get();
    core->retention_.Start(options.retention_interval, [raw] {
      if (absl::Status s = raw->EnforceRetention(); !s.ok()) {
        LOG(WARNING) << "retention failed (retried): " << s;
      }
    });
  }
  return core;
}

absl::Status MasterCore::Load() {
  const absl::Time lease_deadline = CurrentTime(options_) + options_.lease;
  RETURN_IF_ERROR(counters_.Load());
  ASSIGN_OR_RETURN(std::vector<MoveRecord> aborted, membership_.Load(lease_deadline));
  RETURN_IF_ERROR(catalog_.Load());
  RETURN_IF_ERROR(jobs_.Load(lease_deadline));
  moves_.Load(aborted);
  RETURN_IF_ERROR(checkpoints_.Load());
  LOG(INFO) << "master state loaded: epoch " << membership_.epoch() << ", "
            << membership_.pod_count() << " pods, " << catalog_.size() << " tables, "
            << jobs_.worker_count() << " workers, " << jobs_.job_count() << " jobs";
  return absl::OkStatus();
}

// ---- PS pods and the shard map: Membership ----

absl::Status MasterCore::RegisterPod(const RegisterPodRequest& req, RegisterPodResponse* resp) {
  bool joined_empty = false;
  // Roles changed by a lost volume, and the primaries streaming to a pod at a new address:
  // told at once.
  std::vector<std::string> tell;
  RETURN_IF_ERROR(membership_.RegisterPod(req, resp, &joined_empty, &tell));
  // Not waited for: a primary that does not answer must not hold up the registration.
  moves_.NotifyPodsSoon(tell);
  // A pod that owns nothing joined (new, or undrained): spread the vshards onto it.
  if (joined_empty) balancer_.RequestRebalance();
  rereplicator_.Wake();  // a pod that may take (or, back, needs) copies
  return absl::OkStatus();
}

absl::Status MasterCore::PodHeartbeat(const PodHeartbeatRequest& req, PodHeartbeatResponse* resp) {
  return membership_.PodHeartbeat(req, resp);
}

absl::Status MasterCore::LeavePod(const LeavePodRequest& req, LeavePodResponse* resp) {
  return membership_.LeavePod(req, resp);
}

absl::Status MasterCore::GetShardMap(const GetShardMapRequest& req, ShardMapResponse* resp) {
  return membership_.GetShardMap(req, resp);
}

// ---- Catalog ----

absl::Status MasterCore::CreateTable(const CreateTableRequest& req, CreateTableResponse* resp) {
  return catalog_.CreateTable(req, resp);
}

absl::Status MasterCore::CreateDense(const CreateDenseRequest& req, CreateDenseResponse* resp) {
  return catalog_.CreateDense(req, resp);
}

absl::Status MasterCore::ListTables(const ListTablesRequest& req, ListTablesResponse* resp) {
  return catalog_.ListTables(req, resp);
}

// ---- Workers, jobs and tasks: JobDispatcher ----

absl::Status MasterCore::RegisterWorker(const RegisterWorkerRequest& req,
                                        RegisterWorkerResponse* resp) {
  return jobs_.RegisterWorker(req, resp);
}

absl::Status MasterCore::WorkerHeartbeat(const WorkerHeartbeatRequest& req,
                                         WorkerHeartbeatResponse* resp) {
  return jobs_.WorkerHeartbeat(req, resp);
}

absl::Status MasterCore::LeaveWorker(const LeaveWorkerRequest& req, LeaveWorkerResponse* resp) {
  return jobs_.LeaveWorker(req, resp);
}

absl::Status MasterCore::CreateJob(const CreateJobRequest& req, CreateJobResponse* resp) {
  return jobs_.CreateJob(req, resp);
}

absl::Status MasterCore::GetTask(const GetTaskRequest& req, GetTaskResponse* resp) {
  return jobs_.GetTask(req, resp);
}

absl::Status MasterCore::ReportTask(const ReportTaskRequest& req, ReportTaskResponse* resp) {
  return jobs_.ReportTask(req, resp);
}

absl::Status MasterCore::ExpireLeases() {
  const absl::Time now = CurrentTime(options_);
  // After a failover the pods whose role changed learn it now, not at their next heartbeat.
  std::vector<std::string> tell = membership_.ExpireLeases(now);
  moves_.NotifyPods(tell);
  if (!tell.empty()) rereplicator_.Wake();  // ack sets shrank: copies to make
  return jobs_.ExpireLeases(now);
}

absl::Status MasterCore::EnforceRetention() {
  return jobs_.EnforceRetention(CurrentTime(options_));
}

absl::Status MasterCore::DeleteJob(const DeleteJobRequest& req, DeleteJobResponse* resp) {
  return jobs_.DeleteJob(req, resp);
}

// ---- Moves, drains, rebalances, checkpoints ----

absl::StatusOr<MoveInfo> MasterCore::MoveVShards(const std::string& source,
                                                 const std::string& destination,
                                                 const std::vector<uint32_t>& vshards) {
  return moves_.MoveVShards(source, destination, vshards);
}

absl::Status MasterCore::Drain(const DrainRequest& req, DrainResponse* resp) {
  return balancer_.Drain(req, resp);
}

absl::Status MasterCore::Rebalance(const RebalanceRequest& req, RebalanceResponse* resp) {
  return balancer_.Rebalance(req, resp);
}

absl::Status MasterCore::Checkpoint(const CheckpointRequest& req, CheckpointResponse* resp) {
  return checkpoints_.Checkpoint(req, resp);
}

// ---- Admin ----

absl::Status MasterCore::Status(const StatusRequest&, StatusResponse* resp) {
  const absl::Time now = CurrentTime(options_);
  resp->set_lease_ms(absl::ToInt64Milliseconds(options_.lease));
  resp->set_uptime_seconds(absl::ToDoubleSeconds(now - started_));
  membership_.Describe(now, resp);
  jobs_.Describe(now, resp);
  moves_.Describe(resp);
  balancer_.Describe(resp);
  checkpoints_.Describe(resp);
  // Every table known to the catalog or pushed to by a finished task.
  const Counters counters = counters_.Get();
  std::set<std::string> tables = catalog_.Names();
  for (const auto& [name, version] : counters.table_versions()) tables.insert(name);
  for (const std::string& name : tables) {
    TableProgress* p = resp->add_tables();
    p->set_name(name);
    auto v = counters.table_versions().find(name);
    p->set_version(v == counters.table_versions().end() ? 0 : v->second);
  }
  return absl::OkStatus();
}

}  // namespace ps
