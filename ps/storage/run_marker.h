// The run marker of a pod's database: whether the previous run ended with a clean close,
// and if not, whether its log may lack records it acknowledged.
//
// A run writes the marker file (StorageDb::WriteRunMarker, fsynced) when the database is
// open and recovered, before it acknowledges anything, and a clean close removes it once
// every record of the log is written and fsynced. So a marker found at the next open means
// the previous run ended in a crash (or a kill). Its content says what that crash may have
// cost:
//   "exact"          the run acknowledged a record only once it was fsynced (machine): no
//                    crash, of the process or of the machine, lost anything acknowledged;
//   "process <boot>" the run acknowledged a record once it was written to the page cache
//                    (process), on the boot with id <boot> (/proc/sys/kernel/random/boot_id):
//                    a crash of the process lost nothing, but if the machine went down
//                    since (the boot id differs now: power loss, kernel panic, reboot) the
//                    page cache's unsynced tail of the log may be gone, so it counts as
//                    lossy;
//   "lossy"          the run acknowledged records before writing them (periodic), or carried
//                    an earlier such crash not yet cleared: up to --flush_ms of acknowledged
//                    records may be missing from the log (at R >= 2 its followers or its
//                    primary hold them).
// A lossy crash stays recorded ("lossy" is written again) until a clean close, so a pod
// that crashes again before it reported the loss to the master reports it next time.
// Any other content (a marker torn by a crash while written) is taken as "lossy". A
// database without a marker (new, cleanly closed, written by an older version, or a
// checkpoint's copy: the file is beside the database, not in it) counts as a clean close.
// Where the boot id cannot be read (not Linux), a process-mode run is recorded without one
// and its crash counts as exact, as before boot ids were recorded (a warning says so).
//
// Not thread-safe: called by PodStorage at open and at close only.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ps/storage/durable_log.h"
#include "ps/storage/storage_db.h"

namespace ps {

struct PreviousRun {
  bool crashed = false;                 // a marker was found: no clean close
  bool lost_acknowledged_tail = false;  // crashed "lossy" (or unknown), or "process" on
                                        // another boot
};

// This machine's boot id (/proc/sys/kernel/random/boot_id, trimmed), or "" when it cannot
// be read.
std::string CurrentBootId();

// Reads the previous run's marker, then writes this run's (fsynced): "lossy" when `mode`
// acknowledges before writing (periodic) or the previous run lost its tail, "process
// <boot_id>" in process mode, else "exact". `boot_id` is this boot's (CurrentBootId();
// tests inject others). Returns what the previous run left. Store errors as they come (then
// nothing is known: the caller refuses to start).
absl::StatusOr<PreviousRun> BeginRun(StorageDb* db, Durability mode, absl::string_view boot_id);
// The same on this machine's boot id.
absl::StatusOr<PreviousRun> BeginRun(StorageDb* db, Durability mode);

// Removes the marker (fsynced): the run ended cleanly. Call only once every record this run
// acknowledged is written and fsynced.
absl::Status EndRun(StorageDb* db);

}  // namespace ps
