#include "ps/storage/run_marker.h"

#include <glog/logging.h>

#include <fstream>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/base/status_macros.h"

namespace ps {
namespace {

constexpr char kExact[] = "exact";
constexpr char kLossy[] = "lossy";
constexpr char kProcessPrefix[] = "process ";
constexpr char kBootIdPath[] = "/proc/sys/kernel/random/boot_id";

// Whether a crash that left `marker` may have lost acknowledged records, seen on `boot_id`.
bool TailLost(absl::string_view marker, absl::string_view boot_id) {
  if (marker == kExact) return false;
  if (absl::ConsumePrefix(&marker, kProcessPrefix)) {
    // Written to the page cache only: lost if the machine went down since. Without a boot
    // id on either side nothing tells, as before boot ids were recorded.
    if (marker.empty() || boot_id.empty()) return false;
    if (marker == boot_id) return false;
    LOG(WARNING) << "the previous run (durability process) crashed on boot " << marker
                 << " and this is boot " << boot_id
                 << ": the machine went down since, so its log's unsynced tail may be lost";
    return true;
  }
  return true;  // "lossy", or torn
}

}  // namespace

std::string CurrentBootId() {
  std::ifstream in(kBootIdPath);
  std::string id;
  if (!in || !std::getline(in, id)) return "";
  return std::string(absl::StripAsciiWhitespace(id));
}

absl::StatusOr<PreviousRun> BeginRun(StorageDb* db, Durability mode, absl::string_view boot_id) {
  PreviousRun previous;
  ASSIGN_OR_RETURN(std::optional<std::string> found, db->ReadRunMarker());
  if (found.has_value()) {
    previous.crashed = true;
    previous.lost_acknowledged_tail = TailLost(*found, boot_id);
  }
  std::string marker = kExact;
  if (mode == Durability::kPeriodic || previous.lost_acknowledged_tail) {
    marker = kLossy;
  } else if (mode == Durability::kProcess) {
    if (boot_id.empty()) {
      LOG(WARNING) << "cannot read " << kBootIdPath
                   << ": a machine crash in durability process will not be reported as having "
                      "lost the log's tail";
    }
    marker = absl::StrCat(kProcessPrefix, boot_id);
  }
  RETURN_IF_ERROR(db->WriteRunMarker(marker));
  return previous;
}

absl::StatusOr<PreviousRun> BeginRun(StorageDb* db, Durability mode) {
  return BeginRun(db, mode, CurrentBootId());
}

absl::Status EndRun(StorageDb* db) { return db->RemoveRunMarker(); }

}  // namespace ps
