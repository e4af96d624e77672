// What a chaos worker did, one line per event, appended to its own file with one write(2)
// each, so that a worker killed with SIGKILL leaves every line it wrote whole (the page
// cache keeps them; the file is read only after the worker is gone).
//
//   T task attempt epoch first end   took task `task` (records [first, end) of `epoch`)
//   P task attempt epoch record      about to push that record's parts
//   A task attempt epoch record      the push was acknowledged (every part applied once)
//   F task attempt epoch record      the push failed after the client's retries: its
//                                    parts may or may not have been applied
//   R task attempt outcome           the report's outcome: ok, duplicate or lost
//
// A P with no A or F after it in the same file is a push in flight when the worker died:
// like F, applied or not.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace ps::chaos {

// Appends lines to one journal file. Not thread-safe (one per worker process).
class JournalWriter {
 public:
  // Opens (creates) `path` for appending.
  static absl::StatusOr<JournalWriter> Open(const std::string& path);
  JournalWriter(JournalWriter&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  JournalWriter& operator=(JournalWriter&&) = delete;
  ~JournalWriter();

  // Appends `line` and a newline with one write(2).
  absl::Status Append(const std::string& line);

 private:
  explicit JournalWriter(int fd) : fd_(fd) {}
  int fd_;
};

// What all journals say about one (epoch, record): pushes acknowledged, and pushes whose
// fate is unknown (failed, or in flight when their worker died).
struct RecordPushes {
  uint32_t acked = 0;
  uint32_t unknown = 0;
};

struct TaskReports {
  uint32_t ok = 0;         // reports the master accepted (it counted the task)
  uint32_t duplicate = 0;  // retried reports of an accepted one
  uint32_t lost = 0;       // refused: the task was no longer the worker's
};

struct JournalSummary {
  // (epoch, record) -> its pushes.
  std::map<std::pair<uint32_t, uint64_t>, RecordPushes> records;
  // task id -> its reports.
  std::map<uint64_t, TaskReports> tasks;
  uint64_t acked_pushes = 0;
  uint64_t unknown_pushes = 0;
  uint64_t attempts = 0;  // T lines
  uint64_t files = 0;
  uint64_t bad_lines = 0;  // lines that do not parse (none are expected)
};

// Reads every `*.journal` file in `dir`.
absl::StatusOr<JournalSummary> ReadJournals(const std::string& dir);

// Adds one journal's text to `summary` (exposed for tests).
void AddJournal(const std::string& text, JournalSummary* summary);

}  // namespace ps::chaos
