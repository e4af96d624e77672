#include "master/checkpoints.h"

#include <glog/logging.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "master/keys.h"
#include "master/operation_lock.h"

namespace ps {

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
  RETURN_IF_ERROR(store_->Checkpoint(absl::StrCat(info.dir(), "/master")));
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
