#include "embedding/admission_sketch.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

constexpr uint32_t kVersion = 1;

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

template <typename T>
bool Get(absl::string_view* in, T* v) {
  if (in->size() < sizeof(T)) return false;
  std::memcpy(v, in->data(), sizeof(T));
  in->remove_prefix(sizeof(T));
  return true;
}

}  // namespace

AdmissionSketch::AdmissionSketch(uint32_t num_vshards)
    : mask_(num_vshards - 1), shards_(std::make_unique<Shard[]>(num_vshards)) {}

uint32_t AdmissionSketch::Slot(uint64_t route_hash, uint32_t row) {
  // The low bits pick the vshard: hash again so the slots spread within it.
  uint64_t x = route_hash + 0x9E3779B97F4A7C15ull * (row + 1);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return row * kWidth + static_cast<uint32_t>(x % kWidth);
}

uint32_t AdmissionSketch::Add(uint64_t route_hash) {
  Shard& s = shards_[route_hash & mask_];
  SpinLockHolder lock(&s.mu);
  if (s.counters.empty()) s.counters.assign(size_t{kDepth} * kWidth, 0);
  uint32_t estimate = UINT32_MAX;
  for (uint32_t r = 0; r < kDepth; ++r) {
    uint16_t& c = s.counters[Slot(route_hash, r)];
    if (c < UINT16_MAX) ++c;
    estimate = std::min<uint32_t>(estimate, c);
  }
  ++s.counted;
  if (estimate == 1) first_seen_.fetch_add(1, std::memory_order_relaxed);
  return estimate;
}

uint32_t AdmissionSketch::Estimate(uint64_t route_hash) const {
  const Shard& s = shards_[route_hash & mask_];
  SpinLockHolder lock(&s.mu);
  if (s.counters.empty()) return 0;
  uint32_t estimate = UINT32_MAX;
  for (uint32_t r = 0; r < kDepth; ++r) {
    estimate = std::min<uint32_t>(estimate, s.counters[Slot(route_hash, r)]);
  }
  return estimate;
}

uint64_t AdmissionSketch::pending() const {
  const uint64_t seen = first_seen_.load(std::memory_order_relaxed);
  const uint64_t admitted = admitted_.load(std::memory_order_relaxed);
  return seen > admitted ? seen - admitted : 0;
}

std::vector<uint32_t> AdmissionSketch::DueForDecay() const {
  std::vector<uint32_t> due;
  for (uint32_t v = 0; v <= mask_; ++v) {
    SpinLockHolder lock(&shards_[v].mu);
    if (shards_[v].counted >= kDecayEvery) due.push_back(v);
  }
  return due;
}

void AdmissionSketch::Decay(absl::Span<const uint32_t> vshards) {
  for (uint32_t v : vshards) {
    if (v > mask_) continue;
    Shard& s = shards_[v];
    SpinLockHolder lock(&s.mu);
    for (uint16_t& c : s.counters) c >>= 1;
    s.counted = 0;
  }
}

void AdmissionSketch::Clear(absl::Span<const uint32_t> vshards) {
  for (uint32_t v : vshards) {
    if (v > mask_) continue;
    Shard& s = shards_[v];
    SpinLockHolder lock(&s.mu);
    s.counters.clear();
    s.counters.shrink_to_fit();
    s.counted = 0;
  }
}

std::string AdmissionSketch::Serialize() const {
  std::vector<uint32_t> all(mask_ + 1);
  for (uint32_t v = 0; v <= mask_; ++v) all[v] = v;
  return SerializeImpl(all, /*totals=*/true);
}

std::string AdmissionSketch::SerializeVShards(absl::Span<const uint32_t> vshards) const {
  return SerializeImpl(vshards, /*totals=*/false);
}

std::string AdmissionSketch::SerializeImpl(absl::Span<const uint32_t> vshards, bool totals) const {
  std::string out;
  Put<uint32_t>(&out, kVersion);
  Put<uint64_t>(&out, totals ? admitted() : 0);
  Put<uint64_t>(&out, totals ? dropped() : 0);
  Put<uint64_t>(&out, totals ? first_seen_.load(std::memory_order_relaxed) : 0);
  const size_t count_at = out.size();
  Put<uint32_t>(&out, 0);
  uint32_t n = 0;
  for (uint32_t v : vshards) {
    if (v > mask_) continue;
    const Shard& s = shards_[v];
    SpinLockHolder lock(&s.mu);
    if (s.counters.empty()) continue;
    Put<uint32_t>(&out, v);
    Put<uint64_t>(&out, s.counted);
    out.append(reinterpret_cast<const char*>(s.counters.data()),
               s.counters.size() * sizeof(uint16_t));
    ++n;
  }
  std::memcpy(&out[count_at], &n, sizeof(n));
  return out;
}

absl::Status AdmissionSketch::Restore(absl::string_view in, bool with_totals) {
  uint32_t version = 0, n = 0;
  uint64_t admitted = 0, dropped = 0, seen = 0;
  if (!Get(&in, &version) || version != kVersion || !Get(&in, &admitted) || !Get(&in, &dropped) ||
      !Get(&in, &seen) || !Get(&in, &n)) {
    return absl::InvalidArgumentError("admission sketch: unknown version or short header");
  }
  const size_t counter_bytes = size_t{kDepth} * kWidth * sizeof(uint16_t);
  if (in.size() != size_t{n} * (4 + 8 + counter_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("admission sketch: ", in.size(), " bytes for ", n, " vshards"));
  }
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t v = 0;
    uint64_t counted = 0;
    Get(&in, &v);
    Get(&in, &counted);
    if (v > mask_) {
      return absl::InvalidArgumentError(
          absl::StrCat("admission sketch: vshard ", v, " of ", mask_ + 1));
    }
    Shard& s = shards_[v];
    SpinLockHolder lock(&s.mu);
    s.counted = counted;
    s.counters.resize(size_t{kDepth} * kWidth);
    std::memcpy(s.counters.data(), in.data(), counter_bytes);
    in.remove_prefix(counter_bytes);
  }
  if (with_totals) {
    admitted_.store(admitted, std::memory_order_relaxed);
    dropped_.store(dropped, std::memory_order_relaxed);
    first_seen_.store(seen, std::memory_order_relaxed);
  }
  return absl::OkStatus();
}

}  // namespace ps
