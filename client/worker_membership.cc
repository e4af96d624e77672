#include "client/worker_membership.h"

#include <glog/logging.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "proto/master.pb.h"
#include "proto/status_detail.h"

namespace ps::internal {

Refusal ClassifyRefusal(const absl::Status& s, bool job_call) {
  if (s.code() == absl::StatusCode::kNotFound && !job_call) return Refusal::kLost;
  if (s.code() != absl::StatusCode::kFailedPrecondition) return Refusal::kNone;
  // The master (master/job_dispatcher_workers.cc, LiveWorker) refuses a stale incarnation
  // and a worker that is LOST or LEFT with the same code and tells them apart by its
  // WorkerRefused detail (proto/master.proto). Without one (a master older than the
  // detail) the worker registers again, as it always did.
  const auto refused = DetailOf<WorkerRefused>(s);
  return refused.has_value() && refused->reason() == WorkerRefused::SUPERSEDED
             ? Refusal::kSuperseded
             : Refusal::kLost;
}

absl::StatusOr<std::unique_ptr<WorkerMembership>> WorkerMembership::Start(
    const WorkerOptions& options, Master::Stub* master, const RetryPolicy* policy) {
  std::unique_ptr<WorkerMembership> m(new WorkerMembership(options, master, policy));
  absl::Status registered;
  {
    absl::MutexLock lock(&m->reregister_mu_);
    registered = m->Register(options.worker_id);
  }
  if (!registered.ok()) {
    absl::MutexLock lock(&m->mu_);
    m->left_ = true;  // never registered: nothing to leave
    return registered;
  }
  if (options.heartbeat) {
    WorkerMembership* raw = m.get();
    m->heartbeat_ = std::thread([raw] { raw->HeartbeatLoop(); });
  }
  return m;
}

WorkerMembership::~WorkerMembership() {
  Leave().IgnoreError();  // logged there
}

WorkerMembership::Identity WorkerMembership::identity() const {
  absl::MutexLock lock(&mu_);
  return identity_;
}

int64_t WorkerMembership::lease_ms() const {
  absl::MutexLock lock(&mu_);
  return lease_ms_;
}

uint64_t WorkerMembership::reregistrations() const {
  absl::MutexLock lock(&mu_);
  return reregistrations_;
}

bool WorkerMembership::superseded() const {
  absl::MutexLock lock(&mu_);
  return superseded_;
}

bool WorkerMembership::left() const {
  absl::MutexLock lock(&mu_);
  return left_;
}

absl::Status WorkerMembership::Register(uint64_t worker_id) {
  RegisterWorkerRequest req;
  req.set_worker_id(worker_id);
  RegisterWorkerResponse resp;
  RETURN_IF_ERROR(policy_->Run(
      [&](grpc::ClientContext* ctx) { return master_->RegisterWorker(ctx, req, &resp); },
      absl::StrCat("master ", options_.master, " RegisterWorker")));
  std::shared_ptr<PsClient> client;
  {
    absl::MutexLock lock(&mu_);
    identity_ = {resp.worker_id(), resp.incarnation()};
    lease_ms_ = static_cast<int64_t>(resp.lease_ms());
    client = client_;
  }
  if (client != nullptr) {
    RETURN_IF_ERROR(client->SetIdentity(resp.worker_id(), resp.incarnation()));
  }
  LOG(INFO) << "worker " << resp.worker_id() << " registered with master " << options_.master
            << " (incarnation " << resp.incarnation() << ", lease " << resp.lease_ms() << " ms)";
  return absl::OkStatus();
}

Refusal WorkerMembership::OnRefused(const absl::Status& s, uint64_t seen, bool job_call) {
  const Refusal refusal = ClassifyRefusal(s, job_call);
  if (refusal == Refusal::kNone) return refusal;
  absl::MutexLock reregister(&reregister_mu_);
  Identity id;
  {
    absl::MutexLock lock(&mu_);
    if (left_ || superseded_ || identity_.incarnation != seen) return refusal;  // handled
    if (refusal == Refusal::kSuperseded) {
      superseded_ = true;
      LOG(WARNING) << "worker " << identity_.worker_id << " incarnation " << seen
                   << " was superseded: another process registered this worker id (" << s
                   << "); this one stops using it";
      return refusal;
    }
    id = identity_;
  }
  LOG(WARNING) << "worker " << id.worker_id << " incarnation " << id.incarnation
               << " lost its lease (" << s
               << "); registering again: the tasks it held were re-queued";
  if (absl::Status again = Register(id.worker_id); !again.ok()) {
    LOG(WARNING) << "worker " << id.worker_id << " could not register again: " << again;
    return refusal;
  }
  absl::MutexLock lock(&mu_);
  ++reregistrations_;
  return refusal;
}

void WorkerMembership::HeartbeatLoop() {
  for (;;) {
    absl::Duration interval;
    {
      absl::MutexLock lock(&mu_);
      interval = std::max(absl::Milliseconds(10), absl::Milliseconds(lease_ms_) / 3);
    }
    if (stop_.WaitForNotificationWithTimeout(interval)) return;
    Identity id;
    {
      absl::MutexLock lock(&mu_);
      if (absl::Now() < heartbeats_paused_until_ || superseded_) continue;
      id = identity_;
    }
    absl::Status s = Heartbeat(id);
    if (s.ok() || stop_.HasBeenNotified()) continue;
    if (OnRefused(s, id.incarnation, /*job_call=*/false) == Refusal::kNone) {
      LOG_EVERY_N(WARNING, 20) << "heartbeat of worker " << id.worker_id << " to master "
                               << options_.master << " failed: " << s
                               << " (every 20th failure is logged)";
    }
  }
}

absl::Status WorkerMembership::Heartbeat(const Identity& id) {
  WorkerHeartbeatRequest req;
  req.set_worker_id(id.worker_id);
  req.set_incarnation(id.incarnation);
  WorkerHeartbeatResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(policy_->AttemptDeadline());
  {
    absl::MutexLock lock(&mu_);
    if (left_) return absl::CancelledError("left");
    heartbeat_ctx_ = &ctx;
  }
  // One attempt: the next heartbeat is the retry.
  grpc::Status gs = master_->WorkerHeartbeat(&ctx, req, &resp);
  absl::MutexLock lock(&mu_);
  heartbeat_ctx_ = nullptr;
  if (gs.ok() && resp.lease_ms() > 0) lease_ms_ = static_cast<int64_t>(resp.lease_ms());
  return RetryPolicy::Final(gs, absl::StrCat("master ", options_.master, " WorkerHeartbeat"), 1);
}

absl::StatusOr<std::shared_ptr<PsClient>> WorkerMembership::Client() {
  ClientOptions client_options = options_.client;
  {
    absl::MutexLock lock(&mu_);
    if (left_) return absl::FailedPreconditionError("the worker left: no client");
    if (client_ != nullptr) return client_;
    client_options.worker_id = identity_.worker_id;
    client_options.incarnation = identity_.incarnation;
  }
  client_options.master = options_.master;
  // Connecting may take a while (pods starting): not under the lock.
  ASSIGN_OR_RETURN(std::unique_ptr<PsClient> made, PsClient::Connect(client_options));
  return Install(std::shared_ptr<PsClient>(std::move(made)), /*replace=*/false);
}

absl::Status WorkerMembership::AttachClient(std::shared_ptr<PsClient> client) {
  if (client == nullptr) return absl::InvalidArgumentError("AttachClient(nullptr)");
  return Install(std::move(client), /*replace=*/true).status();
}

absl::StatusOr<std::shared_ptr<PsClient>> WorkerMembership::Install(
    std::shared_ptr<PsClient> client, bool replace) {
  // Under reregister_mu_: no registration can slip between reading the identity and
  // giving it to the client, so the client never keeps an old incarnation.
  absl::MutexLock reregister(&reregister_mu_);
  Identity id;
  {
    absl::MutexLock lock(&mu_);
    if (left_) return absl::FailedPreconditionError("the worker left: no client");
    if (client_ != nullptr && !replace) return client_;  // made by another thread meanwhile
    client_ = client;
    id = identity_;
  }
  RETURN_IF_ERROR(client->SetIdentity(id.worker_id, id.incarnation));
  return client;
}

absl::StatusOr<uint32_t> WorkerMembership::Leave() {
  absl::MutexLock leaving(&leave_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (left_) return leave_result_;
    left_ = true;  // no registration starts from now on
    if (heartbeat_ctx_ != nullptr) heartbeat_ctx_->TryCancel();
  }
  stop_.Notify();
  // Not under reregister_mu_: the heartbeat thread may be waiting for it.
  if (heartbeat_.joinable()) heartbeat_.join();
  // A registration that started before left_ was set has finished once we hold this, so
  // the identity read below is the last one.
  absl::MutexLock reregister(&reregister_mu_);
  Identity id;
  std::shared_ptr<PsClient> client;
  bool superseded;
  {
    absl::MutexLock lock(&mu_);
    id = identity_;
    superseded = superseded_;
    client = std::move(client_);
  }
  absl::StatusOr<uint32_t> result = 0u;
  if (superseded) {
    result = absl::FailedPreconditionError(
        absl::StrCat("worker ", id.worker_id, " incarnation ", id.incarnation,
                     " was superseded; its successor leaves for it"));
  } else {
    LeaveWorkerRequest req;
    req.set_worker_id(id.worker_id);
    req.set_incarnation(id.incarnation);
    LeaveWorkerResponse resp;
    absl::Status s = policy_->Run(
        [&](grpc::ClientContext* ctx) { return master_->LeaveWorker(ctx, req, &resp); },
        absl::StrCat("master ", options_.master, " LeaveWorker"));
    if (s.ok()) {
      result = resp.requeued_tasks();
      LOG(INFO) << "worker " << id.worker_id << " incarnation " << id.incarnation << " left ("
                << resp.requeued_tasks() << " tasks re-queued)";
    } else {
      result = s;
      LOG(WARNING) << "worker " << id.worker_id << " could not leave (its lease will expire "
                   << "instead): " << s;
    }
  }
  client.reset();  // the session's reference; callers may still hold theirs
  absl::MutexLock lock(&mu_);
  leave_result_ = result;
  return result;
}

void WorkerMembership::PauseHeartbeats(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  heartbeats_paused_until_ = absl::Now() + d;
}

}  // namespace ps::internal
