#include "master/checkpoints.h"

#include <glog/logging.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "master/keys.h"
#include "master/operation_lock.h"
#include "proto/master_state.pb.h"

namespace ps {
namespace {

// Makes the master's copy in `dir` (just written) name one authoritative copy per vshard:
// its primary's. The pods cut their databases one after another while pushes flow, so a
// follower's copy of a vshard is cut at another moment than its primary's; restored as
// they are, the replicas would differ (and replay skips records a row already holds, so
// nothing would reconcile them). The copy's map keeps every primary and empties every ack
// set (epoch + 1): at restore each pod drops the rows of vshards it no longer follows at
// its first assignment, and re-replication (master/rereplicator.h) fills the followers
// from the primaries, so every copy is the primary's checkpointed state. `owner` is the
// map the pods were asked by; a copy whose primaries differ (a failover during the
// checkpoint) is refused with ABORTED. Returns how many follower entries were removed.
absl::StatusOr<size_t> KeepPrimariesOnly(const std::string& dir,
                                         const std::vector<std::string>& owner) {
  ASSIGN_OR_RETURN(std::unique_ptr<MasterStore> copy, MasterStore::Open(dir));
  ASSIGN_OR_RETURN(std::optional<ShardMapRecord> map, GetRecord<ShardMapRecord>(*copy, keys::kMap));
  if (!map.has_value()) return absl::DataLossError(absl::StrCat(dir, ": no shard map record"));
  if (!std::equal(map->owner().begin(), map->owner().end(), owner.begin(), owner.end())) {
    return absl::AbortedError(
        "a vshard's primary changed while the pods copied their state (a failover); take the "
        "checkpoint again");
  }
  size_t removed = 0;
  for (ReplicaSet& set : *map->mutable_followers()) {
    removed += set.pods_size();
    set.clear_pods();
  }
  if (removed == 0) return removed;
  map->set_epoch(map->epoch() + 1);
  StoreBatch batch;
  batch.Put(std::string(keys::kMap), *map);
  RETURN_IF_ERROR(copy->Write(batch));
  return removed;
}

}  // namespace

absl::Status Checkpoints::Load() {
  CheckpointInfo last;
  RETURN_IF_ERROR(ScanRecords<CheckpointInfo>(*store_, keys::kCheckpointPrefix,
                                              [&](absl::string_view, CheckpointInfo info) {
                                                last = std::move(info);  // key order: newest last
                                                return absl::OkStatus();
                                              }));
  absl::MutexLock lock(&mu_);
  last_ = std::move(last);
  return absl::OkStatus();
}

absl::Status Checkpoints::Checkpoint(const CheckpointRequest&, CheckpointResponse* resp) {
  if (options_.checkpoint_dir.empty()) {
    return absl::FailedPreconditionError(
        "this master has no --checkpoint_dir: start it with one to take cluster checkpoints");
  }
  // No move may change the map while the pods copy their state.
  OperationLock op(operation_mu_);
  if (!op.held()) {
    return absl::AbortedError("a drain or rebalance is running; checkpoint after it");
  }
  const absl::Time start = absl::Now();
  CheckpointInfo info;
  // next_checkpoint_id is ours (see counters_record.h), and the operation lock serializes
  // checkpoints: read now, written before anything else.
  info.set_checkpoint_id(counters_->Get().next_checkpoint_id() + 1);
  RETURN_IF_ERROR(counters_->Write(
      StoreBatch(), [&](Counters* c) { c->set_next_checkpoint_id(info.checkpoint_id()); }));
  info.set_dir(absl::StrCat(options_.checkpoint_dir, "/ckpt-", info.checkpoint_id()));
  const ClusterView view = membership_->View();
  info.set_epoch(view.epoch);
  std::vector<std::pair<std::string, std::string>> pods;  // (id, address)
  for (const std::string& id : view.known) {
    if (view.OwnedBy(id) == 0) continue;
    if (!view.Live(id)) {
      return absl::UnavailableError(absl::StrCat(
          "pod ", id, " owns vshards but is not live: its state cannot be checkpointed now"));
    }
    pods.emplace_back(id, view.registered.at(id).address);
  }
  for (const auto& [id, address] : pods) {
    PodCheckpointRequest req;
    req.set_dir(absl::StrCat(info.dir(), "/", id));
    PodCheckpointResponse pod_resp;
    if (absl::Status s = options_.pod_control->Checkpoint(address, req, &pod_resp); !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("checkpoint ", info.checkpoint_id(), ": pod ", id,
                                       " could not write ", req.dir(), ": ", s.message()));
    }
    info.add_pods(id);
  }
  info.set_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  info.set_unix_seconds(absl::ToUnixSeconds(absl::Now()));
  // Recorded first, so the master's own copy lists the checkpoint it belongs to.
  StoreBatch batch;
  batch.Put(keys::Checkpoint(info.checkpoint_id()), info);
  RETURN_IF_ERROR(store_->Write(batch));
  std::error_code ec;
  std::filesystem::create_directories(info.dir(), ec);  // pods on other hosts made theirs
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot create ", info.dir(), ": ", ec.message()));
  }
  const std::string master_dir = absl::StrCat(info.dir(), "/master");
  RETURN_IF_ERROR(store_->Checkpoint(master_dir));
  if (view.replication > 1) {
    absl::StatusOr<size_t> removed = KeepPrimariesOnly(master_dir, view.owner);
    if (!removed.ok()) {
      StoreBatch undo;  // the copy is unusable: the checkpoint was not taken
      undo.Delete(keys::Checkpoint(info.checkpoint_id()));
      if (absl::Status s = store_->Write(undo); !s.ok()) {
        LOG(ERROR) << "checkpoint " << info.checkpoint_id()
                   << " failed and its record stays: " << s;
      }
      return absl::Status(removed.status().code(),
                          absl::StrCat("checkpoint ", info.checkpoint_id(), ": ", master_dir, ": ",
                                       removed.status().message()));
    }
    LOG(INFO) << "checkpoint " << info.checkpoint_id() << ": the restored map keeps the primaries' "
              << "copies only (" << *removed << " follower entries removed, epoch + 1); "
              << "re-replication refills the followers after a restore";
  }
  {
    absl::MutexLock lock(&mu_);
    last_ = info;
  }
  LOG(INFO) << "checkpoint " << info.checkpoint_id() << " in " << info.dir() << " at epoch "
            << info.epoch() << ": " << info.pods_size() << " pods, " << info.seconds() << " s";
  *resp->mutable_checkpoint() = info;
  return absl::OkStatus();
}

void Checkpoints::Describe(StatusResponse* resp) const {
  absl::MutexLock lock(&mu_);
  if (last_.checkpoint_id() != 0) *resp->mutable_last_checkpoint() = last_;
}

}  // namespace ps
