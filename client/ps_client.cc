#include "client/ps_client.h"

#include <glog/logging.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstring>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "client/completion_threads.h"
#include "client/id_index.h"
#include "client/timer.h"
#include "common/base/status_macros.h"
#include "common/routing/hash.h"
#include "common/routing/shard_map.h"
#include "common/rpc/grpc_status.h"
#include "proto/master.grpc.pb.h"
#include "proto/ps.grpc.pb.h"
#include "proto/wire.h"

namespace ps {
namespace internal {

// One logical call: several RPCs (one per pod) that finish independently; the last one
// to finish marks the op done. `finish` runs once, on the waiting thread, after all RPCs
// succeeded (a pull's duplicate rows).
class Op {
 public:
  explicit Op(int pending) : pending_(pending) {}

  void RpcDone(const absl::Status& s) {
    std::function<void(absl::Status)> then;
    absl::Status result;
    {
      absl::MutexLock lock(&mu_);
      if (!s.ok() && status_.ok()) status_ = s;
      if (--pending_ == 0 && then_) {
        result = FinishLocked();
        then = std::move(then_);
      }
    }
    if (then) then(std::move(result));
  }

  // More RPCs joined the op (a re-routed part); call before the RPC they replace is done.
  void Add(int n) {
    absl::MutexLock lock(&mu_);
    pending_ += n;
  }
  // Keeps `p` alive as long as the op (re-routed RPCs).
  void Keep(std::shared_ptr<void> p) {
    absl::MutexLock lock(&mu_);
    keep_.push_back(std::move(p));
  }

  // Every RPC is done.
  bool done() {
    absl::MutexLock lock(&mu_);
    return pending_ == 0;
  }

  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* pending) { return *pending == 0; }, &pending_));
    return FinishLocked();
  }

  // Runs done(status) once every RPC is done: at once, on this thread, if they already
  // are; otherwise on the thread that finishes the last one (after its scatter).
  void Then(std::function<void(absl::Status)> done) {
    absl::Status result;
    {
      absl::MutexLock lock(&mu_);
      if (pending_ != 0) {
        then_ = std::move(done);
        return;
      }
      result = FinishLocked();
    }
    done(std::move(result));
  }

  void set_finish(std::function<absl::Status()> f) { finish_ = std::move(f); }

 private:
  // The call's status, running the finish step the first time (pending_ must be 0).
  absl::Status FinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!finished_) {
      finished_ = true;
      if (status_.ok() && finish_) status_ = finish_();
      finish_ = nullptr;  // frees the plan
    }
    return status_;
  }

  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::function<absl::Status()> finish_;  // set before any RPC starts
  std::vector<std::shared_ptr<void>> keep_ ABSL_GUARDED_BY(mu_);
  std::function<void(absl::Status)> then_ ABSL_GUARDED_BY(mu_);
};

}  // namespace internal

absl::Status Handle::Wait() {
  if (op_ == nullptr) return absl::FailedPreconditionError("Wait on an empty Handle");
  if (CompletionThreads::OnCompletionThread() && !op_->done()) {
    // The answer may have to arrive on this very thread: waiting could never end.
    return absl::FailedPreconditionError(
        "Handle::Wait called from a completion callback (Handle::Then) on a call not "
        "finished yet; chain it with Then instead");
  }
  return op_->Wait();
}

void Handle::Then(std::function<void(absl::Status)> done) {
  if (op_ == nullptr) return done(absl::FailedPreconditionError("Then on an empty Handle"));
  op_->Then(std::move(done));
}

namespace {

using internal::Op;
using Stub = ParameterServer::Stub;

// A typed method of the pods' service, in its completion-queue form.
template <typename Req, typename Resp>
using AsyncMethod = std::unique_ptr<grpc::ClientAsyncResponseReader<Resp>> (Stub::*)(
    grpc::ClientContext*, const Req&, grpc::CompletionQueue*);

// A method called with raw messages (grpc::ByteBuffer both ways, encoded and decoded by
// proto/wire.h), by its full name.
struct RawMethod {
  const char* name;
};
constexpr RawMethod kRawPull{"/ps.ParameterServer/Pull"};
constexpr RawMethod kRawPush{"/ps.ParameterServer/Push"};

bool Retryable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::ABORTED ||
         code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

struct Pod;

// Where a pull RPC's rows go: for entry e of its request (one table), row k is written to
// out + dest[e][k] * dim.
struct PullScatter {
  struct Entry {
    std::string table;
    float* out = nullptr;
    uint32_t dim = 0;
    std::vector<uint32_t> dest;
  };
  std::vector<Entry> entries;
  bool read_only = false;
};

// One RPC to one pod, re-sent as is on retry (same pod identity, same push key).
template <typename Req, typename Resp>
struct Rpc {
  std::shared_ptr<Pod> pod;
  uint64_t epoch = 0;  // of the routing it was built with
  Req req;
  Resp resp;
  std::unique_ptr<grpc::ClientContext> ctx;
  int attempt = 0;
  int reroutes = 0;     // map changes this part of the call has followed
  absl::Status status;  // the final outcome
  // If set, runs on gRPC's thread when the RPC succeeds, before the op learns of it; its
  // error becomes the RPC's. A pull scatters its rows here, while they are in cache.
  std::function<absl::Status()> on_ok;
  // Pull and push RPCs: after the pod refused ids it does not own (so applied nothing),
  // re-routes the request under the refreshed map as new RPCs of `op`.
  std::function<void(const std::shared_ptr<Op>& op)> reroute;
  std::shared_ptr<PullScatter> scatter;  // pulls
  // Set for the calls of RunAll: the queue the calling thread drains (else the client's
  // completion threads).
  grpc::CompletionQueue* queue = nullptr;
};

using RawRpc = Rpc<grpc::ByteBuffer, grpc::ByteBuffer>;

bool WrongShard(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
         s.error_message().find("does not own") != std::string::npos;
}

struct Pod {
  std::string id;  // the master's pod id, or "pod i" in a static map
  std::string address;
  std::vector<std::unique_ptr<Stub>> stubs;
  std::vector<std::unique_ptr<grpc::GenericStub>> raw_stubs;  // on the same channels
  std::atomic<uint32_t> next{0};

  uint32_t NextChannel() {
    return next.fetch_add(1, std::memory_order_relaxed) % static_cast<uint32_t>(stubs.size());
  }
};

// Every call to a pod runs on the client's completion threads.
template <typename Req, typename Resp>
void Invoke(Pod& pod, AsyncMethod<Req, Resp> method, grpc::ClientContext* ctx, const Req* req,
            Resp* resp, std::function<void(grpc::Status)> done, CompletionThreads& completions,
            grpc::CompletionQueue* own_queue) {
  Stub* stub = pod.stubs[pod.NextChannel()].get();
  completions.Start([&](grpc::CompletionQueue* queue) { return (stub->*method)(ctx, *req, queue); },
                    resp, std::move(done), own_queue);
}

void Invoke(Pod& pod, RawMethod method, grpc::ClientContext* ctx, const grpc::ByteBuffer* req,
            grpc::ByteBuffer* resp, std::function<void(grpc::Status)> done,
            CompletionThreads& completions, grpc::CompletionQueue* own_queue) {
  grpc::GenericStub* stub = pod.raw_stubs[pod.NextChannel()].get();
  completions.Start(
      [&](grpc::CompletionQueue* queue) {
        return stub->PrepareUnaryCall(ctx, method.name, *req, queue);
      },
      resp, std::move(done), own_queue);
}

// The channels of `options.security`; its files were read once already by Connect, so a
// failure here (a file removed since) leaves plain text without a token, which a secured
// server refuses.
ChannelMaker Channels(const ClientOptions& options) {
  return ChannelMaker::Create(options.security).value_or(ChannelMaker());
}

// The pods and the vshard map one call routes with.
struct Routing {
  ShardMap map;
  std::vector<std::shared_ptr<Pod>> pods;  // index = the map's pod index
  // Per pod: reachable as far as the master knows (LIVE or DRAINED; always with a static
  // map). Calls to every pod (create, stats, the catalog at Connect) skip the others: a
  // drained pod that was removed stays in the master's list as LOST.
  std::vector<bool> up;
};

class PsClientImpl final : public PsClient {
 public:
  PsClientImpl(const ClientOptions& options, std::shared_ptr<const Routing> routing)
      : options_(options),
        worker_id_(options.worker_id),
        routing_(std::move(routing)),
        completions_(std::make_unique<CompletionThreads>(options.completion_threads)) {
    if (worker_id_ == 0) {
      std::random_device rd;
      while (worker_id_ == 0) worker_id_ = (uint64_t{rd()} << 32) | rd();
    }
    if (!options_.master.empty()) {
      master_ = Master::NewStub(Channels(options_).Make(options_.master));
    }
  }

  ~PsClientImpl() override {
    // From a completion callback the wait below could never end (the callback's own call
    // is still in flight) and the completion threads could not be joined.
    LOG_IF(FATAL, CompletionThreads::OnCompletionThread())
        << "a PsClient was destroyed from one of its completion callbacks";
    absl::MutexLock lock(&inflight_mu_);
    inflight_mu_.Await(absl::Condition(
        +[](int* n) { return *n == 0; }, &inflight_rpcs_));
  }

  // A pod with its channels.
  static std::shared_ptr<Pod> NewPod(const ClientOptions& options, const std::string& id,
                                     const std::string& address) {
    auto pod = std::make_shared<Pod>();
    pod->id = id;
    pod->address = address;
    if (address.empty()) return pod;  // never registered: owns nothing, gets no calls
    const ChannelMaker channels = Channels(options);
    for (int c = 0; c < std::max(1, options.channels_per_server); ++c) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(options.max_message_bytes);
      args.SetMaxSendMessageSize(options.max_message_bytes);
      // Own connection per channel, rather than one shared subchannel.
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      // The client retries on its own (with backoff and push keys); gRPC's transparent
      // retry layer would only add per-call work (it buffers every message it sends).
      args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
      args.SetInt("ps.channel_index", c);
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, options.initial_backoff_ms);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, options.max_backoff_ms);
      auto channel = channels.Make(address, args);
      pod->stubs.push_back(ParameterServer::NewStub(channel));
      pod->raw_stubs.push_back(std::make_unique<grpc::GenericStub>(channel));
    }
    return pod;
  }

  // The routing of a master's map: pods keep their channels when their address is the
  // same as in `previous`.
  static absl::StatusOr<std::shared_ptr<const Routing>> RoutingFromMap(const ClientOptions& options,
                                                                       const ShardMapResponse& resp,
                                                                       const Routing* previous) {
    auto routing = std::make_shared<Routing>();
    std::vector<uint32_t> owner(resp.owner().begin(), resp.owner().end());
    for (const PodInfo& info : resp.pods()) {
      std::shared_ptr<Pod> pod;
      if (previous != nullptr) {
        for (const auto& p : previous->pods) {
          if (p->id == info.pod_id() && p->address == info.address()) pod = p;
        }
      }
      if (pod == nullptr) pod = NewPod(options, info.pod_id(), info.address());
      routing->pods.push_back(std::move(pod));
      routing->up.push_back(!info.address().empty() &&
                            (info.state() == PodInfo::LIVE || info.state() == PodInfo::DRAINED));
    }
    for (uint32_t pod : owner) {
      if (pod >= routing->pods.size() || routing->pods[pod]->address.empty()) {
        return absl::UnavailableError(
            absl::StrCat("the master's map names pod ", pod, ", which has no address yet"));
      }
    }
    ASSIGN_OR_RETURN(routing->map,
                     ShardMap::FromOwners(std::move(owner), static_cast<uint32_t>(resp.pods_size()),
                                          resp.epoch()));
    return std::shared_ptr<const Routing>(std::move(routing));
  }

  // Loads the catalog from the pods (and, with a static map, checks that they agree with
  // it: a wrong --shard flag or server order is an error here, not silent misrouting).
  absl::Status Init() {
    auto r = routing();
    std::vector<std::unique_ptr<Rpc<DescribeRequest, DescribeResponse>>> rpcs;
    for (size_t p = 0; p < r->pods.size(); ++p) {
      if (!r->up[p]) continue;
      rpcs.push_back(MakeRpc<DescribeRequest, DescribeResponse>(r->pods[p], r->map.epoch()));
    }
    RETURN_IF_ERROR(RunAll(&Stub::PrepareAsyncDescribe, &rpcs));
    for (size_t i = 0; i < rpcs.size(); ++i) {
      const DescribeResponse& d = rpcs[i]->resp;
      const std::string& where = rpcs[i]->pod->address;
      if (d.num_vshards() != r->map.num_vshards()) {
        return absl::FailedPreconditionError(
            absl::StrCat("pod ", i, " (", where, ") has ", d.num_vshards(),
                         " vshards; the client is configured with ", r->map.num_vshards()));
      }
      if (options_.master.empty()) {
        for (uint32_t v = 0; v < r->map.num_vshards(); ++v) {
          const bool owns = (static_cast<uint8_t>(d.owned_vshards()[v >> 3]) >> (v & 7)) & 1;
          if (owns != (r->map.PodOfVShard(v) == i)) {
            return absl::FailedPreconditionError(absl::StrCat(
                "pod ", i, " (", where, ") ", owns ? "owns" : "does not own", " vshard ", v,
                ", unlike the shard map (epoch ", r->map.epoch(), ") of ", r->pods.size(),
                " pods. Static map: start pod i with --shard=i/", r->pods.size(),
                " and list the servers in that order"));
          }
        }
      }
      absl::MutexLock lock(&catalog_mu_);
      for (const TableInfo& t : d.tables()) tables_[t.spec().name()] = t.spec();
      for (const DenseInfo& t : d.dense()) dense_[t.spec().name()] = t.spec();
    }
    return absl::OkStatus();
  }

  uint64_t worker_id() const override { return worker_id_; }

  absl::Status CreateTable(const TableSpec& spec) override {
    if (master_ != nullptr) {  // the catalog: pods that join later create it from there
      CreateTableRequest req;
      *req.mutable_spec() = spec;
      CreateTableResponse resp;
      RETURN_IF_ERROR(CallMaster(&Master::Stub::CreateTable, req, &resp));
    }
    return CreateOnEveryPod<CreateTableRequest, CreateTableResponse>(&Stub::PrepareAsyncCreateTable,
                                                                     spec);
  }

  absl::Status CreateDense(const DenseSpec& spec) override {
    if (master_ != nullptr) {
      CreateDenseRequest req;
      *req.mutable_spec() = spec;
      CreateDenseResponse resp;
      RETURN_IF_ERROR(CallMaster(&Master::Stub::CreateDense, req, &resp));
    }
    return CreateOnEveryPod<CreateDenseRequest, CreateDenseResponse>(&Stub::PrepareAsyncCreateDense,
                                                                     spec);
  }

  absl::StatusOr<TableSpec> GetTable(const std::string& name) override {
    return Lookup(tables_, name, "table");
  }
  absl::StatusOr<DenseSpec> GetDense(const std::string& name) override {
    return Lookup(dense_, name, "dense tensor");
  }

  Handle PullAsync(std::vector<PullSpec> specs, bool read_only) override;
  Handle PushAsync(std::vector<PushSpec> specs) override;
  absl::Status PullDense(const std::vector<std::string>& names,
                         const std::vector<float*>& out) override;
  absl::Status PushDense(const std::vector<std::string>& names,
                         const std::vector<const float*>& grads, float lr) override;

  absl::StatusOr<std::vector<StatsResponse>> Stats() override {
    auto r = routing();
    std::vector<std::unique_ptr<Rpc<StatsRequest, StatsResponse>>> rpcs;
    for (size_t p = 0; p < r->pods.size(); ++p) {
      if (!r->up[p]) continue;
      rpcs.push_back(MakeRpc<StatsRequest, StatsResponse>(r->pods[p], r->map.epoch()));
    }
    RETURN_IF_ERROR(RunAll(&Stub::PrepareAsyncStats, &rpcs));
    std::vector<StatsResponse> out;
    for (auto& rpc : rpcs) out.push_back(std::move(rpc->resp));
    return out;
  }

 private:
  std::shared_ptr<const Routing> routing() const {
    absl::MutexLock lock(&routing_mu_);
    return routing_;
  }

  template <typename Req, typename Resp>
  absl::Status CallMaster(grpc::Status (Master::Stub::*method)(grpc::ClientContext*, const Req&,
                                                               Resp*),
                          const Req& req, Resp* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(options_.deadline_ms));
    return FromGrpcStatus((master_.get()->*method)(&ctx, req, resp),
                          absl::StrCat("master ", options_.master));
  }

  // Calls `then` once the routing is newer than `seen_epoch`, or after one refresh from the
  // master (whatever it brought). Refreshes are shared by all calls waiting for one and at
  // most one per map_refresh_ms. `then` runs on the timer or a gRPC thread.
  void RefreshMap(uint64_t seen_epoch, std::function<void()> then) {
    if (routing()->map.epoch() > seen_epoch) return then();
    {
      absl::MutexLock lock(&refresh_mu_);
      refresh_waiters_.push_back(std::move(then));
      if (refresh_in_flight_) return;
      refresh_in_flight_ = true;
    }
    {
      absl::MutexLock lock(&inflight_mu_);
      ++inflight_rpcs_;
    }
    const absl::Duration wait =
        std::max(absl::ZeroDuration(),
                 last_refresh_ + absl::Milliseconds(options_.map_refresh_ms) - absl::Now());
    timer_.After(wait, [this] { StartRefresh(); });
  }

  // Runs on the timer thread: a blocking call (the master answers in a few ms, or fails at
  // once when down; 2 s at most), so no call state outlives it.
  void StartRefresh() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    ShardMapResponse resp;
    if (master_->GetShardMap(&ctx, GetShardMapRequest(), &resp).ok()) {
      auto current = routing();
      if (resp.epoch() >= current->map.epoch()) {
        auto next = RoutingFromMap(options_, resp, current.get());
        if (next.ok()) {
          absl::MutexLock lock(&routing_mu_);
          routing_ = *std::move(next);
        }
      }
    }
    std::vector<std::function<void()>> waiters;
    {
      absl::MutexLock lock(&refresh_mu_);
      refresh_in_flight_ = false;
      last_refresh_ = absl::Now();
      waiters.swap(refresh_waiters_);
    }
    for (auto& w : waiters) w();
    absl::MutexLock lock(&inflight_mu_);
    --inflight_rpcs_;
  }

  // The pod with `id` in the current routing (its address may have changed), or `pod`.
  std::shared_ptr<Pod> Resolve(const std::shared_ptr<Pod>& pod) {
    auto r = routing();
    for (const auto& p : r->pods) {
      if (p->id == pod->id) return p->address.empty() ? pod : p;
    }
    return pod;
  }

  template <typename Req, typename Resp>
  std::unique_ptr<Rpc<Req, Resp>> MakeRpc(std::shared_ptr<Pod> pod, uint64_t epoch) {
    auto rpc = std::make_unique<Rpc<Req, Resp>>();
    rpc->pod = std::move(pod);
    rpc->epoch = epoch;
    return rpc;
  }

  // Sends (or re-sends) one RPC; on completion retries it or reports it to `op`.
  // Counts an RPC in flight from its first send until its final completion, retries
  // included, so the destructor can wait for it.
  template <typename Method, typename Req, typename Resp>
  void Begin(Method method, Rpc<Req, Resp>* rpc, std::shared_ptr<Op> op) {
    {
      absl::MutexLock lock(&inflight_mu_);
      ++inflight_rpcs_;
    }
    Start(method, rpc, std::move(op));
  }

  // Retries and map changes:
  // - UNAVAILABLE / ABORTED / DEADLINE_EXCEEDED: the same request again to the same pod
  //   identity, with backoff. From the third attempt on (with a master) the map is
  //   refreshed first, so a pod restarted at a new address is found.
  // - FAILED_PRECONDITION for ids the pod does not own (a map change): nothing of the
  //   request was applied there, so after a refresh its ids are routed again as new RPCs
  //   (a push under a new key), which may go to several pods.
  template <typename Method, typename Req, typename Resp>
  void Start(Method method, Rpc<Req, Resp>* rpc, std::shared_ptr<Op> op) {
    rpc->ctx = std::make_unique<grpc::ClientContext>();
    rpc->ctx->set_deadline(std::chrono::system_clock::now() +
                           std::chrono::milliseconds(options_.deadline_ms));
    Invoke(
        *rpc->pod, method, rpc->ctx.get(), &rpc->req, &rpc->resp,
        [this, method, rpc, op = std::move(op)](grpc::Status s) mutable {
          ++rpc->attempt;
          const bool master = master_ != nullptr;
          if (!s.ok() && Retryable(s.error_code()) && rpc->attempt < options_.max_attempts) {
            const absl::Duration backoff = Backoff(rpc->attempt);
            auto resend = [this, method, rpc, op]() mutable {
              rpc->resp.Clear();
              rpc->pod = Resolve(rpc->pod);
              Start(method, rpc, std::move(op));
            };
            if (master && rpc->attempt >= 3) {
              timer_.After(backoff, [this, rpc, resend = std::move(resend)]() mutable {
                RefreshMap(rpc->epoch, std::move(resend));
              });
            } else {
              timer_.After(backoff, std::move(resend));
            }
            return;
          }
          if (master && rpc->reroute && WrongShard(s) && rpc->reroutes < options_.max_reroutes) {
            // The refresh ends on the timer thread; the re-routing (which may finish the
            // call and run its Then callback) runs on a completion thread, as every
            // completion does.
            RefreshMap(rpc->epoch, [this, rpc, op = std::move(op)]() mutable {
              completions_->Run([this, rpc, op = std::move(op)] {
                rpc->reroute(op);  // adds its RPCs to the op before this one is done
                Done(rpc, op.get(), absl::OkStatus());
              });
            });
            return;
          }
          absl::Status status;
          if (!s.ok()) {
            status =
                FromGrpcStatus(s, absl::StrCat("pod ", rpc->pod->id, " (", rpc->pod->address, ")"));
            if (rpc->attempt > 1) {
              status = absl::Status(status.code(), absl::StrCat(status.message(), " [after ",
                                                                rpc->attempt, " attempts]"));
            }
          } else if (rpc->on_ok) {
            status = rpc->on_ok();
          }
          Done(rpc, op.get(), status);
        },
        *completions_, rpc->queue);
  }

  template <typename Req, typename Resp>
  void Done(Rpc<Req, Resp>* rpc, Op* op, const absl::Status& status) {
    rpc->status = status;
    op->RpcDone(status);
    absl::MutexLock lock(&inflight_mu_);
    --inflight_rpcs_;
  }

  absl::Duration Backoff(int attempt) {
    const int64_t cap = std::min<int64_t>(
        options_.max_backoff_ms, int64_t{options_.initial_backoff_ms} << std::min(attempt - 1, 20));
    thread_local std::mt19937_64 rng(std::random_device{}());
    return absl::Milliseconds(cap / 2 + static_cast<int64_t>(rng() % (cap / 2 + 1)));
  }

  // Starts `rpcs` as part of `op` (whose pending count already includes them); the op
  // keeps them alive.
  void StartRaw(RawMethod method, std::vector<std::shared_ptr<RawRpc>> rpcs,
                const std::shared_ptr<Op>& op) {
    for (auto& rpc : rpcs) {
      op->Keep(rpc);
      Begin(method, rpc.get(), op);
    }
  }

  // Blocking fan-out over caller-owned RPCs.
  template <typename Req, typename Resp>
  // The calls run on a queue of their own that this thread drains (retries included), so
  // a blocking call never waits on a completion thread: it works from one too.
  absl::Status RunAll(AsyncMethod<Req, Resp> method,
                      std::vector<std::unique_ptr<Rpc<Req, Resp>>>* rpcs) {
    auto op = std::make_shared<Op>(static_cast<int>(rpcs->size()));
    grpc::CompletionQueue queue;
    for (auto& rpc : *rpcs) {
      rpc->queue = &queue;
      Begin(method, rpc.get(), op);
    }
    CompletionThreads::Drain(&queue, [&op] { return op->done(); });
    queue.Shutdown();
    CompletionThreads::Drain(&queue, [] { return false; });  // empty: every call is done
    return op->Wait();
  }

  // Sends the create request to every pod (in parallel), then refreshes the catalog.
  template <typename Req, typename Resp, typename Spec>
  absl::Status CreateOnEveryPod(AsyncMethod<Req, Resp> method, const Spec& spec) {
    auto r = routing();
    std::vector<std::unique_ptr<Rpc<Req, Resp>>> rpcs;
    for (size_t p = 0; p < r->pods.size(); ++p) {
      if (!r->up[p]) continue;
      rpcs.push_back(MakeRpc<Req, Resp>(r->pods[p], r->map.epoch()));
      *rpcs.back()->req.mutable_spec() = spec;
    }
    RETURN_IF_ERROR(RunAll(method, &rpcs));
    return RefreshCatalog();
  }

  absl::Status RefreshCatalog() {
    auto r = routing();
    std::vector<std::unique_ptr<Rpc<DescribeRequest, DescribeResponse>>> rpcs;
    rpcs.push_back(
        MakeRpc<DescribeRequest, DescribeResponse>(r->pods[r->map.PodOfVShard(0)], r->map.epoch()));
    RETURN_IF_ERROR(RunAll(&Stub::PrepareAsyncDescribe, &rpcs));
    absl::MutexLock lock(&catalog_mu_);
    for (const TableInfo& t : rpcs[0]->resp.tables()) tables_[t.spec().name()] = t.spec();
    for (const DenseInfo& t : rpcs[0]->resp.dense()) dense_[t.spec().name()] = t.spec();
    return absl::OkStatus();
  }

  template <typename Spec>
  absl::StatusOr<Spec> Lookup(const absl::flat_hash_map<std::string, Spec>& map,
                              const std::string& name, absl::string_view kind) {
    for (int pass = 0; pass < 2; ++pass) {
      {
        absl::MutexLock lock(&catalog_mu_);
        auto it = map.find(name);
        if (it != map.end()) return it->second;
      }
      if (pass == 0) RETURN_IF_ERROR(RefreshCatalog());
    }
    return absl::NotFoundError(absl::StrCat(kind, " '", name, "' does not exist"));
  }

  // The dim of a table without copying its spec (the hot path needs only that).
  absl::StatusOr<uint32_t> TableDim(const std::string& name) {
    {
      absl::MutexLock lock(&catalog_mu_);
      auto it = tables_.find(name);
      if (it != tables_.end()) return it->second.dim();
    }
    ASSIGN_OR_RETURN(TableSpec spec, GetTable(name));
    return spec.dim();
  }

  PushKey NextKey() {
    PushKey key;
    key.set_worker_id(worker_id_);
    key.set_incarnation(options_.incarnation);
    key.set_sequence(sequence_.fetch_add(1, std::memory_order_relaxed));
    return key;
  }

  // Rows to reserve in one pod's entry for a call of n ids: the even share plus a margin
  // for hash imbalance (a reserve too small only costs a reallocation).
  static size_t ReserveRows(size_t n, size_t pods) {
    return pods <= 1 ? n : n / pods + n / (4 * pods) + 16;
  }

  Handle Failed(absl::Status s) {
    auto op = std::make_shared<Op>(0);
    op->set_finish([s] { return s; });
    return Handle(op);
  }

  // Pull RPCs built from (pod, table entry) parts; see PullAsync and ReroutePull.
  struct PullBuild {
    std::vector<PullRequest> reqs;
    std::vector<std::shared_ptr<PullScatter>> scatters;
    std::vector<uint32_t> pod_of_rpc;
    std::vector<int> rpc_of_pod;
  };
  std::vector<std::shared_ptr<RawRpc>> FinishPull(PullBuild* b, const Routing& r, int reroutes);
  void ReroutePull(RawRpc* rpc, const std::shared_ptr<Op>& op);
  // Push RPCs: one PushRequest per pod (all under `key`).
  std::vector<std::shared_ptr<RawRpc>> MakePushRpcs(std::vector<PushRequest>* reqs,
                                                    const std::vector<uint32_t>& pod_of_rpc,
                                                    const Routing& r, int reroutes);
  void ReroutePush(RawRpc* rpc, const std::shared_ptr<Op>& op);

  // Constant after construction.
  const ClientOptions options_;
  uint64_t worker_id_;
  std::unique_ptr<Master::Stub> master_;  // null with a static map

  mutable absl::Mutex routing_mu_;
  std::shared_ptr<const Routing> routing_ ABSL_GUARDED_BY(routing_mu_);
  absl::Mutex refresh_mu_ ABSL_ACQUIRED_AFTER(routing_mu_);
  bool refresh_in_flight_ ABSL_GUARDED_BY(refresh_mu_) = false;
  absl::Time last_refresh_ ABSL_GUARDED_BY(refresh_mu_) = absl::InfinitePast();
  std::vector<std::function<void()>> refresh_waiters_ ABSL_GUARDED_BY(refresh_mu_);

  std::atomic<uint64_t> sequence_{1};
  absl::Mutex inflight_mu_;
  int inflight_rpcs_ ABSL_GUARDED_BY(inflight_mu_) = 0;
  absl::Mutex catalog_mu_;
  absl::flat_hash_map<std::string, TableSpec> tables_ ABSL_GUARDED_BY(catalog_mu_);
  absl::flat_hash_map<std::string, DenseSpec> dense_ ABSL_GUARDED_BY(catalog_mu_);
  Timer timer_;  // destroyed before the members above, so no retry fires into a dying client
  // Last: destroyed first, once no call is in flight (the destructor waits for that).
  std::unique_ptr<CompletionThreads> completions_;
};

// Where the rows of one table's pull go besides the RPCs' scatters: a repeated id's row
// is copied from its first occurrence once every RPC is done.
struct PullPlan {
  float* out;
  uint32_t dim;
  std::vector<std::pair<uint32_t, uint32_t>> dups;  // (request index, first index)
};

// Scatters a pull RPC's rows into the caller's buffers, on gRPC's thread.
absl::Status ScatterPull(RawRpc* r) {
  std::vector<grpc::Slice> slices;
  std::vector<absl::string_view> pieces = wire::Pieces(r->resp, &slices);
  r->resp.Clear();  // the slices hold the memory from here
  uint64_t epoch;
  std::vector<wire::TableValuesView> tables;
  absl::Status s = wire::DecodePullResponse(pieces, &epoch, &tables);
  if (!s.ok()) return absl::InternalError(absl::StrCat("pod ", r->pod->id, ": ", s.message()));
  const auto& entries = r->scatter->entries;
  if (tables.size() != entries.size()) {
    return absl::InternalError(absl::StrCat("pod ", r->pod->id, " answered ", tables.size(),
                                            " tables for ", entries.size()));
  }
  for (size_t e = 0; e < entries.size(); ++e) {
    const PullScatter::Entry& entry = entries[e];
    const size_t row_bytes = entry.dim * sizeof(float);
    if (tables[e].values_bytes != entry.dest.size() * row_bytes) {
      return absl::InternalError(absl::StrCat("pod ", r->pod->id, " answered a pull of '",
                                              entry.table, "' with the wrong number of values"));
    }
    char* out = reinterpret_cast<char*>(entry.out);
    wire::Reader values(tables[e].values);
    for (uint32_t i : entry.dest) values.CopyTo(out + i * row_bytes, row_bytes);
  }
  return absl::OkStatus();
}

std::vector<std::shared_ptr<RawRpc>> PsClientImpl::FinishPull(PullBuild* b, const Routing& r,
                                                              int reroutes) {
  std::vector<std::shared_ptr<RawRpc>> rpcs;
  for (size_t k = 0; k < b->reqs.size(); ++k) {
    auto rpc = std::shared_ptr<RawRpc>(
        MakeRpc<grpc::ByteBuffer, grpc::ByteBuffer>(r.pods[b->pod_of_rpc[k]], r.map.epoch()));
    rpc->req = wire::EncodePullRequest(&b->reqs[k]);
    rpc->scatter = std::move(b->scatters[k]);
    rpc->reroutes = reroutes;
    RawRpc* raw = rpc.get();
    rpc->on_ok = [raw] { return ScatterPull(raw); };
    rpc->reroute = [this, raw](const std::shared_ptr<Op>& op) { ReroutePull(raw, op); };
    rpcs.push_back(std::move(rpc));
  }
  return rpcs;
}

void PsClientImpl::ReroutePull(RawRpc* rpc, const std::shared_ptr<Op>& op) {
  grpc::ByteBuffer raw(rpc->req);
  PullRequest req;
  if (!grpc::SerializationTraits<PullRequest>::Deserialize(&raw, &req).ok()) {
    op->Add(1);
    return op->RpcDone(absl::InternalError("cannot re-route a pull: its request is unreadable"));
  }
  auto r = routing();
  const uint32_t num_pods = r->map.num_pods();
  PullBuild b;
  b.rpc_of_pod.assign(num_pods, -1);
  const auto& entries = rpc->scatter->entries;
  for (int e = 0; e < req.tables_size() && e < static_cast<int>(entries.size()); ++e) {
    const PullScatter::Entry& entry = entries[e];
    const std::string& ids = req.tables(e).ids();
    const uint64_t name_hash = NameHash(entry.table);
    std::vector<int> entry_of_pod(num_pods, -1);
    for (size_t k = 0; k < entry.dest.size(); ++k) {
      int64_t id;
      std::memcpy(&id, ids.data() + k * sizeof(id), sizeof(id));
      const uint32_t pod = r->map.PodOf(name_hash, id);
      if (b.rpc_of_pod[pod] < 0) {
        b.rpc_of_pod[pod] = static_cast<int>(b.reqs.size());
        b.pod_of_rpc.push_back(pod);
        b.reqs.emplace_back().set_epoch(r->map.epoch());
        b.reqs.back().set_read_only(req.read_only());
        b.scatters.push_back(std::make_shared<PullScatter>());
      }
      const int k_rpc = b.rpc_of_pod[pod];
      PullScatter& sc = *b.scatters[k_rpc];
      if (entry_of_pod[pod] < 0) {
        entry_of_pod[pod] = static_cast<int>(sc.entries.size());
        sc.entries.push_back({entry.table, entry.out, entry.dim, {}});
        b.reqs[k_rpc].add_tables()->set_table(entry.table);
      }
      sc.entries[entry_of_pod[pod]].dest.push_back(entry.dest[k]);
      b.reqs[k_rpc]
          .mutable_tables(entry_of_pod[pod])
          ->mutable_ids()
          ->append(reinterpret_cast<const char*>(&id), sizeof(id));
    }
  }
  auto rpcs = FinishPull(&b, *r, rpc->reroutes + 1);
  op->Add(static_cast<int>(rpcs.size()));
  StartRaw(kRawPull, std::move(rpcs), op);
}

Handle PsClientImpl::PullAsync(std::vector<PullSpec> specs, bool read_only) {
  auto r = routing();
  const uint32_t num_pods = r->map.num_pods();
  const uint32_t num_vshards = r->map.num_vshards();
  PullBuild b;
  b.rpc_of_pod.assign(num_pods, -1);
  auto plans = std::make_shared<std::vector<PullPlan>>(specs.size());
  thread_local IdIndex unique;
  for (size_t s = 0; s < specs.size(); ++s) {
    const PullSpec& spec = specs[s];
    auto dim = TableDim(spec.table);
    if (!dim.ok()) return Failed(dim.status());
    if (spec.out == nullptr && !spec.ids.empty()) {
      return Failed(absl::InvalidArgumentError(
          absl::StrCat("pull of '", spec.table, "' has no output buffer")));
    }
    PullPlan& plan = (*plans)[s];
    plan.out = spec.out;
    plan.dim = *dim;
    const uint64_t name_hash = NameHash(spec.table);
    unique.Reset(spec.ids.size());
    std::vector<std::string*> ids_of_pod(num_pods, nullptr);
    std::vector<std::vector<uint32_t>*> dest_of_pod(num_pods, nullptr);
    for (size_t i = 0; i < spec.ids.size(); ++i) {
      const int64_t id = spec.ids[i];
      const uint64_t h = RouteHash(name_hash, id);
      bool inserted;
      const uint32_t first = unique.FindOrInsert(id, h, static_cast<uint32_t>(i), &inserted);
      if (!inserted) {
        plan.dups.emplace_back(static_cast<uint32_t>(i), first);
        continue;
      }
      const uint32_t pod = r->map.PodOfVShard(VShardOf(h, num_vshards));
      std::string* ids = ids_of_pod[pod];
      if (ids == nullptr) {
        if (b.rpc_of_pod[pod] < 0) {
          b.rpc_of_pod[pod] = static_cast<int>(b.reqs.size());
          b.pod_of_rpc.push_back(pod);
          b.reqs.emplace_back().set_epoch(r->map.epoch());
          b.reqs.back().set_read_only(read_only);
          b.scatters.push_back(std::make_shared<PullScatter>());
        }
        const int k = b.rpc_of_pod[pod];
        TableIds* entry = b.reqs[k].add_tables();
        entry->set_table(spec.table);
        ids = ids_of_pod[pod] = entry->mutable_ids();
        ids->reserve(ReserveRows(spec.ids.size(), num_pods) * sizeof(int64_t));
        PullScatter& sc = *b.scatters[k];
        sc.entries.push_back({spec.table, spec.out, *dim, {}});
        dest_of_pod[pod] = &sc.entries.back().dest;
        dest_of_pod[pod]->reserve(ReserveRows(spec.ids.size(), num_pods));
      }
      dest_of_pod[pod]->push_back(static_cast<uint32_t>(i));
      ids->append(reinterpret_cast<const char*>(&id), sizeof(id));
    }
  }
  auto rpcs = FinishPull(&b, *r, 0);
  auto op = std::make_shared<Op>(static_cast<int>(rpcs.size()));
  // The duplicates are filled in last, once every pod's rows are in place.
  op->set_finish([plans]() -> absl::Status {
    for (const PullPlan& plan : *plans) {
      const size_t row_bytes = plan.dim * sizeof(float);
      char* out = reinterpret_cast<char*>(plan.out);
      for (auto [i, first] : plan.dups) {
        std::memcpy(out + i * row_bytes, out + first * row_bytes, row_bytes);
      }
    }
    return absl::OkStatus();
  });
  StartRaw(kRawPull, std::move(rpcs), op);
  return Handle(op);
}

std::vector<std::shared_ptr<RawRpc>> PsClientImpl::MakePushRpcs(
    std::vector<PushRequest>* reqs, const std::vector<uint32_t>& pod_of_rpc, const Routing& r,
    int reroutes) {
  std::vector<std::shared_ptr<RawRpc>> rpcs;
  for (size_t k = 0; k < reqs->size(); ++k) {
    auto rpc = std::shared_ptr<RawRpc>(
        MakeRpc<grpc::ByteBuffer, grpc::ByteBuffer>(r.pods[pod_of_rpc[k]], r.map.epoch()));
    rpc->req = wire::EncodePushRequest(&(*reqs)[k]);
    rpc->reroutes = reroutes;
    RawRpc* raw = rpc.get();
    rpc->reroute = [this, raw](const std::shared_ptr<Op>& op) { ReroutePush(raw, op); };
    rpcs.push_back(std::move(rpc));
  }
  return rpcs;
}

// The pod refused the whole request (FAILED_PRECONDITION: it applied none of it), so its
// rows go out again under the current map as a new push, with a new key.
void PsClientImpl::ReroutePush(RawRpc* rpc, const std::shared_ptr<Op>& op) {
  grpc::ByteBuffer raw(rpc->req);
  PushRequest req;
  if (!grpc::SerializationTraits<PushRequest>::Deserialize(&raw, &req).ok()) {
    op->Add(1);
    return op->RpcDone(absl::InternalError("cannot re-route a push: its request is unreadable"));
  }
  auto r = routing();
  const uint32_t num_pods = r->map.num_pods();
  const PushKey key = NextKey();
  std::vector<PushRequest> reqs;
  std::vector<uint32_t> pod_of_rpc;
  std::vector<int> rpc_of_pod(num_pods, -1);
  for (const TableGrads& t : req.tables()) {
    const size_t n = t.ids().size() / sizeof(int64_t);
    if (n == 0) continue;
    const size_t row_bytes = t.grads().size() / n;
    const uint64_t name_hash = NameHash(t.table());
    std::vector<TableGrads*> entry_of_pod(num_pods, nullptr);
    for (size_t k = 0; k < n; ++k) {
      int64_t id;
      std::memcpy(&id, t.ids().data() + k * sizeof(id), sizeof(id));
      const uint32_t pod = r->map.PodOf(name_hash, id);
      if (rpc_of_pod[pod] < 0) {
        rpc_of_pod[pod] = static_cast<int>(reqs.size());
        pod_of_rpc.push_back(pod);
        reqs.emplace_back().set_epoch(r->map.epoch());
        *reqs.back().mutable_key() = key;
      }
      TableGrads*& entry = entry_of_pod[pod];
      if (entry == nullptr) {
        entry = reqs[rpc_of_pod[pod]].add_tables();
        entry->set_table(t.table());
        entry->set_learning_rate(t.learning_rate());
      }
      entry->mutable_ids()->append(reinterpret_cast<const char*>(&id), sizeof(id));
      entry->mutable_grads()->append(t.grads().data() + k * row_bytes, row_bytes);
    }
  }
  auto rpcs = MakePushRpcs(&reqs, pod_of_rpc, *r, rpc->reroutes + 1);
  op->Add(static_cast<int>(rpcs.size()));
  StartRaw(kRawPush, std::move(rpcs), op);
}

Handle PsClientImpl::PushAsync(std::vector<PushSpec> specs) {
  auto r = routing();
  const uint32_t num_pods = r->map.num_pods();
  const uint32_t num_vshards = r->map.num_vshards();
  std::vector<PushRequest> reqs;  // per RPC, encoded once complete
  std::vector<uint32_t> pod_of_rpc;
  std::vector<int> rpc_of_pod(num_pods, -1);
  const PushKey key = NextKey();
  thread_local IdIndex unique;
  // Per unique id of the current spec: its pod and position in that pod's entry.
  std::vector<std::pair<uint32_t, uint32_t>> where;
  for (const PushSpec& spec : specs) {
    auto table_dim = TableDim(spec.table);
    if (!table_dim.ok()) return Failed(table_dim.status());
    if (spec.grads == nullptr && !spec.ids.empty()) {
      return Failed(
          absl::InvalidArgumentError(absl::StrCat("push to '", spec.table, "' has no gradients")));
    }
    const uint32_t dim = *table_dim;
    const size_t row_bytes = dim * sizeof(float);
    const uint64_t name_hash = NameHash(spec.table);
    // Per pod: the ids and gradients of its entry for this table (null until it has one).
    struct Entry {
      std::string* ids = nullptr;
      std::string* grads = nullptr;
    };
    std::vector<Entry> entry_of_pod(num_pods);
    unique.Reset(spec.ids.size());
    where.clear();
    for (size_t i = 0; i < spec.ids.size(); ++i) {
      const int64_t id = spec.ids[i];
      const float* g = spec.grads + i * dim;
      const uint64_t h = RouteHash(name_hash, id);
      bool inserted;
      const uint32_t u = unique.FindOrInsert(id, h, static_cast<uint32_t>(where.size()), &inserted);
      if (!inserted) {  // a duplicate: sum into the first row
        auto [pod, pos] = where[u];
        float* row = reinterpret_cast<float*>(entry_of_pod[pod].grads->data() + pos * row_bytes);
        for (uint32_t j = 0; j < dim; ++j) row[j] += g[j];
        continue;
      }
      const uint32_t pod = r->map.PodOfVShard(VShardOf(h, num_vshards));
      Entry& entry = entry_of_pod[pod];
      if (entry.ids == nullptr) {
        if (rpc_of_pod[pod] < 0) {
          rpc_of_pod[pod] = static_cast<int>(reqs.size());
          pod_of_rpc.push_back(pod);
          reqs.emplace_back().set_epoch(r->map.epoch());
          *reqs.back().mutable_key() = key;
        }
        TableGrads* t = reqs[rpc_of_pod[pod]].add_tables();
        t->set_table(spec.table);
        t->set_learning_rate(spec.learning_rate);
        entry.ids = t->mutable_ids();
        entry.grads = t->mutable_grads();
        const size_t expect = ReserveRows(spec.ids.size(), num_pods);
        entry.ids->reserve(expect * sizeof(int64_t));
        entry.grads->reserve(expect * row_bytes);
      }
      const uint32_t pos = static_cast<uint32_t>(entry.ids->size() / sizeof(int64_t));
      entry.ids->append(reinterpret_cast<const char*>(&id), sizeof(id));
      entry.grads->append(reinterpret_cast<const char*>(g), row_bytes);
      where.emplace_back(pod, pos);
    }
  }
  auto rpcs = MakePushRpcs(&reqs, pod_of_rpc, *r, 0);
  auto op = std::make_shared<Op>(static_cast<int>(rpcs.size()));
  StartRaw(kRawPush, std::move(rpcs), op);
  return Handle(op);
}

absl::Status PsClientImpl::PullDense(const std::vector<std::string>& names,
                                     const std::vector<float*>& out) {
  if (names.size() != out.size()) return absl::InvalidArgumentError("names and out differ in size");
  std::vector<size_t> numel(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    ASSIGN_OR_RETURN(DenseSpec spec, GetDense(names[i]));
    numel[i] = 1;
    for (int64_t d : spec.shape()) numel[i] *= d;
  }
  // A pull is idempotent: after a map change it simply runs again under the new map.
  for (int round = 0;; ++round) {
    auto r = routing();
    std::vector<std::unique_ptr<Rpc<DensePullRequest, DensePullResponse>>> rpcs;
    std::vector<int> rpc_of_pod(r->map.num_pods(), -1);
    for (size_t i = 0; i < names.size(); ++i) {
      const uint32_t pod = r->map.PodOfVShard(DenseVShard(names[i], r->map.num_vshards()));
      if (rpc_of_pod[pod] < 0) {
        rpc_of_pod[pod] = static_cast<int>(rpcs.size());
        rpcs.push_back(MakeRpc<DensePullRequest, DensePullResponse>(r->pods[pod], r->map.epoch()));
        rpcs.back()->req.set_epoch(r->map.epoch());
      }
      rpcs[rpc_of_pod[pod]]->req.add_names(names[i]);
    }
    absl::Status s = RunAll(&Stub::PrepareAsyncPullDense, &rpcs);
    if (!s.ok()) {
      if (master_ == nullptr || round >= options_.max_reroutes ||
          s.code() != absl::StatusCode::kFailedPrecondition ||
          s.message().find("does not own") == absl::string_view::npos) {
        return s;
      }
      absl::Notification refreshed;
      RefreshMap(r->map.epoch(), [&] { refreshed.Notify(); });
      refreshed.WaitForNotification();
      continue;
    }
    absl::flat_hash_map<std::string, const std::string*> values;
    for (const auto& rpc : rpcs) {
      for (const DenseValues& v : rpc->resp.tensors()) values[v.name()] = &v.values();
    }
    for (size_t i = 0; i < names.size(); ++i) {
      auto it = values.find(names[i]);
      if (it == values.end() || it->second->size() != numel[i] * sizeof(float)) {
        return absl::InternalError(
            absl::StrCat("dense pull of '", names[i], "' came back malformed"));
      }
      std::memcpy(out[i], it->second->data(), it->second->size());
    }
    return absl::OkStatus();
  }
}

absl::Status PsClientImpl::PushDense(const std::vector<std::string>& names,
                                     const std::vector<const float*>& grads, float lr) {
  if (names.size() != grads.size())
    return absl::InvalidArgumentError("names and grads differ in size");
  std::vector<size_t> numel(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    ASSIGN_OR_RETURN(DenseSpec spec, GetDense(names[i]));
    numel[i] = 1;
    for (int64_t d : spec.shape()) numel[i] *= d;
  }
  // Tensors still to push; after a pod refuses its part (applying none of it) that part
  // goes out again under the new map with a new key.
  std::vector<size_t> todo(names.size());
  for (size_t i = 0; i < todo.size(); ++i) todo[i] = i;
  for (int round = 0;; ++round) {
    auto r = routing();
    const PushKey key = NextKey();
    std::vector<std::unique_ptr<Rpc<DensePushRequest, PushResponse>>> rpcs;
    std::vector<std::vector<size_t>> tensors_of_rpc;
    std::vector<int> rpc_of_pod(r->map.num_pods(), -1);
    for (size_t i : todo) {
      const uint32_t pod = r->map.PodOfVShard(DenseVShard(names[i], r->map.num_vshards()));
      if (rpc_of_pod[pod] < 0) {
        rpc_of_pod[pod] = static_cast<int>(rpcs.size());
        rpcs.push_back(MakeRpc<DensePushRequest, PushResponse>(r->pods[pod], r->map.epoch()));
        rpcs.back()->req.set_epoch(r->map.epoch());
        *rpcs.back()->req.mutable_key() = key;
        tensors_of_rpc.emplace_back();
      }
      DenseGrads* g = rpcs[rpc_of_pod[pod]]->req.add_tensors();
      g->set_name(names[i]);
      g->set_grads(reinterpret_cast<const char*>(grads[i]), numel[i] * sizeof(float));
      g->set_learning_rate(lr);
      tensors_of_rpc[rpc_of_pod[pod]].push_back(i);
    }
    absl::Status s = RunAll(&Stub::PrepareAsyncPushDense, &rpcs);
    if (s.ok()) return s;
    std::vector<size_t> again;
    for (size_t k = 0; k < rpcs.size(); ++k) {
      const absl::Status& rs = rpcs[k]->status;
      if (rs.ok()) continue;
      if (master_ == nullptr || round >= options_.max_reroutes ||
          rs.code() != absl::StatusCode::kFailedPrecondition ||
          rs.message().find("does not own") == absl::string_view::npos) {
        return rs;
      }
      again.insert(again.end(), tensors_of_rpc[k].begin(), tensors_of_rpc[k].end());
    }
    todo = std::move(again);
    absl::Notification refreshed;
    RefreshMap(r->map.epoch(), [&] { refreshed.Notify(); });
    refreshed.WaitForNotification();
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Connect(const ClientOptions& options) {
  if (options.servers.empty() && options.master.empty()) {
    return absl::InvalidArgumentError("no PS servers and no master given");
  }
  RETURN_IF_ERROR(ChannelMaker::Create(options.security).status());
  if (options.deadline_ms <= 0 || options.max_attempts < 1 || options.initial_backoff_ms < 1 ||
      options.max_backoff_ms < options.initial_backoff_ms) {
    return absl::InvalidArgumentError(
        "need deadline_ms > 0, max_attempts >= 1, 1 <= initial_backoff_ms <= max_backoff_ms");
  }
  if (options.master.empty()) {
    ASSIGN_OR_RETURN(ShardMap map, ShardMap::Static(options.num_vshards,
                                                    static_cast<uint32_t>(options.servers.size())));
    auto routing = std::make_shared<Routing>();
    routing->map = std::move(map);
    for (size_t i = 0; i < options.servers.size(); ++i) {
      routing->pods.push_back(
          PsClientImpl::NewPod(options, absl::StrCat("pod ", i), options.servers[i]));
      routing->up.push_back(true);
    }
    auto client = std::make_unique<PsClientImpl>(options, std::move(routing));
    RETURN_IF_ERROR(client->Init());
    return std::unique_ptr<PsClient>(std::move(client));
  }
  // From the master: retry while pods start or have not applied the map yet.
  auto stub = Master::NewStub(Channels(options).Make(options.master));
  const absl::Time deadline = absl::Now() + absl::Milliseconds(options.connect_timeout_ms);
  absl::Duration backoff = absl::Milliseconds(options.initial_backoff_ms);
  for (;;) {
    absl::Status s;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ShardMapResponse resp;
    grpc::Status gs = stub->GetShardMap(&ctx, GetShardMapRequest(), &resp);
    if (gs.ok()) {
      // Every owner live, so Init's Describe reaches them.
      for (uint32_t pod : resp.owner()) {
        if (pod < static_cast<uint32_t>(resp.pods_size()) &&
            resp.pods(pod).state() != PodInfo::LIVE && s.ok()) {
          s = absl::UnavailableError(absl::StrCat("pod ", resp.pods(pod).pod_id(), " is ",
                                                  PodInfo::State_Name(resp.pods(pod).state())));
        }
      }
      if (s.ok()) {
        auto routing = PsClientImpl::RoutingFromMap(options, resp, nullptr);
        if (routing.ok()) {
          auto client = std::make_unique<PsClientImpl>(options, *std::move(routing));
          s = client->Init();
          if (s.ok()) return std::unique_ptr<PsClient>(std::move(client));
        } else {
          s = routing.status();
        }
      }
    } else {
      s = FromGrpcStatus(gs);
    }
    const bool retry = s.code() == absl::StatusCode::kUnavailable ||
                       s.code() == absl::StatusCode::kFailedPrecondition ||
                       s.code() == absl::StatusCode::kDeadlineExceeded;
    if (!retry || absl::Now() + backoff > deadline) {
      return absl::Status(
          s.code(), absl::StrCat("connecting through master ", options.master, ": ", s.message()));
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(options.max_backoff_ms));
  }
}

}  // namespace ps
