#include "client/pod_batch.h"

#include <algorithm>

#include "client/id_index.h"
#include "common/routing/hash.h"
#include "proto/wire.h"

namespace ps::internal {
namespace {

// Rows to reserve in one pod's entry for a table of n ids: the even share plus a margin
// for hash imbalance (a reserve too small only costs a reallocation).
size_t ReserveRows(size_t n, size_t pods) { return pods <= 1 ? n : n / pods + n / (4 * pods) + 16; }

// Per-thread scratch of the grouping, kept across calls so that a batch allocates nothing
// for it.
struct Scratch {
  IdIndex unique;
  // Pushes: for the id first seen at position k, its gradient row (the entry's grads, row).
  std::vector<std::pair<std::string*, uint32_t>> first_row;
};

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

// The index of `pod`'s request, made (init(request)) on the pod's first id.
template <typename Req, typename Init>
int RequestOf(PodRequests<Req>& requests, uint32_t pod, Init init) {
  int& r = requests.index_of_pod[pod];
  if (r < 0) {
    r = static_cast<int>(requests.reqs.size());
    requests.pods.push_back(pod);
    init(requests.reqs.emplace_back());
  }
  return r;
}

// The grouping loop, the one place ids are routed to pods. For the first occurrence (at
// position k) of each id of `ids`, routed under `map`: add(entry, k, id), where `entry` is
// the table's entry in the pod's request, made by new_entry(pod) on the pod's first id.
// For a later occurrence at k of the id first seen at `first`: repeat(k, first).
template <typename Entry, typename NewEntry, typename AddId, typename Repeat>
void GroupByPod(const ShardMap& map, const std::string& table, absl::Span<const int64_t> ids,
                IdIndex& unique, NewEntry new_entry, AddId add, Repeat repeat) {
  const uint64_t name_hash = NameHash(table);
  const uint32_t num_vshards = map.num_vshards();
  std::vector<Entry> entry_of_pod(map.num_pods());  // empty until the pod's first id
  unique.Reset(ids.size());
  for (size_t k = 0; k < ids.size(); ++k) {
    const int64_t id = ids[k];
    const uint64_t h = RouteHash(name_hash, id);
    bool inserted;
    const uint32_t first = unique.FindOrInsert(id, h, static_cast<uint32_t>(k), &inserted);
    if (!inserted) {
      repeat(k, first);
      continue;
    }
    const uint32_t pod = map.PodOfVShard(VShardOf(h, num_vshards));
    Entry& entry = entry_of_pod[pod];
    if (!entry) entry = new_entry(pod);
    add(entry, k, id);
  }
}

void AppendId(std::string* ids, int64_t id) {
  ids->append(reinterpret_cast<const char*>(&id), sizeof(id));
}

}  // namespace

PullBatch::PullBatch(const ShardMap& map, bool read_only, ValueType value_type)
    : map_(map), read_only_(read_only), value_type_(value_type), requests_(map.num_pods()) {}

void PullBatch::Add(const std::string& table, uint32_t dim, void* out,
                    absl::Span<const int64_t> ids, absl::Span<const uint32_t> dest,
                    PullDuplicates* dups, bool widen) {
  // A pod's entry for this table: the request's ids and where their rows go.
  struct Entry {
    std::string* ids = nullptr;
    std::vector<uint32_t>* dest = nullptr;
    explicit operator bool() const { return ids != nullptr; }
  };
  const size_t reserve = ReserveRows(ids.size(), map_.num_pods());
  auto new_entry = [&](uint32_t pod) {
    const int r = RequestOf(requests_, pod, [&](PullRequest& req) {
      req.set_epoch(map_.epoch());
      req.set_read_only(read_only_);
      req.set_value_type(value_type_);
      scatters_.push_back(std::make_shared<PullScatter>());
      scatters_.back()->wire = value_type_;
    });
    TableIds* t = requests_.reqs[r].add_tables();
    t->set_table(table);
    t->mutable_ids()->reserve(reserve * sizeof(int64_t));
    PullScatter::Entry& sc = scatters_[r]->entries.emplace_back();
    sc.table = table;
    sc.out = out;
    sc.dim = dim;
    sc.widen = widen;
    sc.dest.reserve(reserve);
    return Entry{t->mutable_ids(), &sc.dest};
  };
  // `position(k)`: where the row of ids[k] goes. Chosen once, not per id.
  auto group = [&](auto position) {
    GroupByPod<Entry>(
        map_, table, ids, ThreadScratch().unique, new_entry,
        [&](Entry& entry, size_t k, int64_t id) {
          entry.dest->push_back(position(k));
          AppendId(entry.ids, id);
        },
        [&](size_t k, uint32_t first) { dups->rows.emplace_back(position(k), position(first)); });
  };
  if (dest.empty()) {
    group([](size_t k) { return static_cast<uint32_t>(k); });
  } else {
    group([&dest](size_t k) { return dest[k]; });
  }
}

std::vector<PodRequest> PullBatch::Finish() {
  std::vector<PodRequest> out(requests_.reqs.size());
  for (size_t r = 0; r < out.size(); ++r) {
    out[r].pod = requests_.pods[r];
    out[r].request = wire::EncodePullRequest(&requests_.reqs[r]);
    out[r].scatter = std::move(scatters_[r]);
  }
  requests_ = PodRequests<PullRequest>(map_.num_pods());
  scatters_.clear();
  return out;
}

PushBatch::PushBatch(const ShardMap& map, std::function<PushKey()> key_of_part)
    : map_(map), key_of_part_(std::move(key_of_part)), requests_(map.num_pods()) {}

void PushBatch::Add(const std::string& table, uint32_t dim, float learning_rate,
                    absl::Span<const int64_t> ids, const float* grads) {
  // A pod's entry for this table: the request's ids and gradients.
  struct Entry {
    std::string* ids = nullptr;
    std::string* grads = nullptr;
    explicit operator bool() const { return ids != nullptr; }
  };
  const size_t row_bytes = dim * sizeof(float);
  const size_t reserve = ReserveRows(ids.size(), map_.num_pods());
  Scratch& scratch = ThreadScratch();
  auto& first_row = scratch.first_row;
  // Sized for these ids (a slot is written before it is read); memory from a far larger
  // batch is given back.
  if (first_row.size() < ids.size() ||
      first_row.size() > std::max<size_t>(8 * ids.size(), size_t{1} << 16)) {
    first_row.resize(ids.size());
    first_row.shrink_to_fit();
  }
  GroupByPod<Entry>(
      map_, table, ids, scratch.unique,
      [&](uint32_t pod) {
        const int r = RequestOf(requests_, pod, [&](PushRequest& req) {
          req.set_epoch(map_.epoch());
          *req.mutable_key() = key_of_part_();
        });
        TableGrads* t = requests_.reqs[r].add_tables();
        t->set_table(table);
        t->set_learning_rate(learning_rate);
        t->mutable_ids()->reserve(reserve * sizeof(int64_t));
        t->mutable_grads()->reserve(reserve * row_bytes);
        return Entry{t->mutable_ids(), t->mutable_grads()};
      },
      [&](Entry& entry, size_t k, int64_t id) {
        first_row[k] = {entry.grads, static_cast<uint32_t>(entry.ids->size() / sizeof(int64_t))};
        AppendId(entry.ids, id);
        entry.grads->append(reinterpret_cast<const char*>(grads + k * dim), row_bytes);
      },
      [&](size_t k, uint32_t first) {  // a duplicate: sum into the first row
        auto [row_grads, row] = first_row[first];
        float* sum = reinterpret_cast<float*>(row_grads->data() + row * row_bytes);
        const float* g = grads + k * dim;
        for (uint32_t j = 0; j < dim; ++j) sum[j] += g[j];
      });
}

std::vector<PodRequest> PushBatch::Finish() {
  std::vector<PodRequest> out(requests_.reqs.size());
  for (size_t r = 0; r < out.size(); ++r) {
    out[r].pod = requests_.pods[r];
    out[r].key = requests_.reqs[r].key();
    out[r].request = wire::EncodePushRequest(&requests_.reqs[r]);
  }
  requests_ = PodRequests<PushRequest>(map_.num_pods());
  return out;
}

}  // namespace ps::internal
