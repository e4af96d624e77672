#include "embedding/embedding_table.h"

#include <cstring>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "embedding/hash.h"
#include "embedding/spec.h"
#include "embedding/status_macros.h"

namespace ps {
namespace {

// Row storage is a list of fixed-size blocks per stripe: growing never moves a row, and a
// block is about kBlockBytes so small tables stay small.
constexpr size_t kBlockBytes = 32 * 1024;

// Layout of one row, in floats: [weights dim][slots k*dim][step: 2 floats][pad to 4].
struct RowLayout {
  uint32_t dim;
  uint32_t slot_floats;
  uint32_t stride;  // floats per row, a multiple of 4 (16-byte aligned rows)

  RowLayout(uint32_t d, int slots)
      : dim(d), slot_floats(d * slots), stride(((d + d * slots + 2) + 3) / 4 * 4) {}
  size_t step_offset() const { return dim + slot_floats; }
};

class alignas(64) Stripe {
 public:
  absl::Mutex mu;
  absl::flat_hash_map<int64_t, uint32_t> index ABSL_GUARDED_BY(mu);  // id -> slot
  std::vector<std::unique_ptr<float[]>> blocks ABSL_GUARDED_BY(mu);
  uint32_t used_slots ABSL_GUARDED_BY(mu) = 0;
};

class EmbeddingTableImpl final : public EmbeddingTable {
 public:
  EmbeddingTableImpl(TableSpec spec, const TableOptions& options)
      : spec_(std::move(spec)),
        name_hash_(NameHash(spec_.name())),
        initializer_(spec_.initializer()),
        optimizer_(spec_.optimizer()),
        layout_(spec_.dim(), optimizer_.slots()),
        rows_per_block_(std::max<size_t>(1, kBlockBytes / (layout_.stride * sizeof(float)))),
        stripe_mask_(options.num_stripes - 1),
        stripes_(options.num_stripes) {}

  const TableSpec& spec() const override { return spec_; }
  uint32_t dim() const override { return layout_.dim; }
  uint64_t name_hash() const override { return name_hash_; }

  void Pull(absl::Span<const int64_t> ids, float* out, bool read_only) override {
    const size_t row_bytes = layout_.dim * sizeof(float);
    for (size_t i = 0; i < ids.size(); ++i) {
      float* dst = out + i * layout_.dim;
      Stripe& s = StripeOf(ids[i]);
      absl::MutexLock lock(&s.mu);
      auto it = s.index.find(ids[i]);
      if (it != s.index.end()) {
        std::memcpy(dst, RowAt(s, it->second), row_bytes);
      } else if (read_only) {
        initializer_.Fill(name_hash_, ids[i], dst, layout_.dim);
      } else {
        std::memcpy(dst, CreateRow(s, ids[i]), row_bytes);
      }
    }
  }

  void Push(absl::Span<const int64_t> ids, const float* grads, float lr) override {
    for (size_t i = 0; i < ids.size(); ++i) {
      Stripe& s = StripeOf(ids[i]);
      absl::MutexLock lock(&s.mu);
      auto it = s.index.find(ids[i]);
      float* row = it != s.index.end() ? RowAt(s, it->second) : CreateRow(s, ids[i]);
      uint64_t step;
      std::memcpy(&step, row + layout_.step_offset(), sizeof(step));
      optimizer_.Apply(lr, row, row + layout_.dim, &step, grads + i * layout_.dim,
                       layout_.dim);
      std::memcpy(row + layout_.step_offset(), &step, sizeof(step));
    }
  }

  bool Inspect(int64_t id, const std::function<void(const RowView&)>& fn) override {
    Stripe& s = StripeOf(id);
    absl::MutexLock lock(&s.mu);
    auto it = s.index.find(id);
    if (it == s.index.end()) return false;
    const float* row = RowAt(s, it->second);
    RowView view;
    view.id = id;
    view.weights = row;
    view.slots = row + layout_.dim;
    std::memcpy(&view.step, row + layout_.step_offset(), sizeof(view.step));
    fn(view);
    return true;
  }

  uint64_t rows() const override { return rows_.load(std::memory_order_relaxed); }

  uint64_t memory_bytes() const override {
    // Blocks plus the index's slots (key, value, control byte) at its ~87% max load.
    const uint64_t blocks = blocks_.load(std::memory_order_relaxed);
    return blocks * rows_per_block_ * layout_.stride * sizeof(float) +
           rows() * (sizeof(int64_t) + sizeof(uint32_t) + 1) * 8 / 7;
  }

 private:
  Stripe& StripeOf(int64_t id) {
    // High bits of the routing hash: within one vshard (which fixes the low bits) ids still
    // spread over every stripe.
    return stripes_[(RouteHash(name_hash_, id) >> 40) & stripe_mask_];
  }

  float* RowAt(Stripe& s, uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    return s.blocks[slot / rows_per_block_].get() + (slot % rows_per_block_) * layout_.stride;
  }

  float* CreateRow(Stripe& s, int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    const uint32_t slot = s.used_slots++;
    if (slot / rows_per_block_ >= s.blocks.size()) {
      s.blocks.push_back(std::make_unique<float[]>(rows_per_block_ * layout_.stride));
      blocks_.fetch_add(1, std::memory_order_relaxed);
    }
    s.index.emplace(id, slot);
    rows_.fetch_add(1, std::memory_order_relaxed);
    float* row = RowAt(s, slot);
    initializer_.Fill(name_hash_, id, row, layout_.dim);
    optimizer_.InitSlots(row + layout_.dim, layout_.dim);
    const uint64_t zero = 0;
    std::memcpy(row + layout_.step_offset(), &zero, sizeof(zero));
    return row;
  }

  // Constant after construction.
  const TableSpec spec_;
  const uint64_t name_hash_;
  const Initializer initializer_;
  const Optimizer optimizer_;
  const RowLayout layout_;
  const size_t rows_per_block_;
  const uint64_t stripe_mask_;

  std::vector<Stripe> stripes_;  // each guarded by its own mu
  std::atomic<uint64_t> rows_{0};
  std::atomic<uint64_t> blocks_{0};
};

}  // namespace

absl::StatusOr<std::unique_ptr<EmbeddingTable>> EmbeddingTable::Create(
    const TableSpec& spec, const TableOptions& options) {
  ASSIGN_OR_RETURN(TableSpec normalized, NormalizeTableSpec(spec));
  if (options.num_stripes < 1 || (options.num_stripes & (options.num_stripes - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TableOptions.num_stripes = ", options.num_stripes, " must be a power of two"));
  }
  return std::unique_ptr<EmbeddingTable>(
      std::make_unique<EmbeddingTableImpl>(std::move(normalized), options));
}

}  // namespace ps
