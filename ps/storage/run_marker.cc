#include "ps/storage/run_marker.h"

#include <optional>
#include <string>

#include "common/base/status_macros.h"

namespace ps {
namespace {

constexpr char kExact[] = "exact";
constexpr char kLossy[] = "lossy";

}  // namespace

absl::StatusOr<PreviousRun> BeginRun(StorageDb* db, Durability mode) {
  PreviousRun previous;
  ASSIGN_OR_RETURN(std::optional<std::string> found, db->ReadRunMarker());
  if (found.has_value()) {
    previous.crashed = true;
    previous.lost_acknowledged_tail = *found != kExact;
  }
  const bool lossy = mode == Durability::kPeriodic || previous.lost_acknowledged_tail;
  RETURN_IF_ERROR(db->WriteRunMarker(lossy ? kLossy : kExact));
  return previous;
}

absl::Status EndRun(StorageDb* db) { return db->RemoveRunMarker(); }

}  // namespace ps
