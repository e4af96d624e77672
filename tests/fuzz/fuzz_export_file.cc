// libFuzzer harness: the export file reader (proto/export_file.h), as `ps-transfer
// import` reads a file it is given. An input is
//   u8 flags (bit 0: leave the checksums as they are; else they are set right, so that
//   the fuzzer reaches what lies behind them), then the file's bytes.
// The file is read whole (Open, then Next until the end or an error). Checks (any
// mismatch aborts; an allocation beyond -malloc_limit_mb is a crash too):
// - errors are DATA_LOSS, UNIMPLEMENTED (a newer version) or, never, anything else;
// - a block has exactly its records' ids, steps and values;
// - a file read to its end block: its summary counts every record, every byte, and has
//   the CRC-32C of the whole file.
//
// Seeds: tests/fuzz/corpus/export_file/ (tests/fuzz/make_corpus.py).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/crc32c.h"
#include "proto/export_file.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_export_file: %s\n", what);
    std::abort();
  }
}

uint32_t Get32(const std::string& s, size_t at) {
  uint32_t v;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}

void Put32(std::string* s, size_t at, uint32_t v) { std::memcpy(s->data() + at, &v, 4); }

// Writes the right checksums where the file's own lengths place them (as far as they fit).
void FixChecksums(std::string* f) {
  constexpr size_t kFixed = 8 + 4 + 4 + 4;  // magic, version, kind, spec length
  if (f->size() < kFixed) return;
  const size_t spec = Get32(*f, 16);
  if (spec > f->size() - kFixed || f->size() - kFixed - spec < 12) return;
  const size_t crc_at = kFixed + spec + 8;
  Put32(f, crc_at, ps::Crc32c(0, f->data(), crc_at));
  size_t at = crc_at + 4;
  while (f->size() - at >= 12) {
    uint64_t payload;
    std::memcpy(&payload, f->data() + at + 4, 8);
    if (payload > f->size() - at - 12 || f->size() - at - 12 - payload < 4) return;
    Put32(f, at + 12 + payload, payload == 0 ? 0 : ps::Crc32c(0, f->data() + at + 12, payload));
    at += 12 + payload + 4;
  }
}

// The file lives in memory; the reader opens it by path, as it would a file on disk.
class MemFile {
 public:
  explicit MemFile(const std::string& bytes) : fd_(memfd_create("export", MFD_CLOEXEC)) {
    Check(fd_ >= 0, "memfd_create");
    Check(write(fd_, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()), "write");
  }
  ~MemFile() { close(fd_); }
  std::string path() const { return absl::StrCat("/proc/self/fd/", fd_); }

 private:
  int fd_;
};

bool Expected(const absl::Status& s) {
  return s.code() == absl::StatusCode::kDataLoss || s.code() == absl::StatusCode::kUnimplemented;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::string file(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) FixChecksums(&file);
  MemFile mem(file);
  auto reader = ps::ExportFileReader::Open(mem.path());
  if (!reader.ok()) {
    Check(Expected(reader.status()), "Open fails with DATA_LOSS or UNIMPLEMENTED");
    return 0;
  }
  const size_t floats = size_t{(*reader)->dim()} + (*reader)->slot_floats();
  ps::ExportBlock block;
  uint64_t rows = 0;
  for (;;) {
    absl::StatusOr<bool> more = (*reader)->Next(&block);
    if (!more.ok()) {
      Check(Expected(more.status()), "Next fails with DATA_LOSS or UNIMPLEMENTED");
      return 0;
    }
    if (!*more) break;
    Check(!block.ids.empty(), "a block before the end has records");
    Check(block.steps.size() == block.ids.size(), "a step per record");
    Check(block.values.size() == block.ids.size() * floats, "dim + slot floats per record");
    rows += block.ids.size();
  }
  const ps::ExportFileSummary& summary = (*reader)->summary();
  Check(summary.rows == rows, "the summary counts every record");
  Check(summary.bytes == file.size(), "a file read to its end was read whole");
  Check(summary.crc32c == ps::Crc32c(0, file.data(), file.size()), "the whole file's checksum");
  return 0;
}
