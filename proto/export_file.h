// The data files of a portable export (docs/architecture.md, "Export format"): one table's
// rows, or one dense tensor, with a checksum per block and one over the whole file.
//
// Layout, little-endian:
//   header  "PSEXPORT", u32 version (1), u32 kind (1 table rows, 2 dense tensor, 3 deleted
//           ids: a delta export's rows deleted since its cursor; dim and slots 0),
//           u32 spec length, spec (TableSpec / DenseSpec, protobuf binary, normalized),
//           u32 dim (a dense tensor's numel), u32 slot floats (optimizer state per record),
//           u32 CRC-32C of the header bytes before it
//   blocks  u32 records, u64 payload bytes, payload, u32 CRC-32C of the payload;
//           a record is i64 id, u64 step, dim f32 weights, slot floats f32 (a dense
//           tensor is one record with id 0; a deleted id is id and step 0, no floats)
//   end     a block of 0 records and 0 payload bytes (its CRC is 0)
// A file without the end block is truncated (DATA_LOSS), as is one with bytes after it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ps {

enum class ExportKind : uint32_t { kTableRows = 1, kDense = 2, kDeletedIds = 3 };

// The position an export was cut at, per pod (ps/storage/change_journal.h: the pod's
// database identity, its change journal's entry and that entry's tag). A cluster's cursor
// is every part's position, as text: "v1:" then, comma-separated, "<identity hex>.<seq>.<tag
// hex>" (e.g. "v1:9f2c03a1e4b5d6c7.42.1b2e..."); "v1:" alone names no pod (every pod exports
// whole). `ps-transfer export` prints it; `--since` takes it back.
struct ExportCursorEntry {
  uint64_t identity = 0;
  uint64_t seq = 0;
  uint64_t tag = 0;
  bool operator==(const ExportCursorEntry& o) const {
    return identity == o.identity && seq == o.seq && tag == o.tag;
  }
};
std::string FormatExportCursor(const std::vector<ExportCursorEntry>& entries);
// INVALID_ARGUMENT naming what is wrong: not a cursor, a damaged entry, over 65536 entries.
absl::StatusOr<std::vector<ExportCursorEntry>> ParseExportCursor(const std::string& cursor);

struct ExportFileSummary {
  uint64_t rows = 0;    // records
  uint64_t bytes = 0;   // file size
  uint32_t crc32c = 0;  // of every byte of the file
};

// Writes one file. Not thread-safe.
class ExportFileWriter {
 public:
  // Creates `path` (it must not exist) and writes the header. Payload blocks are cut at
  // about `block_bytes`.
  static absl::StatusOr<std::unique_ptr<ExportFileWriter>> Create(
      const std::string& path, ExportKind kind, const std::string& spec_bytes, uint32_t dim,
      uint32_t slot_floats, size_t block_bytes = size_t{1} << 20);
  ~ExportFileWriter();  // closes the file if Finish was not called (the file is incomplete)

  // Appends one record: dim weights and slot_floats slots.
  absl::Status Add(int64_t id, uint64_t step, const float* weights, const float* slots);
  // Writes the last block and the end block, fsyncs and closes. The summary is what the
  // manifest records.
  absl::StatusOr<ExportFileSummary> Finish();
  uint64_t rows() const { return rows_; }
  uint64_t bytes() const { return bytes_ + block_.size(); }

 private:
  ExportFileWriter(std::string path, int fd, uint32_t dim, uint32_t slot_floats,
                   size_t block_bytes);
  absl::Status Write(const std::string& data);
  absl::Status FlushBlock();

  const std::string path_;
  int fd_;
  const uint32_t dim_, slot_floats_;
  const size_t block_bytes_;
  std::string block_;  // payload being gathered
  uint32_t block_records_ = 0;
  uint64_t rows_ = 0, bytes_ = 0;
  uint32_t crc_ = 0;
};

// One decoded block: per record its id, step, and dim + slot_floats values.
struct ExportBlock {
  std::vector<int64_t> ids;
  std::vector<uint64_t> steps;
  std::vector<float> values;
};

// Reads one file, checking every checksum. Not thread-safe.
class ExportFileReader {
 public:
  // Opens `path` and checks its header: NOT_FOUND if missing, DATA_LOSS if it is not an
  // export file or its header is damaged, UNIMPLEMENTED for a newer version.
  static absl::StatusOr<std::unique_ptr<ExportFileReader>> Open(const std::string& path);
  ~ExportFileReader();

  ExportKind kind() const { return kind_; }
  const std::string& spec_bytes() const { return spec_; }
  uint32_t dim() const { return dim_; }
  uint32_t slot_floats() const { return slot_floats_; }

  // The next block into *block (replacing its contents): true, or false at the end
  // block. DATA_LOSS for a damaged or truncated file (naming it and the offset).
  absl::StatusOr<bool> Next(ExportBlock* block);
  // After Next returned false: records, size and checksum of the whole file.
  const ExportFileSummary& summary() const { return summary_; }

 private:
  ExportFileReader(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  absl::Status ReadExact(void* dst, size_t n, const char* what);
  // Reads n bytes into *out, growing it as they arrive (a damaged length field costs no
  // more memory than the bytes the file really has).
  absl::Status ReadGrowing(std::string* out, uint64_t n, const char* what);

  const std::string path_;
  int fd_;
  ExportKind kind_ = ExportKind::kTableRows;
  std::string spec_;
  uint32_t dim_ = 0, slot_floats_ = 0;
  ExportFileSummary summary_;
  uint64_t offset_ = 0;
  bool done_ = false;
};

}  // namespace ps
