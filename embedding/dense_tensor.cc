#include "embedding/dense_tensor.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/routing/hash.h"
#include "embedding/spec.h"

namespace ps {
namespace {

size_t Numel(const DenseSpec& spec) {
  size_t n = 1;
  for (int64_t d : spec.shape()) n *= static_cast<size_t>(d);
  return n;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DenseTensor>> DenseTensor::Create(const DenseSpec& spec) {
  ASSIGN_OR_RETURN(DenseSpec normalized, NormalizeDenseSpec(spec, SpecRules::kStored));
  return std::make_unique<DenseTensor>(Key{}, std::move(normalized));
}

DenseTensor::DenseTensor(Key, DenseSpec spec)
    : spec_(std::move(spec)), numel_(Numel(spec_)), optimizer_(Optimizer::For(spec_)) {
  values_.resize(numel_ * (1 + optimizer_.slots()));
  Initializer(spec_.initializer()).Fill(NameHash(spec_.name()), 0, values_.data(), numel_);
  optimizer_.InitSlots(values_.data() + numel_, numel_);
}

void DenseTensor::Pull(float* out) const {
  absl::MutexLock lock(&mu_);
  std::memcpy(out, values_.data(), numel_ * sizeof(float));
}

uint64_t DenseTensor::Push(const float* grads, float lr) {
  absl::MutexLock lock(&mu_);
  optimizer_.Apply(lr, values_.data(), values_.data() + numel_, &step_, grads, numel_);
  dirty_ = true;
  return step_;
}

void DenseTensor::Replay(const float* grads, float lr, uint64_t step) {
  absl::MutexLock lock(&mu_);
  if (step_ >= step) return;
  step_ = step - 1;
  optimizer_.Apply(lr, values_.data(), values_.data() + numel_, &step_, grads, numel_);
  dirty_ = true;
}

absl::Status DenseTensor::Restore(absl::Span<const float> values, uint64_t step) {
  absl::MutexLock lock(&mu_);
  if (values.size() != values_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("dense tensor '", spec_.name(), "' holds ",
                                                   values_.size(), " floats; restore has ",
                                                   values.size()));
  }
  std::copy(values.begin(), values.end(), values_.begin());
  step_ = step;
  return absl::OkStatus();
}

absl::StatusOr<bool> DenseTensor::Install(absl::Span<const float> values, uint64_t step) {
  absl::MutexLock lock(&mu_);
  if (values.size() != values_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("dense tensor '", spec_.name(), "' holds ",
                                                   values_.size(), " floats; install has ",
                                                   values.size()));
  }
  if (step_ >= step) return false;
  std::copy(values.begin(), values.end(), values_.begin());
  step_ = step;
  dirty_ = true;
  return true;
}

bool DenseTensor::Snapshot(bool always, std::vector<float>* values, uint64_t* step) {
  absl::MutexLock lock(&mu_);
  if (!dirty_ && !always) return false;
  if (!always) dirty_ = false;  // `always` is a read (e.g. a migration), not a write-out
  *values = values_;
  *step = step_;
  return true;
}

uint64_t DenseTensor::step() const {
  absl::MutexLock lock(&mu_);
  return step_;
}

}  // namespace ps
