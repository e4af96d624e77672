#include "embedding/dense_tensor.h"

#include <cstring>

#include "embedding/hash.h"
#include "embedding/spec.h"
#include "embedding/status_macros.h"

namespace ps {
namespace {

size_t Numel(const DenseSpec& spec) {
  size_t n = 1;
  for (int64_t d : spec.shape()) n *= static_cast<size_t>(d);
  return n;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DenseTensor>> DenseTensor::Create(const DenseSpec& spec) {
  ASSIGN_OR_RETURN(DenseSpec normalized, NormalizeDenseSpec(spec));
  return std::make_unique<DenseTensor>(Key{}, std::move(normalized));
}

DenseTensor::DenseTensor(Key, DenseSpec spec)
    : spec_(std::move(spec)), numel_(Numel(spec_)), optimizer_(spec_.optimizer()) {
  values_.resize(numel_ * (1 + optimizer_.slots()));
  Initializer(spec_.initializer()).Fill(NameHash(spec_.name()), 0, values_.data(), numel_);
  optimizer_.InitSlots(values_.data() + numel_, numel_);
}

void DenseTensor::Pull(float* out) const {
  absl::MutexLock lock(&mu_);
  std::memcpy(out, values_.data(), numel_ * sizeof(float));
}

void DenseTensor::Push(const float* grads, float lr) {
  absl::MutexLock lock(&mu_);
  optimizer_.Apply(lr, values_.data(), values_.data() + numel_, &step_, grads, numel_);
}

uint64_t DenseTensor::step() const {
  absl::MutexLock lock(&mu_);
  return step_;
}

}  // namespace ps
