// SparseCalls: pulls.
#include <glog/logging.h>

#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "client/sparse_calls.h"
#include "proto/value_type.h"

namespace ps::internal {

namespace {

// OK when `spec` names exactly the outputs a pull of `type` can fill (ps_client.h).
absl::Status CheckOutputs(const PullSpec& spec, ValueType type) {
  if (spec.ids.empty()) return absl::OkStatus();
  if (spec.out != nullptr && spec.out_half != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("pull of '", spec.table, "' gives both out and out_half: give one"));
  }
  if (spec.out_half != nullptr && type == FLOAT32) {
    return absl::InvalidArgumentError(
        absl::StrCat("pull of '", spec.table,
                     "' gives out_half for float32 values: ask for BFLOAT16 or FLOAT16"));
  }
  if (spec.out == nullptr && spec.out_half == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("pull of '", spec.table, "' has no output buffer"));
  }
  return absl::OkStatus();
}

}  // namespace

Handle SparseCalls::Pull(std::vector<PullSpec> specs, const PullOptions& options) {
  counters_->pulls.fetch_add(1, std::memory_order_relaxed);
  if (ValueTypeBytes(options.value_type) == 0) {
    return Handle(Op::Failed(absl::InvalidArgumentError(
        absl::StrCat("pull asks for unknown value_type ", options.value_type))));
  }
  auto r = router_->current();
  PullBatch batch(r->map, options.read_only, options.value_type);
  auto dups = std::make_shared<std::vector<PullDuplicates>>(specs.size());
  for (size_t s = 0; s < specs.size(); ++s) {
    const PullSpec& spec = specs[s];
    auto dim = catalog_->TableDim(spec.table);
    if (!dim.ok()) return Handle(Op::Failed(dim.status()));
    if (absl::Status st = CheckOutputs(spec, options.value_type); !st.ok()) {
      return Handle(Op::Failed(st));
    }
    // A float32 output of a compact pull is filled widened.
    const bool widen = spec.out != nullptr && options.value_type != FLOAT32;
    void* out = spec.out != nullptr ? static_cast<void*>(spec.out) : spec.out_half;
    PullDuplicates& d = (*dups)[s];
    d.out = out;
    d.row_bytes = *dim * (spec.out != nullptr ? sizeof(float) : sizeof(uint16_t));
    batch.Add(spec.table, *dim, out, spec.ids, {}, &d, widen);
  }
  auto rpcs = PullRpcs(batch.Finish(), *r, 0, /*may_fall_back=*/options.read_only);
  auto op = std::make_shared<Op>(static_cast<int>(rpcs.size()));
  // The duplicates are filled in last, once every pod's rows are in place.
  op->set_finish([dups]() -> absl::Status {
    CopyDuplicates(*dups);
    return absl::OkStatus();
  });
  runner_->BeginAll(kRawPull, std::move(rpcs), op);
  return Handle(op);
}

std::vector<std::shared_ptr<RawRpc>> SparseCalls::PullRpcs(std::vector<PodRequest> parts,
                                                           const Routing& r, int reroutes,
                                                           bool may_fall_back) {
  std::vector<std::shared_ptr<RawRpc>> rpcs;
  rpcs.reserve(parts.size());
  for (PodRequest& part : parts) {
    auto rpc = std::make_shared<PullRpc>();
    rpc->pod = r.pods[part.pod];
    rpc->epoch = r.map.epoch();
    rpc->req = std::move(part.request);
    rpc->scatter = std::move(part.scatter);
    rpc->reroutes = reroutes;
    PullRpc* raw = rpc.get();
    rpc->on_ok = [raw] { return ScatterRows(*raw->scatter, &raw->resp, raw->pod->id); };
    rpc->reroute = [this, raw](const std::shared_ptr<Op>& op) { ReroutePull(raw, op); };
    if (may_fall_back && r.map.has_followers()) {
      rpc->fallback = [this, raw](const std::shared_ptr<Op>& op) { return FallBackPull(raw, op); };
    }
    rpcs.push_back(std::move(rpc));
  }
  return rpcs;
}

bool SparseCalls::RegroupPull(PullRpc* rpc, const ShardMap& map, const Routing& r,
                              bool may_fall_back, const std::shared_ptr<Op>& op) {
  grpc::ByteBuffer raw(rpc->req);
  PullRequest req;
  if (!grpc::SerializationTraits<PullRequest>::Deserialize(&raw, &req).ok()) return false;
  PullBatch batch(map, req.read_only(), req.value_type());
  PullDuplicates none;  // the ids of one entry are unique: the call de-duplicated them
  const auto& entries = rpc->scatter->entries;
  std::vector<int64_t> ids;
  for (int e = 0; e < req.tables_size() && e < static_cast<int>(entries.size()); ++e) {
    const PullScatter::Entry& entry = entries[e];
    const std::string& packed = req.tables(e).ids();
    ids.resize(std::min(entry.dest.size(), packed.size() / sizeof(int64_t)));
    std::memcpy(ids.data(), packed.data(), ids.size() * sizeof(int64_t));
    batch.Add(entry.table, entry.dim, entry.out, ids, entry.dest, &none, entry.widen);
  }
  auto rpcs = PullRpcs(batch.Finish(), r, rpc->reroutes + 1, may_fall_back);
  op->Add(static_cast<int>(rpcs.size()));
  runner_->BeginAll(kRawPull, std::move(rpcs), op);
  return true;
}

void SparseCalls::ReroutePull(PullRpc* rpc, const std::shared_ptr<Op>& op) {
  auto r = router_->current();
  if (!RegroupPull(rpc, r->map, *r, /*may_fall_back=*/true, op)) {
    op->Add(1);
    op->RpcDone(absl::InternalError("cannot re-route a pull: its request is unreadable"));
  }
}

bool SparseCalls::FallBackPull(PullRpc* rpc, const std::shared_ptr<Op>& op) {
  auto r = router_->current();
  uint32_t pod = 0;
  while (pod < r->pods.size() && r->pods[pod]->id != rpc->pod->id) ++pod;
  if (pod == r->pods.size()) return false;  // no longer in the map: retry (and re-route)
  std::optional<ShardMap> view = r->map.ReadReplicaView(pod, r->up);
  if (!view.has_value()) return false;
  LOG_EVERY_N(WARNING, 100) << "pod " << rpc->pod->id << " (" << rpc->pod->address
                            << ") is unreachable; its read-only pull goes to followers "
                            << "(every 100th fallback is logged)";
  counters_->read_fallbacks.fetch_add(1, std::memory_order_relaxed);
  return RegroupPull(rpc, *view, *r, /*may_fall_back=*/false, op);
}

}  // namespace ps::internal
