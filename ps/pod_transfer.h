// Export and import of a pod's rows in the portable format (docs/architecture.md,
// "Export format"): the work behind the PodTransfer RPCs, independent of the transport.
// pod_transfer.cc also defines PsCore's installs of whole rows (PsCore::ImportRows, and
// the helpers a vshard move's PsCore::ImportChunk shares with it).
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "proto/ps.pb.h"
#include "ps/ps_core.h"

namespace ps {

struct ExportOptions {
  // A table's rows are split into files of about this size, so no single file gets huge
  // and an import can read several at once.
  size_t max_file_bytes = size_t{256} << 20;
};

// Writes the tables and dense tensors of the vshards `core` owns into req.dir (created if
// missing). A durable pod exports a consistent cut: it checkpoints its database into
// <dir>/.snapshot, opens that copy lazily (only the rows its log updates come into
// memory), writes those and streams the other stored rows, then deletes the copy. An
// in-memory pod writes its live rows, each row whole, while pushes continue.
// Every export of a durable pod returns its position (resp->cursor; proto/export_file.h).
// With req.since (a delta, docs/architecture.md "Incremental export"): from the same cut,
// only the rows the change journal (ps/storage/change_journal.h) names after this pod's
// position in `since`, plus the rows the snapshot's log updates, and the ids deleted since
// then (files of kind 3); a pod `since` does not name, or whose position there is not one of
// its history, writes every row (resp->whole), as does an in-memory pod.
// Errors: INVALID_ARGUMENT (empty dir, a damaged cursor), ALREADY_EXISTS (dir holds a
// manifest.json), FAILED_PRECONDITION (`since` older than the change journal keeps: take a
// full export), file system errors (RESOURCE_EXHAUSTED when the disk is full). Blocking;
// thread-safe.
absl::Status ExportPod(PsCore& core, const ExportRequest& req, ExportResponse* resp,
                       const ExportOptions& options = {});

}  // namespace ps
