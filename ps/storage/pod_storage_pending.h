// Inside PodStorage (pod_storage_*.cc only): the recovered log's updates, indexed per row.
// Recovery replays them into the tables, or, during a lazy replay, keeps them and applies
// a row's updates when the row is read back from the database.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "embedding/embedding_table.h"
#include "embedding/initializer.h"
#include "embedding/optimizer.h"
#include "ps/storage/log_files.h"
#include "ps/storage/pod_storage.h"

namespace ps {

// One logged row update (or whole row installed by an import or a move, or a deletion),
// pointing into the log.
struct PendingUpdate {
  int64_t id;
  uint64_t step;
  const float* data;  // the gradient, or the installed row (weights then slots)
  float lr;
  bool install;
  bool erase = false;  // the row was deleted here (log order, not step order, places it)
};

// The recovered log's updates of one table, in log order, with each row's updates
// chained (no sort of the whole log: a row's chain is put in step order when applied).
// Rows are split into shards by a hash of the id, so that shards are built (Add) and
// replayed (ReplayInto) in parallel, one thread per shard; Apply is thread-safe once the
// table is built.
class PendingTable {
 public:
  PendingTable(std::shared_ptr<EmbeddingTable> table, size_t shards);

  size_t shards() const { return shards_.size(); }
  size_t ShardOf(int64_t id) const {
    return ((static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull) >> 32) % shards_.size();
  }
  // Room for about n updates in all.
  void Reserve(size_t n);
  // Adds an update of a row of shard `shard` (ShardOf(u.id)). One thread per shard.
  void Add(size_t shard, const PendingUpdate& u);
  // Updates in all.
  size_t size() const;
  // The ids of every row with updates, sorted.
  std::vector<int64_t> Ids() const;
  // Applies every update of the rows of `shard` to the table (EmbeddingTable::Replay /
  // Install skip what a row already holds; a deletion is EmbeddingTable::Delete).
  void ReplayInto(size_t shard) const;
  // The same arithmetic on a row read back from the database (`*found`) or, if it is not
  // stored, on its initial value: values holds dim weights then the slots; a row whose
  // last logged change deleted it ends with *found false. Returns whether `id` has logged
  // updates.
  bool Apply(int64_t id, float* values, uint64_t* step, bool* found) const;

  const std::shared_ptr<EmbeddingTable> table;

 private:
  static constexpr uint32_t kEnd = ~uint32_t{0};
  struct Chain {
    uint32_t first, last;
  };
  struct Shard {
    std::vector<PendingUpdate> updates;  // log order
    std::vector<uint32_t> next;          // the next update of the same row, or kEnd
    absl::flat_hash_map<int64_t, Chain> rows;
  };
  // A row's updates in step order between its deletions (see pod_storage_pending.cc).
  void Ordered(const Shard& s, const Chain& chain, std::vector<const PendingUpdate*>* row) const;

  std::vector<Shard> shards_;
  const Optimizer optimizer_;
  const Initializer initializer_;
};

// The recovered log: its records (mapped segments) and, per table number, the updates
// that point into them.
struct PodStorage::Pending {
  LogRead log;
  absl::flat_hash_map<uint32_t, std::unique_ptr<PendingTable>> tables;
};

}  // namespace ps
