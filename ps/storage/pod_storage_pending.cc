#include "ps/storage/pod_storage_pending.h"

#include <algorithm>
#include <tuple>

#include "embedding/row_rules.h"

namespace ps {

PendingTable::PendingTable(std::shared_ptr<EmbeddingTable> t, size_t shards)
    : table(std::move(t)),
      shards_(shards),
      optimizer_(Optimizer::For(table->spec())),
      initializer_(table->spec().initializer()) {}

void PendingTable::Reserve(size_t n) {
  const size_t per_shard = n / shards_.size() + n / 64 + 16;
  for (Shard& s : shards_) {
    s.updates.reserve(per_shard);
    s.next.reserve(per_shard);
    s.rows.reserve(per_shard / 2);  // rows are usually updated more than once
  }
}

void PendingTable::Add(size_t shard, const PendingUpdate& u) {
  Shard& s = shards_[shard];
  const uint32_t i = static_cast<uint32_t>(s.updates.size());
  s.updates.push_back(u);
  s.next.push_back(kEnd);
  auto [it, inserted] = s.rows.try_emplace(u.id, Chain{i, i});
  if (!inserted) {
    s.next[it->second.last] = i;
    it->second.last = i;
  }
}

size_t PendingTable::size() const {
  size_t n = 0;
  for (const Shard& s : shards_) n += s.updates.size();
  return n;
}

std::vector<int64_t> PendingTable::Ids() const {
  std::vector<int64_t> ids;
  for (const Shard& s : shards_) {
    for (const auto& [id, chain] : s.rows) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

void PendingTable::ReplayInto(size_t shard) const {
  std::vector<const PendingUpdate*> row;
  const Shard& s = shards_[shard];
  for (const auto& [id, chain] : s.rows) {
    Ordered(s, chain, &row);
    for (const PendingUpdate* u : row) {
      if (u->erase) {
        table->Delete(absl::MakeConstSpan(&u->id, 1));
      } else if (u->install) {
        table->Install(u->id, u->data, u->data + table->dim(), u->step);
      } else {
        table->Replay(u->id, u->data, u->lr, u->step);
      }
    }
  }
}

bool PendingTable::Apply(int64_t id, float* values, uint64_t* step, bool* found) const {
  const Shard& s = shards_[ShardOf(id)];
  auto it = s.rows.find(id);
  if (it == s.rows.end()) return false;
  std::vector<const PendingUpdate*> row;
  Ordered(s, it->second, &row);
  // The rules of EmbeddingTable::Replay and Install (embedding/row_rules.h), on a row
  // that is not in the table: each update is skipped if the stored row has it already.
  const uint32_t dim = table->dim();
  float* weights = values;
  float* slots = values + dim;
  for (const PendingUpdate* u : row) {
    if (u->erase) {
      *found = false;
      *step = 0;
      continue;
    }
    if (u->install) {
      InstallValues(u->data, u->data + dim, u->step, dim, table->slot_floats(), *found, weights,
                    slots, step);
    } else {
      if (!*found) {
        InitRowValues(initializer_, optimizer_, table->name_hash(), id, dim, weights, slots, step);
      }
      ReplayGradient(optimizer_, u->lr, u->data, u->step, dim, weights, slots, step);
    }
    *found = true;
  }
  return true;
}

// At equal steps the gradient update comes first: an install at the step a row already
// had was skipped (and so never logged), so an install is never followed by an update
// with its own step. The log order is nearly step order already (concurrent pushes of one
// row may log out of step order). A deletion stays where the log has it: it was applied
// with the apply lock held exclusively, so the updates logged before it are exactly those
// applied before it (log_record.h); each stretch between deletions is sorted alone (a row
// that came back restarted its steps).
void PendingTable::Ordered(const Shard& s, const Chain& chain,
                           std::vector<const PendingUpdate*>* row) const {
  row->clear();
  for (uint32_t i = chain.first; i != kEnd; i = s.next[i]) row->push_back(&s.updates[i]);
  auto less = [](const PendingUpdate* a, const PendingUpdate* b) {
    return std::tie(a->step, a->install) < std::tie(b->step, b->install);
  };
  auto begin = row->begin();
  while (begin != row->end()) {
    auto end = std::find_if(begin, row->end(), [](const PendingUpdate* u) { return u->erase; });
    if (!std::is_sorted(begin, end, less)) std::sort(begin, end, less);
    begin = end == row->end() ? end : end + 1;
  }
}

}  // namespace ps
