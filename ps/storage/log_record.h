// The durable log's record of one applied push: its key (for exactly-once across
// restarts) and, per table, the ids, the step each row reached with this update
// (EmbeddingTable::Push) and the gradients; per dense tensor, the step and gradients.
// Recovery replays each row's updates in step order, so the recovered rows equal the
// ones in memory before the crash, bit for bit.
//
// Encoding (little-endian): u8 version, u64 worker_id, u64 incarnation, u64 sequence, for
// version 2 u32 piece, then entries until the end. The version says how the key counts:
//   1  a whole key (PushKey.piece 0), recorded for every vshard of its part;
//   2  a re-routed piece (PushKey.piece != 0), for its one vshard;
//   3  a whole key recorded exactly: for the vshards of this record's rows only (the push
//      was routed under an older shard map than the primary's, PsCore::Change::key_exact;
//      a follower records it the same way). Records of versions 1 and 2 read as before.
// Each entry is
//   u8 1 (table), u16 name length, name, f32 lr, u32 n, u32 dim, n i64 ids, n u64 steps,
//        n*dim f32 gradients
//   u8 2 (dense), u16 name length, name, f32 lr, u64 step, u32 numel, numel f32 gradients
//   u8 3 (installed rows: an import, or a vshard move's copy), u16 name length, name, u32 n, u32
//   floats per row
//        (dim + slot floats), n i64 ids, n u64 steps, n*floats f32 weights then slots
//   u8 4 (installed dense tensor), u16 name length, name, u64 step, u32 count, count f32
//        values (weights then slots)
//   u8 5 (deleted rows: feature eviction, or an imported deletion), u16 name length, name,
//        u32 n, n i64 ids
//   u8 6 (admission counters halved: AdmissionSketch::Decay), u16 name length, name, u32 n,
//        n u32 vshards
//   u8 7 (admission counters installed: a move's copy), u16 name length, name, u32 length,
//        the bytes of AdmissionSketch::SerializeVShards
// A table entry's step 0 is a push that admission counted and dropped (no row changed);
// in a table with admission, step 1 is the push that admitted its row
// (EmbeddingTable::CountLogged).
// Installs are replayed with EmbeddingTable::Install at their step, after any update of
// the same row with the same step (the install was skipped then, so never logged).
// A deletion is ordered against the row's updates by its place in the log, not by steps
// (a row that comes back restarts at step 0): it is applied with the apply lock held
// exclusively, so every update logged before it was applied before it and every update
// logged after it was applied after it. Recovery replays each row's updates in step
// order within the stretches of the log between its deletions.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/ps.pb.h"

namespace ps {

struct LogTableEntry {
  std::string table;
  float lr = 0;
  uint32_t dim = 0;
  std::vector<int64_t> ids;
  std::vector<uint64_t> steps;
  std::vector<float> grads;
};

struct LogDenseEntry {
  std::string name;
  float lr = 0;
  uint64_t step = 0;
  std::vector<float> grads;
};

// Whole rows installed by an import or a vshard move (EmbeddingTable::Install).
struct LogInstallEntry {
  std::string table;
  uint32_t row_floats = 0;  // dim + slot floats
  std::vector<int64_t> ids;
  std::vector<uint64_t> steps;
  std::vector<float> values;  // n * row_floats
};

struct LogDenseInstall {
  std::string name;
  uint64_t step = 0;
  std::vector<float> values;
};

// Rows deleted (EmbeddingTable::Delete).
struct LogDeleteEntry {
  std::string table;
  std::vector<int64_t> ids;
};

// Admission counters halved (one table, some vshards).
struct LogDecayEntry {
  std::string table;
  std::vector<uint32_t> vshards;
};

// Admission counters of some vshards installed (AdmissionSketch::Restore).
struct LogAdmissionInstall {
  std::string table;
  std::string counters;
};

struct LogRecord {
  PushKey key;
  bool key_exact = false;  // version 3: see the file comment
  std::vector<LogAdmissionInstall> admission_installs;
  std::vector<LogDeleteEntry> deletes;
  std::vector<LogDecayEntry> decays;
  std::vector<LogTableEntry> tables;
  std::vector<LogDenseEntry> dense;
  std::vector<LogInstallEntry> installs;
  std::vector<LogDenseInstall> dense_installs;
};

// Builds one encoded record. Not thread-safe.
class LogRecordBuilder {
 public:
  // `expected_bytes` sizes the buffer once (EncodedTableBytes helps compute it).
  LogRecordBuilder(const PushKey& key, size_t expected_bytes);
  void AddTable(absl::string_view table, float lr, uint32_t dim, absl::Span<const int64_t> ids,
                absl::Span<const uint64_t> steps, const float* grads);
  void AddDense(absl::string_view name, float lr, uint64_t step, absl::Span<const float> grads);
  // Rows installed whole: values holds ids.size() rows of row_floats floats.
  void AddInstall(absl::string_view table, uint32_t row_floats, absl::Span<const int64_t> ids,
                  absl::Span<const uint64_t> steps, absl::Span<const float> values);
  void AddDenseInstall(absl::string_view name, uint64_t step, absl::Span<const float> values);
  // Rows deleted: the change must be applied with the apply lock held exclusively
  // (PodStorage::ApplyLogged's `exclusive`), see the file comment.
  void AddDelete(absl::string_view table, absl::Span<const int64_t> ids);
  // Admission counters of `vshards` halved (with the apply lock held exclusively).
  void AddDecay(absl::string_view table, absl::Span<const uint32_t> vshards);
  // Admission counters installed (a move's copy).
  void AddAdmissionInstall(absl::string_view table, absl::string_view counters);
  // Marks a whole key as recorded exactly (version 3, see the file comment): for the
  // vshards of the record's rows only. No effect on a piece's key (exact already) or on an
  // adopted record (which carries its own mark). May come before or after the entries.
  void SetKeyExact();
  // Makes `encoded` the record, a whole record already encoded under the same key
  // (ParseLogRecord accepted it), shared rather than copied: a follower logs its
  // primary's record as it came instead of encoding the same entries again
  // (ps/ps_core_replicate.cc). Entries added before are dropped; add none after.
  void Adopt(std::shared_ptr<const std::string> encoded);
  // Whether an entry was added (or a record adopted): a record without one changes nothing.
  bool has_entries() const { return adopted_ != nullptr || out_.size() > header_bytes_; }
  // The encoded record (a copy of an adopted one); the builder is empty afterwards.
  std::string Finish();
  // The same, shared: an adopted record as it was given, never copied.
  std::shared_ptr<const std::string> FinishShared();

  static constexpr size_t kHeaderBytes = 1 + 3 * 8;  // version, key

  static size_t TableBytes(absl::string_view table, size_t n, uint32_t dim) {
    return 1 + 2 + table.size() + 4 + 4 + 4 + n * (8 + 8 + 4 * size_t{dim});
  }

 private:
  std::string out_;
  std::shared_ptr<const std::string> adopted_;  // set by Adopt
  size_t header_bytes_ = kHeaderBytes;          // plus the piece's u32 for a piece's key
};

// DATA_LOSS if `bytes` is not a well-formed record. The record with its arrays copied out
// (ParseLogRecord reads it in place).
absl::StatusOr<LogRecord> DecodeLogRecord(absl::string_view bytes);

// A record parsed in place (recovery): the entries point into the record's bytes, which
// must outlive the view. Numbers may be unaligned: read ids and steps with the accessors.
struct LogArrayView {
  const char* p = nullptr;
  template <typename T>
  T Get(size_t i) const {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    return v;
  }
};
struct LogTableView {
  absl::string_view table;
  float lr = 0;
  uint32_t n = 0, dim = 0;
  LogArrayView ids, steps;
  const char* grads = nullptr;  // n * dim floats
  int64_t id(size_t i) const { return ids.Get<int64_t>(i); }
  uint64_t step(size_t i) const { return steps.Get<uint64_t>(i); }
  const float* grad(size_t i) const {
    return reinterpret_cast<const float*>(grads + i * dim * sizeof(float));
  }
};
struct LogInstallView {
  absl::string_view table;
  uint32_t n = 0, row_floats = 0;
  LogArrayView ids, steps;
  const char* values = nullptr;  // n * row_floats floats
  int64_t id(size_t i) const { return ids.Get<int64_t>(i); }
  uint64_t step(size_t i) const { return steps.Get<uint64_t>(i); }
  const float* row(size_t i) const {
    return reinterpret_cast<const float*>(values + i * row_floats * sizeof(float));
  }
};
struct LogDenseView {
  absl::string_view name;
  float lr = 0;
  uint64_t step = 0;
  uint32_t n = 0;
  const char* grads = nullptr;  // n floats
};
struct LogDenseInstallView {
  absl::string_view name;
  uint64_t step = 0;
  uint32_t n = 0;
  const char* values = nullptr;  // n floats
};
struct LogDeleteView {
  absl::string_view table;
  uint32_t n = 0;
  LogArrayView ids;
  int64_t id(size_t i) const { return ids.Get<int64_t>(i); }
};
struct LogDecayView {
  absl::string_view table;
  uint32_t n = 0;
  LogArrayView vshards;
  uint32_t vshard(size_t i) const { return vshards.Get<uint32_t>(i); }
};
struct LogAdmissionInstallView {
  absl::string_view table;
  absl::string_view counters;
};
struct LogRecordView {
  PushKey key;
  bool key_exact = false;  // version 3: see the file comment
  std::vector<LogAdmissionInstallView> admission_installs;
  std::vector<LogDeleteView> deletes;
  std::vector<LogDecayView> decays;
  std::vector<LogTableView> tables;
  std::vector<LogInstallView> installs;
  std::vector<LogDenseView> dense;
  std::vector<LogDenseInstallView> dense_installs;
  bool has_dense = false;  // dense or dense_installs is not empty (rare, small: decode them)
};
// The one parser of the format: DecodeLogRecord is this plus copies of the arrays.
absl::StatusOr<LogRecordView> ParseLogRecord(absl::string_view bytes);

}  // namespace ps
