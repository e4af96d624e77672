// Keys of the master's records in its store (the layout is listed in master_store.h).
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace ps {
namespace keys {

inline constexpr absl::string_view kConfig = "config";
inline constexpr absl::string_view kCounters = "counters";
inline constexpr absl::string_view kMap = "map";
inline constexpr absl::string_view kPodPrefix = "pod/";
inline constexpr absl::string_view kTablePrefix = "table/";
inline constexpr absl::string_view kDensePrefix = "dense/";
inline constexpr absl::string_view kWorkerPrefix = "worker/";
inline constexpr absl::string_view kJobPrefix = "job/";
// A task key is kTaskPrefix + job + "/" + 20 digits: parse from the end (names may hold "/").
inline constexpr absl::string_view kTaskPrefix = "task/";
inline constexpr absl::string_view kMovePrefix = "move/";
inline constexpr absl::string_view kCheckpointPrefix = "checkpoint/";

inline std::string Pod(absl::string_view id) { return absl::StrCat(kPodPrefix, id); }
inline std::string Table(absl::string_view name) { return absl::StrCat(kTablePrefix, name); }
inline std::string Dense(absl::string_view name) { return absl::StrCat(kDensePrefix, name); }
// Zero-padded so that key order is numeric order.
inline std::string Worker(uint64_t id) { return absl::StrFormat("worker/%020u", id); }
inline std::string Job(absl::string_view name) { return absl::StrCat(kJobPrefix, name); }
inline std::string Move(uint64_t id) { return absl::StrFormat("move/%020u", id); }
inline std::string Checkpoint(uint64_t id) { return absl::StrFormat("checkpoint/%020u", id); }
inline std::string Task(absl::string_view job, uint64_t id) {
  return absl::StrFormat("task/%s/%020u", job, id);
}

}  // namespace keys
}  // namespace ps
