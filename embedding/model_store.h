// The tables and dense tensors one PS pod holds, by name.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "embedding/dense_tensor.h"
#include "embedding/embedding_table.h"

namespace ps {

class ModelStore {
 public:
  explicit ModelStore(TableOptions table_options = {}) : table_options_(table_options) {}

  // Creates the table. Returns true if created, false if a table with the same normalized
  // spec already existed (creation is idempotent), ALREADY_EXISTS if one with another spec
  // exists, INVALID_ARGUMENT for a bad spec. Thread-safe.
  absl::StatusOr<bool> CreateTable(const TableSpec& spec);
  absl::StatusOr<bool> CreateDense(const DenseSpec& spec);

  // The table or tensor, or nullptr. The pointer stays valid while the caller holds it
  // (tables are never dropped under a reader). Thread-safe.
  std::shared_ptr<EmbeddingTable> FindTable(absl::string_view name) const;
  std::shared_ptr<DenseTensor> FindDense(absl::string_view name) const;

  // Snapshots of all tables / tensors, sorted by name. Thread-safe.
  std::vector<std::shared_ptr<EmbeddingTable>> Tables() const;
  std::vector<std::shared_ptr<DenseTensor>> DenseTensors() const;

 private:
  const TableOptions table_options_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<EmbeddingTable>> tables_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<DenseTensor>> dense_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps
