// The request logic of one PS pod, independent of the transport: validates a request
// whole before applying any of it, checks vshard ownership, de-duplicates keyed pushes,
// and runs pulls and pushes against the ModelStore. The gRPC services (ps_service.h,
// transfer_service.h) are thin adapters over it.
//
// Every request that changes rows or dense tensors (Push, PushDense, ImportRows, and
// ImportChunk, a vshard move's copy) takes one path, ApplyChange: the ownership (or, for a
// move's copy, the receiving) checked and kept until applied, an outgoing move's fence and
// touched-row tracking, the exactly-once claim of keyed pushes, and the durable apply
// (PodStorage::ApplyLogged) or the in-memory one.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/routing/shard_ownership.h"
#include "embedding/model_store.h"
#include "proto/ps.pb.h"
#include "ps/replica_order.h"
#include "ps/replicator.h"
#include "ps/storage/log_record.h"
#include "ps/storage/pod_storage.h"
#include "ps/storage/push_dedup.h"
#include "ps/synced_acks.h"

namespace ps {

struct PsCoreOptions {
  // Rows in one pull or push request, summed over its tables. 1M 64-dim rows is 256 MB of
  // floats: beyond that a client should split its batch.
  size_t max_batch_rows = size_t{1} << 20;
  // Largest answer the pod builds: the transport's send limit (PsServer sets it from
  // PsServerOptions::max_message_bytes, --max_message_mb). A pull, dense pull or Describe
  // whose answer would be larger is refused with RESOURCE_EXHAUSTED before anything is
  // built, and a dense tensor whose state (weights and optimizer slots, as an import or a
  // move carries it) would not fit one message is refused at creation.
  size_t max_message_bytes = size_t{256} << 20;
  // Tables and dense tensors a pod holds, together: CreateTable / CreateDense beyond it
  // answer RESOURCE_EXHAUSTED (each table costs ~100 KiB before its first row).
  size_t max_tables = 10000;
  PushDedupOptions dedup;
  TableOptions table;
  // storage.db.dir empty: state in memory only (lost when the process ends).
  PodStorageOptions storage;
  // How a primary reaches its followers (replication, ps_core_replicate.cc). Null: the pod
  // cannot be a primary with followers (an assignment naming followers is refused).
  std::shared_ptr<ReplicaSender> replica_sender;
  ReplicatorOptions replicator;
  // Feature eviction (TableSpec.eviction, issue 17): a pod opened with PsCore::Open looks
  // for rows to evict this often (0: never by itself; EvictOnce still works), and deletes
  // at most this many per DELETE change, each one short exclusive section of the apply
  // lock, so pushes never stop for longer than deleting a batch takes (~1 ms).
  int eviction_interval_ms = 1000;
  size_t eviction_batch_rows = 4096;
};

// Where a pull's rows go (PsCore::Pull with a sink), so a transport can place them in its
// own buffers instead of a PullResponse.
class PullSink {
 public:
  virtual ~PullSink() = default;
  // The pod's shard-map epoch; called first, even if the pull then fails.
  virtual void SetEpoch(uint64_t epoch) = 0;
  // Returns where to write the `bytes` bytes of values (packed in the request's
  // value_type) of the next response entry, of table `table`; suitably aligned for
  // float32. Called once per request entry, in order, and only once the whole request has
  // validated. The buffer must stay valid until Pull returns.
  virtual char* AddEntry(const std::string& table, size_t bytes) = 0;
};

class PsCore {
 public:
  using Done = std::function<void(absl::Status)>;

  // A pod; with options.storage.db.dir set, its state is recovered from and kept durable
  // in that directory (errors: see StorageDb::Open and PodStorage::Open).
  static absl::StatusOr<std::unique_ptr<PsCore>> Open(PsCoreOptions options,
                                                      ShardOwnership ownership);
  // An in-memory pod (options.storage is ignored).
  PsCore(PsCoreOptions options, ShardOwnership ownership);
  ~PsCore();

  // Each returns OK or the most specific error: INVALID_ARGUMENT (malformed, empty,
  // oversized, repeated dense names, a spec outside embedding/spec.h's ranges, a learning
  // rate outside them, a non-finite gradient or, for a table that does not clip, one
  // beyond ±kMaxGradient), NOT_FOUND (unknown table), ALREADY_EXISTS (table with another
  // spec), FAILED_PRECONDITION (id of a vshard this pod does not own, stale incarnation),
  // RESOURCE_EXHAUSTED (the answer would exceed max_message_bytes, or max_tables is
  // reached; the message names the limit), ABORTED (the same push is being applied right
  // now: retry). On error nothing of the request was applied, and a failed pull created
  // no rows. Thread-safe.
  absl::Status CreateTable(const CreateTableRequest& req, CreateTableResponse* resp);
  absl::Status CreateDense(const CreateDenseRequest& req, CreateDenseResponse* resp);
  absl::Status Describe(const DescribeRequest& req, DescribeResponse* resp);
  absl::Status Pull(const PullRequest& req, PullResponse* resp);
  // The same pull (same validation, errors and counters), with the rows written where
  // `sink` says.
  absl::Status Pull(const PullRequest& req, PullSink* sink);
  absl::Status Push(const PushRequest& req, PushResponse* resp);
  absl::Status PullDense(const DensePullRequest& req, DensePullResponse* resp);
  absl::Status PushDense(const DensePushRequest& req, PushResponse* resp);
  absl::Status Stats(const StatsRequest& req, StatsResponse* resp);
  // FAILED_PRECONDITION for a pod without storage.
  absl::Status Checkpoint(const PodCheckpointRequest& req, PodCheckpointResponse* resp);

  // Pushes complete asynchronously on a durable pod: `done` runs once the push is durable
  // (or failed), possibly on another thread, possibly before the call returns. *resp must
  // stay valid until then. Push / PushDense above wait for it.
  void PushAsync(const PushRequest& req, PushResponse* resp, Done done);
  void PushDenseAsync(const DensePushRequest& req, PushResponse* resp, Done done);

  // Installs whole rows and dense tensors (PodTransfer.ImportRows: ps-transfer import;
  // ps/pod_transfer.cc). The request is validated whole first: NOT_FOUND (unknown table or
  // tensor), INVALID_ARGUMENT (sizes, non-finite values), FAILED_PRECONDITION (an id of a
  // vshard this pod does not own); UNAVAILABLE while a move has fenced one of its vshards
  // (retry). Each row is installed only if it is missing or has fewer updates than the
  // imported step (EmbeddingTable::Install), so an import is idempotent; resp counts the
  // installed and skipped ones. A row or tensor whose values are not a state its
  // optimizer can hold (Optimizer::ValidState: non-finite, beyond ±kMaxValue, a negative
  // accumulator; no export of this version writes one) is not installed: it is counted in
  // resp->invalid, named in resp->invalid_rows and the pod's log, and the rest goes on.
  // `done` runs as PushAsync's does: on a durable pod once the installs are logged. *resp
  // must stay valid until then. Thread-safe.
  void ImportRows(const ImportRowsRequest& req, ImportRowsResponse* resp, Done done);

  // Deletes rows of `table` (feature eviction; a delta import's deletions) through the one
  // change path as one logged DELETE change: on a durable pod under the apply lock held
  // exclusively, so recovery, followers (ReplicateRecords) and the materializer order it
  // exactly against the rows' updates (ps/storage/log_record.h). A row that comes back
  // starts from its initial value. NOT_FOUND for an unknown table, FAILED_PRECONDITION if
  // an id's vshard is not owned here, UNAVAILABLE (retry) while a move fences one
  // of its vshards or a lazy start's log is still being applied. *deleted (if given)
  // gets the resident rows removed. Blocks until durable. Thread-safe.
  absl::Status DeleteRows(const std::string& table, absl::Span<const int64_t> ids,
                          uint64_t* deleted = nullptr);

  // One pass of feature eviction over every table with an EvictionSpec, for the vshards
  // this pod owns (followers delete what their primary logs): deletes the rows not
  // updated for ttl_seconds, then, if the table holds more than its share of max_rows
  // (max_rows x owned vshards / vshards, rounded up), the least frequently (LFU: fewest
  // updates) or least recently (LRU) updated rows down to 1/32 below that share (room for
  // new rows before the next pass), in batches (DeleteRows); a row updated
  // since it was chosen (in a later second) stays. Counted per table (TableInfo.evicted).
  // Returns the rows evicted; a table whose deletion is refused (vshards fenced for a
  // move's final copy, a lazy start's log being applied) is skipped until the next pass.
  // A move running on the pod copies the deletions (ps_core_migrate.cc). Thread-safe: one pass
  // at a time (the pod's eviction thread, or a test with a fake TableOptions.clock).
  uint64_t EvictOnce();

  // Requests refused for reasons StatsResponse does not count, since start (metrics).
  struct Refusals {
    uint64_t gradient_too_large = 0;   // pushes with a gradient beyond ±kMaxGradient
    uint64_t answer_too_large = 0;     // pulls, dense pulls, Describes over max_message_bytes
    uint64_t invalid_import_rows = 0;  // rows and tensors an import skipped (ValidState)
  };
  Refusals refusals() const;

  // Replaces the ownership (a new shard map epoch). Waits for pushes being applied; a
  // push applies entirely under one ownership. Thread-safe.
  void SetOwnership(ShardOwnership ownership);

  // Live migration (ps_core_migrate.cc; the protocol is described in proto/ps.proto).
  // ApplyAssignment installs the master's assignment unless its epoch is older than the
  // pod's: ownership, the end of an outgoing move (unfencing it, or dropping the moved
  // rows), and dropping rows of vshards the pod neither owns nor receives.
  absl::Status ApplyAssignment(const Assignment& req, ApplyAssignmentResponse* resp);
  // Source side: starts tracking the vshards (which this pod must own) and snapshots the
  // ids of their rows. FAILED_PRECONDITION for a vshard it does not own.
  absl::Status MigrateBegin(const MigrateBeginRequest& req, MigrateBeginResponse* resp);
  // Source side: one chunk of a phase. FINAL at cursor 0 fences the vshards and waits
  // until every push applied to them is durable. NOT_FOUND for another move id.
  absl::Status MigrateExport(const MigrateExportRequest& req, MigrateExportResponse* resp);
  // Destination side: BeginImport keeps the vshards' rows from being dropped until the
  // move ends; ImportChunk installs an exported chunk (creating its tables), adding its
  // row count and bytes: logged like an import, not waiting for the write; ABORTED once
  // any of its vshards is no longer being received, FAILED_PRECONDITION for a row older
  // than this pod's copy of it (see ImportChunk). FinishImport waits until everything
  // imported is durable and returns the first error of any chunk since BeginImport.
  absl::Status BeginImport(uint64_t move_id, absl::Span<const uint32_t> vshards);
  absl::Status ImportChunk(const MigrateExportResponse& chunk, uint64_t* rows, uint64_t* bytes);
  // ABORTED once any of `vshards` is no longer being received (the master gave up on the
  // move): the import stops instead of leaving rows nobody drops.
  absl::Status CheckImporting(absl::Span<const uint32_t> vshards);
  absl::Status FinishImport();
  std::shared_ptr<const ShardOwnership> ownership() const;

  // Replication (ps_core_replicate.cc; protocol in proto/ps.proto). A follower's side:
  // checks that `req.primary` is this pod's primary of some vshard, at an epoch no older
  // than the one this pod learned its primaries at (else FAILED_PRECONDITION: a deposed
  // primary), then applies the records in order through ApplyChange (each logged here
  // with its push key, rows replayed at the primary's steps, so rows are bit-identical),
  // stopping at the first that fails (ABORTED: retry the batch). Rows of vshards this pod
  // does not follow from the sender are left out (counted) when the batch's epoch is no
  // newer than this pod's, and refused (UNAVAILABLE, retried) in a newer one. `done` runs
  // once every applied record is durable. Thread-safe; batches are applied one at a time,
  // each primary's numbered batches in number order (ps/replica_order.h).
  void ReplicateRecords(const ReplicateRecordsRequest& req, ReplicateRecordsResponse* resp,
                        Done done);
  // The same with the request shared: this pod's log keeps references to the records it
  // logs as they came (no copy) until they are written. The gRPC service's form.
  void ReplicateRecords(std::shared_ptr<const ReplicateRecordsRequest> req,
                        ReplicateRecordsResponse* resp, Done done);
  // A primary with followers accepts changes only until `deadline` (its master lease, set
  // by the master agent after each heartbeat: the heartbeat's send time + the lease), so a
  // primary cut off from the master stops before the master promotes a follower.
  // Thread-safe.
  void RenewWriteLease(absl::Time deadline);
  struct ReplicationStats {
    uint32_t factor = 1;
    uint32_t following = 0;  // vshards this pod follows
    std::vector<Replicator::FollowerStats> followers;
    uint64_t records_received = 0, records_applied = 0, refused_batches = 0;
    // Rows and dense entries of received records left out: of vshards this pod does not
    // follow from the sender (yet), e.g. while a copy fills them.
    uint64_t rows_left_out = 0;
    uint64_t lease_refusals = 0;
    // Vshards this pod leads with no follower in their ack set, and the changes of them
    // acknowledged only after an fsync of the log (periodic durability), in how many fsyncs.
    uint32_t sole_copy = 0;
    uint64_t sole_copy_synced_acks = 0, sole_copy_syncs = 0;
    // The time those fsyncs took, and the acknowledgements' waits for them, summed
    // (SyncedAcks::Stats).
    absl::Duration sole_copy_sync_time, sole_copy_ack_wait;
    // A follower this far behind is to be reported to the master at once (the role's
    // max_lag_ms; zero: none given).
    absl::Duration max_lag;
  };
  // A snapshot of the above. Thread-safe.
  ReplicationStats replication_stats() const;

  ModelStore& store() { return store_; }
  // Null for an in-memory pod.
  PodStorage* storage() { return storage_.get(); }

 private:
  // A table entry of a pull or push, validated: the table exists, the ids are whole
  // int64s, non-empty, within the request's row budget and all owned by this pod.
  struct TableIdsView {
    std::shared_ptr<EmbeddingTable> table;
    absl::Span<const int64_t> ids;
    std::vector<int64_t> scratch;
  };
  struct PreparedPush;
  // Validates one entry into *out; `op` ("pull" or "push") names it in errors; *total
  // accumulates rows across the request's entries.
  // `followed_ok` (read-only pulls only): ids of vshards this pod follows as a replica pass
  // the ownership check too (CheckReadable).
  absl::Status PrepareIds(absl::string_view op, const std::string& table, const std::string& ids,
                          const ShardOwnership& own, size_t* total, TableIdsView* out,
                          bool followed_ok = false);
  // CheckOwned, except that an id of a vshard this pod follows (replication) is accepted:
  // a read-only pull may be served by a follower, whose rows are the primary's as of the
  // records it has received.
  absl::Status CheckReadable(const ShardOwnership& own, const EmbeddingTable& table,
                             absl::Span<const int64_t> ids) ABSL_LOCKS_EXCLUDED(migrate_mu_);
  absl::Status CheckOwned(const ShardOwnership& own, const EmbeddingTable& table,
                          absl::Span<const int64_t> ids);
  // The same check by the table's name, for a table this pod does not know.
  absl::Status CheckOwnedByName(const ShardOwnership& own, absl::string_view table,
                                uint64_t name_hash, absl::Span<const int64_t> ids);
  absl::Status CheckOwnedDense(const ShardOwnership& own, absl::string_view name);
  absl::Status PreparePush(const PushRequest& req, const ShardOwnership& own,
                           std::vector<PreparedPush>* prepared, size_t* total);
  // INVALID_ARGUMENT (counted) unless every gradient of `what` is finite and, unless the
  // spec's clipping bounds it, within ±kMaxGradient: the bound that keeps every update
  // finite (embedding/spec.h). `row_floats` (dim) and `ids` name the bad element.
  absl::Status CheckGradients(absl::string_view what, absl::Span<const float> grads,
                              float clip_value, float clip_norm, size_t row_floats,
                              absl::Span<const int64_t> ids);
  // RESOURCE_EXHAUSTED (counted) when an answer of `bytes` exceeds max_message_bytes.
  absl::Status CheckAnswerBytes(absl::string_view what, size_t bytes);
  // RESOURCE_EXHAUSTED when the pod holds max_tables tables and tensors already.
  absl::Status CheckTableCount() ABSL_EXCLUSIVE_LOCKS_REQUIRED(create_mu_);
  struct PreparedDense {
    std::shared_ptr<DenseTensor> tensor;
    absl::Span<const float> grads;
    std::vector<float> scratch;
    float lr;
  };
  absl::Status PrepareDensePush(const DensePushRequest& req, const ShardOwnership& own,
                                std::vector<PreparedDense>* prepared);

  // A change of rows or dense tensors that a request has validated whole.
  struct Change {
    // What it may write: an outgoing move fences these and records them as touched.
    std::vector<std::pair<std::shared_ptr<EmbeddingTable>, absl::Span<const int64_t>>> rows;
    std::vector<absl::string_view> dense;  // tensor names
    size_t record_bytes = 0;               // log record size hint
    // Pushes: the key claimed once (PushDedup) and the response that answers a duplicate.
    // Imports carry none: installs are idempotent by their steps.
    const PushKey* key = nullptr;
    PushResponse* resp = nullptr;
    // A change a client asked this pod for as the vshards' primary: shipped to the
    // followers (replication). False for what a follower applies from its primary.
    bool ship = false;
    // It deletes rows: applied with the storage's apply lock held exclusively
    // (PodStorage::ApplyLogged).
    bool exclusive = false;
    // The key's part holds rows this change does not (a follower that left some out): the
    // key is recorded for these vshards only (those the follower follows from the sender;
    // PushDedup, "Per vshard"). Null: for the whole part.
    std::shared_ptr<const std::vector<uint32_t>> key_part;
    // The request was routed under an older shard map than this pod's: it may lack rows of
    // its part in vshards this pod leads, so its key is recorded for its own vshards only.
    // Its log record says so (LogRecordBuilder::SetKeyExact), and a follower's change of
    // such a record is exact too.
    bool key_exact = false;
    // Narrows the change, before `apply` runs, to the rows of the vshards given (sorted):
    // its key was applied here for the others already. Null: such a change is refused
    // (ABORTED, retried).
    const std::function<void(const std::vector<uint32_t>&)>* narrow = nullptr;
  };
  // The sorted, distinct vshards of a change's rows and tensors.
  std::vector<uint32_t> VShardsOf(const Change& change);
  // Applies the change in memory and adds its entries to `record` (null on an in-memory
  // pod), or fails having applied nothing.
  using ApplyFn = absl::FunctionRef<absl::Status(LogRecordBuilder* record)>;
  // The one path of every change (see the file comment). The caller holds migrate_mu_
  // shared from its ownership check on, so no assignment or fence comes between. Refuses
  // a change that touches a fenced vshard (UNAVAILABLE; a push applied before is answered
  // as a duplicate instead), claims a push's key, runs `apply` (through
  // PodStorage::ApplyLogged on a durable pod), records what an outgoing move must copy
  // again, and calls `done` once durable, as PushAsync describes.
  void ApplyChange(const Change& change, ApplyFn apply, Done done)
      ABSL_SHARED_LOCKS_REQUIRED(migrate_mu_);
  // ApplyChange's apply and durable apply for a change shipped to followers: under
  // ship_mu_ from the apply to the log append, so records reach every follower in the
  // order they were applied here (each row's updates in step order), each once this pod's
  // log holds it (PodStorage::ApplyLogged's `ship`), and `done` once this pod and the ack
  // set hold it.
  void ApplyShipped(const Change& change, ApplyFn apply, Done done)
      ABSL_SHARED_LOCKS_REQUIRED(migrate_mu_);
  // UNAVAILABLE when this pod is a replicated primary whose master lease ran out.
  absl::Status CheckWriteLease() ABSL_SHARED_LOCKS_REQUIRED(migrate_mu_);
  // Installs the replication part of an assignment (under migrate_mu_ exclusively);
  // returns the followers the replicator must use, and whether pushes awaiting followers
  // must fail (this pod lost vshards it was the primary of).
  struct RoleChange {
    bool changed = false;
    bool deposed = false;
    std::vector<ReplicaPeer> followers;
  };
  RoleChange ApplyRole(const Assignment& req, const ShardOwnership& before,
                       const ShardOwnership& after) ABSL_EXCLUSIVE_LOCKS_REQUIRED(migrate_mu_);
  // Whether vshard v's records are accepted from primary `pod`.
  bool Follows(uint32_t v, absl::string_view pod) const ABSL_SHARED_LOCKS_REQUIRED(migrate_mu_);

  // DeleteRows for eviction: with updated_before < UINT32_MAX only rows not updated since
  // (EmbeddingTable::DeleteStale) are deleted, and only those are logged.
  absl::Status DeleteRowsIf(const std::string& table, absl::Span<const int64_t> ids,
                            uint32_t updated_before, uint64_t* deleted);
  // The one DELETE change (DeleteRowsIf's, and a move's copy of the source's deletions):
  // deletes `ids` of `t` (with updated_before < UINT32_MAX only the rows not updated since)
  // as an exclusive change, logs the ids it deleted, and first records them for an
  // outgoing move (RecordDeleted). *removed (if given) gets the resident rows removed,
  // before `done` runs (as ApplyChange's). `ship`: a primary's own change, for followers.
  void ApplyDelete(const std::shared_ptr<EmbeddingTable>& t, absl::Span<const int64_t> ids,
                   uint32_t updated_before, bool ship, uint64_t* removed, Done done)
      ABSL_SHARED_LOCKS_REQUIRED(migrate_mu_);
  // EvictOnce's pass over one table (with an EvictionSpec); returns the rows evicted.
  // Callers hold evict_pass_mu_.
  uint64_t EvictTable(EmbeddingTable& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(evict_pass_mu_);
  // The eviction thread (started by Open): EvictOnce every eviction_interval_ms and, in
  // between, a pass over any table that holds more than its share of max_rows.
  void RunEviction();

  // Whole rows and dense tensors to install (ImportRows, ImportChunk: their messages have
  // the same fields; ps/pod_transfer.cc). The spans point into the request or the scratch
  // vectors.
  struct Installs {
    struct Rows {
      std::shared_ptr<EmbeddingTable> table;
      absl::Span<const int64_t> ids;
      absl::Span<const uint64_t> steps;
      absl::Span<const float> values;  // per row: dim weights, then the optimizer slots
      std::vector<int64_t> id_scratch;
      std::vector<uint64_t> step_scratch;
      std::vector<float> value_scratch;
    };
    struct Dense {
      std::shared_ptr<DenseTensor> tensor;
      uint64_t step = 0;
      absl::Span<const float> values;  // weights then slots
      std::vector<float> scratch;
    };
    std::vector<Rows> rows;
    std::vector<Dense> dense;
  };
  // Parses the packed arrays of `out->table`'s rows; INVALID_ARGUMENT (naming `what`) unless
  // there is one step and dim + slot floats per id.
  static absl::Status ParseRows(absl::string_view what, const std::string& ids,
                                const std::string& steps, const std::string& values,
                                Installs::Rows* out);
  // Leaves out of *r the rows that are no state its optimizer can hold (ValidState),
  // reporting each in *resp and the log; the spans then point into r's scratch vectors.
  static void DropInvalidRows(Installs::Rows* r, ImportRowsResponse* resp);
  // Parses `out->tensor`'s values; INVALID_ARGUMENT unless numel + slot floats.
  static absl::Status ParseDense(absl::string_view what, const std::string& values,
                                 Installs::Dense* out);
  // ImportRows' validation (ps/pod_transfer.cc): tables and tensors exist, sizes, every id
  // owned. Rows and tensors that are not a valid state are dropped from *in and reported
  // in *resp (see ImportRows).
  absl::Status PrepareImport(const ImportRowsRequest& req, const ShardOwnership& own, Installs* in,
                             ImportRowsResponse* resp);
  // What installing `in` may write.
  static void AddTouches(const Installs& in, Change* change);
  // The ApplyFn of an install: reads evicted rows back (a failed read installs nothing),
  // installs each row and tensor that is missing or older than its step (Install), and
  // logs those it installed; counts the others as skipped.
  static absl::Status ApplyInstalls(const Installs& in, LogRecordBuilder* record,
                                    uint64_t* installed, uint64_t* skipped);

  const PsCoreOptions options_;
  const absl::Time started_;
  ModelStore store_;
  PushDedup dedup_;
  std::unique_ptr<PodStorage> storage_;  // null: in memory only
  absl::Mutex create_mu_;                // serializes table and tensor creation

  // Migration. Changes (ApplyChange) hold migrate_mu_ shared from reading the ownership
  // until they are applied in memory (and their touched rows recorded); changing the
  // ownership or fencing takes it exclusively, so no change straddles either.
  struct OutgoingMove;
  // UNAVAILABLE ("moving; retry") if the change touches a vshard `out` has fenced.
  static absl::Status CheckFence(const OutgoingMove& out, const Change& change);
  // Remembers the rows and tensors a change wrote that `out` tracks, for its next phase.
  static void RecordTouched(OutgoingMove* out, const Change& change);
  // Remembers ids of `t` that `out` tracks as deleted, BEFORE a DELETE change deletes them:
  // the export then sends their deletion ahead of any later state of those rows.
  static void RecordDeleted(OutgoingMove* out, const std::shared_ptr<EmbeddingTable>& t,
                            absl::Span<const int64_t> ids);
  // A move's copy: ABORTED unless every row and tensor of `in` is in a vshard this pod is
  // receiving.
  absl::Status CheckReceiving(const Installs& in) ABSL_SHARED_LOCKS_REQUIRED(migrate_mu_);
  // Erases the rows of `vshards` from memory and storage, except those of a vshard a copy
  // began filling since (held_ again).
  absl::Status DropVShards(const std::vector<uint32_t>& vshards);
  // A refused push (FAILED_PRECONDITION): a key this pod already applied is a duplicate
  // even if it no longer owns the vshards (for all of `vshards`, those of the request's
  // rows), and one being applied is ABORTED (retry); a re-routed piece (PushKey.piece)
  // applied here stays refused: the vshard's owner decides.
  absl::Status RefusedOrDuplicate(const PushKey& key, PushDedup::VShardsFn vshards,
                                  PushResponse* resp, absl::Status refused);
  // The answer to a push whose key is not new: OK with resp->duplicate (applied before), or
  // ABORTED (being applied now: retry).
  absl::Status Repeated(const PushKey& key, PushDedup::Claim claim, PushResponse* resp);
  absl::Mutex migrate_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::shared_ptr<OutgoingMove> outgoing_ ABSL_GUARDED_BY(migrate_mu_);
  std::vector<bool> incoming_ ABSL_GUARDED_BY(migrate_mu_);
  // Vshards this pod may hold rows of (all of them until the first assignment).
  std::vector<bool> held_ ABSL_GUARDED_BY(migrate_mu_);
  bool assigned_ ABSL_GUARDED_BY(migrate_mu_) = false;
  // One drop at a time; BeginImport waits for it. Taken before migrate_mu_.
  absl::Mutex drop_mu_;
  // The destination of a move: the first error of its chunks (applying, or writing their
  // log records), which ImportChunk and FinishImport return. Reset by BeginImport.
  absl::Mutex import_mu_;
  absl::Status import_error_ ABSL_GUARDED_BY(import_mu_);
  // A chunk merged the source's push keys: FinishImport stores them.
  bool keys_imported_ ABSL_GUARDED_BY(import_mu_) = false;

  mutable absl::Mutex mu_;
  std::shared_ptr<const ShardOwnership> ownership_ ABSL_GUARDED_BY(mu_);

  // Replication. The role comes with assignments (under migrate_mu_).
  struct Role {
    std::string pod_id;
    uint32_t factor = 1;
    bool ack_leader = false;
    absl::Duration max_lag;
    std::vector<std::string> primary_of;  // per vshard: the primary this pod follows, or ""
    uint64_t role_epoch = 0;              // epoch at which primary_of last changed
    std::vector<ReplicaPeer> followers;
    // Per vshard: this pod leads it with an empty ack set (ReplicationRole.sole_copy).
    std::vector<bool> sole_copy;
    bool any_sole_copy = false;
  };
  Role role_ ABSL_GUARDED_BY(migrate_mu_);
  // --durability=periodic: changes of a vshard this pod holds the only copy of are
  // acknowledged once the log is fsynced (AckWhenDurable); null in other modes and in
  // memory. Stopped before the storage closes.
  std::unique_ptr<SyncedAcks> synced_acks_;
  // `done`, or when `change` is a client's change of a sole-copy vshard on a periodic pod,
  // a callback that passes an OK on to `done` only after the next fsync of the log.
  Done AckWhenDurable(const Change& change, Done done) ABSL_SHARED_LOCKS_REQUIRED(migrate_mu_);
  std::unique_ptr<Replicator> replicator_;  // null without options_.replica_sender
  // Held from apply to log append by a primary with followers (see ApplyShipped).
  absl::Mutex ship_mu_ ABSL_ACQUIRED_AFTER(migrate_mu_);
  absl::Mutex follow_mu_;  // one replicated batch at a time
  // ReplicateRecords in its turn: applies the batch, answers `done`, returns how many of
  // its records applied (0 when refused).
  uint64_t ApplyReplicated(const std::shared_ptr<const ReplicateRecordsRequest>& req,
                           ReplicateRecordsResponse* resp, Done done);
  std::atomic<int64_t> write_lease_ns_{0};  // absl::ToUnixNanos of the lease's end
  // The log this pod recovered at start (ps_core_replicate.cc; PodStorage::
  // ForEachRecoveredRecord): its keys are held (a retry gets ABORTED) until the first
  // assignment says what the pod is. StartReplicatedStorage (Open) installs the storage's
  // truncate gate and releases the recovered log of a pod with a static shard (no master);
  // ResolveRecoveredLog (the first assignment) re-ships to the followers the records of the
  // vshards this pod leads, whose keys stay held until the followers hold them, keeps the
  // keys of vshards it follows and forgets the others (their rows are dropped).
  void StartReplicatedStorage();
  void ResolveRecoveredLog(const ShardOwnership& own) ABSL_EXCLUSIVE_LOCKS_REQUIRED(migrate_mu_);
  // Without followers: confirms every recovered key and releases the recovered log. A key
  // recorded exactly (LogRecordView::key_exact) counts for its record's vshards only
  // (those of `num_vshards`; 0: not known, then whole as every other key).
  void ConfirmRecoveredKeys(uint32_t num_vshards);
  bool recovered_unresolved_ ABSL_GUARDED_BY(migrate_mu_) = false;

  // Feature eviction: one pass at a time; the thread and its stop signal.
  absl::Mutex evict_pass_mu_;
  absl::Mutex evict_mu_;
  bool stop_eviction_ ABSL_GUARDED_BY(evict_mu_) = false;
  std::thread evictor_;

  struct Counters {
    std::atomic<uint64_t> pull_requests{0}, push_requests{0}, pulled_rows{0}, pushed_rows{0},
        duplicate_pushes{0}, rejected_nonfinite{0}, rejected_wrong_shard{0},
        rejected_gradient_too_large{0}, rejected_answer_too_large{0}, invalid_import_rows{0},
        replicated_received{0}, replicated_applied{0}, replicated_refused{0},
        replicated_left_out{0}, lease_refusals{0};
  } counters_;
  // Each primary's replicated batches in number order. Last: destroyed first, it answers
  // the batches still waiting in it while everything they touch is alive.
  ReplicaOrder replica_order_;
};

}  // namespace ps
