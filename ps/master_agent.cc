#include "ps/master_agent.h"

#include <glog/logging.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/rpc/grpc_status.h"
#include "proto/master.grpc.pb.h"
#include "ps/storage/pod_storage.h"
#include "ps/storage/storage_db.h"

namespace ps {
namespace {

// A restarted master counts each pod's lease from its own start, so the pods must find it
// well within a lease: gRPC's default reconnect backoff (1 s, growing to minutes) lost a
// live pod's lease to a master restart at a 1.5 s lease, and failed its vshards over
// (migration_test MasterKilledMidRebalance/R2).
grpc::ChannelArguments ReconnectQuickly() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 250);
  return args;
}

class MasterAgentImpl final : public MasterAgent {
 public:
  MasterAgentImpl(const MasterAgentOptions& options, PsCore* core, const ChannelMaker& channels)
      : options_(options),
        core_(core),
        stub_(Master::NewStub(channels.Make(options.master, ReconnectQuickly()))),
        storage_id_(core->storage() != nullptr ? core->storage()->storage_id() : NewStorageId()),
        fresh_storage_(core->storage() == nullptr || core->storage()->storage_created()),
        tail_lost_(core->storage() != nullptr && core->storage()->acknowledged_tail_lost()),
        thread_([this] { Run(); }) {}

  ~MasterAgentImpl() override { Stop(); }

  bool registered() const override { return registered_.load(); }

  absl::Status Leave() override {
    Stop();
    if (!registered_) return absl::OkStatus();
    LeavePodRequest req;
    req.set_pod_id(options_.pod_id);
    req.set_address(options_.address);
    LeavePodResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    absl::Status s = FromGrpcStatus(stub_->LeavePod(&ctx, req, &resp));
    registered_ = false;
    if (s.ok()) {
      LOG(INFO) << "pod " << options_.pod_id << " deregistered from master " << options_.master;
    } else {
      LOG(WARNING) << "pod " << options_.pod_id << " could not deregister from master "
                   << options_.master << " (its lease will expire instead): " << s;
    }
    return s;
  }

 private:
  // A replicated primary with a follower at least its role's max lag behind: the master
  // should hear of it now, not at the next regular heartbeat (pushes wait for it).
  bool FollowerLagging() const {
    const PsCore::ReplicationStats r = core_->replication_stats();
    if (r.max_lag <= absl::ZeroDuration()) return false;
    for (const Replicator::FollowerStats& f : r.followers) {
      if (f.lag >= r.max_lag) return true;
    }
    return false;
  }

  void Run() {
    absl::Duration wait = absl::ZeroDuration();
    int failures = 0;
    for (;;) {
      // Sleep until the next heartbeat is due, looking at the followers' lag meanwhile
      // (every quarter of the bound; a local read) when this pod is a replicated primary.
      const absl::Time due = absl::Now() + wait;
      bool stopped = false, early = false;
      for (;;) {
        const absl::Duration max_lag =
            registered_ ? core_->replication_stats().max_lag : absl::ZeroDuration();
        absl::Duration step = due - absl::Now();
        if (max_lag > absl::ZeroDuration()) {
          step = std::min(step, std::max(absl::Milliseconds(5), max_lag / 4));
        }
        if (stop_.WaitForNotificationWithTimeout(std::max(absl::ZeroDuration(), step))) {
          stopped = true;
          break;
        }
        if (absl::Now() >= due) break;
        if (max_lag > absl::ZeroDuration() && FollowerLagging()) {
          early = true;
          break;
        }
      }
      if (stopped) break;
      if (early && !reported_early_) {
        LOG(WARNING) << "a follower is behind the replication bound: reporting it to the master "
                        "now (pushes wait for it until the master takes it out of the ack set)";
      }
      reported_early_ = early;
      absl::Status s = registered_ ? Heartbeat() : Register();
      if (s.ok()) {
        if (failures > 0) LOG(INFO) << "master " << options_.master << " reachable again";
        failures = 0;
        wait = heartbeat_interval_;
        continue;
      }
      // Log the first failure and then one in 50, not one per retry.
      if (failures++ % 50 == 0) {
        LOG(WARNING) << (registered_ ? "heartbeat" : "registration") << " of pod "
                     << options_.pod_id << " with master " << options_.master << " failed: " << s;
      }
      if (registered_ && (s.code() == absl::StatusCode::kNotFound ||
                          s.code() == absl::StatusCode::kFailedPrecondition)) {
        LOG(WARNING) << "pod " << options_.pod_id << " lost its registration with master "
                     << options_.master << " (" << s << "); registering again";
        registered_ = false;  // the master forgot or re-assigned us: register again at once
        wait = absl::ZeroDuration();
        continue;
      }
      wait = registered_ ? heartbeat_interval_ : options_.retry_interval;
    }
  }

  void Stop() {
    if (!stop_.HasBeenNotified()) stop_.Notify();
    if (thread_.joinable()) thread_.join();
  }

  void SetDeadline(grpc::ClientContext* ctx) const {
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  }

  // The write lease of a replicated primary runs from the heartbeat's send time: the
  // master's lease runs from its receipt, so this pod's ends first.
  void RenewLease(absl::Time sent, const PodAssignment& a) {
    core_->RenewWriteLease(sent + absl::Milliseconds(a.lease_ms()));
  }

  absl::Status Register() {
    const absl::Time sent = absl::Now();
    RegisterPodRequest req;
    req.set_pod_id(options_.pod_id);
    req.set_address(options_.address);
    req.set_num_vshards(options_.num_vshards);
    req.set_storage_id(storage_id_);
    req.set_fresh_storage(fresh_storage_);
    // Until the master has taken it: a registration answered with an error may not have.
    req.set_log_tail_lost(tail_lost_ && !tail_reported_);
    RegisterPodResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    absl::Status s = FromGrpcStatus(stub_->RegisterPod(&ctx, req, &resp));
    if (!s.ok()) return s;
    registered_ = true;
    LOG(INFO) << "pod " << options_.pod_id << " registered with master " << options_.master
              << " at " << options_.address << " (storage id " << storage_id_
              << (fresh_storage_ ? ", created by this start)" : ")");
    if (req.log_tail_lost()) {
      tail_reported_ = true;
      LOG(WARNING) << "pod " << options_.pod_id
                   << " told the master that its log may lack records it acknowledged before "
                      "a crash (periodic durability): at R >= 2 it gives up its copies, which "
                      "the master fails over and refills from their other replicas";
    }
    return Apply(sent, resp.assignment());
  }

  absl::Status Heartbeat() {
    const absl::Time sent = absl::Now();
    PodHeartbeatRequest req;
    req.set_pod_id(options_.pod_id);
    req.set_address(options_.address);
    for (const Replicator::FollowerStats& f : core_->replication_stats().followers) {
      FollowerLag* lag = req.add_followers();
      lag->set_follower(f.pod_id);
      lag->set_records(f.queued_records);
      lag->set_bytes(f.queued_bytes);
      lag->set_lag_ms(absl::ToInt64Milliseconds(f.lag));
      lag->set_failed_calls(f.failed_calls);
      lag->set_held_records(f.held_records);
    }
    PodHeartbeatResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    absl::Status s = FromGrpcStatus(stub_->PodHeartbeat(&ctx, req, &resp));
    if (!s.ok()) return s;
    return Apply(sent, resp.assignment());
  }

  // Syncs the catalog, installs the assignment if it differs from the core's ownership,
  // then renews the write lease. The catalog comes first so a pod never serves vshards
  // without the tables of the map it serves (a pod back on an empty disk answered NOT_FOUND,
  // which is final for clients, between the two); the assignment is installed even if the
  // catalog failed (a deposed primary must learn it), but then no lease is renewed, so a
  // primary takes no writes until its tables exist. The lease comes last: a deposed primary
  // back from a pause must never hold a fresh lease with the vshards it no longer leads.
  absl::Status Apply(absl::Time sent, const PodAssignment& a) {
    heartbeat_interval_ = std::max(absl::Milliseconds(10), absl::Milliseconds(a.lease_ms()) / 3);
    Assignment assignment;
    assignment.set_epoch(a.epoch());
    assignment.set_num_vshards(a.num_vshards());
    *assignment.mutable_owned() = a.owned_vshards();
    *assignment.mutable_moving_in() = a.moving_in();
    *assignment.mutable_moving_out() = a.moving_out();
    if (a.has_replication()) *assignment.mutable_replication() = a.replication();
    const absl::Status catalog = a.catalog_version() != catalog_version_
                                     ? SyncCatalog(a.catalog_version())
                                     : absl::OkStatus();
    ApplyAssignmentResponse applied;
    // Ignored when older than what the master already sent the pod directly.
    if (absl::Status s = core_->ApplyAssignment(assignment, &applied); !s.ok()) return s;
    if (!catalog.ok()) return catalog;
    RenewLease(sent, a);
    return absl::OkStatus();
  }

  // Creates every table and dense tensor of the master's catalog here (idempotent).
  absl::Status SyncCatalog(uint64_t version) {
    ListTablesResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    absl::Status s = FromGrpcStatus(stub_->ListTables(&ctx, ListTablesRequest(), &resp));
    if (!s.ok()) return s;
    for (const TableSpec& spec : resp.tables()) {
      CreateTableRequest req;
      *req.mutable_spec() = spec;
      CreateTableResponse ignored;
      if (absl::Status c = core_->CreateTable(req, &ignored); !c.ok()) {
        LOG(ERROR) << "pod " << options_.pod_id << " cannot create catalog table " << spec.name()
                   << ": " << c;
      }
    }
    for (const DenseSpec& spec : resp.dense()) {
      CreateDenseRequest req;
      *req.mutable_spec() = spec;
      CreateDenseResponse ignored;
      if (absl::Status c = core_->CreateDense(req, &ignored); !c.ok()) {
        LOG(ERROR) << "pod " << options_.pod_id << " cannot create catalog dense tensor "
                   << spec.name() << ": " << c;
      }
    }
    catalog_version_ = std::max(version, resp.catalog_version());
    return absl::OkStatus();
  }

  const MasterAgentOptions options_;
  PsCore* const core_;
  std::unique_ptr<Master::Stub> stub_;
  // The data identity reported at registration: the database's storage id, or for a pod
  // in memory one drawn for this process (its data does not outlive it).
  const std::string storage_id_;
  const bool fresh_storage_;
  // The data's log may lack records it acknowledged (PodStorage::acknowledged_tail_lost):
  // reported at registration until the master has accepted one.
  const bool tail_lost_;
  absl::Notification stop_;
  std::atomic<bool> registered_{false};
  // Used by the agent thread only.
  absl::Duration heartbeat_interval_ = absl::Seconds(1);
  uint64_t catalog_version_ = 0;
  bool reported_early_ = false;  // the last heartbeat was sent early for a lagging follower
  bool tail_reported_ = false;   // a registration carrying log_tail_lost succeeded
  std::thread thread_;           // last: starts after everything above is constructed
};

}  // namespace

absl::StatusOr<std::unique_ptr<MasterAgent>> MasterAgent::Start(const MasterAgentOptions& options,
                                                                PsCore* core) {
  if (options.master.empty() || options.pod_id.empty() || options.address.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the master agent needs a master address, a pod id and the pod's address; got master '",
        options.master, "', pod id '", options.pod_id, "', address '", options.address, "'"));
  }
  absl::StatusOr<ChannelMaker> channels = ChannelMaker::Create(options.security);
  if (!channels.ok()) return channels.status();
  return std::unique_ptr<MasterAgent>(std::make_unique<MasterAgentImpl>(options, core, *channels));
}

std::string DefaultAdvertiseAddress(const std::string& host, int port) {
  std::string h = host;
  if (h.empty() || h == "0.0.0.0" || h == "::" || h == "[::]") {
    char name[256] = {0};
    h = gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0' ? name : "localhost";
  }
  return absl::StrCat(h, ":", port);
}

}  // namespace ps
