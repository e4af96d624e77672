#include "tests/chaos_journal.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ps::chaos {

absl::StatusOr<JournalWriter> JournalWriter::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  return JournalWriter(fd);
}

JournalWriter::~JournalWriter() {
  if (fd_ >= 0) close(fd_);
}

absl::Status JournalWriter::Append(const std::string& line) {
  const std::string text = line + "\n";
  ssize_t n;
  do {
    n = write(fd_, text.data(), text.size());
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(text.size())) {
    return absl::InternalError(absl::StrCat("journal write: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

void AddJournal(const std::string& text, JournalSummary* summary) {
  ++summary->files;
  // The push announced by the last P line, until its A or F.
  bool pending = false;
  std::pair<uint32_t, uint64_t> pending_record;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    uint64_t task = 0, attempt = 0, epoch = 0, record = 0;
    const bool numbers =
        f.size() >= 3 && absl::SimpleAtoi(f[1], &task) && absl::SimpleAtoi(f[2], &attempt);
    if (!numbers) {
      ++summary->bad_lines;
      continue;
    }
    const absl::string_view kind = f[0];
    if (kind == "T" && f.size() == 6) {
      ++summary->attempts;
    } else if (kind == "R" && f.size() == 4) {
      TaskReports& r = summary->tasks[task];
      if (f[3] == "ok") {
        ++r.ok;
      } else if (f[3] == "duplicate") {
        ++r.duplicate;
      } else if (f[3] == "lost") {
        ++r.lost;
      } else {
        ++summary->bad_lines;
      }
    } else if ((kind == "P" || kind == "A" || kind == "F") && f.size() == 5 &&
               absl::SimpleAtoi(f[3], &epoch) && absl::SimpleAtoi(f[4], &record)) {
      const std::pair<uint32_t, uint64_t> key(static_cast<uint32_t>(epoch), record);
      if (kind == "P") {
        if (pending) {  // a P without its outcome: cannot happen in a whole journal
          ++summary->bad_lines;
          ++summary->records[pending_record].unknown;
          ++summary->unknown_pushes;
        }
        pending = true;
        pending_record = key;
        continue;
      }
      if (!pending || pending_record != key) {
        ++summary->bad_lines;
        continue;
      }
      pending = false;
      if (kind == "A") {
        ++summary->records[key].acked;
        ++summary->acked_pushes;
      } else {
        ++summary->records[key].unknown;
        ++summary->unknown_pushes;
      }
    } else {
      ++summary->bad_lines;
    }
  }
  if (pending) {  // in flight when the worker died
    ++summary->records[pending_record].unknown;
    ++summary->unknown_pushes;
  }
}

absl::StatusOr<JournalSummary> ReadJournals(const std::string& dir) {
  JournalSummary summary;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() != ".journal") continue;
    std::ifstream in(entry.path(), std::ios::binary);
    if (!in) return absl::InternalError(absl::StrCat("cannot read ", entry.path().string()));
    std::stringstream text;
    text << in.rdbuf();
    AddJournal(text.str(), &summary);
  }
  if (ec) return absl::InternalError(absl::StrCat("list ", dir, ": ", ec.message()));
  return summary;
}

}  // namespace ps::chaos
