#include "ps/storage/log_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/crc32c.h"
#include "common/base/status_macros.h"

namespace ps {
namespace {

constexpr size_t kHeader = 24;
constexpr char kSuffix[] = ".log";

absl::Status Errno(absl::string_view what, int err) {
  const std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::UnavailableError(msg);  // ENOSPC, EIO, ...
}

std::string SegmentName(uint64_t first_lsn) {
  return absl::StrFormat("%020u%s", first_lsn, kSuffix);
}

void EncodeHeader(uint64_t lsn, uint32_t bytes, uint32_t crc, char* out) {
  std::memcpy(out, &lsn, 8);
  std::memcpy(out + 8, &bytes, 4);
  std::memcpy(out + 12, &crc, 4);
  const uint32_t header_crc = Crc32c(0, out, 16);
  std::memcpy(out + 16, &header_crc, 4);
  std::memset(out + 20, 0, 4);
}

// Maps a whole file read-only (the page cache's pages, no copy); *bytes views it.
absl::Status MapFile(int fd, const std::string& path, std::shared_ptr<const void>* mapping,
                     absl::string_view* bytes) {
  struct stat st;
  if (fstat(fd, &st) != 0) return Errno(absl::StrCat("cannot stat ", path), errno);
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    *bytes = absl::string_view();
    return absl::OkStatus();
  }
  void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) return Errno(absl::StrCat("cannot map ", path), errno);
  madvise(p, size, MADV_SEQUENTIAL);
  *mapping =
      std::shared_ptr<const void>(p, [size](const void* q) { munmap(const_cast<void*>(q), size); });
  *bytes = absl::string_view(static_cast<const char*>(p), size);
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno(absl::StrCat("cannot open ", dir), errno);
  const int rc = fsync(fd);
  const int err = errno;
  close(fd);
  if (rc != 0) return Errno(absl::StrCat("cannot fsync ", dir), err);
  return absl::OkStatus();
}

// The first lsns of the segments in `dir`, in order. FAILED_PRECONDITION if it holds
// anything else.
absl::StatusOr<std::vector<uint64_t>> ListSegments(const std::string& dir) {
  std::vector<uint64_t> firsts;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return Errno(absl::StrCat("cannot list ", dir), errno);
  while (dirent* e = readdir(d)) {
    const absl::string_view name(e->d_name);
    uint64_t lsn;
    if (name.size() == 20 + std::strlen(kSuffix) && absl::EndsWith(name, kSuffix) &&
        absl::SimpleAtoi(name.substr(0, 20), &lsn)) {
      firsts.push_back(lsn);
    } else if (name != "." && name != "..") {
      closedir(d);
      return absl::FailedPreconditionError(
          absl::StrCat("push log dir ", dir, " holds '", name, "', which is not a log segment"));
    }
  }
  closedir(d);
  std::sort(firsts.begin(), firsts.end());
  return firsts;
}

// Deletes `path`; a file already gone is fine when `missing_ok`.
absl::Status DeleteFile(const std::string& path, bool missing_ok) {
  if (unlink(path.c_str()) != 0 && !(missing_ok && errno == ENOENT)) {
    return Errno(absl::StrCat("cannot delete ", path), errno);
  }
  return absl::OkStatus();
}

// A segment file mapped read-only: `bytes` views `mapping` (null for an empty file).
struct MappedSegment {
  std::shared_ptr<const void> mapping;
  absl::string_view bytes;
};

absl::StatusOr<MappedSegment> MapSegment(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno(absl::StrCat("cannot open ", path), errno);
  MappedSegment segment;
  absl::Status s = MapFile(fd, path, &segment.mapping, &segment.bytes);
  close(fd);
  if (!s.ok()) return s;
  return segment;
}

// Decodes the record at the start of `buf`, which should be record `expect`. Returns
// what is wrong with it (a torn or damaged record), or an empty string and sets *payload.
std::string DecodeRecord(absl::string_view buf, uint64_t expect, absl::string_view* payload) {
  if (buf.size() < kHeader) return "a torn record header";
  const char* h = buf.data();
  uint64_t lsn;
  uint32_t bytes, crc, header_crc;
  std::memcpy(&lsn, h, 8);
  std::memcpy(&bytes, h + 8, 4);
  std::memcpy(&crc, h + 12, 4);
  std::memcpy(&header_crc, h + 16, 4);
  if (Crc32c(0, h, 16) != header_crc) return "a record header that fails its checksum";
  if (lsn != expect) return absl::StrCat("record ", lsn, " where ", expect, " was expected");
  if (buf.size() - kHeader < bytes) return "a torn record";
  *payload = absl::string_view(h + kHeader, bytes);
  if (LogFiles::Checksum(*payload) != crc) {
    return absl::StrCat("record ", lsn, " failing its checksum");
  }
  return std::string();
}

// The lsn of the last record read, across segments: records must follow on.
struct LsnChain {
  bool have_prev = false;
  uint64_t prev = 0;
};

// What a scan of one segment found: `valid` bytes of whole records from its start, then
// `damage` (empty if the records fill the file).
struct SegmentScan {
  size_t valid = 0;
  std::string damage;
};

// Reads the records of one segment (first lsn `first_lsn`, at `path`), adding those from
// `from` on to `out`. DATA_LOSS if its first record does not follow `chain`'s.
absl::StatusOr<SegmentScan> ScanSegment(const std::string& path, absl::string_view buf,
                                        uint64_t first_lsn, uint64_t from, LsnChain* chain,
                                        LogRead* out) {
  SegmentScan scan;
  uint64_t expect = first_lsn;
  while (scan.valid < buf.size()) {
    absl::string_view payload;
    scan.damage = DecodeRecord(buf.substr(scan.valid), expect, &payload);
    if (!scan.damage.empty()) break;
    const uint64_t lsn = expect;
    if (chain->have_prev && lsn != chain->prev + 1) {
      return absl::DataLossError(absl::StrCat("push log records ", chain->prev + 1, " to ", lsn - 1,
                                              " are missing (before segment ", path, ")"));
    }
    chain->have_prev = true;
    chain->prev = lsn;
    if (lsn >= from) {
      out->records.push_back({lsn, payload});
      out->bytes += payload.size();
    }
    ++expect;
    scan.valid += kHeader + payload.size();
  }
  return scan;
}

// Damage in the newest segment is a write cut short by a crash, never acknowledged: it is
// cut off. Anywhere else it is DATA_LOSS.
absl::Status HandleDamage(const std::string& path, size_t file_bytes, const SegmentScan& scan,
                          bool newest) {
  if (scan.damage.empty()) return absl::OkStatus();
  if (!newest) {
    return absl::DataLossError(absl::StrCat("push log segment ", path, " is damaged at byte ",
                                            scan.valid, " (", scan.damage,
                                            ") and is not the newest"));
  }
  LOG(WARNING) << "push log: cutting " << file_bytes - scan.valid << " bytes off " << path
               << " at byte " << scan.valid << " (" << scan.damage
               << "; a write interrupted by a crash)";
  if (truncate(path.c_str(), static_cast<off_t>(scan.valid)) != 0) {
    return Errno(absl::StrCat("cannot truncate ", path), errno);
  }
  return absl::OkStatus();
}

}  // namespace

struct LogFiles::Segment {
  uint64_t first_lsn = 0;
  std::string path;
  int fd = -1;        // open for appends (the newest segment), else -1
  uint64_t size = 0;  // bytes of whole records
  ~Segment() {
    if (fd >= 0) close(fd);
  }
};

uint32_t LogFiles::Checksum(absl::string_view record) {
  return Crc32c(0, record.data(), record.size());
}

LogFiles::LogFiles(const LogFilesOptions& options) : options_(options) {}
LogFiles::~LogFiles() = default;

absl::StatusOr<std::unique_ptr<LogFiles>> LogFiles::Open(const LogFilesOptions& options) {
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create push log dir ", options.dir, ": ", ec.message()));
  }
  return std::unique_ptr<LogFiles>(new LogFiles(options));
}

absl::Status LogFiles::Injected(absl::string_view what) const {
  if (options_.inject_write_error && options_.inject_write_error()) {
    return absl::UnavailableError(
        absl::StrCat(what, " ", options_.dir, ": No space left on device (injected fault)"));
  }
  return absl::OkStatus();
}

absl::Status LogFiles::ReadAll(uint64_t from, LogRead* out) {
  ASSIGN_OR_RETURN(const std::vector<uint64_t> firsts, ListSegments(options_.dir));
  std::vector<std::shared_ptr<Segment>> kept;
  LsnChain chain;
  for (size_t i = 0; i < firsts.size(); ++i) {
    const std::string path = absl::StrCat(options_.dir, "/", SegmentName(firsts[i]));
    const bool newest = i + 1 == firsts.size();
    if (!newest && firsts[i + 1] <= from) {  // only records below `from`: deleted earlier
      RETURN_IF_ERROR(DeleteFile(path, /*missing_ok=*/true));
      continue;
    }
    ASSIGN_OR_RETURN(MappedSegment file, MapSegment(path));
    ASSIGN_OR_RETURN(const SegmentScan scan,
                     ScanSegment(path, file.bytes, firsts[i], from, &chain, out));
    RETURN_IF_ERROR(HandleDamage(path, file.bytes.size(), scan, newest));
    if (scan.valid == 0) {  // nothing in it: the next append reuses or replaces it
      RETURN_IF_ERROR(DeleteFile(path, /*missing_ok=*/false));
      continue;
    }
    out->buffers.push_back(std::move(file.mapping));
    auto seg = std::make_shared<Segment>();
    seg->first_lsn = firsts[i];
    seg->path = path;
    seg->size = scan.valid;
    kept.push_back(std::move(seg));
  }
  absl::MutexLock lock(&mu_);
  segments_ = std::move(kept);
  return absl::OkStatus();
}

absl::Status LogFiles::Append(absl::Span<const LogAppend> records, bool sync) {
  if (records.empty()) return absl::OkStatus();
  if (absl::Status s = Injected("cannot append to the push log in"); !s.ok()) return s;
  std::shared_ptr<Segment> cur;
  {
    absl::MutexLock lock(&mu_);
    if (!open_for_append_ || segments_.empty() ||
        segments_.back()->size >= options_.segment_bytes) {
      if (open_for_append_ && !segments_.empty() && options_.sync_on_rotate) {
        if (fdatasync(segments_.back()->fd) != 0) {
          return Errno(absl::StrCat("cannot fsync ", segments_.back()->path), errno);
        }
      }
      auto seg = std::make_shared<Segment>();
      seg->first_lsn = records.front().lsn;
      seg->path = absl::StrCat(options_.dir, "/", SegmentName(seg->first_lsn));
      seg->fd = open(seg->path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
      if (seg->fd < 0) return Errno(absl::StrCat("cannot create ", seg->path), errno);
      if (options_.sync_on_rotate) RETURN_IF_ERROR(SyncDir(options_.dir));
      if (!segments_.empty() && segments_.back()->fd >= 0) {
        close(segments_.back()->fd);  // Sync works on a dup of it
        segments_.back()->fd = -1;
      }
      segments_.push_back(seg);
      open_for_append_ = true;
    }
    cur = segments_.back();
  }
  std::vector<char> headers(records.size() * kHeader);
  std::vector<iovec> iov;
  iov.reserve(records.size() * 2);
  size_t total = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    const LogAppend& r = records[i];
    char* h = headers.data() + i * kHeader;
    EncodeHeader(r.lsn, static_cast<uint32_t>(r.record.size()), r.crc, h);
    iov.push_back({h, kHeader});
    if (!r.record.empty()) iov.push_back({const_cast<char*>(r.record.data()), r.record.size()});
    total += kHeader + r.record.size();
  }
  size_t next = 0;
  while (next < iov.size()) {
    const int n = static_cast<int>(std::min<size_t>(iov.size() - next, IOV_MAX));
    const ssize_t w = writev(cur->fd, iov.data() + next, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return Errno(absl::StrCat("cannot append to ", cur->path), errno);
    size_t left = static_cast<size_t>(w);
    while (left > 0 && left >= iov[next].iov_len) left -= iov[next++].iov_len;
    if (left > 0) {  // a short write: continue inside this buffer
      iov[next].iov_base = static_cast<char*>(iov[next].iov_base) + left;
      iov[next].iov_len -= left;
    }
  }
  if (sync) {
    if (absl::Status s = Injected("cannot fsync the push log in"); !s.ok()) return s;
    if (fdatasync(cur->fd) != 0) return Errno(absl::StrCat("cannot fsync ", cur->path), errno);
  }
  absl::MutexLock lock(&mu_);
  cur->size += total;
  return absl::OkStatus();
}

absl::Status LogFiles::Sync() {
  if (absl::Status s = Injected("cannot fsync the push log in"); !s.ok()) return s;
  std::string path;
  int fd;
  {
    absl::MutexLock lock(&mu_);
    if (!open_for_append_ || segments_.empty()) return absl::OkStatus();
    path = segments_.back()->path;
    // A duplicate, so a rotation closing the segment's fd cannot race with the fsync.
    fd = dup(segments_.back()->fd);
  }
  if (fd < 0) return Errno(absl::StrCat("cannot fsync ", path), errno);
  const int rc = fdatasync(fd);
  const int err = errno;
  close(fd);
  if (rc != 0) return Errno(absl::StrCat("cannot fsync ", path), err);
  return absl::OkStatus();
}

absl::Status LogFiles::DeleteBelow(uint64_t cut) {
  std::vector<std::string> doomed;
  {
    absl::MutexLock lock(&mu_);
    size_t n = 0;
    while (n + 1 < segments_.size() && segments_[n + 1]->first_lsn <= cut) {
      doomed.push_back(segments_[n]->path);
      ++n;
    }
    segments_.erase(segments_.begin(), segments_.begin() + n);
  }
  for (const std::string& path : doomed) {
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Errno(absl::StrCat("cannot delete ", path), errno);
    }
  }
  return absl::OkStatus();
}

absl::Status LogFiles::CopyTo(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::FailedPreconditionError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  struct Source {
    int fd;
    uint64_t first_lsn, size;
    std::string path;
  };
  std::vector<Source> sources;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& seg : segments_) {
      const int fd = open(seg->path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        status = Errno(absl::StrCat("cannot open ", seg->path), errno);
        break;
      }
      sources.push_back({fd, seg->first_lsn, seg->size, seg->path});
    }
  }
  std::vector<char> buf(size_t{1} << 20);
  for (const Source& src : sources) {
    if (!status.ok()) break;
    const std::string dst = absl::StrCat(dir, "/", SegmentName(src.first_lsn));
    const int out = open(dst.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (out < 0) {
      status = Errno(absl::StrCat("cannot create ", dst), errno);
      break;
    }
    uint64_t done = 0;
    while (status.ok() && done < src.size) {
      const ssize_t n = pread(src.fd, buf.data(), std::min<uint64_t>(buf.size(), src.size - done),
                              static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        status = n == 0 ? absl::DataLossError(absl::StrCat(src.path, " is shorter than written"))
                        : Errno(absl::StrCat("cannot read ", src.path), errno);
        break;
      }
      size_t put = 0;
      while (put < static_cast<size_t>(n)) {
        const ssize_t w = write(out, buf.data() + put, static_cast<size_t>(n) - put);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
          status = Errno(absl::StrCat("cannot write ", dst), errno);
          break;
        }
        put += static_cast<size_t>(w);
      }
      done += static_cast<uint64_t>(n);
    }
    if (status.ok() && fsync(out) != 0) status = Errno(absl::StrCat("cannot fsync ", dst), errno);
    close(out);
  }
  for (const Source& src : sources) close(src.fd);
  if (status.ok()) status = SyncDir(dir);
  return status;
}

uint64_t LogFiles::bytes() const {
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (const auto& seg : segments_) total += seg->size;
  return total;
}

}  // namespace ps
