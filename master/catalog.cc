#include "master/catalog.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "embedding/spec.h"
#include "master/keys.h"

namespace ps {

absl::Status Catalog::Load() {
  std::map<std::string, TableSpec> tables;
  std::map<std::string, DenseSpec> dense;
  RETURN_IF_ERROR(
      ScanRecords<TableSpec>(*store_, keys::kTablePrefix, [&](absl::string_view, TableSpec spec) {
        tables[spec.name()] = std::move(spec);
        return absl::OkStatus();
      }));
  RETURN_IF_ERROR(
      ScanRecords<DenseSpec>(*store_, keys::kDensePrefix, [&](absl::string_view, DenseSpec spec) {
        dense[spec.name()] = std::move(spec);
        return absl::OkStatus();
      }));
  absl::MutexLock lock(&mu_);
  tables_ = std::move(tables);
  dense_ = std::move(dense);
  return absl::OkStatus();
}

template <typename Spec, typename Response>
absl::Status Catalog::Create(absl::StatusOr<Spec> spec, absl::string_view what,
                             std::string (*key)(absl::string_view),
                             std::map<std::string, Spec>* specs, Response* resp) {
  if (!spec.ok()) return spec.status();
  absl::MutexLock lock(&mu_);
  auto it = specs->find(spec->name());
  if (it != specs->end()) {
    if (!SpecsEqual(it->second, *spec)) {
      return absl::AlreadyExistsError(absl::StrCat(
          what, " ", spec->name(), " exists with another spec: ", it->second.ShortDebugString()));
    }
    resp->set_created(false);
    return absl::OkStatus();
  }
  StoreBatch batch;
  batch.Put(key(spec->name()), *spec);
  RETURN_IF_ERROR(counters_->Write(
      std::move(batch), [](Counters* c) { c->set_catalog_version(c->catalog_version() + 1); }));
  const std::string name = spec->name();
  (*specs)[name] = *std::move(spec);
  resp->set_created(true);
  return absl::OkStatus();
}

absl::Status Catalog::CreateTable(const CreateTableRequest& req, CreateTableResponse* resp) {
  return Create(NormalizeTableSpec(req.spec()), "table", &keys::Table, &tables_, resp);
}

absl::Status Catalog::CreateDense(const CreateDenseRequest& req, CreateDenseResponse* resp) {
  return Create(NormalizeDenseSpec(req.spec()), "dense tensor", &keys::Dense, &dense_, resp);
}

absl::Status Catalog::ListTables(const ListTablesRequest&, ListTablesResponse* resp) {
  absl::MutexLock lock(&mu_);
  for (const auto& [name, spec] : tables_) *resp->add_tables() = spec;
  for (const auto& [name, spec] : dense_) *resp->add_dense() = spec;
  // Under mu_: catalog_version changes only under it, so it matches the lists.
  resp->set_catalog_version(counters_->catalog_version());
  return absl::OkStatus();
}

std::set<std::string> Catalog::Names() const {
  absl::MutexLock lock(&mu_);
  std::set<std::string> names;
  for (const auto& [name, spec] : tables_) names.insert(name);
  for (const auto& [name, spec] : dense_) names.insert(name);
  return names;
}

size_t Catalog::size() const {
  absl::MutexLock lock(&mu_);
  return tables_.size() + dense_.size();
}

}  // namespace ps
