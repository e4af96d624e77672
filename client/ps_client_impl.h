// PsClient's implementation: owns the pieces and forwards to them. Internal to the
// client library (only its sources include this).
//
//   Router       the routing snapshot and its refresh from the master  (routing.h)
//   RpcRunner    attempts, deadlines, backoff, wrong-shard re-route    (rpc_runner.h)
//   Catalog      table specs, table creation                           (catalog.h)
//   SparseCalls  pulls and pushes of rows                              (sparse_calls.h)
//   DenseCalls   pulls and pushes of dense tensors                     (dense_calls.h)
//   CompletionThreads receive the pods' answers and run completions    (completion_threads.h)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "client/catalog.h"
#include "client/client_counters.h"
#include "client/completion_threads.h"
#include "client/dense_calls.h"
#include "client/inflight.h"
#include "client/ps_client.h"
#include "client/push_keys.h"
#include "client/routing.h"
#include "client/rpc_runner.h"
#include "client/sparse_calls.h"
#include "client/timer.h"
#include "proto/master.grpc.pb.h"

namespace ps::internal {

class PsClientImpl final : public PsClient {
 public:
  // Routes with `routing` (from the master named in options.master, if any, whose later
  // maps it then follows). Makes no call: Init does.
  PsClientImpl(const ClientOptions& options, std::shared_ptr<const Routing> routing);
  // Waits for every call in flight (retries and map refreshes included). Must not run on
  // one of the client's completion threads (fails loudly).
  ~PsClientImpl() override;

  // Describes every pod that is up: checks its vshard count (and, with a static map, its
  // ownership: a wrong --shard flag or server order is an error here, not silent
  // misrouting) and loads the catalog. Defined in connect.cc.
  absl::Status Init();

  uint64_t worker_id() const override { return keys_.worker_id(); }
  uint64_t incarnation() const override { return keys_.incarnation(); }
  absl::Status SetIdentity(uint64_t worker_id, uint64_t incarnation) override {
    return keys_.SetIdentity(worker_id, incarnation);
  }
  ClientStats client_stats() const override { return counters_.Snapshot(); }
  absl::Status CreateTable(const TableSpec& spec) override { return catalog_.CreateTable(spec); }
  absl::Status CreateDense(const DenseSpec& spec) override { return catalog_.CreateDense(spec); }
  absl::StatusOr<TableSpec> GetTable(const std::string& name) override {
    return catalog_.Table(name);
  }
  absl::StatusOr<DenseSpec> GetDense(const std::string& name) override {
    return catalog_.Dense(name);
  }
  using PsClient::PullAsync;
  Handle PullAsync(std::vector<PullSpec> specs, const PullOptions& options) override {
    return sparse_.Pull(std::move(specs), options);
  }
  Handle PushAsync(std::vector<PushSpec> specs) override { return sparse_.Push(std::move(specs)); }
  absl::Status PullDense(const std::vector<std::string>& names,
                         const std::vector<float*>& out) override {
    return dense_.Pull(names, out);
  }
  absl::Status PushDense(const std::vector<std::string>& names,
                         const std::vector<const float*>& grads, float learning_rate) override {
    return dense_.Push(names, grads, learning_rate);
  }
  absl::StatusOr<std::vector<StatsResponse>> Stats() override;
  // Defined in ps_client_views.cc, with Stats.
  absl::StatusOr<std::vector<PodStats>> StatsByPod() override;
  absl::StatusOr<std::vector<PodDescription>> DescribeByPod() override;
  ShardMapView shard_map() const override;
  PushKey NextPushKey() override { return keys_.Next(); }

 private:
  // Declaration order is construction order; the destructor tears down the completion
  // threads first, once nothing is in flight, and the rest needs no order after that.
  const ClientOptions options_;
  const RetryPolicy policy_;
  const std::unique_ptr<Master::Stub> master_;  // null with a static map
  ClientCounters counters_;
  InFlight inflight_;
  Timer timer_;
  std::unique_ptr<CompletionThreads> completions_;
  Router router_;
  RpcRunner runner_;
  Catalog catalog_;
  PushKeys keys_;
  SparseCalls sparse_;
  DenseCalls dense_;
};

}  // namespace ps::internal
