// The C++ client of the parameter server: the one implementation of the data plane
// (the Python SDK binds it). The worker protocol (register, heartbeat, tasks, leave) is
// client/worker_session.h.
//
// Given the pods' addresses (and so the static vshard map), a pull or push
// de-duplicates its ids (summing the gradients of duplicates), groups them by owning pod,
// sends one RPC per pod carrying all of its tables, in parallel, and scatters the rows
// back in request order. Every RPC has a deadline; UNAVAILABLE, ABORTED and
// DEADLINE_EXCEEDED are retried with exponential backoff (common/rpc/retry_policy.h), which
// is safe for pushes because each carries a (worker id, incarnation, sequence) key that the
// pods apply once. A pod's wrong-shard refusal (proto/wrong_shard.h) makes a client that
// follows a master refresh its map and route the refused part again.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/rpc/transport_security.h"
#include "proto/ps.pb.h"

namespace ps {

struct ClientOptions {
  // The master (host:port). When set, Connect takes the pods and the vshard map from it
  // (waiting, up to connect_timeout_ms, until every pod that owns vshards is live and
  // serves them), and `servers` and `num_vshards` are ignored. The client then follows
  // map changes: a pod that refuses ids it does not own (a vshard moved), or stays
  // unreachable for a few attempts (restarted elsewhere), makes it refresh the map from
  // the master and route again; the caller never sees those errors.
  std::string master;
  // At most one map refresh per this many ms, shared by every call waiting for one.
  int map_refresh_ms = 50;
  // Map changes one part of a call may follow before its error is returned.
  int max_reroutes = 200;
  int connect_timeout_ms = 30000;
  // Pod addresses (host:port). With a static map, pod i is the one started --shard=i/N.
  std::vector<std::string> servers;
  // Must equal the pods' --num_vshards; Connect checks it. 0: the first pod's (Connect
  // asks it), for a caller that does not know the cluster's setting.
  uint32_t num_vshards = 256;
  // The retry policy of every call, to pods and master (common/rpc/retry_policy.h, whose
  // RetryOptions these four fields fill; defaults as there). deadline_ms: per attempt. A
  // 1M-row batch takes well under a second on loopback; 10 s leaves room for a loaded pod
  // without hanging a worker on a dead one.
  int deadline_ms = 10000;
  // Attempts per RPC (first try included), with backoff doubling from initial to max and
  // jitter (each wait is in [b/2, b]). 10 attempts wait 4.5 to 9.1 s in all: enough to
  // ride out a pod restart, not a permanent outage. gRPC's own reconnect backoff is set
  // to the same bounds, so a retry finds a restarted pod as soon as it listens. From the
  // third attempt on, a client following a master refreshes its map first.
  int max_attempts = 10;
  int initial_backoff_ms = 20;
  int max_backoff_ms = 4000;
  int channels_per_server = 2;
  // Threads that receive the answers of pulls and pushes and run their completions (the
  // scatter of pulled rows, Handle::Then callbacks), each polling its own queue
  // (client/completion_threads.h). One keeps up with a pod answering 5M+ rows/s; more
  // help a client of many busy pods.
  int completion_threads = 1;
  int max_message_bytes = 256 << 20;
  // Push identity. worker_id 0: a random id is drawn (a master assigns ids in production:
  // client/worker_session.h). Two live clients must not share one (worker_id, incarnation).
  uint64_t worker_id = 0;
  uint64_t incarnation = 1;
  // The sequence of the first push key. 0: microseconds since the Unix epoch, so a process
  // restarted with the same identity starts above every sequence its predecessor used
  // (it would have to have pushed more than once per microsecond since it started to get
  // there) and its pushes are never mistaken for duplicates. Set it only from a counter
  // persisted across restarts (or in tests).
  uint64_t first_push_sequence = 0;
  // TLS (CA, client certificate for mutual TLS) and the bearer token, towards the pods and
  // the master. Default: plain text, no token. Connect fails on unreadable files.
  ChannelSecurity security;
};

// Rows to pull from one table: ids[i]'s row goes to out[i*dim, (i+1)*dim) (or
// out_half's, below). `ids` and the output must stay valid until the handle's Wait
// returns. Rows are written to the output as each pod answers, before Wait; so call Wait
// before freeing it, even to abandon the call. After a failed call the output holds some
// rows and not others.
//
// A compact pull (PullOptions::value_type BFLOAT16 or FLOAT16) is answered with 16-bit
// values, half the bytes of float32, each the stored float32 rounded to nearest even
// (common/base/half.h; fp16 overflows to +-Inf beyond 65504). Give exactly one of:
//  - out_half: the raw 16-bit values (bf16 or fp16 bits), copied as they come: the cheapest,
//    for a caller that computes in that type (a torch.bfloat16 tensor);
//  - out: the values widened to float32 while they are scattered (exact, one extra pass
//    over rows already in cache), for a caller that computes in float32 but wants the
//    smaller answer.
// A FLOAT32 pull takes `out` only.
struct PullSpec {
  std::string table;
  absl::Span<const int64_t> ids;
  float* out = nullptr;
  uint16_t* out_half = nullptr;
};

// How a pull is made.
struct PullOptions {
  // Evaluation pulls: a missing row is returned at its initial value but not created.
  bool read_only = false;
  // The values' type on the wire (see PullSpec).
  ValueType value_type = FLOAT32;
  // (No option) With a replicated map (ps-master --replication >= 2), a read-only pull
  // whose pod does not answer (UNAVAILABLE, DEADLINE_EXCEEDED) is sent at once to a
  // follower of each of its vshards that is up, instead of retrying the primary: rows as
  // of the records that follower has received (with --replication_ack=all, every
  // acknowledged push). Training pulls (which create rows) go to primaries only.
};

// Gradients to push to one table: grads[i*dim, (i+1)*dim) for ids[i]; duplicates are
// summed before sending. learning_rate > 0 overrides the table's. Both spans need only
// live until PushAsync returns (the request is built eagerly).
struct PushSpec {
  std::string table;
  absl::Span<const int64_t> ids;
  const float* grads = nullptr;
  float learning_rate = 0;
};

// One pod of the client's routing, as shard_map() reports it.
struct PodView {
  std::string id;       // the master's pod id, or "pod i" in a static map
  std::string address;  // host:port; empty for a pod that never registered
  bool up = false;      // LIVE or DRAINED as far as the master knows; always with a static map
};

// A copy of the routing the client's calls are made with: vshard v is owned by
// pods[owner[v]].
struct ShardMapView {
  uint64_t epoch = 0;  // 0 for a static map
  std::vector<uint32_t> owner;
  std::vector<PodView> pods;
};

// A pod's answer to a call made to every pod that is up, with the pod it came from.
struct PodDescription {
  PodView pod;
  DescribeResponse response;
};
struct PodStats {
  PodView pod;
  StatsResponse response;
};

// What this client has done, counted since Connect (PsClient::client_stats). Every field
// only grows.
struct ClientStats {
  uint64_t pulls = 0;   // PullAsync and PullDense calls
  uint64_t pushes = 0;  // PushAsync and PushDense calls
  // Push RPCs a pod acknowledged (one per pod a call touched, plus re-routed parts).
  uint64_t push_rpcs = 0;
  // Acknowledged push RPCs the pod answered `duplicate`: it had applied that key before,
  // so nothing was applied again. Expected after a retry (the first attempt's answer was
  // lost); see reused_keys for the other case.
  uint64_t duplicate_pushes = 0;
  // Of those, answered `duplicate` to their first attempt: the key was used before by
  // someone else (two clients sharing an identity, or a sequence reused after a restart),
  // and this push's gradients were dropped. Should stay 0; each one is logged (WARNING,
  // rate-limited).
  uint64_t reused_keys = 0;
  uint64_t retries = 0;        // RPC attempts after the first (all calls)
  uint64_t map_refreshes = 0;  // shard maps fetched from the master after Connect
  uint64_t reroutes = 0;       // RPCs routed again after a wrong-shard refusal
  // Read-only pull RPCs sent to followers because the vshards' primary was unreachable
  // (replication; see PullOptions).
  uint64_t read_fallbacks = 0;
};

namespace internal {
class Op;
}

// The result of an asynchronous call. Wait blocks until every RPC of the call has
// finished (after retries) and returns the call's status; when it returns OK, a pull's
// rows are all in the caller's buffers. Wait may be called more than once; not
// thread-safe.
class Handle {
 public:
  Handle() = default;
  explicit Handle(std::shared_ptr<internal::Op> op) : op_(std::move(op)) {}
  absl::Status Wait();
  // The completion-callback form of Wait: runs done(status) once, when Wait would return,
  // with the status Wait would return. If the call has already finished, done runs at
  // once on this thread; otherwise on the client's completion thread that finishes the
  // call (ClientOptions::completion_threads, even when the call was re-routed after a
  // map change), which answers the client's other calls too, so done must be short, and
  // must not destroy the client. It may start other calls and chain them with Then (a
  // driver keeps a pipeline full that way, with no thread woken to do it); it must not
  // Wait: Wait inside a Then callback (or anywhere on a completion thread) always returns
  // FAILED_PRECONDITION, whichever thread runs the callback and whether or not the call
  // is finished, rather than risk waiting for an answer this very thread would have to
  // receive. The client's other
  // methods (CreateTable, PullDense, Stats...) may be called from it: they block the
  // thread for their round trip but use a queue of their own. The handle may be dropped
  // after Then; the call's buffers must stay valid until done runs. At most one Then per
  // handle; Wait may still be called.
  void Then(std::function<void(absl::Status)> done);

 private:
  std::shared_ptr<internal::Op> op_;
};

// Destroying the client waits for its calls in flight (and their retries) to finish.
class PsClient {
 public:
  // Connects to every pod, checks that they agree with the options (vshard count, static
  // ownership) and loads the table catalog. Retries while pods are starting.
  static absl::StatusOr<std::unique_ptr<PsClient>> Connect(const ClientOptions& options);
  virtual ~PsClient() = default;

  // Creates the table (or dense tensor) on every pod; idempotent for an identical spec,
  // ALREADY_EXISTS for a different one. Thread-safe, as is everything below.
  virtual absl::Status CreateTable(const TableSpec& spec) = 0;
  virtual absl::Status CreateDense(const DenseSpec& spec) = 0;
  // The normalized spec of a table, refreshing the catalog once if it is unknown.
  virtual absl::StatusOr<TableSpec> GetTable(const std::string& name) = 0;
  virtual absl::StatusOr<DenseSpec> GetDense(const std::string& name) = 0;

  // INVALID_ARGUMENT (from the handle) for a spec without its output, or with both
  // outputs, or out_half on a FLOAT32 pull, or an unknown value_type.
  virtual Handle PullAsync(std::vector<PullSpec> specs, const PullOptions& options) = 0;
  Handle PullAsync(std::vector<PullSpec> specs, bool read_only = false) {
    return PullAsync(std::move(specs), PullOptions{read_only});
  }
  virtual Handle PushAsync(std::vector<PushSpec> specs) = 0;
  absl::Status Pull(std::vector<PullSpec> specs, const PullOptions& options) {
    return PullAsync(std::move(specs), options).Wait();
  }
  absl::Status Pull(std::vector<PullSpec> specs, bool read_only = false) {
    return PullAsync(std::move(specs), read_only).Wait();
  }
  absl::Status Push(std::vector<PushSpec> specs) { return PushAsync(std::move(specs)).Wait(); }

  // Dense tensors: out[i] / grads[i] hold the numel floats of names[i].
  virtual absl::Status PullDense(const std::vector<std::string>& names,
                                 const std::vector<float*>& out) = 0;
  virtual absl::Status PushDense(const std::vector<std::string>& names,
                                 const std::vector<const float*>& grads,
                                 float learning_rate = 0) = 0;

  // Per-pod statistics, in pod order (with a master: of the pods it reports live or
  // drained).
  virtual absl::StatusOr<std::vector<StatsResponse>> Stats() = 0;
  // The same calls as Stats, and Describe (tables with their rows, owned vshards), each
  // answer with the pod it came from.
  virtual absl::StatusOr<std::vector<PodStats>> StatsByPod() = 0;
  virtual absl::StatusOr<std::vector<PodDescription>> DescribeByPod() = 0;

  // A copy of the current routing (it changes when the client follows the master's map).
  virtual ShardMapView shard_map() const = 0;
  // A key no call of this client uses, of its current identity: for tools and tests that
  // send a PushRequest of their own.
  virtual PushKey NextPushKey() = 0;

  virtual uint64_t worker_id() const = 0;
  virtual uint64_t incarnation() const = 0;
  // Pushes from now on carry (worker_id, incarnation), e.g. after the worker re-registered
  // with the master under a new incarnation (WorkerSession does this). The sequence goes on
  // from where it was, or from the clock if that is higher. Pushes already started keep
  // their keys (a retry must resend the same key); pods refuse those of a superseded
  // incarnation. INVALID_ARGUMENT for worker_id 0 or incarnation 0.
  virtual absl::Status SetIdentity(uint64_t worker_id, uint64_t incarnation) = 0;

  // This client's counters (a snapshot; cheap).
  virtual ClientStats client_stats() const = 0;
};

}  // namespace ps
