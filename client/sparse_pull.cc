// SparseCalls: pulls.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/sparse_calls.h"

namespace ps::internal {

Handle SparseCalls::Pull(std::vector<PullSpec> specs, bool read_only) {
  counters_->pulls.fetch_add(1, std::memory_order_relaxed);
  auto r = router_->current();
  PullBatch batch(r->map, read_only);
  auto dups = std::make_shared<std::vector<PullDuplicates>>(specs.size());
  for (size_t s = 0; s < specs.size(); ++s) {
    const PullSpec& spec = specs[s];
    auto dim = catalog_->TableDim(spec.table);
    if (!dim.ok()) return Handle(Op::Failed(dim.status()));
    if (spec.out == nullptr && !spec.ids.empty()) {
      return Handle(Op::Failed(absl::InvalidArgumentError(
          absl::StrCat("pull of '", spec.table, "' has no output buffer"))));
    }
    PullDuplicates& d = (*dups)[s];
    d.out = spec.out;
    d.dim = *dim;
    batch.Add(spec.table, *dim, spec.out, spec.ids, {}, &d);
  }
  auto rpcs = PullRpcs(batch.Finish(), *r, 0);
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
                                                           const Routing& r, int reroutes) {
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
    rpcs.push_back(std::move(rpc));
  }
  return rpcs;
}

void SparseCalls::ReroutePull(PullRpc* rpc, const std::shared_ptr<Op>& op) {
  grpc::ByteBuffer raw(rpc->req);
  PullRequest req;
  if (!grpc::SerializationTraits<PullRequest>::Deserialize(&raw, &req).ok()) {
    op->Add(1);
    return op->RpcDone(absl::InternalError("cannot re-route a pull: its request is unreadable"));
  }
  auto r = router_->current();
  PullBatch batch(r->map, req.read_only());
  PullDuplicates none;  // the ids of one entry are unique: the call de-duplicated them
  const auto& entries = rpc->scatter->entries;
  std::vector<int64_t> ids;
  for (int e = 0; e < req.tables_size() && e < static_cast<int>(entries.size()); ++e) {
    const PullScatter::Entry& entry = entries[e];
    const std::string& packed = req.tables(e).ids();
    ids.resize(std::min(entry.dest.size(), packed.size() / sizeof(int64_t)));
    std::memcpy(ids.data(), packed.data(), ids.size() * sizeof(int64_t));
    batch.Add(entry.table, entry.dim, entry.out, ids, entry.dest, &none);
  }
  auto rpcs = PullRpcs(batch.Finish(), *r, rpc->reroutes + 1);
  op->Add(static_cast<int>(rpcs.size()));
  runner_->BeginAll(kRawPull, std::move(rpcs), op);
}

}  // namespace ps::internal
