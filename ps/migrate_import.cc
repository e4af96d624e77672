#include "ps/migrate_import.h"

#include <glog/logging.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/rpc/grpc_status.h"
#include "proto/ps.grpc.pb.h"

namespace ps {
namespace {

// Exports one whole phase from the source into the core; returns the phase's row count.
absl::StatusOr<uint64_t> CopyPhase(ParameterServer::Stub* stub, PsCore* core,
                                   const MigrateImportRequest& req,
                                   MigrateExportRequest::Phase phase,
                                   const MigrateImportOptions& options,
                                   MigrateImportResponse* resp) {
  MigrateExportRequest ex;
  ex.set_move_id(req.move_id());
  ex.set_phase(phase);
  ex.set_max_bytes(options.chunk_bytes);
  for (;;) {
    MigrateExportResponse chunk;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.rpc_timeout));
    absl::Status s = FromGrpcStatus(stub->MigrateExport(&ctx, ex, &chunk));
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("export of move ", req.move_id(), " from ",
                                                 req.source(), ": ", s.message()));
    }
    uint64_t rows = 0, bytes = 0;
    RETURN_IF_ERROR(
        core->CheckImporting(std::vector<uint32_t>(req.vshards().begin(), req.vshards().end())));
    RETURN_IF_ERROR(core->ImportChunk(chunk, &rows, &bytes));
    resp->set_rows(resp->rows() + rows);
    resp->set_bytes(resp->bytes() + bytes);
    if (chunk.done()) return chunk.phase_rows();
    ex.set_cursor(chunk.next_cursor());
  }
}

}  // namespace

absl::Status RunMigrateImport(PsCore* core, const MigrateImportRequest& req,
                              MigrateImportResponse* resp, const MigrateImportOptions& options) {
  if (req.source().empty() || req.vshards_size() == 0) {
    return absl::InvalidArgumentError("MigrateImport needs a source and vshards");
  }
  std::vector<uint32_t> vshards(req.vshards().begin(), req.vshards().end());
  RETURN_IF_ERROR(core->BeginImport(req.move_id(), vshards));
  grpc::ChannelArguments args;
  // A response holds rows, or in FINAL one part of the source's push de-duplication state
  // (PushDedup::SerializeParts), of at most chunk_bytes (plus one row or one layer beyond:
  // the doubling), and at cursor 0 of a phase the admission counters and dense tensors of
  // the moving vshards (the 80 MiB). Before, the FINAL chunk carried the whole key state,
  // up to ~9 KiB per writer (16 layers of 512 bytes each, and pieces), 100k writers
  // (PushDedupOptions::max_writers): beyond this bound, and the copy failed every time.
  args.SetMaxReceiveMessageSize(static_cast<int>(options.chunk_bytes * 2 + (80 << 20)));
  auto stub = ParameterServer::NewStub(options.channels.Make(req.source(), args));
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(uint64_t rows,
                   CopyPhase(stub.get(), core, req, MigrateExportRequest::SNAPSHOT, options, resp));
  // Catch up until a round is small enough to copy under the fence.
  const uint32_t fence_rows = req.fence_rows() > 0 ? req.fence_rows() : 2000;
  const uint32_t max_rounds = req.max_rounds() > 0 ? req.max_rounds() : 8;
  uint32_t rounds = 0;
  while (rows > fence_rows && rounds < max_rounds) {
    ASSIGN_OR_RETURN(rows,
                     CopyPhase(stub.get(), core, req, MigrateExportRequest::DELTA, options, resp));
    ++rounds;
  }
  resp->set_rounds(rounds);
  resp->set_copy_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  const absl::Time fence = absl::Now();
  ASSIGN_OR_RETURN(uint64_t final_rows,
                   CopyPhase(stub.get(), core, req, MigrateExportRequest::FINAL, options, resp));
  RETURN_IF_ERROR(core->FinishImport());
  resp->set_final_rows(final_rows);
  resp->set_final_ms(absl::ToDoubleMilliseconds(absl::Now() - fence));
  LOG(INFO) << "move " << req.move_id() << ": received " << resp->rows() << " rows ("
            << resp->bytes() << " bytes) from " << req.source() << " in " << resp->copy_seconds()
            << " s + final " << resp->final_ms() << " ms (" << final_rows << " rows, " << rounds
            << " catch-up rounds)";
  return absl::OkStatus();
}

}  // namespace ps
