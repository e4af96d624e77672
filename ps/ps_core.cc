#include "ps/ps_core.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/base/half.h"
#include "common/base/status_macros.h"
#include "common/routing/hash.h"
#include "embedding/spec.h"
#include "google/protobuf/io/coded_stream.h"
#include "proto/packed.h"
#include "proto/value_type.h"
#include "proto/wrong_shard.h"
#include "ps/deposed_outcome.h"

namespace ps {
namespace {

// Index of the first element of v that is NaN, Inf or beyond ±limit (a finite float), or
// -1. Non-negative floats order as their bit patterns, and NaN and Inf come above every
// finite one, so one integer comparison of |x|'s bits does all three. SSE2 tests 16
// floats per step (GCC does not vectorize the scalar loop at -O2); the scalar loop finds
// the exact index and handles the tail.
int64_t FirstBeyond(absl::Span<const float> v, float limit) {
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(v.data());
  constexpr uint32_t kAbs = 0x7fffffffu;
  uint32_t limit_bits;
  std::memcpy(&limit_bits, &limit, sizeof(limit_bits));
  size_t i = 0;
#ifdef __SSE2__
  const __m128i abs = _mm_set1_epi32(static_cast<int>(kAbs));
  const __m128i lim = _mm_set1_epi32(static_cast<int>(limit_bits));
  auto beyond = [&](size_t k) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bits + k));
    return _mm_cmpgt_epi32(_mm_and_si128(x, abs), lim);  // both non-negative as int32
  };
  for (; i + 16 <= v.size(); i += 16) {
    const __m128i any = _mm_or_si128(_mm_or_si128(beyond(i), beyond(i + 4)),
                                     _mm_or_si128(beyond(i + 8), beyond(i + 12)));
    if (_mm_movemask_epi8(any) != 0) break;
  }
#endif
  for (; i < v.size(); ++i) {
    if ((bits[i] & kAbs) > limit_bits) return static_cast<int64_t>(i);
  }
  return -1;
}

// Bytes of a length-delimited protobuf field of `n` bytes (tag, length, payload), tag < 16.
size_t FieldBytes(size_t n) {
  return 1 + google::protobuf::io::CodedOutputStream::VarintSize64(n) + n;
}

// Bytes of one entry of a PullResponse (TableValues) or DensePullResponse (DenseValues):
// the name and `value_bytes` of packed floats, as a field of the response.
size_t ValuesEntryBytes(const std::string& name, size_t value_bytes) {
  return FieldBytes(FieldBytes(name.size()) + (value_bytes > 0 ? FieldBytes(value_bytes) : 0));
}

// A response's epoch field, at most.
constexpr size_t kEpochBytes = 11;

// What a message carrying one dense tensor's whole state may need beside it: the name,
// step and framing, and in a move's first chunk (MigrateExport) up to 4 MiB of rows and
// the catalog.
constexpr size_t kMessageMargin = size_t{5} << 20;

}  // namespace

struct PsCore::PreparedPush {
  TableIdsView rows;
  absl::Span<const float> grads;
  std::vector<float> grad_scratch;
  float lr;
  // Narrowed (Change::narrow): the rows kept; `rows.ids` and `grads` point here then.
  std::vector<int64_t> narrowed_ids;
  std::vector<float> narrowed_grads;
};

namespace {

// The sorted, distinct vshards of a push request's rows (ids packed as TableGrads says);
// a request it cannot read names none.
std::vector<uint32_t> RequestVShards(const PushRequest& req, uint32_t n) {
  std::vector<uint32_t> out;
  for (const TableGrads& t : req.tables()) {
    const uint64_t h = NameHash(t.table());
    for (size_t k = 0; k + sizeof(int64_t) <= t.ids().size(); k += sizeof(int64_t)) {
      int64_t id;
      std::memcpy(&id, t.ids().data() + k, sizeof(id));
      out.push_back(VShardOf(RouteHash(h, id), n));
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

std::vector<uint32_t> PsCore::VShardsOf(const Change& change) {
  const uint32_t n = ownership()->num_vshards();
  std::vector<uint32_t> out;
  for (const auto& [table, ids] : change.rows) {
    const uint64_t h = table->name_hash();
    for (int64_t id : ids) out.push_back(VShardOf(RouteHash(h, id), n));
  }
  for (absl::string_view name : change.dense) out.push_back(DenseVShard(name, n));
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

absl::Status PsCore::PrepareIds(absl::string_view op, const std::string& table,
                                const std::string& ids, const ShardOwnership& own, size_t* total,
                                TableIdsView* out, bool followed_ok) {
  out->table = store_.FindTable(table);
  ASSIGN_OR_RETURN(out->ids, PackedView<int64_t>(ids, &out->scratch, "ids of", table));
  if (out->table == nullptr) {
    // Ids this pod does not own are refused as such first: a pod that lost its disk and
    // owns nothing yet has no catalog either, and a client routed there by an older map
    // must re-route (a permanent NOT_FOUND failed a push whose other parts applied).
    if (!followed_ok) RETURN_IF_ERROR(CheckOwnedByName(own, table, NameHash(table), out->ids));
    return absl::NotFoundError(absl::StrCat("table '", table, "' does not exist"));
  }
  if (out->ids.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(op, " of '", table, "' has no ids"));
  }
  *total += out->ids.size();
  if (*total > options_.max_batch_rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, " of ", *total, "+ rows exceeds max_batch_rows = ", options_.max_batch_rows));
  }
  return followed_ok ? CheckReadable(own, *out->table, out->ids)
                     : CheckOwned(own, *out->table, out->ids);
}

absl::Status PsCore::CheckReadable(const ShardOwnership& own, const EmbeddingTable& table,
                                   absl::Span<const int64_t> ids) {
  if (own.owned_count() == own.num_vshards()) return absl::OkStatus();
  const uint64_t h = table.name_hash();
  size_t i = 0;
  const uint32_t n = own.num_vshards();
  while (i < ids.size() && own.Owns(VShardOf(RouteHash(h, ids[i]), n))) ++i;
  if (i == ids.size()) return absl::OkStatus();  // the usual case: no lock taken
  absl::ReaderMutexLock role(&migrate_mu_);
  for (; i < ids.size(); ++i) {
    const uint32_t v = VShardOf(RouteHash(h, ids[i]), n);
    if (own.Owns(v) || (v < role_.primary_of.size() && !role_.primary_of[v].empty())) continue;
    return CheckOwned(own, table, ids.subspan(i, 1));  // the wrong-shard refusal, counted
  }
  return absl::OkStatus();
}

namespace {

// The table options of a pod: admission counters per vshard of its map.
TableOptions WithVShards(TableOptions options, const ShardOwnership& ownership) {
  options.num_vshards = ownership.num_vshards();
  return options;
}

}  // namespace

PsCore::PsCore(PsCoreOptions options, ShardOwnership ownership)
    : options_(options),
      started_(absl::Now()),
      store_(WithVShards(options.table, ownership)),
      dedup_(options.dedup),
      ownership_(std::make_shared<const ShardOwnership>(std::move(ownership))),
      replicator_(options.replica_sender == nullptr
                      ? nullptr
                      : std::make_unique<Replicator>(options.replica_sender, options.replicator)) {}

// The replicator and the storage first: they may still complete queued changes, whose
// callbacks use this core's members.
PsCore::~PsCore() {
  if (evictor_.joinable()) {
    {
      absl::MutexLock lock(&evict_mu_);
      stop_eviction_ = true;
    }
    evictor_.join();
  }
  if (storage_ != nullptr) {
    // A replicated pod keeps its log at shutdown: records its followers may not hold yet are
    // re-shipped from it at the next start (ResolveRecoveredLog).
    const bool replicated = replicator_ != nullptr && replicator_->active();
    storage_->SetTruncateGate(replicated ? std::function<absl::Status()>([] {
      return absl::UnavailableError("replicated pod shutting down");
    })
                                         : nullptr);
  }
  // Records already applied are shipped from the log writer once written: before the
  // replicator goes (a failed log ships nothing more).
  if (storage_ != nullptr) storage_->WaitApplied().IgnoreError();
  replicator_.reset();
  if (synced_acks_ != nullptr) synced_acks_->Stop();  // uses the storage
  storage_.reset();
}

absl::StatusOr<std::unique_ptr<PsCore>> PsCore::Open(PsCoreOptions options,
                                                     ShardOwnership ownership) {
  const bool durable = !options.storage.db.dir.empty();
  if (durable) options.table.track_dirty = true;
  if (options.storage.memory_budget_bytes > 0) {
    if (!durable) {
      return absl::InvalidArgumentError(
          "a memory budget needs a data dir: evicted rows live in the pod's database");
    }
    options.table.evictable = true;
  }
  auto core = std::make_unique<PsCore>(options, std::move(ownership));
  if (durable) {
    ASSIGN_OR_RETURN(core->storage_,
                     PodStorage::Open(options.storage, &core->store_, &core->dedup_));
    core->StartReplicatedStorage();
  }
  if (options.eviction_interval_ms > 0) {
    core->evictor_ = std::thread([c = core.get()] { c->RunEviction(); });
  }
  return core;
}

void PsCore::SetOwnership(ShardOwnership ownership) {
  auto next = std::make_shared<const ShardOwnership>(std::move(ownership));
  absl::WriterMutexLock fence(&migrate_mu_);
  absl::MutexLock lock(&mu_);
  ownership_ = std::move(next);
}

std::shared_ptr<const ShardOwnership> PsCore::ownership() const {
  absl::MutexLock lock(&mu_);
  return ownership_;
}

absl::Status PsCore::CheckOwned(const ShardOwnership& own, const EmbeddingTable& table,
                                absl::Span<const int64_t> ids) {
  return CheckOwnedByName(own, table.spec().name(), table.name_hash(), ids);
}

absl::Status PsCore::CheckOwnedByName(const ShardOwnership& own, absl::string_view table,
                                      uint64_t name_hash, absl::Span<const int64_t> ids) {
  // A pod owning every vshard (a single pod, or a map of one) owns every id.
  if (own.owned_count() == own.num_vshards()) return absl::OkStatus();
  const uint64_t h = name_hash;
  for (int64_t id : ids) {
    const uint32_t v = VShardOf(RouteHash(h, id), own.num_vshards());
    if (!own.Owns(v)) {
      counters_.rejected_wrong_shard.fetch_add(1, std::memory_order_relaxed);
      return WrongShardError(absl::StrCat("id ", id, " of table '", table, "' is in vshard ", v,
                                          ", which this pod does not own at epoch ", own.epoch()),
                             own.epoch(), v);
    }
  }
  return absl::OkStatus();
}

absl::Status PsCore::CheckOwnedDense(const ShardOwnership& own, absl::string_view name) {
  const uint32_t v = DenseVShard(name, own.num_vshards());
  if (!own.Owns(v)) {
    counters_.rejected_wrong_shard.fetch_add(1, std::memory_order_relaxed);
    return WrongShardError(absl::StrCat("dense tensor '", name, "' is in vshard ", v,
                                        ", which this pod does not own at epoch ", own.epoch()),
                           own.epoch(), v);
  }
  return absl::OkStatus();
}

absl::Status PsCore::CreateTable(const CreateTableRequest& req, CreateTableResponse* resp) {
  // A new spec is held to every range (embedding/spec.h); stored ones load more leniently.
  ASSIGN_OR_RETURN(TableSpec normalized, NormalizeTableSpec(req.spec()));
  absl::MutexLock lock(&create_mu_);
  if (store_.FindTable(normalized.name()) == nullptr) {
    RETURN_IF_ERROR(CheckTableCount());
    // Stored before it exists in memory, so no push to it is logged before its spec.
    if (storage_ != nullptr) RETURN_IF_ERROR(storage_->AddTable(normalized));
  }
  ASSIGN_OR_RETURN(bool created, store_.CreateTable(normalized));
  resp->set_created(created);
  return absl::OkStatus();
}

absl::Status PsCore::CreateDense(const CreateDenseRequest& req, CreateDenseResponse* resp) {
  ASSIGN_OR_RETURN(DenseSpec normalized, NormalizeDenseSpec(req.spec()));
  // Its whole state (weights and slots) travels in one message: a dense pull, an import's
  // DenseState, a move's MigratedDense. Refused here rather than failing on every later
  // pull, export or move.
  uint64_t numel = 1;
  for (int64_t d : normalized.shape()) numel *= static_cast<uint64_t>(d);  // <= 2^24
  const uint64_t state_bytes =
      numel * (1 + SlotsPerElement(normalized.optimizer().kind())) * sizeof(float);
  if (state_bytes + kMessageMargin > options_.max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dense tensor '", normalized.name(), "' of ", numel, " elements holds ", state_bytes,
        " bytes of weights and optimizer state, more than one message of this pod carries (",
        options_.max_message_bytes, " bytes less ", kMessageMargin,
        ", --max_message_mb): split it into several tensors"));
  }
  absl::MutexLock lock(&create_mu_);
  if (store_.FindDense(normalized.name()) == nullptr) {
    RETURN_IF_ERROR(CheckTableCount());
    if (storage_ != nullptr) RETURN_IF_ERROR(storage_->AddDense(normalized));
  }
  ASSIGN_OR_RETURN(bool created, store_.CreateDense(normalized));
  resp->set_created(created);
  return absl::OkStatus();
}

absl::Status PsCore::CheckTableCount() {
  const size_t held = store_.Tables().size() + store_.DenseTensors().size();
  if (held < options_.max_tables) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "this pod holds ", held,
      " tables and dense tensors, its limit (max_tables = ", options_.max_tables, ")"));
}

absl::Status PsCore::CheckAnswerBytes(absl::string_view what, size_t bytes) {
  if (bytes <= options_.max_message_bytes) return absl::OkStatus();
  counters_.rejected_answer_too_large.fetch_add(1, std::memory_order_relaxed);
  return absl::ResourceExhaustedError(absl::StrCat(
      what, " would answer ", bytes, " bytes, more than this pod's largest message (",
      options_.max_message_bytes, " bytes, --max_message_mb); nothing was done: split it"));
}

PsCore::Refusals PsCore::refusals() const {
  Refusals r;
  r.gradient_too_large = counters_.rejected_gradient_too_large.load(std::memory_order_relaxed);
  r.answer_too_large = counters_.rejected_answer_too_large.load(std::memory_order_relaxed);
  r.invalid_import_rows = counters_.invalid_import_rows.load(std::memory_order_relaxed);
  return r;
}

absl::Status PsCore::Describe(const DescribeRequest&, DescribeResponse* resp) {
  for (const auto& t : store_.Tables()) {
    TableInfo* info = resp->add_tables();
    *info->mutable_spec() = t->spec();
    info->set_rows(t->rows());
    info->set_memory_bytes(t->memory_bytes());
    if (const AdmissionSketch* a = t->admission(); a != nullptr) {
      info->set_admitted(a->admitted());
      info->set_pending_admission(a->pending());
      info->set_dropped_gradients(a->dropped());
    }
    info->set_evicted(t->evicted());
  }
  for (const auto& d : store_.DenseTensors()) *resp->add_dense()->mutable_spec() = d->spec();
  auto own = ownership();
  resp->set_num_vshards(own->num_vshards());
  resp->set_epoch(own->epoch());
  resp->set_owned_vshards(own->Bitmap());
  // Bounded by max_tables specs (~100 bytes each), so built first and measured.
  if (absl::Status s = CheckAnswerBytes("describe", resp->ByteSizeLong()); !s.ok()) {
    resp->Clear();
    return s;
  }
  return absl::OkStatus();
}

namespace {

// Writes a pull into a PullResponse.
class ResponseSink final : public PullSink {
 public:
  explicit ResponseSink(PullResponse* resp) : resp_(resp) {}
  void SetEpoch(uint64_t epoch) override { resp_->set_epoch(epoch); }
  char* AddEntry(const std::string& table, size_t bytes) override {
    TableValues* out = resp_->add_tables();
    out->set_table(table);
    return PackedResize<char>(out->mutable_values(), bytes);
  }

 private:
  PullResponse* const resp_;
};

}  // namespace

absl::Status PsCore::Pull(const PullRequest& req, PullResponse* resp) {
  ResponseSink sink(resp);
  return Pull(req, &sink);
}

namespace {

// Rows a compact pull copies into float32 scratch at a time before narrowing them: the
// scratch stays small (<= 256 KiB) and in cache, whatever the pull's size.
constexpr size_t kNarrowChunkFloats = size_t{64} << 10;

}  // namespace

absl::Status PsCore::Pull(const PullRequest& req, PullSink* sink) {
  auto own = ownership();
  sink->SetEpoch(own->epoch());
  if (req.tables_size() == 0) return absl::InvalidArgumentError("pull names no tables");
  const size_t value_bytes = ValueTypeBytes(req.value_type());
  if (value_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pull asks for value_type ", req.value_type(),
                     ", which this pod does not know (FLOAT32, BFLOAT16, FLOAT16)"));
  }
  const bool compact = req.value_type() != FLOAT32;
  // Validate the whole request, and the size of its answer, before touching any table: a
  // refused pull creates no rows and allocates nothing for its answer.
  std::vector<TableIdsView> prepared(req.tables_size());
  size_t total = 0;
  size_t answer = kEpochBytes;
  size_t pulls = 0;  // table Pull calls this request makes
  for (int i = 0; i < req.tables_size(); ++i) {
    RETURN_IF_ERROR(PrepareIds("pull", req.tables(i).table(), req.tables(i).ids(), *own, &total,
                               &prepared[i], /*followed_ok=*/req.read_only()));
    const TableIdsView& p = prepared[i];
    answer += ValuesEntryBytes(p.table->spec().name(), p.ids.size() * p.table->dim() * value_bytes);
    const size_t chunk_rows = std::max<size_t>(1, kNarrowChunkFloats / p.table->dim());
    pulls += compact ? (p.ids.size() + chunk_rows - 1) / chunk_rows : 1;
  }
  RETURN_IF_ERROR(CheckAnswerBytes(
      absl::StrCat("pull of ", total, " rows from ", req.tables_size(), " table(s)"), answer));
  // Rows evicted under a memory budget (or not loaded yet after a lazy start) are read back
  // from disk, and that read can fail. A table's Pull reads before it creates missing rows,
  // so when the request takes several table Pulls (several entries, or a compact pull's
  // chunks) every row is read first: a failed read leaves no table with new rows. (Load
  // creates no rows; tables without a row source return at once.)
  if (!req.read_only() && pulls > 1) {
    for (const TableIdsView& p : prepared) RETURN_IF_ERROR(p.table->Load(p.ids));
  }
  absl::Status read_error;
  // Reused by this thread's compact pulls: at most kNarrowChunkFloats floats (256 KiB).
  static thread_local std::vector<float> scratch;
  for (TableIdsView& p : prepared) {
    const size_t dim = p.table->dim();
    char* values = sink->AddEntry(p.table->spec().name(), p.ids.size() * dim * value_bytes);
    if (!compact) {
      p.table->Pull(p.ids, reinterpret_cast<float*>(values), req.read_only(), &read_error);
      continue;
    }
    // Narrowed chunk by chunk (common/base/half.h: round to nearest even).
    uint16_t* out = reinterpret_cast<uint16_t*>(values);
    const size_t chunk_rows = std::max<size_t>(1, kNarrowChunkFloats / dim);
    scratch.resize(std::min(chunk_rows, p.ids.size()) * dim);
    for (size_t begin = 0; begin < p.ids.size(); begin += chunk_rows) {
      const auto ids = p.ids.subspan(begin, chunk_rows);
      p.table->Pull(ids, scratch.data(), req.read_only(), &read_error);
      const size_t n = ids.size() * dim;
      if (req.value_type() == BFLOAT16) {
        FloatsToBf16(scratch.data(), n, out + begin * dim);
      } else {
        FloatsToFp16(scratch.data(), n, out + begin * dim);
      }
    }
  }
  RETURN_IF_ERROR(read_error);
  counters_.pull_requests.fetch_add(1, std::memory_order_relaxed);
  counters_.pulled_rows.fetch_add(total, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status PsCore::CheckGradients(absl::string_view what, absl::Span<const float> grads,
                                    float clip_value, float clip_norm, size_t row_floats,
                                    absl::Span<const int64_t> ids) {
  const float limit = MaxPushGradient(clip_value, clip_norm);
  const int64_t bad = FirstBeyond(grads, limit);
  if (bad < 0) return absl::OkStatus();
  const std::string where =
      ids.empty() ? absl::StrCat("element ", bad)
                  : absl::StrCat("id ", ids[bad / row_floats], " element ", bad % row_floats);
  if (!std::isfinite(grads[bad])) {
    counters_.rejected_nonfinite.fetch_add(1, std::memory_order_relaxed);
    return absl::InvalidArgumentError(absl::StrCat(what, " has a non-finite gradient (", grads[bad],
                                                   ") at ", where, "; nothing was applied"));
  }
  counters_.rejected_gradient_too_large.fetch_add(1, std::memory_order_relaxed);
  return absl::InvalidArgumentError(absl::StrCat(
      what, " has a gradient of ", grads[bad], " at ", where, ", beyond +-", limit,
      ", the largest an update is sure to stay finite with (embedding/spec.h); nothing was "
      "applied. Set the table's clip_value or clip_norm to clip gradients instead"));
}

absl::Status PsCore::PreparePush(const PushRequest& req, const ShardOwnership& own,
                                 std::vector<PreparedPush>* prepared, size_t* total) {
  if (req.tables_size() == 0) return absl::InvalidArgumentError("push names no tables");
  prepared->resize(req.tables_size());
  for (int i = 0; i < req.tables_size(); ++i) {
    const TableGrads& entry = req.tables(i);
    PreparedPush& p = (*prepared)[i];
    RETURN_IF_ERROR(PrepareIds("push", entry.table(), entry.ids(), own, total, &p.rows));
    ASSIGN_OR_RETURN(
        p.grads, PackedView<float>(entry.grads(), &p.grad_scratch, "gradients of", entry.table()));
    const size_t dim = p.rows.table->dim();
    if (p.grads.size() != p.rows.ids.size() * dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push to '", entry.table(), "' has ", p.grads.size(), " gradient floats for ",
          p.rows.ids.size(), " ids of dim ", dim, " (expected ", p.rows.ids.size() * dim, ")"));
    }
    const TableSpec& spec = p.rows.table->spec();
    RETURN_IF_ERROR(CheckGradients(absl::StrCat("push to '", entry.table(), "'"), p.grads,
                                   spec.clip_value(), spec.clip_norm(), dim, p.rows.ids));
    RETURN_IF_ERROR(ValidatePushLearningRate(entry.learning_rate(), entry.table()));
    p.lr = entry.learning_rate();
  }
  return absl::OkStatus();
}

void PsCore::PushAsync(const PushRequest& req, PushResponse* resp, Done done) {
  // Held from the ownership check until applied: see migrate_mu_.
  absl::ReaderMutexLock fence(&migrate_mu_);
  auto own = ownership();
  resp->set_epoch(own->epoch());
  std::vector<PreparedPush> prepared;
  size_t total = 0;
  if (absl::Status s = PreparePush(req, *own, &prepared, &total); !s.ok()) {
    if (s.code() == absl::StatusCode::kNotFound && req.epoch() > own->epoch()) {
      // Asked under a newer map than this pod has: it may not have the catalog yet (a pod
      // just started on an empty data dir learns it at registration), so the client retries.
      s = absl::UnavailableError(absl::StrCat(s.message(), " on this pod at map epoch ",
                                              own->epoch(), ", older than the request's ",
                                              req.epoch(), ": not told the catalog yet; retry"));
    }
    auto vshards = [&] { return RequestVShards(req, own->num_vshards()); };
    return done(RefusedOrDuplicate(req.key(), vshards, resp, std::move(s)));
  }
  if (const uint32_t piece = req.key().piece(); piece != 0) {
    // A re-routed piece holds the rows of its one vshard (ps/storage/push_dedup.h).
    for (const PreparedPush& p : prepared) {
      for (int64_t id : p.rows.ids) {
        const uint32_t v = VShardOf(RouteHash(p.rows.table->name_hash(), id), own->num_vshards());
        if (v != piece - 1) {
          return done(absl::InvalidArgumentError(
              absl::StrCat("push piece ", piece, " (vshard ", piece - 1, ") holds row ", id,
                           " of '", p.rows.table->spec().name(), "', which is in vshard ", v)));
        }
      }
    }
  }
  Change change;
  change.key = &req.key();
  change.resp = resp;
  change.ship = true;
  // Routed under an older map (a re-routed part keeps its key): the rest of its part may
  // have gone to other pods although this pod leads their vshards now. Before, the key
  // counted here for every vshard, and a later piece of the part in one of those vshards
  // was answered "duplicate" (migration_test at R = 2, after the drain).
  change.key_exact = req.epoch() != 0 && req.epoch() < own->epoch();
  for (const PreparedPush& p : prepared) {
    change.rows.emplace_back(p.rows.table, p.rows.ids);
    change.record_bytes += LogRecordBuilder::TableBytes(p.rows.table->spec().name(),
                                                        p.rows.ids.size(), p.rows.table->dim());
  }
  // The key applied here for some of these vshards already (a follower that kept part of
  // its record, then led the rest): only the others' rows apply. change.rows keeps the
  // whole request (a fence and a move's touched rows may name more than applies).
  const uint32_t n = own->num_vshards();
  const std::function<void(const std::vector<uint32_t>&)> narrow =
      [&prepared, n](const std::vector<uint32_t>& vshards) {
        for (PreparedPush& p : prepared) {
          const uint32_t dim = p.rows.table->dim();
          const uint64_t h = p.rows.table->name_hash();
          p.narrowed_ids.clear();
          p.narrowed_grads.clear();
          for (size_t i = 0; i < p.rows.ids.size(); ++i) {
            if (!std::binary_search(vshards.begin(), vshards.end(),
                                    VShardOf(RouteHash(h, p.rows.ids[i]), n))) {
              continue;
            }
            p.narrowed_ids.push_back(p.rows.ids[i]);
            p.narrowed_grads.insert(p.narrowed_grads.end(), p.grads.begin() + i * dim,
                                    p.grads.begin() + (i + 1) * dim);
          }
          p.rows.ids = p.narrowed_ids;
          p.grads = p.narrowed_grads;
        }
      };
  change.narrow = &narrow;
  auto apply = [&prepared](LogRecordBuilder* record) -> absl::Status {
    // Evicted rows (memory budget) are read back first, so that a failed read applies
    // nothing; eviction waits for the apply lock this runs under.
    for (PreparedPush& p : prepared) RETURN_IF_ERROR(p.rows.table->Load(p.rows.ids));
    std::vector<uint64_t> steps;
    for (PreparedPush& p : prepared) {
      EmbeddingTable& t = *p.rows.table;
      if (record == nullptr) {
        t.Push(p.rows.ids, p.grads.data(), p.lr);
        continue;
      }
      steps.resize(p.rows.ids.size());
      t.Push(p.rows.ids, p.grads.data(), p.lr, steps.data());
      record->AddTable(t.spec().name(), p.lr, t.dim(), p.rows.ids, steps, p.grads.data());
    }
    return absl::OkStatus();
  };
  ApplyChange(change, apply, [this, total, done = std::move(done)](absl::Status s) {
    if (s.ok()) {
      counters_.push_requests.fetch_add(1, std::memory_order_relaxed);
      counters_.pushed_rows.fetch_add(total, std::memory_order_relaxed);
    }
    done(s);
  });
}

void PsCore::ApplyChange(const Change& change, ApplyFn apply, Done done) {
  // Refused before anything applies (a fence, no write lease): a push applied here before
  // is acknowledged as such (its retry is safe). One this pod never saw is refused as such,
  // so that the client knows its fate: re-routed, it goes to the new owner under a new key,
  // not this one's, which a pod there may hold for another part of the call (a key kept
  // across a re-route names parts on several pods; de-duplication is per pod).
  auto vshards = [&] { return VShardsOf(change); };
  auto refuse = [&](absl::Status refused) {
    if (change.key != nullptr) {
      const PushDedup::Claim claim = dedup_.Peek(*change.key, vshards);
      if (claim == PushDedup::Claim::kDuplicate) {
        return done(Repeated(*change.key, PushDedup::Claim::kDuplicate, change.resp));
      }
      if (claim == PushDedup::Claim::kNew) refused = NotAppliedError(std::move(refused));
    }
    return done(refused);
  };
  OutgoingMove* out = outgoing_.get();
  if (out != nullptr) {
    if (absl::Status fenced = CheckFence(*out, change); !fenced.ok()) return refuse(fenced);
  }
  if (change.ship) {
    if (absl::Status s = CheckWriteLease(); !s.ok()) return refuse(s);
  }
  // The key claimed for this change (null: none, or already applied here).
  const PushKey* key = change.key;
  if (key != nullptr) {
    absl::StatusOr<PushDedup::Claim> claim =
        dedup_.Begin(*key, vshards, change.key_part.get(), change.key_exact);
    if (claim.ok() && *claim == PushDedup::Claim::kPartial && change.ship) {
      // Applied here for some of the push's vshards: the others' rows apply alone.
      if (change.narrow == nullptr) {
        return done(absl::AbortedError(
            absl::StrCat("push ", key->worker_id(), "/", key->incarnation(), "/", key->sequence(),
                         " was applied here for some of its vshards only; retry")));
      }
      std::vector<uint32_t> rest;
      claim = dedup_.BeginRest(*key, vshards, &rest);
      if (claim.ok() && *claim == PushDedup::Claim::kNew) {
        VLOG(1) << "push " << key->worker_id() << "/" << key->sequence()
                << " applied here before for some vshards: applying the rows of " << rest.size()
                << " others";
        (*change.narrow)(rest);
      }
    }
    if (!claim.ok()) return done(claim.status());
    if ((*claim == PushDedup::Claim::kDuplicate || *claim == PushDedup::Claim::kPartial) &&
        !change.ship) {
      // A follower's record from its primary whose key this pod already applied. Its rows
      // are replayed all the same, by their steps (an update already in a row changes
      // nothing): the key may be known here without these rows, since a follower records
      // a part's key when it keeps some of its rows, and a copy carries its source's keys.
      // Skipped, the rows of another vshard's piece of that part, applied later by that
      // vshard's new primary, were missing on this replica (their steps hid the gap) and
      // a failover to it lost them (ps_core_follower_replay_test).
      VLOG(1) << "replicated record of push " << key->worker_id() << "/" << key->incarnation()
              << "/" << key->sequence() << " (piece " << key->piece()
              << ") already applied here: its rows are replayed by their steps";
      key = nullptr;
    } else if (*claim != PushDedup::Claim::kNew) {
      return done(Repeated(*key, *claim, change.resp));
    }
  }
  auto apply_and_track = [&](LogRecordBuilder* record) -> absl::Status {
    RETURN_IF_ERROR(apply(record));
    // Recorded exactly here: the record says so, for the followers and for recovery.
    if (record != nullptr && key != nullptr && change.key_exact) record->SetKeyExact();
    // After applying: a row the move's export reads from now on is current, and one it
    // read before is copied again in the next phase.
    if (out != nullptr) RecordTouched(out, change);
    return absl::OkStatus();
  };
  if (change.ship && replicator_ != nullptr && replicator_->active()) {
    if (key == nullptr) {
      return ApplyShipped(change, apply_and_track, AckWhenDurable(change, std::move(done)));
    }
    // As below: the key is marked applied once this pod and the ack set hold the change.
    return ApplyShipped(change, apply_and_track,
                        AckWhenDurable(change, [this, key = *key, part = change.key_part,
                                                done = std::move(done)](absl::Status s) {
                          FinishPushKey(dedup_, key, s, part.get());
                          done(s);
                        }));
  }
  if (storage_ == nullptr) {
    absl::Status s = apply_and_track(nullptr);
    if (key != nullptr) dedup_.Finish(*key, /*applied=*/s.ok(), change.key_part.get());
    return done(s);
  }
  if (key == nullptr) {
    return storage_->ApplyLogged(PushKey(), change.record_bytes, apply_and_track,
                                 AckWhenDurable(change, std::move(done)), nullptr,
                                 change.exclusive);
  }
  // The key is marked applied only once the record is durable, so a retry before then is
  // told to wait (ABORTED) rather than acknowledged early.
  storage_->ApplyLogged(*key, change.record_bytes, apply_and_track,
                        AckWhenDurable(change, [this, key = *key, part = change.key_part,
                                                done = std::move(done)](absl::Status s) {
                          FinishPushKey(dedup_, key, s, part.get());
                          done(s);
                        }));
}

absl::Status PsCore::RefusedOrDuplicate(const PushKey& key, PushDedup::VShardsFn vshards,
                                        PushResponse* resp, absl::Status refused) {
  if (refused.code() != absl::StatusCode::kFailedPrecondition) return refused;
  // A re-routed piece (replicated only) applied here is the vshard's owner's to decide: it holds
  // every record acknowledged here (a promoted follower; a move's destination also merges
  // this pod's keys), and its rows are the ones that count. This pod's key may name rows
  // it no longer serves and the owner never got: a primary killed while shipping a push,
  // back with its disk, confirms the recovered record's key when it still leads some of
  // its vshards, and answering a piece of another of them "duplicate" lost it (a lost
  // marker in ps-crash-test --replication=2; ps_core_truncation_keys_test). Refused, the
  // client re-routes it under the new map. (One being applied here still waits: ABORTED.)
  // A whole key counts here for the request's vshards only if applied for all of them; one
  // applied for some of them only is refused too: a non-owner never completes it, and
  // answering "being applied now" kept a client retrying a stale route for good (a
  // re-replicated follower holding the copied key of some of the part's vshards, in
  // crash_test_periodic_r2; FollowerReplayTest.ANonOwnerThatKeptSomeRowsRefusesTheWholePart).
  const PushDedup::Claim claim = dedup_.Peek(key, vshards);
  if (claim == PushDedup::Claim::kNew || claim == PushDedup::Claim::kPartial) return refused;
  if (claim == PushDedup::Claim::kDuplicate && key.piece() != 0) return refused;
  return Repeated(key, claim, resp);
}

absl::Status PsCore::Repeated(const PushKey& key, PushDedup::Claim claim, PushResponse* resp) {
  if (claim == PushDedup::Claim::kInProgress) {
    return absl::AbortedError(absl::StrCat("push ", key.worker_id(), "/", key.incarnation(), "/",
                                           key.sequence(), " is being applied now; retry"));
  }
  counters_.duplicate_pushes.fetch_add(1, std::memory_order_relaxed);
  resp->set_duplicate(true);
  return absl::OkStatus();
}

namespace {

// Runs an asynchronous call and waits for its completion.
absl::Status WaitFor(const std::function<void(PsCore::Done)>& start) {
  absl::Notification finished;
  absl::Status result;
  start([&](absl::Status s) {
    result = s;
    finished.Notify();
  });
  finished.WaitForNotification();
  return result;
}

}  // namespace

absl::Status PsCore::Push(const PushRequest& req, PushResponse* resp) {
  return WaitFor([&](Done done) { PushAsync(req, resp, std::move(done)); });
}

absl::Status PsCore::PushDense(const DensePushRequest& req, PushResponse* resp) {
  return WaitFor([&](Done done) { PushDenseAsync(req, resp, std::move(done)); });
}

absl::Status PsCore::PullDense(const DensePullRequest& req, DensePullResponse* resp) {
  auto own = ownership();
  resp->set_epoch(own->epoch());
  if (req.names_size() == 0) return absl::InvalidArgumentError("dense pull names no tensors");
  std::vector<std::shared_ptr<DenseTensor>> tensors;
  absl::flat_hash_set<absl::string_view> seen;
  size_t answer = kEpochBytes;
  for (const std::string& name : req.names()) {
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("dense pull names tensor '", name, "' more than once"));
    }
    auto d = store_.FindDense(name);
    if (d == nullptr) {
      return absl::NotFoundError(absl::StrCat("dense tensor '", name, "' does not exist"));
    }
    RETURN_IF_ERROR(CheckOwnedDense(*own, name));
    answer += ValuesEntryBytes(name, d->numel() * sizeof(float));
    tensors.push_back(std::move(d));
  }
  RETURN_IF_ERROR(
      CheckAnswerBytes(absl::StrCat("dense pull of ", tensors.size(), " tensors"), answer));
  for (const auto& d : tensors) {
    DenseValues* out = resp->add_tensors();
    out->set_name(d->spec().name());
    d->Pull(PackedResize<float>(out->mutable_values(), d->numel()));
  }
  return absl::OkStatus();
}

absl::Status PsCore::PrepareDensePush(const DensePushRequest& req, const ShardOwnership& own,
                                      std::vector<PreparedDense>* prepared) {
  if (req.tensors_size() == 0) return absl::InvalidArgumentError("dense push names no tensors");
  prepared->resize(req.tensors_size());
  for (int i = 0; i < req.tensors_size(); ++i) {
    const DenseGrads& entry = req.tensors(i);
    PreparedDense& p = (*prepared)[i];
    p.tensor = store_.FindDense(entry.name());
    if (p.tensor == nullptr) {
      return absl::NotFoundError(absl::StrCat("dense tensor '", entry.name(), "' does not exist"));
    }
    ASSIGN_OR_RETURN(p.grads,
                     PackedView<float>(entry.grads(), &p.scratch, "gradients of", entry.name()));
    if (p.grads.size() != p.tensor->numel()) {
      return absl::InvalidArgumentError(absl::StrCat("dense push to '", entry.name(), "' has ",
                                                     p.grads.size(), " floats, expected ",
                                                     p.tensor->numel()));
    }
    const DenseSpec& spec = p.tensor->spec();
    RETURN_IF_ERROR(CheckGradients(absl::StrCat("dense push to '", entry.name(), "'"), p.grads,
                                   spec.clip_value(), spec.clip_norm(), p.grads.size(), {}));
    RETURN_IF_ERROR(ValidatePushLearningRate(entry.learning_rate(), entry.name()));
    p.lr = entry.learning_rate();
    RETURN_IF_ERROR(CheckOwnedDense(own, entry.name()));
  }
  return absl::OkStatus();
}

void PsCore::PushDenseAsync(const DensePushRequest& req, PushResponse* resp, Done done) {
  absl::ReaderMutexLock fence(&migrate_mu_);
  auto own = ownership();
  resp->set_epoch(own->epoch());
  std::vector<PreparedDense> prepared;
  if (absl::Status s = PrepareDensePush(req, *own, &prepared); !s.ok()) {
    auto vshards = [&] {
      std::vector<uint32_t> out;
      for (const DenseGrads& d : req.tensors()) {
        out.push_back(DenseVShard(d.name(), own->num_vshards()));
      }
      std::sort(out.begin(), out.end());
      out.erase(std::unique(out.begin(), out.end()), out.end());
      return out;
    };
    return done(RefusedOrDuplicate(req.key(), vshards, resp, std::move(s)));
  }
  Change change;
  change.key = &req.key();
  change.resp = resp;
  change.ship = true;
  for (const PreparedDense& p : prepared) {
    change.dense.push_back(p.tensor->spec().name());
    change.record_bytes += 32 + p.grads.size() * sizeof(float);
  }
  auto apply = [&prepared](LogRecordBuilder* record) {
    for (PreparedDense& p : prepared) {
      const uint64_t step = p.tensor->Push(p.grads.data(), p.lr);
      if (record != nullptr) record->AddDense(p.tensor->spec().name(), p.lr, step, p.grads);
    }
    return absl::OkStatus();
  };
  ApplyChange(change, apply, std::move(done));
}

absl::Status PsCore::Stats(const StatsRequest&, StatsResponse* resp) {
  resp->set_pull_requests(counters_.pull_requests.load());
  resp->set_push_requests(counters_.push_requests.load());
  resp->set_pulled_rows(counters_.pulled_rows.load());
  resp->set_pushed_rows(counters_.pushed_rows.load());
  resp->set_duplicate_pushes(counters_.duplicate_pushes.load());
  resp->set_rejected_nonfinite(counters_.rejected_nonfinite.load());
  resp->set_rejected_wrong_shard(counters_.rejected_wrong_shard.load());
  uint64_t rows = 0, bytes = 0;
  for (const auto& t : store_.Tables()) {
    rows += t->rows();
    bytes += t->memory_bytes();
  }
  for (const auto& d : store_.DenseTensors()) bytes += d->numel() * sizeof(float);
  resp->set_rows(rows);
  resp->set_memory_bytes(bytes);
  resp->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - started_));
  if (storage_ != nullptr) {
    resp->set_durability(DurabilityName(storage_->durability()));
    const DurableLog::Stats log = storage_->log_stats();
    resp->set_log_records(log.records);
    resp->set_log_groups(log.groups);
    resp->set_log_bytes(log.bytes);
    resp->set_log_pending_bytes(log.pending_bytes);
    resp->set_log_max_lag_ms(log.max_lag_ms);
    const PodStorage::Stats st = storage_->stats();
    resp->set_materialize_rounds(st.materialize_rounds);
    resp->set_materialized_rows(st.materialized_rows);
    resp->set_last_materialize_ms(st.last_materialize_ms);
    resp->set_disk_bytes(st.disk_bytes);
    const RecoveryStats& rec = storage_->recovery();
    resp->set_recovery_seconds(rec.seconds);
    resp->set_recovered_rows(rec.rows);
    resp->set_recovered_log_records(rec.log_records);
  }
  return absl::OkStatus();
}

absl::Status PsCore::Checkpoint(const PodCheckpointRequest& req, PodCheckpointResponse* resp) {
  if (storage_ == nullptr) {
    return absl::FailedPreconditionError("this pod has no --data_dir: nothing to checkpoint");
  }
  if (req.dir().empty()) return absl::InvalidArgumentError("checkpoint dir is empty");
  const absl::Time start = absl::Now();
  // A cluster checkpoint names <dir>/<pod id>: the parent may not exist on this host yet.
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(req.dir()).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  RETURN_IF_ERROR(storage_->Checkpoint(req.dir()));
  resp->set_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  LOG(INFO) << "checkpoint written to " << req.dir() << " in " << resp->seconds() << " s";
  return absl::OkStatus();
}

}  // namespace ps
