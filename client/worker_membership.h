// A worker's membership with the master (WorkerSession's first half; internal to the
// client library): registration, the heartbeat thread, registering again after a lost
// lease, the identity its PsClient pushes with, and leaving.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/worker_session.h"
#include "common/rpc/retry_policy.h"
#include "proto/master.grpc.pb.h"

namespace ps::internal {

// How the master refused a call made with the worker's identity.
enum class Refusal {
  kNone,        // not a refusal of the identity (OK, a transport error, a bad request)
  kLost,        // the lease is gone (LOST, LEFT, or the master does not know the id)
  kSuperseded,  // another process registered this id since: never register again
};
// Classifies a WorkerHeartbeat / GetTask error. NOT_FOUND counts as lost only where the
// call names no job (`job_call` false): GetTask's NOT_FOUND may be an unknown job.
Refusal ClassifyRefusal(const absl::Status& s, bool job_call);

// Thread-safe. `options`, `master` and `policy` must outlive it.
class WorkerMembership {
 public:
  struct Identity {
    uint64_t worker_id = 0;
    uint64_t incarnation = 0;
  };

  // Registers (options.worker_id: 0 a new id, else a new incarnation of it) and, with
  // options.heartbeat, starts the heartbeat thread.
  static absl::StatusOr<std::unique_ptr<WorkerMembership>> Start(const WorkerOptions& options,
                                                                 Master::Stub* master,
                                                                 const RetryPolicy* policy);
  // Leave(), which stops the heartbeat thread.
  ~WorkerMembership();

  Identity identity() const;
  int64_t lease_ms() const;
  uint64_t reregistrations() const;
  bool superseded() const;
  bool left() const;

  // A call made as incarnation `seen` was refused with `s` (ClassifyRefusal): registers
  // again if the lease was lost and nobody did since; marks the session superseded if it
  // was. Returns the classification. Logs what it did.
  Refusal OnRefused(const absl::Status& s, uint64_t seen, bool job_call);

  // As WorkerSession::Client / AttachClient.
  absl::StatusOr<std::shared_ptr<PsClient>> Client();
  absl::Status AttachClient(std::shared_ptr<PsClient> client);

  // As WorkerSession::Leave.
  absl::StatusOr<uint32_t> Leave();

  void PauseHeartbeats(absl::Duration d);

 private:
  WorkerMembership(const WorkerOptions& options, Master::Stub* master, const RetryPolicy* policy)
      : options_(options), master_(master), policy_(policy) {}

  // RegisterWorker for `worker_id` (retried); installs the identity and tells the client.
  absl::Status Register(uint64_t worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(reregister_mu_);
  // Makes `client` the session's (if it has none, or `replace`) with the current identity;
  // returns the session's client.
  absl::StatusOr<std::shared_ptr<PsClient>> Install(std::shared_ptr<PsClient> client, bool replace);
  void HeartbeatLoop();
  // One heartbeat, cancelled by Leave.
  absl::Status Heartbeat(const Identity& id);

  // Constant after construction.
  const WorkerOptions& options_;
  Master::Stub* const master_;
  const RetryPolicy* const policy_;

  absl::Mutex leave_mu_ ABSL_ACQUIRED_BEFORE(reregister_mu_);  // one Leave at a time
  // One registration at a time (and the identity a client is given stays current).
  absl::Mutex reregister_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  Identity identity_ ABSL_GUARDED_BY(mu_);
  int64_t lease_ms_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reregistrations_ ABSL_GUARDED_BY(mu_) = 0;
  bool superseded_ ABSL_GUARDED_BY(mu_) = false;
  bool left_ ABSL_GUARDED_BY(mu_) = false;
  absl::StatusOr<uint32_t> leave_result_ ABSL_GUARDED_BY(mu_) = 0u;
  std::shared_ptr<PsClient> client_ ABSL_GUARDED_BY(mu_);
  absl::Time heartbeats_paused_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  grpc::ClientContext* heartbeat_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;  // while one runs

  absl::Notification stop_;  // the heartbeat thread ends
  std::thread heartbeat_;
};

}  // namespace ps::internal
