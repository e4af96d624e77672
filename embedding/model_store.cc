#include "embedding/model_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "embedding/spec.h"

namespace ps {
namespace {

// Shared by tables and dense tensors: idempotent create-if-absent under `mu`.
template <typename Object, typename Spec, typename Make>
absl::StatusOr<bool> CreateIfAbsent(absl::Mutex& mu,
                                    absl::flat_hash_map<std::string, std::shared_ptr<Object>>& map,
                                    const Spec& normalized, absl::string_view kind, Make make) {
  absl::MutexLock lock(&mu);
  auto it = map.find(normalized.name());
  if (it != map.end()) {
    if (SpecsEqual(it->second->spec(), normalized)) return false;
    return absl::AlreadyExistsError(absl::StrCat(
        kind, " '", normalized.name(), "' exists with another spec: ",
        it->second->spec().ShortDebugString(), " (requested ", normalized.ShortDebugString(), ")"));
  }
  ASSIGN_OR_RETURN(auto object, make());
  map.emplace(normalized.name(), std::move(object));
  return true;
}

template <typename Object>
std::vector<std::shared_ptr<Object>> SortedValues(
    const absl::flat_hash_map<std::string, std::shared_ptr<Object>>& map) {
  std::vector<std::shared_ptr<Object>> out;
  out.reserve(map.size());
  for (const auto& [name, object] : map) out.push_back(object);
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a->spec().name() < b->spec().name(); });
  return out;
}

}  // namespace

absl::StatusOr<bool> ModelStore::CreateTable(const TableSpec& spec) {
  ASSIGN_OR_RETURN(TableSpec normalized, NormalizeTableSpec(spec, SpecRules::kStored));
  return CreateIfAbsent(mu_, tables_, normalized, "table",
                        [&] { return EmbeddingTable::Create(normalized, table_options_); });
}

absl::StatusOr<bool> ModelStore::CreateDense(const DenseSpec& spec) {
  ASSIGN_OR_RETURN(DenseSpec normalized, NormalizeDenseSpec(spec, SpecRules::kStored));
  return CreateIfAbsent(mu_, dense_, normalized, "dense tensor",
                        [&] { return DenseTensor::Create(normalized); });
}

std::shared_ptr<EmbeddingTable> ModelStore::FindTable(absl::string_view name) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = tables_.find(name);
  return it == tables_.end() ? nullptr : it->second;
}

std::shared_ptr<DenseTensor> ModelStore::FindDense(absl::string_view name) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = dense_.find(name);
  return it == dense_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<EmbeddingTable>> ModelStore::Tables() const {
  absl::ReaderMutexLock lock(&mu_);
  return SortedValues(tables_);
}

std::vector<std::shared_ptr<DenseTensor>> ModelStore::DenseTensors() const {
  absl::ReaderMutexLock lock(&mu_);
  return SortedValues(dense_);
}

}  // namespace ps
