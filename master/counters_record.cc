#include "master/counters_record.h"

#include <optional>
#include <string>
#include <utility>

#include "common/base/status_macros.h"
#include "master/keys.h"

namespace ps {

absl::Status CountersRecord::Load() {
  absl::MutexLock write_lock(&write_mu_);
  ASSIGN_OR_RETURN(std::optional<Counters> stored, GetRecord<Counters>(*store_, keys::kCounters));
  absl::MutexLock lock(&mu_);
  counters_ = stored.has_value() ? *std::move(stored) : Counters();
  return absl::OkStatus();
}

Counters CountersRecord::Get() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

uint64_t CountersRecord::catalog_version() const {
  absl::MutexLock lock(&mu_);
  return counters_.catalog_version();
}

absl::Status CountersRecord::Write(StoreBatch batch, absl::FunctionRef<void(Counters*)> edit) {
  absl::MutexLock write_lock(&write_mu_);
  Counters next = Get();
  edit(&next);
  batch.Put(std::string(keys::kCounters), next);
  RETURN_IF_ERROR(store_->Write(batch));
  absl::MutexLock lock(&mu_);
  counters_ = std::move(next);
  return absl::OkStatus();
}

}  // namespace ps
