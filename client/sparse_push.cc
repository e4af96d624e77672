// SparseCalls: pushes.
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/finite_check.h"
#include "client/sparse_calls.h"
#include "common/routing/hash.h"

namespace ps::internal {
namespace {

// The rows of `req` as one request per vshard, each under `key` with piece = vshard + 1,
// for the pods of `map`.
std::vector<PodRequest> PushPieces(const PushRequest& req, const PushKey& key,
                                   const ShardMap& map) {
  // The rows of each vshard, by table: (table entry, row) pairs.
  std::map<uint32_t, std::vector<std::pair<int, size_t>>> rows_of;
  const uint32_t num_vshards = map.num_vshards();
  for (int i = 0; i < req.tables_size(); ++i) {
    const TableGrads& t = req.tables(i);
    const uint64_t name_hash = NameHash(t.table());
    const size_t n = t.ids().size() / sizeof(int64_t);
    for (size_t k = 0; k < n; ++k) {
      int64_t id;
      std::memcpy(&id, t.ids().data() + k * sizeof(int64_t), sizeof(id));
      rows_of[VShardOf(RouteHash(name_hash, id), num_vshards)].emplace_back(i, k);
    }
  }
  std::vector<PodRequest> parts;
  std::vector<int64_t> ids;
  std::vector<float> grads;
  for (const auto& [v, rows] : rows_of) {
    PushKey piece = key;
    piece.set_piece(v + 1);
    PushBatch batch(map, [&piece] { return piece; });
    for (size_t begin = 0; begin < rows.size();) {
      const int i = rows[begin].first;
      const TableGrads& t = req.tables(i);
      const size_t n = t.ids().size() / sizeof(int64_t);
      const uint32_t dim = static_cast<uint32_t>(t.grads().size() / n / sizeof(float));
      ids.clear();
      grads.clear();
      size_t end = begin;
      for (; end < rows.size() && rows[end].first == i; ++end) {
        const size_t k = rows[end].second;
        int64_t id;
        std::memcpy(&id, t.ids().data() + k * sizeof(int64_t), sizeof(id));
        ids.push_back(id);
        const size_t at = grads.size();
        grads.resize(at + dim);
        std::memcpy(grads.data() + at, t.grads().data() + k * dim * sizeof(float),
                    dim * sizeof(float));
      }
      batch.Add(t.table(), dim, t.learning_rate(), ids, grads.data());
      begin = end;
    }
    for (PodRequest& part : batch.Finish()) parts.push_back(std::move(part));
  }
  return parts;
}

}  // namespace

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
  // shipped record: the key goes along, so that pod applies it once. Then the part goes
  // as one piece per vshard (PushKey.piece = vshard + 1; ps/storage/push_dedup.h): a pod
  // that applied the part whole answers each piece "duplicate", any other applies each
  // piece once, however the pieces' vshards reach it (several moves to one pod, say).
  const bool keep_key = rpc->fate_unknown && r->replication >= 2;
  std::vector<PodRequest> parts;
  if (keep_key) {
    parts = PushPieces(req, rpc->key, r->map);
  } else {
    PushBatch batch(r->map, [this] { return keys_->Next(); });
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
    parts = batch.Finish();
  }
  auto rpcs = PushRpcs(std::move(parts), *r, rpc->reroutes + 1, keep_key);
  if (keep_key) {
    for (auto& sent : rpcs) sent->attempt = rpc->attempt;  // the same push, retried
  }
  op->Add(static_cast<int>(rpcs.size()));
  runner_->BeginAll(kRawPush, std::move(rpcs), op);
}

}  // namespace ps::internal
