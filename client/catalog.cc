#include "client/catalog.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/rpc/grpc_status.h"

namespace ps::internal {

void Catalog::Add(const DescribeResponse& described) {
  absl::MutexLock lock(&mu_);
  for (const TableInfo& t : described.tables()) tables_[t.spec().name()] = t.spec();
  for (const DenseInfo& t : described.dense()) dense_[t.spec().name()] = t.spec();
}

absl::Status Catalog::CreateTable(const TableSpec& spec) {
  if (master_ != nullptr) {  // the catalog: pods that join later create it from there
    CreateTableRequest req;
    *req.mutable_spec() = spec;
    CreateTableResponse resp;
    RETURN_IF_ERROR(CallMaster(&Master::Stub::CreateTable, req, &resp));
  }
  return CreateOnEveryPod<CreateTableRequest, CreateTableResponse>(
      &ParameterServer::Stub::PrepareAsyncCreateTable, spec);
}

absl::Status Catalog::CreateDense(const DenseSpec& spec) {
  if (master_ != nullptr) {
    CreateDenseRequest req;
    *req.mutable_spec() = spec;
    CreateDenseResponse resp;
    RETURN_IF_ERROR(CallMaster(&Master::Stub::CreateDense, req, &resp));
  }
  return CreateOnEveryPod<CreateDenseRequest, CreateDenseResponse>(
      &ParameterServer::Stub::PrepareAsyncCreateDense, spec);
}

absl::StatusOr<TableSpec> Catalog::Table(const std::string& name) {
  return Lookup(tables_, name, "table");
}

absl::StatusOr<DenseSpec> Catalog::Dense(const std::string& name) {
  return Lookup(dense_, name, "dense tensor");
}

absl::StatusOr<uint32_t> Catalog::TableDim(const std::string& name) {
  {
    absl::MutexLock lock(&mu_);
    auto it = tables_.find(name);
    if (it != tables_.end()) return it->second.dim();
  }
  ASSIGN_OR_RETURN(TableSpec spec, Table(name));
  return spec.dim();
}

absl::Status Catalog::Refresh() {
  auto r = router_->current();
  std::vector<std::unique_ptr<Rpc<DescribeRequest, DescribeResponse>>> rpcs;
  rpcs.push_back(
      MakeRpc<DescribeRequest, DescribeResponse>(r->pods[r->map.PodOfVShard(0)], r->map.epoch()));
  RETURN_IF_ERROR(runner_->RunAll(&ParameterServer::Stub::PrepareAsyncDescribe, &rpcs));
  Add(rpcs[0]->resp);
  return absl::OkStatus();
}

template <typename Req, typename Resp>
absl::Status Catalog::CallMaster(grpc::Status (Master::Stub::*method)(grpc::ClientContext*,
                                                                      const Req&, Resp*),
                                 const Req& req, Resp* resp) {
  // Catalog creations are idempotent on the master: safe to retry.
  return policy_->Run([&](grpc::ClientContext* ctx) { return (master_->*method)(ctx, req, resp); },
                      absl::StrCat("master ", options_.master));
}

// Sends the create request to every pod that is up (in parallel), then refreshes.
template <typename Req, typename Resp, typename Spec>
absl::Status Catalog::CreateOnEveryPod(AsyncMethod<Req, Resp> method, const Spec& spec) {
  auto r = router_->current();
  std::vector<std::unique_ptr<Rpc<Req, Resp>>> rpcs;
  for (size_t p = 0; p < r->pods.size(); ++p) {
    if (!r->up[p]) continue;
    rpcs.push_back(MakeRpc<Req, Resp>(r->pods[p], r->map.epoch()));
    *rpcs.back()->req.mutable_spec() = spec;
  }
  RETURN_IF_ERROR(runner_->RunAll(method, &rpcs));
  return Refresh();
}

template <typename Spec>
absl::StatusOr<Spec> Catalog::Lookup(const absl::flat_hash_map<std::string, Spec>& map,
                                     const std::string& name, absl::string_view kind) {
  for (int pass = 0; pass < 2; ++pass) {
    {
      absl::MutexLock lock(&mu_);
      auto it = map.find(name);
      if (it != map.end()) return it->second;
    }
    if (pass == 0) RETURN_IF_ERROR(Refresh());
  }
  return absl::NotFoundError(absl::StrCat(kind, " '", name, "' does not exist"));
}

}  // namespace ps::internal
