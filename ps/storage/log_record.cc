#include "ps/storage/log_record.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

constexpr uint8_t kVersion = 1;
// The header of a record whose key is a re-routed piece (PushKey.piece): kVersion's, then
// the piece (u32).
constexpr uint8_t kVersionPiece = 2;
// kVersion's header for a whole key recorded exactly (LogRecordBuilder::SetKeyExact).
constexpr uint8_t kVersionExact = 3;
constexpr uint8_t kTable = 1;
constexpr uint8_t kDense = 2;
constexpr uint8_t kInstall = 3;
constexpr uint8_t kDenseInstall = 4;
constexpr uint8_t kDelete = 5;
constexpr uint8_t kDecay = 6;
constexpr uint8_t kAdmissionInstall = 7;

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

void PutBytes(std::string* out, const void* p, size_t n) {
  out->append(static_cast<const char*>(p), n);
}

// Reads from a record, remembering the first failure.
class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  template <typename T>
  T Get() {
    T v{};
    Copy(&v, sizeof(T));
    return v;
  }
  // Skips n elements of T, returning where they start (null if too few bytes).
  template <typename T>
  const char* Skip(size_t n) {
    if (!ok_ || n > in_.size() / sizeof(T)) {
      ok_ = false;
      return nullptr;
    }
    const char* p = in_.data();
    in_.remove_prefix(n * sizeof(T));
    return p;
  }
  absl::string_view GetView(size_t n) {
    if (!ok_ || n > in_.size()) {
      ok_ = false;
      return {};
    }
    absl::string_view v = in_.substr(0, n);
    in_.remove_prefix(n);
    return v;
  }
  bool ok() const { return ok_; }
  bool done() const { return in_.empty(); }

 private:
  void Copy(void* dst, size_t n) {
    if (!ok_ || in_.size() < n) {
      ok_ = false;
      return;
    }
    std::memcpy(dst, in_.data(), n);
    in_.remove_prefix(n);
  }
  absl::string_view in_;
  bool ok_ = true;
};

}  // namespace

LogRecordBuilder::LogRecordBuilder(const PushKey& key, size_t expected_bytes) {
  out_.reserve(kHeaderBytes + sizeof(uint32_t) + expected_bytes);
  Put<uint8_t>(&out_, key.piece() != 0 ? kVersionPiece : kVersion);
  Put<uint64_t>(&out_, key.worker_id());
  Put<uint64_t>(&out_, key.incarnation());
  Put<uint64_t>(&out_, key.sequence());
  if (key.piece() != 0) Put<uint32_t>(&out_, key.piece());
  header_bytes_ = out_.size();
}

void LogRecordBuilder::SetKeyExact() {
  if (adopted_ == nullptr && !out_.empty() && static_cast<uint8_t>(out_[0]) == kVersion) {
    out_[0] = static_cast<char>(kVersionExact);
  }
}

void LogRecordBuilder::Adopt(std::shared_ptr<const std::string> encoded) {
  adopted_ = std::move(encoded);
  out_.clear();
}

std::string LogRecordBuilder::Finish() {
  if (adopted_ == nullptr) return std::move(out_);
  std::string copy = *adopted_;
  adopted_.reset();
  return copy;
}

std::shared_ptr<const std::string> LogRecordBuilder::FinishShared() {
  if (adopted_ != nullptr) return std::move(adopted_);
  return std::make_shared<const std::string>(std::move(out_));
}

void LogRecordBuilder::AddTable(absl::string_view table, float lr, uint32_t dim,
                                absl::Span<const int64_t> ids, absl::Span<const uint64_t> steps,
                                const float* grads) {
  Put<uint8_t>(&out_, kTable);
  Put<uint16_t>(&out_, static_cast<uint16_t>(table.size()));
  PutBytes(&out_, table.data(), table.size());
  Put<float>(&out_, lr);
  Put<uint32_t>(&out_, static_cast<uint32_t>(ids.size()));
  Put<uint32_t>(&out_, dim);
  PutBytes(&out_, ids.data(), ids.size() * sizeof(int64_t));
  PutBytes(&out_, steps.data(), steps.size() * sizeof(uint64_t));
  PutBytes(&out_, grads, ids.size() * dim * sizeof(float));
}

void LogRecordBuilder::AddDense(absl::string_view name, float lr, uint64_t step,
                                absl::Span<const float> grads) {
  Put<uint8_t>(&out_, kDense);
  Put<uint16_t>(&out_, static_cast<uint16_t>(name.size()));
  PutBytes(&out_, name.data(), name.size());
  Put<float>(&out_, lr);
  Put<uint64_t>(&out_, step);
  Put<uint32_t>(&out_, static_cast<uint32_t>(grads.size()));
  PutBytes(&out_, grads.data(), grads.size() * sizeof(float));
}

void LogRecordBuilder::AddInstall(absl::string_view table, uint32_t row_floats,
                                  absl::Span<const int64_t> ids, absl::Span<const uint64_t> steps,
                                  absl::Span<const float> values) {
  Put<uint8_t>(&out_, kInstall);
  Put<uint16_t>(&out_, static_cast<uint16_t>(table.size()));
  PutBytes(&out_, table.data(), table.size());
  Put<uint32_t>(&out_, static_cast<uint32_t>(ids.size()));
  Put<uint32_t>(&out_, row_floats);
  PutBytes(&out_, ids.data(), ids.size() * sizeof(int64_t));
  PutBytes(&out_, steps.data(), steps.size() * sizeof(uint64_t));
  PutBytes(&out_, values.data(), ids.size() * row_floats * sizeof(float));
}

void LogRecordBuilder::AddDenseInstall(absl::string_view name, uint64_t step,
                                       absl::Span<const float> values) {
  Put<uint8_t>(&out_, kDenseInstall);
  Put<uint16_t>(&out_, static_cast<uint16_t>(name.size()));
  PutBytes(&out_, name.data(), name.size());
  Put<uint64_t>(&out_, step);
  Put<uint32_t>(&out_, static_cast<uint32_t>(values.size()));
  PutBytes(&out_, values.data(), values.size() * sizeof(float));
}

void LogRecordBuilder::AddDelete(absl::string_view table, absl::Span<const int64_t> ids) {
  Put<uint8_t>(&out_, kDelete);
  Put<uint16_t>(&out_, static_cast<uint16_t>(table.size()));
  PutBytes(&out_, table.data(), table.size());
  Put<uint32_t>(&out_, static_cast<uint32_t>(ids.size()));
  PutBytes(&out_, ids.data(), ids.size() * sizeof(int64_t));
}

void LogRecordBuilder::AddDecay(absl::string_view table, absl::Span<const uint32_t> vshards) {
  Put<uint8_t>(&out_, kDecay);
  Put<uint16_t>(&out_, static_cast<uint16_t>(table.size()));
  PutBytes(&out_, table.data(), table.size());
  Put<uint32_t>(&out_, static_cast<uint32_t>(vshards.size()));
  PutBytes(&out_, vshards.data(), vshards.size() * sizeof(uint32_t));
}

void LogRecordBuilder::AddAdmissionInstall(absl::string_view table, absl::string_view counters) {
  Put<uint8_t>(&out_, kAdmissionInstall);
  Put<uint16_t>(&out_, static_cast<uint16_t>(table.size()));
  PutBytes(&out_, table.data(), table.size());
  Put<uint32_t>(&out_, static_cast<uint32_t>(counters.size()));
  PutBytes(&out_, counters.data(), counters.size());
}

absl::StatusOr<LogRecordView> ParseLogRecord(absl::string_view bytes) {
  Reader r(bytes);
  LogRecordView rec;
  const uint8_t version = r.Get<uint8_t>();
  if (r.ok() && version != kVersion && version != kVersionPiece && version != kVersionExact) {
    return absl::DataLossError(absl::StrCat("log record version ", version, " is unknown"));
  }
  rec.key.set_worker_id(r.Get<uint64_t>());
  rec.key.set_incarnation(r.Get<uint64_t>());
  rec.key.set_sequence(r.Get<uint64_t>());
  rec.key_exact = version == kVersionExact;
  if (version == kVersionPiece) {
    rec.key.set_piece(r.Get<uint32_t>());
    // One encoding per record: a key without a piece is written as kVersion.
    if (r.ok() && rec.key.piece() == 0) {
      return absl::DataLossError("log record of a piece has piece 0");
    }
  }
  while (r.ok() && !r.done()) {
    const uint8_t tag = r.Get<uint8_t>();
    const absl::string_view name = r.GetView(r.Get<uint16_t>());
    if (tag == kTable) {
      LogTableView& e = rec.tables.emplace_back();
      e.table = name;
      e.lr = r.Get<float>();
      e.n = r.Get<uint32_t>();
      e.dim = r.Get<uint32_t>();
      e.ids.p = r.Skip<int64_t>(e.n);
      e.steps.p = r.Skip<uint64_t>(e.n);
      e.grads = r.Skip<float>(size_t{e.n} * e.dim);
    } else if (tag == kInstall) {
      LogInstallView& e = rec.installs.emplace_back();
      e.table = name;
      e.n = r.Get<uint32_t>();
      e.row_floats = r.Get<uint32_t>();
      e.ids.p = r.Skip<int64_t>(e.n);
      e.steps.p = r.Skip<uint64_t>(e.n);
      e.values = r.Skip<float>(size_t{e.n} * e.row_floats);
    } else if (tag == kDelete) {
      LogDeleteView& e = rec.deletes.emplace_back();
      e.table = name;
      e.n = r.Get<uint32_t>();
      e.ids.p = r.Skip<int64_t>(e.n);
    } else if (tag == kDecay) {
      LogDecayView& e = rec.decays.emplace_back();
      e.table = name;
      e.n = r.Get<uint32_t>();
      e.vshards.p = r.Skip<uint32_t>(e.n);
    } else if (tag == kAdmissionInstall) {
      LogAdmissionInstallView& e = rec.admission_installs.emplace_back();
      e.table = name;
      e.counters = r.GetView(r.Get<uint32_t>());
    } else if (tag == kDense) {
      rec.has_dense = true;
      LogDenseView& e = rec.dense.emplace_back();
      e.name = name;
      e.lr = r.Get<float>();
      e.step = r.Get<uint64_t>();
      e.n = r.Get<uint32_t>();
      e.grads = r.Skip<float>(e.n);
    } else if (tag == kDenseInstall) {
      rec.has_dense = true;
      LogDenseInstallView& e = rec.dense_installs.emplace_back();
      e.name = name;
      e.step = r.Get<uint64_t>();
      e.n = r.Get<uint32_t>();
      e.values = r.Skip<float>(e.n);
    } else {
      return absl::DataLossError(absl::StrCat("log record entry tag ", tag, " is unknown"));
    }
  }
  if (!r.ok()) {
    return absl::DataLossError(absl::StrCat("log record of ", bytes.size(), " bytes is truncated"));
  }
  return rec;
}

namespace {

template <typename T>
std::vector<T> CopyArray(const LogArrayView& a, size_t n) {
  std::vector<T> out(n);
  if (n > 0) std::memcpy(out.data(), a.p, n * sizeof(T));
  return out;
}

std::vector<float> CopyFloats(const char* p, size_t n) { return CopyArray<float>({p}, n); }

}  // namespace

absl::StatusOr<LogRecord> DecodeLogRecord(absl::string_view bytes) {
  absl::StatusOr<LogRecordView> view = ParseLogRecord(bytes);
  if (!view.ok()) return view.status();
  LogRecord rec;
  rec.key = view->key;
  rec.key_exact = view->key_exact;
  for (const LogTableView& v : view->tables) {
    LogTableEntry& e = rec.tables.emplace_back();
    e.table = std::string(v.table);
    e.lr = v.lr;
    e.dim = v.dim;
    e.ids = CopyArray<int64_t>(v.ids, v.n);
    e.steps = CopyArray<uint64_t>(v.steps, v.n);
    e.grads = CopyFloats(v.grads, size_t{v.n} * v.dim);
  }
  for (const LogInstallView& v : view->installs) {
    LogInstallEntry& e = rec.installs.emplace_back();
    e.table = std::string(v.table);
    e.row_floats = v.row_floats;
    e.ids = CopyArray<int64_t>(v.ids, v.n);
    e.steps = CopyArray<uint64_t>(v.steps, v.n);
    e.values = CopyFloats(v.values, size_t{v.n} * v.row_floats);
  }
  for (const LogDeleteView& v : view->deletes) {
    LogDeleteEntry& e = rec.deletes.emplace_back();
    e.table = std::string(v.table);
    e.ids = CopyArray<int64_t>(v.ids, v.n);
  }
  for (const LogAdmissionInstallView& v : view->admission_installs) {
    rec.admission_installs.push_back({std::string(v.table), std::string(v.counters)});
  }
  for (const LogDecayView& v : view->decays) {
    LogDecayEntry& e = rec.decays.emplace_back();
    e.table = std::string(v.table);
    e.vshards = CopyArray<uint32_t>(v.vshards, v.n);
  }
  for (const LogDenseView& v : view->dense) {
    LogDenseEntry& e = rec.dense.emplace_back();
    e.name = std::string(v.name);
    e.lr = v.lr;
    e.step = v.step;
    e.grads = CopyFloats(v.grads, v.n);
  }
  for (const LogDenseInstallView& v : view->dense_installs) {
    LogDenseInstall& e = rec.dense_installs.emplace_back();
    e.name = std::string(v.name);
    e.step = v.step;
    e.values = CopyFloats(v.values, v.n);
  }
  return rec;
}

}  // namespace ps
