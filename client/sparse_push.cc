// SparseCalls: pushes.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/finite_check.h"
#include "client/sparse_calls.h"

namespace ps::internal {

Handle SparseCalls::Push(std::vector<PushSpec> specs) {
  counters_->pushes.fetch_add(1, std::memory_order_relaxed);
  auto r = router_->current();
  PushBatch batch(r->map, [this] { return keys_->Next(); });  // a key per pod part
  for (const PushSpec& spec : specs) {
    auto dim = catalog_->TableDim(spec.table);
    if (!dim.ok()) return Handle(Op::Failed(dim.status()));
    if (spec.grads == nullptr && !spec.ids.empty()) {
      return Handle(Op::Failed(
          absl::InvalidArgumentError(absl::StrCat("push to '", spec.table, "' has no gradients"))));
    }
    absl::Status finite = CheckFinite(absl::StrCat("push to '", spec.table, "'"), spec.grads,
                                      spec.ids.size(), *dim, spec.ids);
    if (!finite.ok()) return Handle(Op::Failed(std::move(finite)));
    batch.Add(spec.table, *dim, spec.learning_rate, spec.ids, spec.grads);
  }
  auto rpcs = PushRpcs(batch.Finish(), *r, 0, /*fate_unknown=*/false);
  auto op = std::make_shared<Op>(static_cast<int>(rpcs.size()));
  runner_->BeginAll(kRawPush, std::move(rpcs), op);
  return Handle(op);
}

std::vector<std::shared_ptr<RawRpc>> SparseCalls::PushRpcs(std::vector<PodRequest> parts,
                                                           const Routing& r, int reroutes,
                                                           bool fate_unknown) {
  std::vector<std::shared_ptr<RawRpc>> rpcs;
  rpcs.reserve(parts.size());
  for (PodRequest& part : parts) {
    auto rpc = std::make_shared<PushRpc>();
    rpc->pod = r.pods[part.pod];
    rpc->epoch = r.map.epoch();
    rpc->req = std::move(part.request);
    rpc->reroutes = reroutes;
    rpc->fate_unknown = fate_unknown;
    rpc->key = part.key;
    PushRpc* raw = rpc.get();
    rpc->on_ok = [this, raw]() -> absl::Status {
      PushResponse resp;
      if (!grpc::SerializationTraits<PushResponse>::Deserialize(&raw->resp, &resp).ok()) {
        return absl::InternalError(
            absl::StrCat("pod ", raw->pod->id, " answered a push with an unreadable response"));
      }
      keys_->Acknowledged(raw->key, resp.duplicate(), raw->attempt);
      return absl::OkStatus();
    };
    rpc->reroute = [this, raw](const std::shared_ptr<Op>& op) { ReroutePush(raw, op); };
    rpcs.push_back(std::move(rpc));
  }
  return rpcs;
}

void SparseCalls::ReroutePush(PushRpc* rpc, const std::shared_ptr<Op>& op) {
  grpc::ByteBuffer raw(rpc->req);
  PushRequest req;
  if (!grpc::SerializationTraits<PushRequest>::Deserialize(&raw, &req).ok()) {
    op->Add(1);
    return op->RpcDone(absl::InternalError("cannot re-route a push: its request is unreadable"));
  }
  auto r = router_->current();
  // Refused by a pod that never had it: applied nowhere, so new keys (the destinations
  // never saw the old one, and "one key, one content per pod" holds). But if an attempt's
  // fate was unknown with R >= 2, a pod may have applied it and shipped it to its
  // followers, one of which leads the vshards now (failover), knowing the key from the
  // shipped record: the key goes along, so that pod applies it once.
  const bool keep_key = rpc->fate_unknown && r->replication >= 2;
  std::function<PushKey()> key_of_part = [this] { return keys_->Next(); };
  if (keep_key) key_of_part = [key = rpc->key] { return key; };
  PushBatch batch(r->map, std::move(key_of_part));
  std::vector<int64_t> ids;
  for (const TableGrads& t : req.tables()) {
    const size_t n = t.ids().size() / sizeof(int64_t);
    if (n == 0) continue;
    const uint32_t dim = static_cast<uint32_t>(t.grads().size() / n / sizeof(float));
    ids.resize(n);
    std::memcpy(ids.data(), t.ids().data(), n * sizeof(int64_t));
    batch.Add(t.table(), dim, t.learning_rate(), ids,
              reinterpret_cast<const float*>(t.grads().data()));
  }
  auto rpcs = PushRpcs(batch.Finish(), *r, rpc->reroutes + 1, keep_key);
  if (keep_key) {
    for (auto& sent : rpcs) sent->attempt = rpc->attempt;  // the same push, retried
  }
  op->Add(static_cast<int>(rpcs.size()));
  runner_->BeginAll(kRawPush, std::move(rpcs), op);
}

}  // namespace ps::internal
