// MasterCore: opening and loading, PS pods and the shard map, catalog, workers, admin.
// The job and task half is in master_jobs.cc.
#include "master/master_core.h"

#include <glog/logging.h>

#include <algorithm>
#include <cctype>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/routing/vshards.h"
#include "embedding/spec.h"
#include "master/keys.h"

namespace ps {
namespace {

template <typename Message>
absl::Status ParseRecord(absl::string_view key, absl::string_view value, Message* out) {
  if (!out->ParseFromArray(value.data(), static_cast<int>(value.size()))) {
    return absl::DataLossError(absl::StrCat("master store: unparsable record at key '", key, "'"));
  }
  return absl::OkStatus();
}

// Natural order of pod ids: "ps-2" < "ps-10"; ids without a numeric suffix sort by text.
bool PodIdLess(const std::string& a, const std::string& b) {
  auto split = [](const std::string& s) {
    size_t i = s.size();
    while (i > 0 && std::isdigit(static_cast<unsigned char>(s[i - 1]))) --i;
    uint64_t n = 0;
    const bool has_num = i < s.size() && absl::SimpleAtoi(s.substr(i), &n);
    return std::make_tuple(s.substr(0, i), has_num ? 0 : 1, n, s);
  };
  return split(a) < split(b);
}

int64_t RemainingMs(absl::Time deadline, absl::Time now) {
  return absl::ToInt64Milliseconds(deadline - now);
}

}  // namespace

MasterCore::MasterCore(const MasterOptions& options)
    : options_(options), started_(options.clock ? options.clock() : absl::Now()) {}

absl::StatusOr<std::unique_ptr<MasterCore>> MasterCore::Open(const MasterOptions& options) {
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
  if (options.vshards_per_move < 1) {
    return absl::InvalidArgumentError("vshards_per_move must be >= 1");
  }
  MasterOptions with_defaults = options;
  if (with_defaults.pod_control == nullptr) with_defaults.pod_control = NewGrpcPodControl();
  auto core = std::unique_ptr<MasterCore>(new MasterCore(with_defaults));
  ASSIGN_OR_RETURN(core->store_, MasterStore::Open(options.data_dir));

  ClusterConfig config;
  ASSIGN_OR_RETURN(std::optional<std::string> stored, core->store_->Get(keys::kConfig));
  if (stored.has_value()) {
    RETURN_IF_ERROR(ParseRecord(keys::kConfig, *stored, &config));
    if (config.num_vshards() != options.num_vshards) {
      return absl::FailedPreconditionError(absl::StrCat(
          "data dir ", options.data_dir, " holds a cluster of num_vshards = ", config.num_vshards(),
          "; refusing to start with num_vshards = ", options.num_vshards));
    }
    if (config.num_ps() != options.num_ps) {
      LOG(INFO) << "--num_ps = " << options.num_ps << " ignored: it sets the initial pods of a "
                << "new cluster, and this one started with " << config.num_ps()
                << " (pods join by registering; ps-admin rebalance / drain move vshards)";
    }
  } else {
    // A new cluster: the static map of num_ps pods, epoch 1.
    config.set_num_vshards(options.num_vshards);
    config.set_num_ps(options.num_ps);
    ShardMapRecord map;
    map.set_epoch(1);
    for (uint32_t v = 0; v < options.num_vshards; ++v) {
      map.add_owner(absl::StrCat("ps-", StaticOwner(v, options.num_vshards, options.num_ps)));
    }
    Counters counters;
    counters.set_next_worker_id(1);
    StoreBatch batch;
    batch.Put(std::string(keys::kConfig), config);
    batch.Put(std::string(keys::kMap), map);
    batch.Put(std::string(keys::kCounters), counters);
    RETURN_IF_ERROR(core->store_->Write(batch));
    LOG(INFO) << "new cluster in " << options.data_dir << ": " << options.num_vshards
              << " vshards over " << options.num_ps << " pods";
  }
  RETURN_IF_ERROR(core->Load(config));
  if (options.auto_rebalance) {
    MasterCore* raw = core.get();
    core->auto_rebalance_ = std::thread([raw] { raw->RunAutoRebalance(); });
  }
  return core;
}

MasterCore::~MasterCore() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (auto_rebalance_.joinable()) auto_rebalance_.join();
}

void MasterCore::RunAutoRebalance() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](MasterCore* c)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return c->rebalance_wanted_ || c->stopping_; },
          this));
      if (stopping_) return;
      rebalance_wanted_ = false;
    }
    RebalanceResponse resp;
    absl::Status s = Rebalance(RebalanceRequest(), &resp);
    if (s.ok()) {
      LOG(INFO) << "auto rebalance: " << resp.moved_vshards() << " vshards moved; epoch "
                << resp.epoch();
    } else {
      LOG(WARNING) << "auto rebalance failed (retried at the next registration): " << s;
    }
  }
}

absl::Status MasterCore::Load(const ClusterConfig& config) {
  absl::MutexLock lock(&mu_);
  config_ = config;
  const absl::Time grace = Now() + options_.lease;
  ASSIGN_OR_RETURN(std::optional<std::string> v, store_->Get(keys::kCounters));
  if (v.has_value()) RETURN_IF_ERROR(ParseRecord(keys::kCounters, *v, &counters_));
  ASSIGN_OR_RETURN(v, store_->Get(keys::kMap));
  if (!v.has_value()) return absl::DataLossError("master store: no shard map record");
  RETURN_IF_ERROR(ParseRecord(keys::kMap, *v, &map_));
  if (map_.owner_size() != static_cast<int>(config_.num_vshards())) {
    return absl::DataLossError(absl::StrCat("master store: shard map has ", map_.owner_size(),
                                            " owners for ", config_.num_vshards(), " vshards"));
  }
  RETURN_IF_ERROR(store_->Scan(keys::kPodPrefix, [&](absl::string_view k, absl::string_view val) {
    Pod pod;
    RETURN_IF_ERROR(ParseRecord(k, val, &pod.record));
    pod.lease_deadline = grace;
    pods_[pod.record.pod_id()] = std::move(pod);
    return absl::OkStatus();
  }));
  RETURN_IF_ERROR(store_->Scan(keys::kTablePrefix, [&](absl::string_view k, absl::string_view val) {
    TableSpec spec;
    RETURN_IF_ERROR(ParseRecord(k, val, &spec));
    tables_[spec.name()] = std::move(spec);
    return absl::OkStatus();
  }));
  RETURN_IF_ERROR(store_->Scan(keys::kDensePrefix, [&](absl::string_view k, absl::string_view val) {
    DenseSpec spec;
    RETURN_IF_ERROR(ParseRecord(k, val, &spec));
    dense_[spec.name()] = std::move(spec);
    return absl::OkStatus();
  }));
  RETURN_IF_ERROR(
      store_->Scan(keys::kWorkerPrefix, [&](absl::string_view k, absl::string_view val) {
        Worker w;
        RETURN_IF_ERROR(ParseRecord(k, val, &w.record));
        w.lease_deadline = grace;
        workers_[w.record.worker_id()] = std::move(w);
        return absl::OkStatus();
      }));
  RETURN_IF_ERROR(store_->Scan(keys::kJobPrefix, [&](absl::string_view k, absl::string_view val) {
    Job job;
    RETURN_IF_ERROR(ParseRecord(k, val, &job.record));
    job.tasks.resize(job.record.num_tasks());
    const std::string name = job.record.spec().name();
    jobs_[name] = std::move(job);
    return absl::OkStatus();
  }));
  RETURN_IF_ERROR(store_->Scan(keys::kTaskPrefix, [&](absl::string_view k, absl::string_view val) {
    Task t;
    RETURN_IF_ERROR(ParseRecord(k, val, &t));
    auto it = jobs_.find(t.job());
    if (it == jobs_.end() || t.task_id() >= it->second.tasks.size()) {
      return absl::DataLossError(
          absl::StrCat("master store: task record '", k, "' belongs to no job it names"));
    }
    it->second.tasks[t.task_id()] = std::move(t);
    return absl::OkStatus();
  }));
  // A move recorded by a master that stopped mid-way is aborted: the source still owns the
  // vshards (the map never named the destination); the epoch moves on so both pods drop
  // the move's state at their next heartbeat (the destination its partial rows).
  {
    StoreBatch batch;
    std::vector<std::string> aborted;
    RETURN_IF_ERROR(store_->Scan(keys::kMovePrefix, [&](absl::string_view k,
                                                        absl::string_view val) {
      MoveRecord move;
      RETURN_IF_ERROR(ParseRecord(k, val, &move));
      batch.Delete(std::string(k));
      aborted.push_back(absl::StrCat("move ", move.move_id(), " (", move.source(), " -> ",
                                     move.destination(), ", ", move.vshards_size(), " vshards)"));
      MoveInfo info;
      info.set_move_id(move.move_id());
      *info.mutable_vshards() = move.vshards();
      info.set_source(move.source());
      info.set_destination(move.destination());
      info.set_state(MoveInfo::ABORTED);
      info.set_error("the master restarted during the move");
      recent_moves_.push_back(std::move(info));
      return absl::OkStatus();
    }));
    if (!batch.empty()) {
      ShardMapRecord map = map_;
      map.set_epoch(map.epoch() + 1);
      batch.Put(std::string(keys::kMap), map);
      RETURN_IF_ERROR(store_->Write(batch));
      map_ = std::move(map);
      LOG(WARNING) << "aborted " << absl::StrJoin(aborted, ", ")
                   << " left by the previous master; epoch " << map_.epoch();
    }
  }
  RETURN_IF_ERROR(
      store_->Scan(keys::kCheckpointPrefix, [&](absl::string_view k, absl::string_view val) {
        return ParseRecord(k, val, &last_checkpoint_);  // key order: the last is the newest
      }));
  // Derived state: queues, phase counts, holders.
  for (auto& [name, job] : jobs_) {
    const uint32_t phases = 2 * job.record.spec().epochs();
    job.unfinished_per_phase.assign(phases, 0);
    for (uint64_t id = 0; id < job.tasks.size(); ++id) {
      const Task& t = job.tasks[id];
      if (t.job() != name || t.task_id() != id) {
        return absl::DataLossError(
            absl::StrCat("master store: job ", name, " is missing task ", id));
      }
      if (Finished(t)) continue;
      ++job.unfinished;
      ++job.unfinished_per_phase[PhaseOf(job, t)];
      if (t.state() == Task::TODO) job.todo.insert(id);
      if (t.state() == Task::DOING) {
        auto w = workers_.find(t.worker_id());
        if (w == workers_.end()) {
          return absl::DataLossError(absl::StrCat("master store: task ", id, " of job ", name,
                                                  " is held by unknown worker ", t.worker_id()));
        }
        w->second.doing.insert({name, id});
      }
    }
  }
  LOG(INFO) << "master state loaded: epoch " << map_.epoch() << ", " << pods_.size() << " pods, "
            << tables_.size() + dense_.size() << " tables, " << workers_.size() << " workers, "
            << jobs_.size() << " jobs";
  return absl::OkStatus();
}

// ---- PS pods and the shard map ----

void MasterCore::FillAssignment(const std::string& pod_id, PodAssignment* out) const {
  out->set_epoch(map_.epoch());
  out->set_num_vshards(config_.num_vshards());
  for (int v = 0; v < map_.owner_size(); ++v) {
    if (map_.owner(v) == pod_id) out->add_owned_vshards(v);
  }
  out->set_lease_ms(absl::ToInt64Milliseconds(options_.lease));
  out->set_catalog_version(counters_.catalog_version());
  for (const auto& [id, move] : moves_) {
    if (move.destination() == pod_id) *out->mutable_moving_in() = move.vshards();
    if (move.source() == pod_id) *out->mutable_moving_out() = move.vshards();
  }
}

absl::Status MasterCore::RegisterPod(const RegisterPodRequest& req, RegisterPodResponse* resp) {
  if (req.pod_id().empty() || req.pod_id().size() > 128 || req.address().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("RegisterPod needs a pod_id (1..128 characters) and an address; got pod_id '",
                     req.pod_id(), "', address '", req.address(), "'"));
  }
  absl::MutexLock lock(&mu_);
  if (req.num_vshards() != 0 && req.num_vshards() != config_.num_vshards()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pod ", req.pod_id(), " runs with num_vshards = ", req.num_vshards(),
                     " but the cluster has ", config_.num_vshards(),
                     "; restart it with --num_vshards=", config_.num_vshards()));
  }
  const absl::Time now = Now();
  auto it = pods_.find(req.pod_id());
  const bool known = it != pods_.end();
  if (known && it->second.record.address() != req.address() && it->second.lease_deadline > now) {
    return absl::AlreadyExistsError(
        absl::StrCat("pod ", req.pod_id(), " is registered at ", it->second.record.address(),
                     " with a live lease (", RemainingMs(it->second.lease_deadline, now),
                     " ms left); refusing the same identity from ", req.address(),
                     ". If the old pod is gone, retry after its lease expires."));
  }
  const bool address_changed = !known || it->second.record.address() != req.address();
  if (address_changed) {
    PodRecord record;  // a new process: not drained (any more)
    record.set_pod_id(req.pod_id());
    record.set_address(req.address());
    ShardMapRecord map = map_;
    map.set_epoch(map.epoch() + 1);
    StoreBatch batch;
    batch.Put(keys::Pod(req.pod_id()), record);
    batch.Put(std::string(keys::kMap), map);
    RETURN_IF_ERROR(store_->Write(batch));
    map_ = std::move(map);
    pods_[req.pod_id()].record = std::move(record);
    LOG(INFO) << "pod " << req.pod_id() << " registered at " << req.address() << "; epoch "
              << map_.epoch();
    // A pod that owns nothing joined (new, or undrained): spread the vshards onto it.
    if (options_.auto_rebalance && OwnedBy(req.pod_id()) == 0) rebalance_wanted_ = true;
  }
  Pod& pod = pods_[req.pod_id()];
  pod.lease_deadline = now + options_.lease;
  pod.lost_logged = false;
  FillAssignment(req.pod_id(), resp->mutable_assignment());
  return absl::OkStatus();
}

absl::Status MasterCore::PodHeartbeat(const PodHeartbeatRequest& req, PodHeartbeatResponse* resp) {
  absl::MutexLock lock(&mu_);
  auto it = pods_.find(req.pod_id());
  if (it == pods_.end()) {
    return absl::NotFoundError(
        absl::StrCat("pod ", req.pod_id(), " is not registered; call RegisterPod first"));
  }
  if (it->second.record.address() != req.address()) {
    return absl::FailedPreconditionError(absl::StrCat("pod ", req.pod_id(), " is registered at ",
                                                      it->second.record.address(), ", not ",
                                                      req.address(), "; register again"));
  }
  if (it->second.lost_logged) LOG(INFO) << "pod " << req.pod_id() << " is back";
  it->second.lease_deadline = Now() + options_.lease;
  it->second.lost_logged = false;
  FillAssignment(req.pod_id(), resp->mutable_assignment());
  return absl::OkStatus();
}

absl::Status MasterCore::LeavePod(const LeavePodRequest& req, LeavePodResponse*) {
  absl::MutexLock lock(&mu_);
  auto it = pods_.find(req.pod_id());
  if (it == pods_.end()) {
    return absl::NotFoundError(absl::StrCat("pod ", req.pod_id(), " is not registered"));
  }
  if (it->second.record.address() != req.address()) {
    return absl::FailedPreconditionError(absl::StrCat("pod ", req.pod_id(), " is registered at ",
                                                      it->second.record.address(), ", not ",
                                                      req.address()));
  }
  it->second.lease_deadline = Now();
  it->second.lost_logged = true;
  LOG(INFO) << "pod " << req.pod_id() << " at " << req.address()
            << " left (shutting down); its vshards stay assigned to it, epoch " << map_.epoch();
  return absl::OkStatus();
}

std::vector<std::string> MasterCore::KnownPodIds() const {
  std::set<std::string> ids(map_.owner().begin(), map_.owner().end());
  for (const auto& [id, pod] : pods_) ids.insert(id);
  std::vector<std::string> out(ids.begin(), ids.end());
  std::sort(out.begin(), out.end(), PodIdLess);
  return out;
}

PodInfo MasterCore::DescribePod(const std::string& pod_id, absl::Time now) const {
  PodInfo info;
  info.set_pod_id(pod_id);
  uint32_t owned = 0;
  for (const std::string& o : map_.owner()) owned += o == pod_id;
  info.set_vshards(owned);
  auto it = pods_.find(pod_id);
  if (it == pods_.end()) {
    info.set_state(PodInfo::NEVER_REGISTERED);
    return info;
  }
  info.set_address(it->second.record.address());
  info.set_lease_remaining_ms(RemainingMs(it->second.lease_deadline, now));
  info.set_state(it->second.lease_deadline > now ? PodInfo::LIVE : PodInfo::LOST);
  if (info.state() == PodInfo::LIVE && it->second.record.drained() && owned == 0) {
    info.set_state(PodInfo::DRAINED);
  }
  return info;
}

absl::Status MasterCore::GetShardMap(const GetShardMapRequest&, ShardMapResponse* resp) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = Now();
  resp->set_epoch(map_.epoch());
  resp->set_num_vshards(config_.num_vshards());
  std::map<std::string, uint32_t> index;
  for (const std::string& id : KnownPodIds()) {
    index[id] = resp->pods_size();
    *resp->add_pods() = DescribePod(id, now);
  }
  for (const std::string& o : map_.owner()) resp->add_owner(index[o]);
  for (const auto& [id, move] : moves_) {
    MoveInfo* info = resp->add_moves();
    info->set_move_id(id);
    *info->mutable_vshards() = move.vshards();
    info->set_source(move.source());
    info->set_destination(move.destination());
    info->set_state(MoveInfo::COPYING);
  }
  return absl::OkStatus();
}

// ---- Catalog ----

absl::Status MasterCore::CreateTable(const CreateTableRequest& req, CreateTableResponse* resp) {
  ASSIGN_OR_RETURN(TableSpec spec, NormalizeTableSpec(req.spec()));
  absl::MutexLock lock(&mu_);
  auto it = tables_.find(spec.name());
  if (it != tables_.end()) {
    if (!SpecsEqual(it->second, spec)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "table ", spec.name(), " exists with another spec: ", it->second.ShortDebugString()));
    }
    resp->set_created(false);
    return absl::OkStatus();
  }
  Counters counters = counters_;
  counters.set_catalog_version(counters.catalog_version() + 1);
  StoreBatch batch;
  batch.Put(keys::Table(spec.name()), spec);
  batch.Put(std::string(keys::kCounters), counters);
  RETURN_IF_ERROR(store_->Write(batch));
  counters_ = std::move(counters);
  tables_[spec.name()] = std::move(spec);
  resp->set_created(true);
  return absl::OkStatus();
}

absl::Status MasterCore::CreateDense(const CreateDenseRequest& req, CreateDenseResponse* resp) {
  ASSIGN_OR_RETURN(DenseSpec spec, NormalizeDenseSpec(req.spec()));
  absl::MutexLock lock(&mu_);
  auto it = dense_.find(spec.name());
  if (it != dense_.end()) {
    if (!SpecsEqual(it->second, spec)) {
      return absl::AlreadyExistsError(
          absl::StrCat("dense tensor ", spec.name(),
                       " exists with another spec: ", it->second.ShortDebugString()));
    }
    resp->set_created(false);
    return absl::OkStatus();
  }
  Counters counters = counters_;
  counters.set_catalog_version(counters.catalog_version() + 1);
  StoreBatch batch;
  batch.Put(keys::Dense(spec.name()), spec);
  batch.Put(std::string(keys::kCounters), counters);
  RETURN_IF_ERROR(store_->Write(batch));
  counters_ = std::move(counters);
  dense_[spec.name()] = std::move(spec);
  resp->set_created(true);
  return absl::OkStatus();
}

absl::Status MasterCore::ListTables(const ListTablesRequest&, ListTablesResponse* resp) {
  absl::MutexLock lock(&mu_);
  for (const auto& [name, spec] : tables_) *resp->add_tables() = spec;
  for (const auto& [name, spec] : dense_) *resp->add_dense() = spec;
  resp->set_catalog_version(counters_.catalog_version());
  return absl::OkStatus();
}

// ---- Workers ----

absl::StatusOr<MasterCore::Worker*> MasterCore::LiveWorker(uint64_t worker_id,
                                                           uint64_t incarnation) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("worker ", worker_id, " is not registered; call RegisterWorker first"));
  }
  Worker& w = it->second;
  if (w.record.incarnation() != incarnation) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", worker_id, " incarnation ",
                                                      incarnation, " is superseded by incarnation ",
                                                      w.record.incarnation()));
  }
  if (w.record.state() != WorkerInfo::LIVE) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker_id, " incarnation ", incarnation, " is ",
                     WorkerInfo::State_Name(w.record.state()),
                     " (its tasks went back to the queue); register again"));
  }
  return &w;
}

absl::Status MasterCore::RegisterWorker(const RegisterWorkerRequest& req,
                                        RegisterWorkerResponse* resp) {
  absl::MutexLock lock(&mu_);
  Counters counters = counters_;
  WorkerRecord record;
  std::vector<Task> requeued;
  StoreBatch batch;
  uint64_t id = req.worker_id();
  if (id == 0) id = counters.next_worker_id();
  auto it = workers_.find(id);
  if (it != workers_.end()) {
    record = it->second.record;
    record.set_incarnation(record.incarnation() + 1);
    requeued = RequeueHeld(it->second, /*count_failure=*/true,
                           absl::StrCat("worker ", id, " re-registered as incarnation ",
                                        record.incarnation(), " while holding it"),
                           &batch);
  } else {
    record.set_worker_id(id);
    record.set_incarnation(1);
  }
  record.set_state(WorkerInfo::LIVE);
  counters.set_next_worker_id(std::max(counters.next_worker_id(), id + 1));
  batch.Put(keys::Worker(id), record);
  batch.Put(std::string(keys::kCounters), counters);
  RETURN_IF_ERROR(store_->Write(batch));
  counters_ = std::move(counters);
  for (const Task& t : requeued) ApplyTask(t);
  Worker& w = workers_[id];
  w.record = record;
  w.lease_deadline = Now() + options_.lease;
  resp->set_worker_id(id);
  resp->set_incarnation(record.incarnation());
  resp->set_lease_ms(absl::ToInt64Milliseconds(options_.lease));
  LOG(INFO) << "worker " << id << " registered, incarnation " << record.incarnation()
            << (requeued.empty() ? std::string()
                                 : absl::StrCat("; ", requeued.size(), " tasks re-queued"));
  return absl::OkStatus();
}

absl::Status MasterCore::WorkerHeartbeat(const WorkerHeartbeatRequest& req,
                                         WorkerHeartbeatResponse* resp) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Worker * w, LiveWorker(req.worker_id(), req.incarnation()));
  w->lease_deadline = Now() + options_.lease;
  resp->set_lease_ms(absl::ToInt64Milliseconds(options_.lease));
  return absl::OkStatus();
}

absl::Status MasterCore::LeaveWorker(const LeaveWorkerRequest& req, LeaveWorkerResponse* resp) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Worker * w, LiveWorker(req.worker_id(), req.incarnation()));
  StoreBatch batch;
  std::vector<Task> requeued = RequeueHeld(*w, /*count_failure=*/false, "", &batch);
  WorkerRecord record = w->record;
  record.set_state(WorkerInfo::LEFT);
  batch.Put(keys::Worker(record.worker_id()), record);
  RETURN_IF_ERROR(store_->Write(batch));
  w->record = std::move(record);
  for (const Task& t : requeued) ApplyTask(t);
  resp->set_requeued_tasks(static_cast<uint32_t>(requeued.size()));
  LOG(INFO) << "worker " << req.worker_id() << " incarnation " << req.incarnation() << " left; "
            << requeued.size() << " tasks re-queued";
  return absl::OkStatus();
}

absl::Status MasterCore::ExpireLeases() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = Now();
  for (auto& [id, pod] : pods_) {
    if (pod.lease_deadline <= now && !pod.lost_logged) {
      pod.lost_logged = true;
      pod_lease_losses_.fetch_add(1);
      LOG(WARNING) << "pod " << id << " at " << pod.record.address() << " LOST: no heartbeat for "
                   << absl::FormatDuration(options_.lease + (now - pod.lease_deadline));
    }
  }
  for (auto& [id, w] : workers_) {
    if (w.record.state() != WorkerInfo::LIVE || w.lease_deadline > now) continue;
    StoreBatch batch;
    std::vector<Task> requeued =
        RequeueHeld(w, /*count_failure=*/true,
                    absl::StrCat("worker ", id, " incarnation ", w.record.incarnation(),
                                 " lost its lease while holding it"),
                    &batch);
    WorkerRecord record = w.record;
    record.set_state(WorkerInfo::LOST);
    batch.Put(keys::Worker(id), record);
    RETURN_IF_ERROR(store_->Write(batch));
    w.record = std::move(record);
    for (const Task& t : requeued) ApplyTask(t);
    worker_lease_losses_.fetch_add(1);
    LOG(WARNING) << "worker " << id << " LOST; " << requeued.size() << " tasks re-queued";
  }
  return absl::OkStatus();
}

// ---- Admin ----

absl::Status MasterCore::Status(const StatusRequest&, StatusResponse* resp) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = Now();
  resp->set_epoch(map_.epoch());
  resp->set_num_vshards(config_.num_vshards());
  resp->set_lease_ms(absl::ToInt64Milliseconds(options_.lease));
  resp->set_uptime_seconds(absl::ToDoubleSeconds(now - started_));
  for (const std::string& id : KnownPodIds()) *resp->add_pods() = DescribePod(id, now);
  for (const auto& [id, w] : workers_) {
    WorkerInfo* info = resp->add_workers();
    info->set_worker_id(id);
    info->set_incarnation(w.record.incarnation());
    info->set_state(w.record.state());
    if (w.record.state() == WorkerInfo::LIVE) {
      info->set_lease_remaining_ms(RemainingMs(w.lease_deadline, now));
    }
    info->set_tasks_doing(static_cast<uint32_t>(w.doing.size()));
  }
  uint64_t tasks_done = 0, records = 0;
  for (const auto& [name, job] : jobs_) {
    JobInfo info = DescribeJob(job);
    tasks_done += info.tasks_done();
    records += info.train_records_done();
    *resp->add_jobs() = std::move(info);
    for (const Task& t : job.tasks) {
      if (t.state() == Task::FAILED) *resp->add_failed_tasks() = t;
      if (t.state() == Task::DOING) *resp->add_doing_tasks() = t;
    }
  }
  resp->set_tasks_done(tasks_done);
  resp->set_records_trained(records);
  std::set<std::string> tables;
  for (const auto& [name, spec] : tables_) tables.insert(name);
  for (const auto& [name, spec] : dense_) tables.insert(name);
  for (const auto& [name, version] : counters_.table_versions()) tables.insert(name);
  for (const auto& [id, move] : moves_) {
    MoveInfo* info = resp->add_moves();
    info->set_move_id(id);
    *info->mutable_vshards() = move.vshards();
    info->set_source(move.source());
    info->set_destination(move.destination());
    info->set_state(MoveInfo::COPYING);
  }
  for (auto it = recent_moves_.rbegin(); it != recent_moves_.rend(); ++it) *resp->add_moves() = *it;
  if (operation_.operation_id() != 0) *resp->mutable_operation() = operation_;
  if (last_checkpoint_.checkpoint_id() != 0) *resp->mutable_last_checkpoint() = last_checkpoint_;
  for (const std::string& name : tables) {
    TableProgress* p = resp->add_tables();
    p->set_name(name);
    auto v = counters_.table_versions().find(name);
    p->set_version(v == counters_.table_versions().end() ? 0 : v->second);
  }
  return absl::OkStatus();
}

}  // namespace ps
