#include "ps/pod_transfer.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/routing/hash.h"
#include "proto/export.pb.h"
#include "proto/export_file.h"
#include "proto/packed.h"
#include "ps/storage/pod_storage.h"
#include "ps/storage/push_dedup.h"

namespace ps {
namespace {

namespace fs = std::filesystem;

absl::Status FsError(const std::string& what, const std::error_code& ec) {
  const std::string msg = absl::StrCat(what, ": ", ec.message());
  if (ec == std::errc::no_space_on_device) return absl::ResourceExhaustedError(msg);
  if (ec == std::errc::permission_denied) return absl::PermissionDeniedError(msg);
  return absl::UnavailableError(msg);
}

// Writes `data` to path through a temporary file, fsynced, then renamed over it.
absl::Status WriteFileAtomically(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return FsError("cannot create " + tmp, std::error_code(errno, std::generic_category()));
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::error_code ec(errno, std::generic_category());
      ::close(fd);
      return FsError("cannot write " + tmp, ec);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    return FsError("cannot sync " + tmp, std::error_code(errno, std::generic_category()));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return FsError("cannot rename " + tmp, ec);
  const int dir = ::open(fs::path(path).parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string out;
  auto s = google::protobuf::util::MessageToJsonString(m, &out, options);
  if (!s.ok()) return absl::InternalError(absl::StrCat("manifest to JSON: ", s.ToString()));
  return out;
}

// Rows an export or import names in the pod's log, per table and request; the rest are
// counted.
constexpr uint64_t kLoggedInvalid = 16;

// True when a row is a state its optimizer can hold (what an import accepts); otherwise
// counts it in *invalid and logs the first few.
bool ExportableRow(const Optimizer& opt, const std::string& table, int64_t id, const float* weights,
                   const float* slots, size_t dim, uint64_t* invalid) {
  std::string why;
  if (opt.ValidState(weights, slots, dim, &why)) return true;
  if (++*invalid <= kLoggedInvalid) {
    LOG(WARNING) << "export: row " << id << " of table '" << table << "' is not written: " << why
                 << " (an import would refuse it)";
  }
  return false;
}

// What changed in one table since a delta's cursor (from the change journal).
struct TableChanges {
  absl::flat_hash_set<int64_t> changed;  // written or deleted
  absl::flat_hash_set<int64_t> deleted;  // deleted at least once
};

// A delta's rows of one table: every id of changes.changed that `table` does not hold in
// memory (those were written already: the rows the copy's log updates) and this pod owns,
// read from the copy's rows column family in batches; fn gets each stored one (id, step,
// dim weights then slots). Into *deleted: every id deleted since the cursor (an import
// deletes them before it installs, so a row deleted and created again starts afresh), and
// every owned changed id that is held nowhere now.
absl::Status ExportChangedRows(
    EmbeddingTable& table, PodStorage* stored, const ShardOwnership& own,
    const TableChanges& changes, std::vector<int64_t>* deleted,
    const std::function<absl::Status(int64_t id, uint64_t step, const float* values)>& fn) {
  const std::string& name = table.spec().name();
  const uint64_t name_hash = table.name_hash();
  const size_t floats = size_t{table.dim()} + table.slot_floats();
  ASSIGN_OR_RETURN(const uint32_t no, stored->TableNumber(name));
  deleted->assign(changes.deleted.begin(), changes.deleted.end());
  std::vector<int64_t> ids;
  for (int64_t id : changes.changed) {
    if (!own.Owns(VShardOf(RouteHash(name_hash, id), own.num_vshards()))) continue;
    if (table.Inspect(id, [](const RowView&) {})) continue;  // resident: written already
    ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());  // reads in key order
  constexpr size_t kBatch = 4096;
  std::vector<float> values(kBatch * floats);
  std::vector<uint64_t> steps(kBatch);
  auto found = std::make_unique<bool[]>(kBatch);
  for (size_t at = 0; at < ids.size(); at += kBatch) {
    const auto chunk = absl::MakeConstSpan(ids).subspan(at, std::min(kBatch, ids.size() - at));
    std::fill(found.get(), found.get() + chunk.size(), false);
    RETURN_IF_ERROR(
        stored->ReadStoredRows(no, chunk, floats, values.data(), steps.data(), found.get()));
    for (size_t i = 0; i < chunk.size(); ++i) {
      // Deleted by the copy's log (listed as deleted), though still on its disk.
      if (found[i] && table.DeletePending(chunk[i])) found[i] = false;
      if (!found[i]) {
        if (!changes.deleted.contains(chunk[i])) deleted->push_back(chunk[i]);
        continue;
      }
      RETURN_IF_ERROR(fn(chunk[i], steps[i], values.data() + i * floats));
    }
  }
  std::sort(deleted->begin(), deleted->end());
  return absl::OkStatus();
}

// Writes a delta's deleted ids of one table (files of kind 3, at most kMaxIdsPerFile each).
absl::Status WriteDeletedIds(const std::vector<int64_t>& ids, const std::string& spec_bytes,
                             const std::string& dir, size_t index, ExportTableInfo* info) {
  constexpr size_t kMaxIdsPerFile = size_t{16} << 20;  // 256 MB of records
  const float none = 0;
  for (size_t at = 0; at < ids.size(); at += kMaxIdsPerFile) {
    const std::string name =
        absl::StrFormat("deleted-%04d-%05d.psx", index, info->deleted_files_size());
    ASSIGN_OR_RETURN(auto writer,
                     ExportFileWriter::Create(dir + "/" + name, ExportKind::kDeletedIds, spec_bytes,
                                              /*dim=*/0, /*slot_floats=*/0));
    for (size_t i = at; i < std::min(ids.size(), at + kMaxIdsPerFile); ++i) {
      RETURN_IF_ERROR(writer->Add(ids[i], 0, &none, &none));
    }
    ASSIGN_OR_RETURN(ExportFileSummary sum, writer->Finish());
    ExportFileInfo* f = info->add_deleted_files();
    f->set_name(name);
    f->set_rows(sum.rows);
    f->set_bytes(sum.bytes);
    f->set_crc32c(sum.crc32c);
    info->set_deleted(info->deleted() + sum.rows);
  }
  return absl::OkStatus();
}

// Writes one table's owned rows into files of about max_file_bytes; rows that are no
// valid state are left out and counted in *invalid (see ExportableRow).
// With `stored` (a lazily opened snapshot), the rows not resident in `table` are read from
// its rows column family: resident rows are the newer ones (the log updated them).
// With `changes` (a delta), only the resident rows and the stored rows of changes->changed
// are written, and the deleted ids into deleted-ids files.
absl::Status ExportTable(EmbeddingTable& table, PodStorage* stored, const ShardOwnership& own,
                         const std::string& dir, size_t index, const ExportOptions& options,
                         const TableChanges* changes, ExportTableInfo* info, uint64_t* invalid) {
  const TableSpec& spec = table.spec();
  const Optimizer opt = Optimizer::For(spec);
  const uint64_t invalid_before = *invalid;
  *info->mutable_spec() = spec;
  info->set_dim(table.dim());
  info->set_optimizer(OptimizerSpec::Kind_Name(spec.optimizer().kind()));
  info->set_slot_floats(table.slot_floats());
  const std::string spec_bytes = spec.SerializeAsString();
  const uint64_t name_hash = table.name_hash();
  std::unique_ptr<ExportFileWriter> writer;
  absl::Status status;
  auto finish = [&]() -> absl::Status {
    if (writer == nullptr) return absl::OkStatus();
    ASSIGN_OR_RETURN(ExportFileSummary sum, writer->Finish());
    ExportFileInfo* f = info->mutable_files(info->files_size() - 1);
    f->set_rows(sum.rows);
    f->set_bytes(sum.bytes);
    f->set_crc32c(sum.crc32c);
    info->set_rows(info->rows() + sum.rows);
    writer.reset();
    return absl::OkStatus();
  };
  auto open = [&]() -> absl::Status {
    const std::string name = absl::StrFormat("table-%04d-%05d.psx", index, info->files_size());
    ASSIGN_OR_RETURN(writer,
                     ExportFileWriter::Create(dir + "/" + name, ExportKind::kTableRows, spec_bytes,
                                              table.dim(), table.slot_floats()));
    info->add_files()->set_name(name);
    return absl::OkStatus();
  };
  status = open();
  table.ForEachRow([&](const RowView& r) {
    if (!status.ok()) return;
    if (!own.Owns(VShardOf(RouteHash(name_hash, r.id), own.num_vshards()))) return;
    if (!ExportableRow(opt, spec.name(), r.id, r.weights, r.slots, table.dim(), invalid)) return;
    if (writer->bytes() >= options.max_file_bytes) {
      status = finish();
      if (status.ok()) status = open();
      if (!status.ok()) return;
    }
    status = writer->Add(r.id, r.step, r.weights, r.slots);
  });
  RETURN_IF_ERROR(status);
  if (changes != nullptr) {
    std::vector<int64_t> deleted;
    RETURN_IF_ERROR(ExportChangedRows(
        table, stored, own, *changes, &deleted,
        [&](int64_t id, uint64_t step, const float* v) -> absl::Status {
          if (!ExportableRow(opt, spec.name(), id, v, v + table.dim(), table.dim(), invalid)) {
            return absl::OkStatus();
          }
          if (writer->bytes() >= options.max_file_bytes) {
            RETURN_IF_ERROR(finish());
            RETURN_IF_ERROR(open());
          }
          return writer->Add(id, step, v, v + table.dim());
        }));
    RETURN_IF_ERROR(WriteDeletedIds(deleted, spec_bytes, dir, index, info));
  } else if (stored != nullptr) {
    RETURN_IF_ERROR(stored->ForEachStoredRow(spec.name(), [&](const StoredRow& r) -> absl::Status {
      if (!own.Owns(VShardOf(RouteHash(name_hash, r.id), own.num_vshards()))) {
        return absl::OkStatus();
      }
      if (table.Inspect(r.id, [](const RowView&) {})) return absl::OkStatus();  // resident
      if (table.DeletePending(r.id)) return absl::OkStatus();  // deleted by the log (issue 17)
      if (r.values.size() != table.dim() + table.slot_floats()) {
        return absl::DataLossError(absl::StrCat("stored row ", r.id, " of '", spec.name(), "' has ",
                                                r.values.size(), " floats"));
      }
      if (!ExportableRow(opt, spec.name(), r.id, r.values.data(), r.values.data() + table.dim(),
                         table.dim(), invalid)) {
        return absl::OkStatus();
      }
      if (writer->bytes() >= options.max_file_bytes) {
        RETURN_IF_ERROR(finish());
        RETURN_IF_ERROR(open());
      }
      return writer->Add(r.id, r.step, r.values.data(), r.values.data() + table.dim());
    }));
  }
  if (*invalid - invalid_before > kLoggedInvalid) {
    LOG(WARNING) << "export: " << *invalid - invalid_before << " rows of table '" << spec.name()
                 << "' were not written (no valid state; the first " << kLoggedInvalid
                 << " are named above)";
  }
  return finish();
}

// What a delta export writes: the cursor it starts from, and, unless the part is written
// whole, the changes since then per table name.
struct Delta {
  std::string since;  // empty: a full export
  bool whole = false;
  absl::flat_hash_map<std::string, TableChanges> tables;
};

absl::Status WriteExport(ModelStore& store, PodStorage* stored, const ShardOwnership& own,
                         const std::string& dir, bool consistent, const ExportOptions& options,
                         const Delta& delta, const std::string& cursor, ExportResponse* resp) {
  ExportManifest manifest;
  manifest.set_cursor(cursor);
  manifest.set_since(delta.since);
  manifest.set_whole(delta.whole);
  const bool by_changes = !delta.since.empty() && !delta.whole;
  const TableChanges no_changes;
  manifest.set_format("ps-export");
  manifest.set_version(1);
  manifest.set_created(absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone()));
  manifest.set_num_vshards(own.num_vshards());
  manifest.set_epoch(own.epoch());
  for (uint32_t v = 0; v < own.num_vshards(); ++v) {
    if (own.Owns(v)) manifest.add_vshards(v);
  }
  manifest.set_consistent(consistent);
  auto tables = store.Tables();
  std::sort(tables.begin(), tables.end(),
            [](const auto& a, const auto& b) { return a->spec().name() < b->spec().name(); });
  uint64_t bytes = 0;
  uint64_t invalid = 0;
  for (size_t i = 0; i < tables.size(); ++i) {
    ExportTableInfo* info = manifest.add_tables();
    const TableChanges* changes = nullptr;
    if (by_changes) {
      auto it = delta.tables.find(tables[i]->spec().name());
      changes = it == delta.tables.end() ? &no_changes : &it->second;
    }
    RETURN_IF_ERROR(ExportTable(*tables[i], stored, own, dir, i, options, changes, info, &invalid));
    resp->set_rows(resp->rows() + info->rows());
    resp->set_deleted(resp->deleted() + info->deleted());
    for (const ExportFileInfo& f : info->files()) bytes += f.bytes();
    for (const ExportFileInfo& f : info->deleted_files()) bytes += f.bytes();
  }
  auto dense = store.DenseTensors();
  std::sort(dense.begin(), dense.end(),
            [](const auto& a, const auto& b) { return a->spec().name() < b->spec().name(); });
  std::vector<float> values;
  for (size_t i = 0; i < dense.size(); ++i) {
    DenseTensor& d = *dense[i];
    if (!own.Owns(DenseVShard(d.spec().name(), own.num_vshards()))) continue;
    uint64_t step = 0;
    d.Snapshot(/*always=*/true, &values, &step);
    if (!ExportableRow(Optimizer::For(d.spec()), d.spec().name(), 0, values.data(),
                       values.data() + d.numel(), d.numel(), &invalid)) {
      continue;  // the tensor's state is invalid (logged): an import would refuse it
    }
    const std::string name = absl::StrFormat("dense-%04d.psx", i);
    ASSIGN_OR_RETURN(auto writer, ExportFileWriter::Create(dir + "/" + name, ExportKind::kDense,
                                                           d.spec().SerializeAsString(),
                                                           static_cast<uint32_t>(d.numel()),
                                                           static_cast<uint32_t>(d.slot_floats())));
    RETURN_IF_ERROR(writer->Add(0, step, values.data(), values.data() + d.numel()));
    ASSIGN_OR_RETURN(ExportFileSummary sum, writer->Finish());
    ExportDenseInfo* info = manifest.add_dense();
    *info->mutable_spec() = d.spec();
    info->set_numel(d.numel());
    info->set_slot_floats(static_cast<uint32_t>(d.slot_floats()));
    info->set_step(step);
    info->mutable_file()->set_name(name);
    info->mutable_file()->set_rows(sum.rows);
    info->mutable_file()->set_bytes(sum.bytes);
    info->mutable_file()->set_crc32c(sum.crc32c);
    bytes += sum.bytes;
    resp->set_dense(resp->dense() + 1);
  }
  ASSIGN_OR_RETURN(std::string json, ToJson(manifest));
  RETURN_IF_ERROR(WriteFileAtomically(dir + "/manifest.json", json));
  resp->set_bytes(bytes);
  resp->set_invalid(invalid);
  resp->set_consistent(consistent);
  resp->set_num_vshards(own.num_vshards());
  resp->set_epoch(own.epoch());
  resp->set_cursor(cursor);
  resp->set_whole(delta.whole);
  return absl::OkStatus();
}

// Decides what a delta of the copy `stored` writes: whole (its database is not in `since`,
// or `since` names a position outside its history), or the changes the journal lists after
// its position in `since` (FAILED_PRECONDITION when the journal no longer reaches back
// there).
absl::Status PlanDelta(PodStorage& stored, const ModelStore& store, const std::string& since,
                       Delta* delta) {
  delta->since = since;
  ASSIGN_OR_RETURN(std::vector<ExportCursorEntry> entries, ParseExportCursor(since));
  const ChangeJournal& journal = stored.journal();
  auto mine = std::find_if(entries.begin(), entries.end(),
                           [&](const ExportCursorEntry& e) { return journal.Names(e.identity); });
  if (mine == entries.end()) {
    LOG(INFO) << "export: the cursor does not name this pod's database; writing its rows whole";
    delta->whole = true;
    return absl::OkStatus();
  }
  // (An entry of the database's older journal identity names the same history.)
  const JournalPosition from{mine->identity, mine->seq, mine->tag};
  ASSIGN_OR_RETURN(const bool covered, journal.Covers(from));
  if (!covered) {
    LOG(WARNING) << "export: the cursor's position " << from.seq
                 << " is not one of this database's history (restored from an older copy?); "
                    "writing its rows whole";
    delta->whole = true;
    return absl::OkStatus();
  }
  absl::flat_hash_map<uint32_t, TableChanges*> by_number;
  for (const auto& t : store.Tables()) delta->tables[t->spec().name()];
  // Pointers into delta->tables once it no longer grows (a flat map moves its values).
  for (auto& [name, changes] : delta->tables) {
    absl::StatusOr<uint32_t> no = stored.TableNumber(name);
    if (no.ok()) by_number[*no] = &changes;
  }
  auto note = [&](uint32_t no, ChangeKind kind, int64_t id) {
    auto it = by_number.find(no);
    if (it == by_number.end()) return absl::OkStatus();  // a table no longer stored
    it->second->changed.insert(id);
    if (kind == ChangeKind::kDelete) it->second->deleted.insert(id);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(journal.ForEachSince(from.seq, note));
  // The deletions the copy's log holds (no round has journaled them yet).
  for (const auto& [no, id] : stored.LoggedDeletes()) {
    RETURN_IF_ERROR(note(no, ChangeKind::kDelete, id));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ExportPod(PsCore& core, const ExportRequest& req, ExportResponse* resp,
                       const ExportOptions& options) {
  if (req.dir().empty()) return absl::InvalidArgumentError("export dir is empty");
  const absl::Time start = absl::Now();
  const std::string dir = req.dir();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return FsError("cannot create export dir " + dir, ec);
  if (fs::exists(dir + "/manifest.json")) {
    return absl::AlreadyExistsError(
        absl::StrCat(dir, " already holds an export (manifest.json); use a new directory"));
  }
  auto own = core.ownership();
  absl::Status status;
  if (core.storage() == nullptr) {
    // No change journal: a delta of an in-memory pod holds every row (whole), and its
    // export names no position (the next delta is whole again).
    Delta delta;
    delta.since = req.since();
    delta.whole = !req.since().empty();
    if (delta.whole) RETURN_IF_ERROR(ParseExportCursor(req.since()).status());
    status = WriteExport(core.store(), nullptr, *own, dir, /*consistent=*/false, options, delta,
                         /*cursor=*/"", resp);
  } else {
    // A consistent cut: a checkpoint of the database, recovered aside exactly as a restart
    // would (stored rows plus the log replayed), then written out.
    const std::string snapshot = dir + "/.snapshot";
    fs::remove_all(snapshot, ec);
    RETURN_IF_ERROR(core.storage()->Checkpoint(snapshot));
    {
      TableOptions table_options;
      table_options.track_dirty = true;
      ModelStore store(table_options);
      PushDedup dedup;
      PodStorageOptions storage_options;
      storage_options.db.dir = snapshot;
      storage_options.db.log_memtable_bytes = size_t{8} << 20;
      storage_options.materialize_ms = 24 * 3600 * 1000;
      storage_options.materialize_on_close = false;
      // Lazily: only the rows the log updates come into memory; the others are streamed
      // from the copy's rows column family.
      storage_options.lazy_start = true;
      storage_options.background_load = false;
      auto storage = PodStorage::Open(storage_options, &store, &dedup);
      status = storage.status();
      Delta delta;
      if (status.ok() && !req.since().empty())
        status = PlanDelta(**storage, store, req.since(), &delta);
      if (status.ok()) {
        const JournalPosition at = (*storage)->journal().position();
        status = WriteExport(store, storage->get(), *own, dir, /*consistent=*/true, options, delta,
                             FormatExportCursor({{at.identity, at.seq, at.tag}}), resp);
      }
    }
    fs::remove_all(snapshot, ec);
  }
  if (!status.ok()) {
    LOG(WARNING) << "export to " << dir << " failed: " << status;
    return status;
  }
  resp->set_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  LOG(INFO) << "exported " << resp->rows() << " rows and " << resp->dense() << " dense tensors ("
            << resp->bytes() << " bytes) to " << dir << " in " << resp->seconds() << " s";
  return absl::OkStatus();
}

// Installing whole rows: ps-transfer's import (ImportRows) and a vshard move's copy
// (PsCore::ImportChunk, ps_core_migrate.cc) both install rows this way.

namespace {

// Notes one row or tensor an import refused: counted in resp, and the first
// kLoggedInvalid of a request named there and in the log.
void ReportInvalid(const std::string& what, const std::string& why, ImportRowsResponse* resp) {
  resp->set_invalid(resp->invalid() + 1);
  if (resp->invalid_rows_size() < static_cast<int>(kLoggedInvalid)) {
    LOG(WARNING) << "import: " << what << " is not installed: " << why;
    resp->add_invalid_rows(absl::StrCat(what, ": ", why));
  }
}

}  // namespace

void PsCore::DropInvalidRows(Installs::Rows* r, ImportRowsResponse* resp) {
  const Optimizer opt = Optimizer::For(r->table->spec());
  const size_t dim = r->table->dim();
  const size_t floats = dim + r->table->slot_floats();
  std::vector<bool> drop;  // stays empty while every row is valid
  std::string why;
  for (size_t i = 0; i < r->ids.size(); ++i) {
    const float* v = r->values.data() + i * floats;
    if (opt.ValidState(v, v + dim, dim, &why)) continue;
    ReportInvalid(absl::StrCat("table '", r->table->spec().name(), "' id ", r->ids[i]), why, resp);
    drop.resize(r->ids.size());
    drop[i] = true;
  }
  if (drop.empty()) return;
  std::vector<int64_t> ids;
  std::vector<uint64_t> steps;
  std::vector<float> values;
  for (size_t i = 0; i < r->ids.size(); ++i) {
    if (drop[i]) continue;
    ids.push_back(r->ids[i]);
    steps.push_back(r->steps[i]);
    values.insert(values.end(), r->values.data() + i * floats, r->values.data() + (i + 1) * floats);
  }
  r->id_scratch = std::move(ids);
  r->step_scratch = std::move(steps);
  r->value_scratch = std::move(values);
  r->ids = r->id_scratch;
  r->steps = r->step_scratch;
  r->values = r->value_scratch;
}

absl::Status PsCore::ParseRows(absl::string_view what, const std::string& ids,
                               const std::string& steps, const std::string& values,
                               Installs::Rows* out) {
  const std::string& name = out->table->spec().name();
  ASSIGN_OR_RETURN(out->ids, PackedView<int64_t>(ids, &out->id_scratch, "ids of", name));
  ASSIGN_OR_RETURN(out->steps, PackedView<uint64_t>(steps, &out->step_scratch, "steps of", name));
  ASSIGN_OR_RETURN(out->values, PackedView<float>(values, &out->value_scratch, "values of", name));
  const size_t floats = out->table->dim() + out->table->slot_floats();
  if (out->steps.size() != out->ids.size() || out->values.size() != out->ids.size() * floats) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", name, "' has ", out->ids.size(), " ids, ", out->steps.size(),
                     " steps and ", out->values.size(), " floats; expected one step and ", floats,
                     " floats (dim + optimizer slots) per id"));
  }
  return absl::OkStatus();
}

absl::Status PsCore::ParseDense(absl::string_view what, const std::string& values,
                                Installs::Dense* out) {
  const std::string& name = out->tensor->spec().name();
  ASSIGN_OR_RETURN(out->values, PackedView<float>(values, &out->scratch, "values of", name));
  const size_t floats = out->tensor->numel() + out->tensor->slot_floats();
  if (out->values.size() != floats) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " dense tensor '", name, "' has ", out->values.size(), " floats, expected ", floats));
  }
  return absl::OkStatus();
}

void PsCore::AddTouches(const Installs& in, Change* change) {
  for (const Installs::Rows& r : in.rows) {
    change->rows.emplace_back(r.table, r.ids);
    change->record_bytes += r.values.size() * sizeof(float) + r.ids.size() * 16 + 64;
  }
  for (const Installs::Dense& d : in.dense) {
    change->dense.push_back(d.tensor->spec().name());
    change->record_bytes += d.values.size() * sizeof(float) + 64;
  }
}

absl::Status PsCore::ApplyInstalls(const Installs& in, LogRecordBuilder* record,
                                   uint64_t* installed, uint64_t* skipped) {
  // Rows evicted under a memory budget are read back first (a failed read installs
  // nothing); eviction waits for the apply lock this runs under.
  for (const Installs::Rows& r : in.rows) RETURN_IF_ERROR(r.table->Load(r.ids));
  std::vector<int64_t> ids;
  std::vector<uint64_t> steps;
  std::vector<float> values;
  for (const Installs::Rows& r : in.rows) {
    EmbeddingTable& t = *r.table;
    const size_t floats = t.dim() + t.slot_floats();
    ids.clear();
    steps.clear();
    values.clear();
    for (size_t i = 0; i < r.ids.size(); ++i) {
      const float* v = r.values.data() + i * floats;
      if (!t.Install(r.ids[i], v, v + t.dim(), r.steps[i])) {
        ++*skipped;
        continue;
      }
      ++*installed;
      if (record == nullptr) continue;
      ids.push_back(r.ids[i]);
      steps.push_back(r.steps[i]);
      values.insert(values.end(), v, v + floats);
    }
    if (record != nullptr && !ids.empty()) {
      record->AddInstall(t.spec().name(), static_cast<uint32_t>(floats), ids, steps, values);
    }
  }
  for (const Installs::Dense& d : in.dense) {
    ASSIGN_OR_RETURN(bool done, d.tensor->Install(d.values, d.step));
    if (!done) {
      ++*skipped;
      continue;
    }
    ++*installed;
    if (record != nullptr) record->AddDenseInstall(d.tensor->spec().name(), d.step, d.values);
  }
  return absl::OkStatus();
}

absl::Status PsCore::PrepareImport(const ImportRowsRequest& req, const ShardOwnership& own,
                                   Installs* in, ImportRowsResponse* resp) {
  if (req.tables_size() == 0 && req.dense_size() == 0) {
    return absl::InvalidArgumentError("import names no rows and no dense tensors");
  }
  in->rows.resize(req.tables_size());
  for (int i = 0; i < req.tables_size(); ++i) {
    const TableRows& e = req.tables(i);
    Installs::Rows& r = in->rows[i];
    r.table = store_.FindTable(e.table());
    if (r.table == nullptr) {
      return absl::NotFoundError(absl::StrCat("table '", e.table(), "' does not exist"));
    }
    RETURN_IF_ERROR(ParseRows("import into", e.ids(), e.steps(), e.values(), &r));
    RETURN_IF_ERROR(CheckOwned(own, *r.table, r.ids));
  }
  in->dense.resize(req.dense_size());
  for (int i = 0; i < req.dense_size(); ++i) {
    const DenseState& e = req.dense(i);
    Installs::Dense& d = in->dense[i];
    d.tensor = store_.FindDense(e.name());
    if (d.tensor == nullptr) {
      return absl::NotFoundError(absl::StrCat("dense tensor '", e.name(), "' does not exist"));
    }
    RETURN_IF_ERROR(ParseDense("import of", e.values(), &d));
    RETURN_IF_ERROR(CheckOwnedDense(own, e.name()));
    d.step = e.step();
  }
  // The whole request is well formed and owned: now leave out what no export writes.
  const uint64_t invalid_before = resp->invalid();
  for (Installs::Rows& r : in->rows) DropInvalidRows(&r, resp);
  std::string why;
  for (auto d = in->dense.begin(); d != in->dense.end();) {
    const size_t numel = d->tensor->numel();
    if (Optimizer::For(d->tensor->spec())
            .ValidState(d->values.data(), d->values.data() + numel, numel, &why)) {
      ++d;
      continue;
    }
    ReportInvalid(absl::StrCat("dense tensor '", d->tensor->spec().name(), "'"), why, resp);
    d = in->dense.erase(d);
  }
  counters_.invalid_import_rows.fetch_add(resp->invalid() - invalid_before,
                                          std::memory_order_relaxed);
  return absl::OkStatus();
}

void PsCore::ImportRows(const ImportRowsRequest& req, ImportRowsResponse* resp, Done done) {
  resp->clear_deleted();
  if (req.tables_size() == 0 && req.dense_size() == 0 && req.deletes_size() == 0) {
    return done(
        absl::InvalidArgumentError("import names no rows, no dense tensors and no deletions"));
  }
  // A delta's deletions come first, each through the one deletion path (DeleteRows: a
  // logged DELETE change), all checked before any is applied.
  std::vector<std::vector<int64_t>> scratch(req.deletes_size());
  std::vector<absl::Span<const int64_t>> deletes(req.deletes_size());
  for (int i = 0; i < req.deletes_size(); ++i) {
    const TableRows& d = req.deletes(i);
    std::shared_ptr<EmbeddingTable> t = store_.FindTable(d.table());
    if (t == nullptr) {
      return done(absl::NotFoundError(absl::StrCat("table '", d.table(), "' does not exist")));
    }
    absl::StatusOr<absl::Span<const int64_t>> ids =
        PackedView<int64_t>(d.ids(), &scratch[i], "deleted ids of", d.table());
    if (!ids.ok()) return done(ids.status());
    if (absl::Status s = CheckOwned(*ownership(), *t, *ids); !s.ok()) return done(s);
    deletes[i] = *ids;
  }
  for (int i = 0; i < req.deletes_size(); ++i) {
    uint64_t deleted = 0;
    if (absl::Status s = DeleteRows(req.deletes(i).table(), deletes[i], &deleted); !s.ok()) {
      return done(s);
    }
    resp->set_deleted(resp->deleted() + deleted);
  }
  if (req.tables_size() == 0 && req.dense_size() == 0) {
    resp->set_epoch(ownership()->epoch());
    return done(absl::OkStatus());
  }
  // Held from the ownership check until applied, as for a push (see migrate_mu_).
  absl::ReaderMutexLock fence(&migrate_mu_);
  auto own = ownership();
  resp->set_epoch(own->epoch());
  resp->clear_invalid();
  resp->clear_invalid_rows();
  Installs in;
  if (absl::Status s = PrepareImport(req, *own, &in, resp); !s.ok()) return done(s);
  Change change;
  AddTouches(in, &change);
  change.ship = true;  // the followers install the same rows
  auto apply = [&](LogRecordBuilder* record) -> absl::Status {
    uint64_t installed = 0, skipped = 0;
    RETURN_IF_ERROR(ApplyInstalls(in, record, &installed, &skipped));
    resp->set_installed(installed);
    resp->set_skipped(skipped);
    return absl::OkStatus();
  };
  ApplyChange(change, apply, std::move(done));
}

}  // namespace ps
