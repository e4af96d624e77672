// Exactly-once application of pushes keyed by (worker id, incarnation, sequence).
//
// Per writer (worker id) the pod keeps its latest incarnation and, for the last `window`
// sequences, which were applied; pushes in flight are claimed so that a retry arriving
// while the original is still being applied is told to retry later rather than being
// acknowledged early. A newer incarnation of a worker replaces the older one, whose pushes
// are refused from then on (that process is gone: the master gave its id a new incarnation).
//
// Per vshard. A key counts as applied for exactly the vshards whose rows were applied
// under it on this pod. Three forms hold that, cheapest first:
//  - whole (a bit per sequence): applied for every vshard of its part. A pod applies a
//    client's part only while it owns all of its vshards, a follower keeps a record whole
//    only when it follows all of them, and a retry carries a subset of the part's rows: the
//    common case costs a bit, as it always did.
//  - layers (a bit per sequence, per layer): whole keys, but not for the vshards a layer
//    names (Forget: this pod dropped those vshards' rows, or replaced them by an import,
//    after applying the key), or only for the vshards a layer names (a copy's keys, Merge:
//    exactly the copied vshards). Layers exist only after a drop or an import and leave
//    with the window; a layer per writer per drop or import, at most max_layers each.
//    A follower's record of which it kept only some rows is a key of a layer too: applied
//    for the vshards it follows from that primary (`part`), which are exactly the part's
//    vshards it kept (the part's vshards all had that primary), so a layer per writer per
//    follower role, not a set per key.
//  - pieces (a small map by sequence, each a few vshards): a re-routed piece
//    (PushKey.piece = v + 1), a retry of a key already partly applied here. Rare, bounded
//    by max_piece_sequences.
// Whether a key is a duplicate then depends on which vshards the request's rows are in:
// Begin and Peek ask for them (VShardsFn), and only when the key has a layer or pieces.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/ps.pb.h"

namespace ps {

struct PushDedupOptions {
  // Sequences remembered per writer. A client retries only its last few in-flight pushes,
  // so 4096 leaves a wide margin at 512 bytes per writer.
  uint32_t window = 4096;
  // Writers remembered; beyond this the least recently seen is forgotten (its old pushes
  // could then apply twice). 100k writers cost about 60 MB.
  size_t max_writers = 100000;
  // Sequences with re-routed pieces remembered per writer (each a few vshards): pieces
  // exist only for pushes in flight when a pod was lost. Beyond it a new piece is refused
  // (RESOURCE_EXHAUSTED) rather than grow without bound.
  size_t max_piece_sequences = 4096;
  // Layers per writer (see the file comment): a layer stays while it has sequences in the
  // window, so this many drops and imports within a writer's last `window` pushes. Beyond
  // it the two oldest are merged, keeping for each sequence only the vshards both name
  // (a retry of those old keys may then apply again on the others; counted and logged).
  size_t max_layers = 16;
};

class PushDedup {
 public:
  enum class Claim {
    kNew,         // apply it, then call Finish
    kDuplicate,   // already applied: acknowledge without applying
    kInProgress,  // the same key is being applied now: tell the client to retry
    kPartial,     // applied here for some of the request's vshards only (nothing claimed)
  };
  // The sorted, distinct vshards of the request's rows; called at most once per call, and
  // only for a key with a layer or pieces here (rare).
  using VShardsFn = absl::FunctionRef<std::vector<uint32_t>()>;

  explicit PushDedup(PushDedupOptions options = {});

  // Claims `key` for application. Anonymous keys (worker_id 0) are always kNew and need
  // no Finish. INVALID_ARGUMENT for sequence 0; FAILED_PRECONDITION for a superseded
  // incarnation or a sequence older than the window. A piece (key.piece() = v + 1) is a
  // duplicate when its key was applied for vshard v; a whole key (piece 0) when it was
  // applied for every vshard `vshards` names, kPartial when for some (the caller applies
  // the others' rows under BeginRest), kNew when for none. `part` (sorted; null: the whole
  // part): the request holds only its part's rows of these vshards (a follower that left
  // rows out: the vshards it follows from the sender), recorded as applied for them only
  // when Finish is given the same `part`. RESOURCE_EXHAUSTED beyond max_piece_sequences.
  // Thread-safe.
  // `exact`: the request may lack rows of its part in vshards this pod holds (sent under
  // an older shard map: a re-routed part keeps its key, and a stale map routes some of its
  // rows elsewhere): recorded for the request's own vshards (a piece set), not whole.
  absl::StatusOr<Claim> Begin(const PushKey& key, VShardsFn vshards,
                              const std::vector<uint32_t>* part = nullptr, bool exact = false);
  // Begin for a request whose vshards are not known: those of a whole key applied whole
  // (kDuplicate), or never applied here (kNew); a key known for some vshards only is
  // kInProgress (the caller cannot tell which it would apply).
  absl::StatusOr<Claim> Begin(const PushKey& key);

  // After kPartial: claims the vshards of `vshards` the key was not applied for here
  // (stored in *rest, sorted) as Begin's kNew would; the caller applies only their rows,
  // then calls Finish. kInProgress (nothing claimed) if the key's state changed since.
  // Thread-safe.
  absl::StatusOr<Claim> BeginRest(const PushKey& key, VShardsFn vshards,
                                  std::vector<uint32_t>* rest);

  // What Begin would answer for `key`, without claiming it or changing any state:
  // kDuplicate (applied), kInProgress (claimed now), kPartial, or kNew (neither, or
  // unknown writer, superseded incarnation, sequence outside the window). Thread-safe.
  Claim Peek(const PushKey& key, VShardsFn vshards) const;
  Claim Peek(const PushKey& key) const;

  // Ends a kNew claim: `applied` marks the key done (for the vshards claimed: with Begin's
  // `part`, for those; with another `part`, for the claimed ones it names: a deposed
  // primary's kept vshards); false releases it so a retry applies it. Thread-safe.
  void Finish(const PushKey& key, bool applied, const std::vector<uint32_t>* part = nullptr);

  // The rows of `vshards` are gone from this pod, or about to be replaced by an
  // import (whose keys Merge brings): every key stops counting as applied for them. Keys
  // claimed now count for them again only if applied after this call. Cost: one pass over
  // the writers; memory: a layer per writer with whole keys (see the file comment).
  // Thread-safe.
  void Forget(const std::vector<uint32_t>& vshards);

  size_t writers() const;
  // Sequences with pieces remembered, over every writer. Thread-safe.
  size_t piece_sequences() const;
  // Layers over every writer, and merges forced by max_layers so far. Thread-safe.
  size_t layers() const;
  uint64_t layer_merges() const;

  // Replication (docs/architecture.md, "Replication"). Hold marks `key` applied but not yet
  // confirmed: a record a replicated pod recovered from its log, which its followers may
  // not hold (its ship queue died with the process). While held, Begin and Peek answer
  // kInProgress for it (a retry is told to wait, never "duplicate"), until Release: with
  // `applied` the key stays applied (the ack set holds its record, or this pod holds the
  // vshards' only copy), else it is forgotten (this pod no longer leads the record's
  // vshards and drops their rows: their new primary decides). Anonymous keys are ignored.
  // Thread-safe.
  void Hold(const PushKey& key);
  void Release(const PushKey& key, bool applied);
  // Release with `applied`, for `vshards` (sorted) only: a follower's recovered record,
  // whose rows are those it kept of its part (the vshards it follows from that record's
  // primary, as Begin's `part`). Thread-safe.
  void ReleaseFor(const PushKey& key, const std::vector<uint32_t>& vshards);
  // Release with `applied`, for `vshards` (sorted) only, as Begin's `exact` records a key:
  // a recovered record whose key was recorded exactly (LogRecordView::key_exact), whose
  // vshards are its rows'. Beyond max_piece_sequences, in a layer (as ReleaseFor).
  // Thread-safe.
  void ReleaseExact(const PushKey& key, const std::vector<uint32_t>& vshards);
  // Releases every held key as Release does; returns how many there were. Thread-safe.
  size_t ReleaseAll(bool applied);
  size_t held() const;

  // Adds the applied keys of `bytes` (another pod's Serialize) to this state: per writer,
  // a newer incarnation replaces this pod's, the same one adds its applied sequences, an
  // older one is ignored. A vshard copy carries its source's state for the copied vshards
  // only (Serialize with `only_vshards`; ps_core_migrate.cc), so a push applied there
  // before the copy is a duplicate here too, for those vshards. INVALID_ARGUMENT as
  // Restore, nothing changed then. Thread-safe.
  absl::Status Merge(absl::string_view bytes);

  // The applied keys (claims in progress are not included), as bytes for storage, and
  // back. With `only_vshards` (indexed by vshard): for those vshards only (a vshard copy
  // carries exactly its own vshards' keys). Restore replaces the state; INVALID_ARGUMENT
  // for bytes it cannot read (or of another window size). Bytes without pieces or layers
  // are the format before them. Thread-safe.
  std::string Serialize(const std::vector<bool>* only_vshards = nullptr) const;
  // Serialize's state cut in parts of at most `max_part_bytes` each, for a message of
  // bounded size (a copy's keys may hold max_layers layers and many pieces per writer).
  // Each part is a whole state Merge accepts (a writer whose layers and pieces span parts
  // is listed in each, with its done bits in the first only), and merging every part, in
  // any order, merges the whole state. A part exceeds the bound only if one writer's entry
  // and one of its layers alone do: 84 + window / 4 + 4 bytes per vshard the layer and
  // `only_vshards` name (1.1 KiB with the default window of 4096 and a few vshards;
  // push_dedup_test checks it). At least one part. Thread-safe.
  std::vector<std::string> SerializeParts(const std::vector<bool>* only_vshards,
                                          size_t max_part_bytes) const;
  absl::Status Restore(absl::string_view bytes);

 private:
  // The vshards of one sequence's pieces: applied (`done`, which includes `held`), held
  // (Hold), claimed now; `claim`: the vshards a whole key's claim applies (Begin on a key
  // with a layer or pieces; BeginRest).
  struct Pieces {
    absl::flat_hash_set<uint32_t> done, held, in_progress;
    std::vector<uint32_t> claim;
    bool empty() const { return done.empty() && in_progress.empty() && claim.empty(); }
  };
  // Keys applied for every vshard but `vshards` (`except`), or for `vshards` only.
  struct Layer {
    std::vector<uint64_t> bits;     // as Writer.done
    std::vector<uint32_t> vshards;  // sorted
    bool except = true;
  };
  struct Writer {
    uint64_t incarnation = 0;
    uint64_t base = 1;  // done bits cover sequences [base, base + window)
    uint64_t last_used = 0;
    std::vector<uint64_t> done;  // ring of window bits, indexed by sequence % window
    absl::flat_hash_set<uint64_t> in_progress;
    absl::flat_hash_set<uint64_t> held;            // applied, not yet confirmed (Hold)
    absl::flat_hash_map<uint64_t, Pieces> pieces;  // by sequence, within the window
    std::vector<Layer> layers;                     // oldest first
    // Whole claims in progress across a Forget: the vshards forgotten meanwhile.
    absl::flat_hash_map<uint64_t, std::vector<uint32_t>> forgotten_claims;
  };
  struct Parsed {
    absl::flat_hash_map<uint64_t, Writer> writers;
    bool only = false;  // Serialize with only_vshards: `vshards` is what it covers
    std::vector<uint32_t> vshards;
  };
  // Parses Serialize's bytes.
  absl::StatusOr<Parsed> Parse(absl::string_view bytes) const;
  // The writer of `worker_id` at `incarnation` (created, or reset for a newer one); null
  // for an older incarnation.
  Writer* WriterFor(uint64_t worker_id, uint64_t incarnation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The known, in-window writer of `key`, or null (Peek).
  const Writer* Known(const PushKey& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The writer of `key` with its window moved to the key, or an error (Begin).
  absl::StatusOr<Writer*> Claimable(const PushKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Begin for a piece (key.piece() != 0) of writer `w`, its window already moved.
  absl::StatusOr<Claim> BeginPiece(Writer& w, const PushKey& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What Begin answers for a known, in-window key, without claiming it; `vshards` null:
  // not known. With `applied_out`, the request's vshards and those applied (kPartial).
  Claim Look(const Writer& w, const PushKey& key, const VShardsFn* vshards,
             std::vector<uint32_t>* request_out = nullptr,
             std::vector<uint32_t>* applied_out = nullptr) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `seq` is in some layer, or has pieces: its duplicate test needs vshards.
  bool HasPartialState(const Writer& w, uint64_t seq) const;
  // Whether the key `seq` counts as applied here for vshard v.
  bool AppliedFor(const Writer& w, uint64_t seq, uint32_t v) const;
  bool IsDone(const Writer& w, uint64_t seq) const { return IsSet(w.done, seq); }
  bool IsSet(const std::vector<uint64_t>& bits, uint64_t seq) const;
  void SetDone(Writer& w, uint64_t seq) { SetBit(w.done, seq); }
  void SetBit(std::vector<uint64_t>& bits, uint64_t seq) const;
  void ClearBit(std::vector<uint64_t>& bits, uint64_t seq) const;
  // Forgets `seq` everywhere (whole bit and layers).
  void ClearApplied(Writer& w, uint64_t seq) const;
  // The writer of a held whole key, its hold released and its applied state forgotten
  // (ReleaseFor, ReleaseExact then record it for some vshards); null when not held.
  Writer* UnholdForRecord(const PushKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets `seq` in the layer of this form (made if missing, merged beyond max_layers).
  void SetInLayer(Writer& w, uint64_t seq, const std::vector<uint32_t>& vshards, bool except)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Layer& LayerFor(Writer& w, const std::vector<uint32_t>& vshards, bool except)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Advance(Writer& w, uint64_t seq);
  void EvictOldest() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PushDedupOptions options_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Writer> writers_ ABSL_GUARDED_BY(mu_);
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t layer_merges_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ps
