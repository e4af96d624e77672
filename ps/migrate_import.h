// The destination pod's side of a vshard move: pulls the vshards' rows from the source pod
// (MigrateExport: the snapshot, catch-up rounds, then the fenced final delta), installs
// them in the PsCore and makes them durable. See proto/ps.proto for the protocol.
#pragma once

#include "absl/status/status.h"
#include "common/rpc/transport_security.h"
#include "proto/ps.pb.h"
#include "ps/ps_core.h"

namespace ps {

struct MigrateImportOptions {
  // Bytes of rows per export chunk: bounds the memory a move needs on both pods.
  uint64_t chunk_bytes = uint64_t{4} << 20;
  // Deadline of each export call. A chunk is a few MB; the FINAL call also waits for the
  // source's log to be written.
  absl::Duration rpc_timeout = absl::Seconds(30);
  // Credentials and token for the call to the source pod (default: plain text).
  ChannelMaker channels;
};

// Runs the whole import of `req` into `core`; OK once every row is durable here. Any
// error leaves partial rows, which the pod drops when the master aborts the move.
absl::Status RunMigrateImport(PsCore* core, const MigrateImportRequest& req,
                              MigrateImportResponse* resp,
                              const MigrateImportOptions& options = {});

}  // namespace ps
