#include "client/ps_client.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstring>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/id_index.h"
#include "client/shard_map.h"
#include "client/timer.h"
#include "embedding/hash.h"
#include "embedding/status_macros.h"
#include "proto/master.grpc.pb.h"
#include "proto/ps.grpc.pb.h"
#include "proto/wire.h"
#include "ps/shard_ownership.h"

namespace ps {
namespace internal {

// One logical call: several RPCs (one per pod) that finish independently; the last one
// to finish marks the op done. `finish` runs once, on the waiting thread, after all RPCs
// succeeded (a pull's duplicate rows).
class Op {
 public:
  explicit Op(int pending) : pending_(pending) {}

  void RpcDone(const absl::Status& s) {
    absl::MutexLock lock(&mu_);
    if (!s.ok() && status_.ok()) status_ = s;
    --pending_;
  }

  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* pending) { return *pending == 0; }, &pending_));
    if (!finished_) {
      finished_ = true;
      if (status_.ok() && finish_) status_ = finish_();
      finish_ = nullptr;  // frees the plan
    }
    return status_;
  }

  void set_finish(std::function<absl::Status()> f) { finish_ = std::move(f); }

 private:
  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::function<absl::Status()> finish_;  // set before any RPC starts
};

}  // namespace internal

absl::Status Handle::Wait() {
  if (op_ == nullptr) return absl::FailedPreconditionError("Wait on an empty Handle");
  return op_->Wait();
}

namespace {

using internal::Op;
using Stub = ParameterServer::Stub;
using AsyncIface = ParameterServer::StubInterface::async_interface;

template <typename Req, typename Resp>
using AsyncMethod = void (AsyncIface::*)(grpc::ClientContext*, const Req*, Resp*,
                                         std::function<void(grpc::Status)>);

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

// One RPC to one pod, re-sent as is on retry.
template <typename Req, typename Resp>
struct Rpc {
  uint32_t pod = 0;
  Req req;
  Resp resp;
  std::unique_ptr<grpc::ClientContext> ctx;
  int attempt = 0;
  // If set, runs on gRPC's thread when the RPC succeeds, before the op learns of it; its
  // error becomes the RPC's. A pull scatters its rows here, while they are in cache.
  std::function<absl::Status()> on_ok;
};

struct Pod {
  std::string address;
  std::vector<std::unique_ptr<Stub>> stubs;
  std::vector<std::unique_ptr<grpc::GenericStub>> raw_stubs;  // on the same channels
  std::atomic<uint32_t> next{0};

  uint32_t NextChannel() {
    return next.fetch_add(1, std::memory_order_relaxed) % static_cast<uint32_t>(stubs.size());
  }
};

template <typename Req, typename Resp>
void Invoke(Pod& pod, AsyncMethod<Req, Resp> method, grpc::ClientContext* ctx, const Req* req,
            Resp* resp, std::function<void(grpc::Status)> done) {
  (pod.stubs[pod.NextChannel()]->async()->*method)(ctx, req, resp, std::move(done));
}

void Invoke(Pod& pod, RawMethod method, grpc::ClientContext* ctx, const grpc::ByteBuffer* req,
            grpc::ByteBuffer* resp, std::function<void(grpc::Status)> done) {
  pod.raw_stubs[pod.NextChannel()]->UnaryCall(ctx, method.name, grpc::StubOptions(), req, resp,
                                              std::move(done));
}

// The channels of `options.security`; its files were read once already by Connect, so a
// failure here (a file removed since) leaves plain text without a token, which a secured
// server refuses.
ChannelMaker Channels(const ClientOptions& options) {
  return ChannelMaker::Create(options.security).value_or(ChannelMaker());
}

class PsClientImpl final : public PsClient {
 public:
  explicit PsClientImpl(const ClientOptions& options, ShardMap map)
      : options_(options), map_(std::move(map)), worker_id_(options.worker_id) {
    if (worker_id_ == 0) {
      std::random_device rd;
      while (worker_id_ == 0) worker_id_ = (uint64_t{rd()} << 32) | rd();
    }
    const ChannelMaker channels = Channels(options_);
    for (const std::string& address : options_.servers) {
      auto pod = std::make_unique<Pod>();
      pod->address = address;
      for (int c = 0; c < std::max(1, options_.channels_per_server); ++c) {
        grpc::ChannelArguments args;
        args.SetMaxReceiveMessageSize(options_.max_message_bytes);
        args.SetMaxSendMessageSize(options_.max_message_bytes);
        // Own connection per channel, rather than one shared subchannel.
        args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
        // The client retries on its own (with backoff and push keys); gRPC's transparent
        // retry layer would only add per-call work (it buffers every message it sends).
        args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
        args.SetInt("ps.channel_index", c);
        args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, options_.initial_backoff_ms);
        args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, options_.max_backoff_ms);
        auto channel = channels.Make(address, args);
        pod->stubs.push_back(ParameterServer::NewStub(channel));
        pod->raw_stubs.push_back(std::make_unique<grpc::GenericStub>(channel));
      }
      pods_.push_back(std::move(pod));
    }
  }

  ~PsClientImpl() override {
    absl::MutexLock lock(&inflight_mu_);
    inflight_mu_.Await(absl::Condition(
        +[](int* n) { return *n == 0; }, &inflight_rpcs_));
  }

  absl::Status Init() {
    std::vector<std::unique_ptr<Rpc<DescribeRequest, DescribeResponse>>> rpcs;
    for (uint32_t p = 0; p < pods_.size(); ++p)
      rpcs.push_back(MakeRpc<DescribeRequest, DescribeResponse>(p));
    RETURN_IF_ERROR(RunAll(&AsyncIface::Describe, &rpcs));
    for (const auto& rpc : rpcs) {
      const DescribeResponse& d = rpc->resp;
      const std::string& where = pods_[rpc->pod]->address;
      if (d.num_vshards() != map_.num_vshards()) {
        return absl::FailedPreconditionError(
            absl::StrCat("pod ", rpc->pod, " (", where, ") has ", d.num_vshards(),
                         " vshards; the client is configured with ", map_.num_vshards()));
      }
      for (uint32_t v = 0; v < map_.num_vshards(); ++v) {
        const bool owns = (static_cast<uint8_t>(d.owned_vshards()[v >> 3]) >> (v & 7)) & 1;
        if (owns != (map_.PodOfVShard(v) == rpc->pod)) {
          return absl::FailedPreconditionError(
              absl::StrCat("pod ", rpc->pod, " (", where, ") ", owns ? "owns" : "does not own",
                           " vshard ", v, ", unlike the shard map (epoch ", map_.epoch(), ") of ",
                           pods_.size(), " pods. Static map: start pod i with --shard=i/",
                           pods_.size(), " and list the servers in that order"));
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
    return CreateOnEveryPod<CreateTableRequest, CreateTableResponse>(&AsyncIface::CreateTable,
                                                                     spec);
  }

  absl::Status CreateDense(const DenseSpec& spec) override {
    return CreateOnEveryPod<CreateDenseRequest, CreateDenseResponse>(&AsyncIface::CreateDense,
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
    std::vector<std::unique_ptr<Rpc<StatsRequest, StatsResponse>>> rpcs;
    for (uint32_t p = 0; p < pods_.size(); ++p)
      rpcs.push_back(MakeRpc<StatsRequest, StatsResponse>(p));
    RETURN_IF_ERROR(RunAll(&AsyncIface::Stats, &rpcs));
    std::vector<StatsResponse> out;
    for (auto& rpc : rpcs) out.push_back(std::move(rpc->resp));
    return out;
  }

 private:
  template <typename Req, typename Resp>
  std::unique_ptr<Rpc<Req, Resp>> MakeRpc(uint32_t pod) {
    auto rpc = std::make_unique<Rpc<Req, Resp>>();
    rpc->pod = pod;
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

  template <typename Method, typename Req, typename Resp>
  void Start(Method method, Rpc<Req, Resp>* rpc, std::shared_ptr<Op> op) {
    rpc->ctx = std::make_unique<grpc::ClientContext>();
    rpc->ctx->set_deadline(std::chrono::system_clock::now() +
                           std::chrono::milliseconds(options_.deadline_ms));
    Invoke(
        *pods_[rpc->pod], method, rpc->ctx.get(), &rpc->req, &rpc->resp,
        [this, method, rpc, op = std::move(op)](grpc::Status s) mutable {
          ++rpc->attempt;
          if (!s.ok() && Retryable(s.error_code()) && rpc->attempt < options_.max_attempts) {
            timer_.After(Backoff(rpc->attempt), [this, method, rpc, op = std::move(op)]() mutable {
              rpc->resp.Clear();
              Start(method, rpc, std::move(op));
            });
            return;
          }
          absl::Status status;
          if (!s.ok()) {
            status = absl::Status(
                static_cast<absl::StatusCode>(s.error_code()),
                absl::StrCat(
                    "pod ", rpc->pod, " (", pods_[rpc->pod]->address, "): ", s.error_message(),
                    rpc->attempt > 1 ? absl::StrCat(" [after ", rpc->attempt, " attempts]") : ""));
          } else if (rpc->on_ok) {
            status = rpc->on_ok();
          }
          op->RpcDone(status);
          absl::MutexLock lock(&inflight_mu_);
          --inflight_rpcs_;
        });
  }

  absl::Duration Backoff(int attempt) {
    const int64_t cap = std::min<int64_t>(
        options_.max_backoff_ms, int64_t{options_.initial_backoff_ms} << std::min(attempt - 1, 20));
    thread_local std::mt19937_64 rng(std::random_device{}());
    return absl::Milliseconds(cap / 2 + static_cast<int64_t>(rng() % (cap / 2 + 1)));
  }

  // Starts every RPC of `rpcs` under one op and returns a handle; `finish` runs on Wait.
  template <typename Method, typename Req, typename Resp>
  Handle StartAll(Method method, std::shared_ptr<std::vector<std::unique_ptr<Rpc<Req, Resp>>>> rpcs,
                  std::function<absl::Status()> finish) {
    auto op = std::make_shared<Op>(static_cast<int>(rpcs->size()));
    // The op's finish closure owns the RPCs, so they live until every callback is done.
    op->set_finish(
        [rpcs, finish = std::move(finish)] { return finish ? finish() : absl::OkStatus(); });
    for (auto& rpc : *rpcs) Begin(method, rpc.get(), op);
    return Handle(op);
  }

  // Blocking fan-out over caller-owned RPCs.
  template <typename Req, typename Resp>
  absl::Status RunAll(AsyncMethod<Req, Resp> method,
                      std::vector<std::unique_ptr<Rpc<Req, Resp>>>* rpcs) {
    auto op = std::make_shared<Op>(static_cast<int>(rpcs->size()));
    for (auto& rpc : *rpcs) Begin(method, rpc.get(), op);
    return op->Wait();
  }

  // Sends the create request to every pod (in parallel), then refreshes the catalog.
  template <typename Req, typename Resp, typename Spec>
  absl::Status CreateOnEveryPod(AsyncMethod<Req, Resp> method, const Spec& spec) {
    std::vector<std::unique_ptr<Rpc<Req, Resp>>> rpcs;
    for (uint32_t p = 0; p < pods_.size(); ++p) {
      rpcs.push_back(MakeRpc<Req, Resp>(p));
      *rpcs.back()->req.mutable_spec() = spec;
    }
    RETURN_IF_ERROR(RunAll(method, &rpcs));
    return RefreshCatalog();
  }

  absl::Status RefreshCatalog() {
    std::vector<std::unique_ptr<Rpc<DescribeRequest, DescribeResponse>>> rpcs;
    rpcs.push_back(MakeRpc<DescribeRequest, DescribeResponse>(0));
    RETURN_IF_ERROR(RunAll(&AsyncIface::Describe, &rpcs));
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
  size_t ReserveRows(size_t n) const {
    const size_t pods = map_.num_pods();
    return pods == 1 ? n : n / pods + n / (4 * pods) + 16;
  }

  Handle Failed(absl::Status s) {
    auto op = std::make_shared<Op>(0);
    op->set_finish([s] { return s; });
    return Handle(op);
  }

  // Constant after construction.
  const ClientOptions options_;
  const ShardMap map_;
  uint64_t worker_id_;
  std::vector<std::unique_ptr<Pod>> pods_;

  std::atomic<uint64_t> sequence_{1};
  absl::Mutex inflight_mu_;
  int inflight_rpcs_ ABSL_GUARDED_BY(inflight_mu_) = 0;
  absl::Mutex catalog_mu_;
  absl::flat_hash_map<std::string, TableSpec> tables_ ABSL_GUARDED_BY(catalog_mu_);
  absl::flat_hash_map<std::string, DenseSpec> dense_ ABSL_GUARDED_BY(catalog_mu_);
  Timer timer_;  // last: destroyed first, so no retry fires into a dying client
};

// Where the rows of one table's pull go: the row at position k of pod p's entry for this
// table is written to out row dest[p][k] (the first request index of that id); a repeated
// id's row is then copied from its first occurrence (dups).
struct PullPlan {
  std::string table;
  float* out;
  uint32_t dim;
  std::vector<int> entry_of_pod;                    // per pod: entry index, or -1
  std::vector<std::vector<uint32_t>> dest;          // per pod, per entry position
  std::vector<std::pair<uint32_t, uint32_t>> dups;  // (request index, first index)
};

Handle PsClientImpl::PullAsync(std::vector<PullSpec> specs, bool read_only) {
  using PullRpc = Rpc<grpc::ByteBuffer, grpc::ByteBuffer>;
  const uint32_t num_pods = map_.num_pods();
  const uint32_t num_vshards = map_.num_vshards();
  std::vector<PullRequest> reqs;  // per RPC, encoded once complete
  std::vector<uint32_t> pod_of_rpc;
  std::vector<int> rpc_of_pod(num_pods, -1);
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
    plan.table = spec.table;
    plan.out = spec.out;
    plan.dim = *dim;
    plan.entry_of_pod.assign(num_pods, -1);
    plan.dest.resize(num_pods);
    const uint64_t name_hash = NameHash(spec.table);
    unique.Reset(spec.ids.size());
    std::vector<std::string*> ids_of_pod(num_pods, nullptr);
    for (size_t i = 0; i < spec.ids.size(); ++i) {
      const int64_t id = spec.ids[i];
      const uint64_t h = RouteHash(name_hash, id);
      bool inserted;
      const uint32_t first = unique.FindOrInsert(id, h, static_cast<uint32_t>(i), &inserted);
      if (!inserted) {
        plan.dups.emplace_back(static_cast<uint32_t>(i), first);
        continue;
      }
      const uint32_t pod = map_.PodOfVShard(VShardOf(h, num_vshards));
      std::string* ids = ids_of_pod[pod];
      if (ids == nullptr) {
        if (rpc_of_pod[pod] < 0) {
          rpc_of_pod[pod] = static_cast<int>(reqs.size());
          pod_of_rpc.push_back(pod);
          reqs.emplace_back().set_epoch(map_.epoch());
          reqs.back().set_read_only(read_only);
        }
        PullRequest& req = reqs[rpc_of_pod[pod]];
        plan.entry_of_pod[pod] = req.tables_size();
        TableIds* entry = req.add_tables();
        entry->set_table(spec.table);
        ids = ids_of_pod[pod] = entry->mutable_ids();
        ids->reserve(ReserveRows(spec.ids.size()) * sizeof(int64_t));
        plan.dest[pod].reserve(ReserveRows(spec.ids.size()));
      }
      plan.dest[pod].push_back(static_cast<uint32_t>(i));
      ids->append(reinterpret_cast<const char*>(&id), sizeof(id));
    }
  }
  auto rpcs = std::make_shared<std::vector<std::unique_ptr<PullRpc>>>();
  for (size_t r = 0; r < reqs.size(); ++r) {
    rpcs->push_back(MakeRpc<grpc::ByteBuffer, grpc::ByteBuffer>(pod_of_rpc[r]));
    rpcs->back()->req = wire::EncodePullRequest(&reqs[r]);
  }
  // Each RPC scatters its pod's rows as it completes; the duplicates are filled in last,
  // once every pod's rows are in place.
  for (auto& rpc : *rpcs) {
    PullRpc* r = rpc.get();
    r->on_ok = [plans, r]() -> absl::Status {
      std::vector<grpc::Slice> slices;
      std::vector<absl::string_view> pieces = wire::Pieces(r->resp, &slices);
      r->resp.Clear();  // the slices hold the memory from here
      uint64_t epoch;
      std::vector<wire::TableValuesView> tables;
      absl::Status s = wire::DecodePullResponse(pieces, &epoch, &tables);
      if (!s.ok()) return absl::InternalError(absl::StrCat("pod ", r->pod, ": ", s.message()));
      for (const PullPlan& plan : *plans) {
        const int e = plan.entry_of_pod[r->pod];
        if (e < 0) continue;
        const size_t row_bytes = plan.dim * sizeof(float);
        const std::vector<uint32_t>& dest = plan.dest[r->pod];
        if (static_cast<size_t>(e) >= tables.size() ||
            tables[e].values_bytes != dest.size() * row_bytes) {
          return absl::InternalError(absl::StrCat("pod ", r->pod, " answered a pull of '",
                                                  plan.table, "' with the wrong number of values"));
        }
        char* out = reinterpret_cast<char*>(plan.out);
        wire::Reader values(tables[e].values);
        for (uint32_t i : dest) values.CopyTo(out + i * row_bytes, row_bytes);
      }
      return absl::OkStatus();
    };
  }
  auto finish = [plans]() -> absl::Status {
    for (const PullPlan& plan : *plans) {
      const size_t row_bytes = plan.dim * sizeof(float);
      char* out = reinterpret_cast<char*>(plan.out);
      for (auto [i, first] : plan.dups) {
        std::memcpy(out + i * row_bytes, out + first * row_bytes, row_bytes);
      }
    }
    return absl::OkStatus();
  };
  return StartAll(kRawPull, rpcs, finish);
}

Handle PsClientImpl::PushAsync(std::vector<PushSpec> specs) {
  using PushRpc = Rpc<grpc::ByteBuffer, grpc::ByteBuffer>;
  const uint32_t num_pods = map_.num_pods();
  const uint32_t num_vshards = map_.num_vshards();
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
      const uint32_t pod = map_.PodOfVShard(VShardOf(h, num_vshards));
      Entry& entry = entry_of_pod[pod];
      if (entry.ids == nullptr) {
        if (rpc_of_pod[pod] < 0) {
          rpc_of_pod[pod] = static_cast<int>(reqs.size());
          pod_of_rpc.push_back(pod);
          reqs.emplace_back().set_epoch(map_.epoch());
          *reqs.back().mutable_key() = key;
        }
        TableGrads* t = reqs[rpc_of_pod[pod]].add_tables();
        t->set_table(spec.table);
        t->set_learning_rate(spec.learning_rate);
        entry.ids = t->mutable_ids();
        entry.grads = t->mutable_grads();
        const size_t expect = ReserveRows(spec.ids.size());
        entry.ids->reserve(expect * sizeof(int64_t));
        entry.grads->reserve(expect * row_bytes);
      }
      const uint32_t pos = static_cast<uint32_t>(entry.ids->size() / sizeof(int64_t));
      entry.ids->append(reinterpret_cast<const char*>(&id), sizeof(id));
      entry.grads->append(reinterpret_cast<const char*>(g), row_bytes);
      where.emplace_back(pod, pos);
    }
  }
  auto rpcs = std::make_shared<std::vector<std::unique_ptr<PushRpc>>>();
  for (size_t r = 0; r < reqs.size(); ++r) {
    rpcs->push_back(MakeRpc<grpc::ByteBuffer, grpc::ByteBuffer>(pod_of_rpc[r]));
    rpcs->back()->req = wire::EncodePushRequest(&reqs[r]);
  }
  return StartAll(kRawPush, rpcs, nullptr);
}

absl::Status PsClientImpl::PullDense(const std::vector<std::string>& names,
                                     const std::vector<float*>& out) {
  if (names.size() != out.size()) return absl::InvalidArgumentError("names and out differ in size");
  std::vector<std::unique_ptr<Rpc<DensePullRequest, DensePullResponse>>> rpcs;
  std::vector<int> rpc_of_pod(map_.num_pods(), -1);
  std::vector<size_t> numel(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    ASSIGN_OR_RETURN(DenseSpec spec, GetDense(names[i]));
    numel[i] = 1;
    for (int64_t d : spec.shape()) numel[i] *= d;
    const uint32_t pod = map_.PodOfVShard(DenseVShard(names[i], map_.num_vshards()));
    if (rpc_of_pod[pod] < 0) {
      rpc_of_pod[pod] = static_cast<int>(rpcs.size());
      rpcs.push_back(MakeRpc<DensePullRequest, DensePullResponse>(pod));
      rpcs.back()->req.set_epoch(map_.epoch());
    }
    rpcs[rpc_of_pod[pod]]->req.add_names(names[i]);
  }
  RETURN_IF_ERROR(RunAll(&AsyncIface::PullDense, &rpcs));
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

absl::Status PsClientImpl::PushDense(const std::vector<std::string>& names,
                                     const std::vector<const float*>& grads, float lr) {
  if (names.size() != grads.size())
    return absl::InvalidArgumentError("names and grads differ in size");
  std::vector<std::unique_ptr<Rpc<DensePushRequest, PushResponse>>> rpcs;
  std::vector<int> rpc_of_pod(map_.num_pods(), -1);
  const PushKey key = NextKey();
  for (size_t i = 0; i < names.size(); ++i) {
    ASSIGN_OR_RETURN(DenseSpec spec, GetDense(names[i]));
    size_t numel = 1;
    for (int64_t d : spec.shape()) numel *= d;
    const uint32_t pod = map_.PodOfVShard(DenseVShard(names[i], map_.num_vshards()));
    if (rpc_of_pod[pod] < 0) {
      rpc_of_pod[pod] = static_cast<int>(rpcs.size());
      rpcs.push_back(MakeRpc<DensePushRequest, PushResponse>(pod));
      rpcs.back()->req.set_epoch(map_.epoch());
      *rpcs.back()->req.mutable_key() = key;
    }
    DenseGrads* g = rpcs[rpc_of_pod[pod]]->req.add_tensors();
    g->set_name(names[i]);
    g->set_grads(reinterpret_cast<const char*>(grads[i]), numel * sizeof(float));
    g->set_learning_rate(lr);
  }
  return RunAll(&AsyncIface::PushDense, &rpcs);
}

}  // namespace

namespace {

// The pods and vshard map the master holds; UNAVAILABLE while a pod that owns vshards is
// not live (still starting, or restarting).
absl::StatusOr<std::pair<std::vector<std::string>, ShardMap>> MapFromMaster(
    const ClientOptions& options) {
  auto stub = Master::NewStub(Channels(options).Make(options.master));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  ShardMapResponse resp;
  grpc::Status status = stub->GetShardMap(&ctx, GetShardMapRequest(), &resp);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  }
  std::vector<std::string> servers;
  for (const PodInfo& pod : resp.pods()) servers.push_back(pod.address());
  std::vector<uint32_t> owner(resp.owner().begin(), resp.owner().end());
  for (uint32_t pod : owner) {
    if (pod >= static_cast<uint32_t>(resp.pods_size())) {
      return absl::InternalError(
          absl::StrCat("master's map names pod ", pod, " of ", resp.pods_size()));
    }
    if (resp.pods(pod).state() != PodInfo::LIVE) {
      return absl::UnavailableError(absl::StrCat("pod ", resp.pods(pod).pod_id(), " is ",
                                                 PodInfo::State_Name(resp.pods(pod).state())));
    }
  }
  ASSIGN_OR_RETURN(
      ShardMap map,
      ShardMap::FromOwners(std::move(owner), static_cast<uint32_t>(servers.size()), resp.epoch()));
  return std::make_pair(std::move(servers), std::move(map));
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
    auto client = std::make_unique<PsClientImpl>(options, std::move(map));
    RETURN_IF_ERROR(client->Init());
    return std::unique_ptr<PsClient>(std::move(client));
  }
  // From the master: retry while pods start or have not applied the map yet.
  const absl::Time deadline = absl::Now() + absl::Milliseconds(options.connect_timeout_ms);
  absl::Duration backoff = absl::Milliseconds(options.initial_backoff_ms);
  for (;;) {
    absl::Status s;
    auto from_master = MapFromMaster(options);
    if (from_master.ok()) {
      ClientOptions with_pods = options;
      with_pods.servers = from_master->first;
      with_pods.num_vshards = from_master->second.num_vshards();
      auto client = std::make_unique<PsClientImpl>(with_pods, std::move(from_master->second));
      s = client->Init();
      if (s.ok()) return std::unique_ptr<PsClient>(std::move(client));
    } else {
      s = from_master.status();
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
