// The client's copy of the table catalog (the tables' and dense tensors' specs), and the
// creation of tables: on the master (with one) and on every pod.
#pragma once

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/ps_client.h"
#include "client/routing.h"
#include "client/rpc_runner.h"
#include "proto/master.grpc.pb.h"

namespace ps::internal {

// Thread-safe. Blocking methods make their calls on a queue the calling thread drains
// (RpcRunner::RunAll), so they work from a completion callback too. `options`, `policy`
// (master calls retry under it), `master` (null with a static map), `router` and `runner`
// must outlive the catalog.
class Catalog {
 public:
  Catalog(const ClientOptions& options, const RetryPolicy* policy, Master::Stub* master,
          Router* router, RpcRunner* runner)
      : options_(options), policy_(policy), master_(master), router_(router), runner_(runner) {}

  // Records the specs a pod described.
  void Add(const DescribeResponse& described);

  // Creates the table (dense tensor) in the master's catalog, if any, then on every pod
  // that is up, then refreshes the catalog. Idempotent for an identical spec;
  // ALREADY_EXISTS for a different one.
  absl::Status CreateTable(const TableSpec& spec);
  absl::Status CreateDense(const DenseSpec& spec);

  // The spec of a table (dense tensor), refreshing the catalog once if it is unknown;
  // NOT_FOUND if it still is.
  absl::StatusOr<TableSpec> Table(const std::string& name);
  absl::StatusOr<DenseSpec> Dense(const std::string& name);
  // A table's dim, without copying its spec when it is known (the hot path).
  absl::StatusOr<uint32_t> TableDim(const std::string& name);

  // Reloads the catalog from the pod that owns vshard 0.
  absl::Status Refresh();

 private:
  template <typename Req, typename Resp>
  absl::Status CallMaster(grpc::Status (Master::Stub::*method)(grpc::ClientContext*, const Req&,
                                                               Resp*),
                          const Req& req, Resp* resp);
  template <typename Req, typename Resp, typename Spec>
  absl::Status CreateOnEveryPod(AsyncMethod<Req, Resp> method, const Spec& spec);
  template <typename Spec>
  absl::StatusOr<Spec> Lookup(const absl::flat_hash_map<std::string, Spec>& map,
                              const std::string& name, absl::string_view kind);

  // Constant after construction.
  const ClientOptions& options_;
  const RetryPolicy* const policy_;
  Master::Stub* const master_;
  Router* const router_;
  RpcRunner* const runner_;

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, TableSpec> tables_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, DenseSpec> dense_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::internal
