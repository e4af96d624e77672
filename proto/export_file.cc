#include "proto/export_file.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/base/crc32c.h"
#include "common/base/status_macros.h"

namespace ps {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "export files are little-endian");

constexpr char kMagic[8] = {'P', 'S', 'E', 'X', 'P', 'O', 'R', 'T'};
constexpr uint32_t kVersion = 1;
constexpr size_t kBlockHeader = 4 + 8;
// Refuses absurd length fields outright (a damaged file); lengths below these still drive
// no allocation before their bytes are read (ReadGrowing).
constexpr uint64_t kMaxPayload = uint64_t{16} << 30;
constexpr uint32_t kMaxSpec = 1 << 20;
// The most a length field makes the reader allocate ahead of the bytes it has read.
constexpr size_t kReadChunk = size_t{1} << 20;

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

absl::Status ErrnoStatus(const std::string& what, const std::string& path) {
  const int e = errno;
  const std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(e));
  if (e == ENOENT) return absl::NotFoundError(msg);
  if (e == EEXIST) return absl::AlreadyExistsError(msg);
  if (e == EACCES || e == EPERM) return absl::PermissionDeniedError(msg);
  if (e == ENOSPC || e == EDQUOT) return absl::ResourceExhaustedError(msg);
  return absl::UnavailableError(msg);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ExportFileWriter>> ExportFileWriter::Create(
    const std::string& path, ExportKind kind, const std::string& spec_bytes, uint32_t dim,
    uint32_t slot_floats, size_t block_bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("cannot create", path);
  std::unique_ptr<ExportFileWriter> w(
      new ExportFileWriter(path, fd, dim, slot_floats, std::max<size_t>(block_bytes, 1)));
  std::string header(kMagic, sizeof(kMagic));
  Put<uint32_t>(&header, kVersion);
  Put<uint32_t>(&header, static_cast<uint32_t>(kind));
  Put<uint32_t>(&header, static_cast<uint32_t>(spec_bytes.size()));
  header += spec_bytes;
  Put<uint32_t>(&header, dim);
  Put<uint32_t>(&header, slot_floats);
  Put<uint32_t>(&header, Crc32c(0, header.data(), header.size()));
  if (absl::Status s = w->Write(header); !s.ok()) return s;
  return w;
}

ExportFileWriter::ExportFileWriter(std::string path, int fd, uint32_t dim, uint32_t slot_floats,
                                   size_t block_bytes)
    : path_(std::move(path)),
      fd_(fd),
      dim_(dim),
      slot_floats_(slot_floats),
      block_bytes_(block_bytes) {}

ExportFileWriter::~ExportFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status ExportFileWriter::Write(const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd_, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("cannot write", path_);
    }
    done += static_cast<size_t>(n);
  }
  crc_ = Crc32c(crc_, data.data(), data.size());
  bytes_ += data.size();
  return absl::OkStatus();
}

absl::Status ExportFileWriter::Add(int64_t id, uint64_t step, const float* weights,
                                   const float* slots) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, " is finished"));
  Put<int64_t>(&block_, id);
  Put<uint64_t>(&block_, step);
  block_.append(reinterpret_cast<const char*>(weights), size_t{dim_} * sizeof(float));
  block_.append(reinterpret_cast<const char*>(slots), size_t{slot_floats_} * sizeof(float));
  ++block_records_;
  ++rows_;
  if (block_.size() >= block_bytes_) return FlushBlock();
  return absl::OkStatus();
}

absl::Status ExportFileWriter::FlushBlock() {
  std::string out;
  out.reserve(kBlockHeader + block_.size() + 4);
  Put<uint32_t>(&out, block_records_);
  Put<uint64_t>(&out, block_.size());
  out += block_;
  Put<uint32_t>(&out, block_.empty() ? 0 : Crc32c(0, block_.data(), block_.size()));
  block_.clear();
  block_records_ = 0;
  return Write(out);
}

absl::StatusOr<ExportFileSummary> ExportFileWriter::Finish() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, " is finished"));
  if (block_records_ > 0) {
    if (absl::Status s = FlushBlock(); !s.ok()) return s;
  }
  if (absl::Status s = FlushBlock(); !s.ok()) return s;  // the end block
  if (::fsync(fd_) != 0) return ErrnoStatus("cannot fsync", path_);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return ErrnoStatus("cannot close", path_);
  return ExportFileSummary{rows_, bytes_, crc_};
}

absl::StatusOr<std::unique_ptr<ExportFileReader>> ExportFileReader::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open", path);
  std::unique_ptr<ExportFileReader> r(new ExportFileReader(path, fd));
  char magic[sizeof(kMagic)];
  uint32_t version, kind, spec_len;
  if (absl::Status s = r->ReadExact(magic, sizeof(magic), "header"); !s.ok()) return s;
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(absl::StrCat(path, " is not an export file (no PSEXPORT magic)"));
  }
  if (absl::Status s = r->ReadExact(&version, 4, "header"); !s.ok()) return s;
  if (version != kVersion) {
    return absl::UnimplementedError(
        absl::StrCat(path, " has export file version ", version, "; this build reads ", kVersion));
  }
  if (absl::Status s = r->ReadExact(&kind, 4, "header"); !s.ok()) return s;
  if (absl::Status s = r->ReadExact(&spec_len, 4, "header"); !s.ok()) return s;
  if (spec_len > kMaxSpec) {
    return absl::DataLossError(absl::StrCat(path, ": header spec length ", spec_len));
  }
  if (absl::Status s = r->ReadGrowing(&r->spec_, spec_len, "header"); !s.ok()) return s;
  if (absl::Status s = r->ReadExact(&r->dim_, 4, "header"); !s.ok()) return s;
  if (absl::Status s = r->ReadExact(&r->slot_floats_, 4, "header"); !s.ok()) return s;
  const uint32_t header_crc = r->summary_.crc32c;
  uint32_t stored;
  if (absl::Status s = r->ReadExact(&stored, 4, "header"); !s.ok()) return s;
  if (stored != header_crc) {
    return absl::DataLossError(absl::StrCat(path, ": header checksum mismatch"));
  }
  if (kind != static_cast<uint32_t>(ExportKind::kTableRows) &&
      kind != static_cast<uint32_t>(ExportKind::kDense) &&
      kind != static_cast<uint32_t>(ExportKind::kDeletedIds)) {
    return absl::DataLossError(absl::StrCat(path, ": unknown file kind ", kind));
  }
  if (kind == static_cast<uint32_t>(ExportKind::kDeletedIds) &&
      (r->dim_ != 0 || r->slot_floats_ != 0)) {
    return absl::DataLossError(absl::StrCat(path, ": a deleted-ids file with ", r->dim_,
                                            " weights and ", r->slot_floats_, " slots per record"));
  }
  r->kind_ = static_cast<ExportKind>(kind);
  return r;
}

ExportFileReader::~ExportFileReader() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status ExportFileReader::ReadExact(void* dst, size_t n, const char* what) {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::read(fd_, static_cast<char*>(dst) + done, n - done);
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("cannot read", path_);
    }
    if (got == 0) {
      return absl::DataLossError(absl::StrCat(path_, " is truncated: ", what, " at offset ",
                                              offset_ + done, " is incomplete"));
    }
    done += static_cast<size_t>(got);
  }
  summary_.crc32c = Crc32c(summary_.crc32c, dst, n);
  offset_ += n;
  summary_.bytes = offset_;
  return absl::OkStatus();
}

absl::Status ExportFileReader::ReadGrowing(std::string* out, uint64_t n, const char* what) {
  out->clear();
  while (out->size() < n) {
    const size_t at = out->size();
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n - at, kReadChunk));
    out->resize(at + chunk);
    RETURN_IF_ERROR(ReadExact(out->data() + at, chunk, what));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ExportFileReader::Next(ExportBlock* block) {
  if (done_) return false;
  const uint64_t at = offset_;
  uint32_t records;
  uint64_t payload_bytes;
  if (absl::Status s = ReadExact(&records, 4, "block header"); !s.ok()) return s;
  if (absl::Status s = ReadExact(&payload_bytes, 8, "block header"); !s.ok()) return s;
  // At most 16 + 2^35 bytes a record: records * record_bytes could wrap in 64 bits, so
  // compare by division.
  const uint64_t record_bytes = 16 + (uint64_t{dim_} + slot_floats_) * sizeof(float);
  if (payload_bytes > kMaxPayload || payload_bytes % record_bytes != 0 ||
      payload_bytes / record_bytes != records) {
    return absl::DataLossError(absl::StrCat(path_, ": block at offset ", at, " claims ", records,
                                            " records in ", payload_bytes, " bytes"));
  }
  // A truncated file ends the read before its claimed length is allocated.
  std::string payload;
  RETURN_IF_ERROR(ReadGrowing(&payload, payload_bytes, "block"));
  uint32_t stored;
  if (absl::Status s = ReadExact(&stored, 4, "block checksum"); !s.ok()) return s;
  const uint32_t crc = payload.empty() ? 0 : Crc32c(0, payload.data(), payload.size());
  if (stored != crc) {
    return absl::DataLossError(
        absl::StrCat(path_, ": checksum mismatch in the block at offset ", at));
  }
  if (records == 0) {
    char extra;
    const ssize_t n = ::read(fd_, &extra, 1);
    if (n != 0) {
      return absl::DataLossError(
          absl::StrCat(path_, ": bytes after the end block at offset ", offset_));
    }
    done_ = true;
    return false;
  }
  const size_t floats = size_t{dim_} + slot_floats_;
  block->ids.resize(records);
  block->steps.resize(records);
  block->values.resize(records * floats);
  const char* p = payload.data();
  for (uint32_t i = 0; i < records; ++i) {
    std::memcpy(&block->ids[i], p, 8);
    std::memcpy(&block->steps[i], p + 8, 8);
    // A deleted-ids file (kind 3) has no floats: values stays empty (data() may be null).
    if (floats != 0) {
      std::memcpy(block->values.data() + i * floats, p + 16, floats * sizeof(float));
    }
    p += record_bytes;
  }
  summary_.rows += records;
  return true;
}

std::string FormatExportCursor(const std::vector<ExportCursorEntry>& entries) {
  std::string out = "v1:";
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i > 0) out += ",";
    absl::StrAppendFormat(&out, "%016x.%d.%016x", entries[i].identity, entries[i].seq,
                          entries[i].tag);
  }
  return out;
}

absl::StatusOr<std::vector<ExportCursorEntry>> ParseExportCursor(const std::string& cursor) {
  constexpr size_t kMaxEntries = 65536;
  if (!absl::StartsWith(cursor, "v1:")) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", cursor.substr(0, 64),
                     "' is no export cursor (one starts with v1:; use what an "
                     "export printed)"));
  }
  std::vector<ExportCursorEntry> out;
  const absl::string_view body = absl::string_view(cursor).substr(3);
  if (body.empty()) return out;
  for (absl::string_view e : absl::StrSplit(body, ',')) {
    if (out.size() == kMaxEntries) {
      return absl::InvalidArgumentError(
          absl::StrCat("the export cursor has more than ", kMaxEntries, " entries"));
    }
    std::vector<absl::string_view> f = absl::StrSplit(e, '.');
    ExportCursorEntry c;
    if (f.size() != 3 || f[0].size() != 16 || f[2].size() != 16 ||
        !absl::SimpleHexAtoi(f[0], &c.identity) || !absl::SimpleAtoi(f[1], &c.seq) ||
        !absl::SimpleHexAtoi(f[2], &c.tag) || c.identity == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("export cursor entry '", e.substr(0, 64),
                       "' is damaged (expected <16 hex digits>.<number>.<16 hex digits>)"));
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace ps
