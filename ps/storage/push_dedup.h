// Exactly-once application of pushes keyed by (worker id, incarnation, sequence).
//
// Per writer (worker id) the pod keeps its latest incarnation and, for the last `window`
// sequences, which were applied; pushes in flight are claimed so that a retry arriving
// while the original is still being applied is told to retry later rather than being
// acknowledged early. A newer incarnation of a worker replaces the older one, whose pushes
// are refused from then on (that process is gone: the master gave its id a new incarnation).
//
// Pieces (PushKey.piece = v + 1). A client part whose fate is unknown is re-routed with its
// key kept, one request per vshard v of its rows (client/sparse_push.cc): a pod that
// applied the whole part (or holds a copy of state that did) knows the key whole and
// answers every piece "duplicate"; any other pod applies each piece once, tracked as the
// pair (sequence, v). A key applied whole names every vshard of its part: a pod applies a
// whole part only while it owns all of its vshards, and every later copy of those vshards
// descends from that state, so the whole bit is exact on any pod. A piece is exact for its
// one vshard only, so a vshard copy exports only the pieces of the vshards it moves.
// Pieces are rare (a pod's loss while a push was in flight) and kept in a small map per
// writer beside the bits, so keys of the common case cost what they did.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
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
};

class PushDedup {
 public:
  enum class Claim {
    kNew,         // apply it, then call Finish
    kDuplicate,   // already applied: acknowledge without applying
    kInProgress,  // the same key is being applied now: tell the client to retry
  };

  explicit PushDedup(PushDedupOptions options = {});

  // Claims `key` for application. Anonymous keys (worker_id 0) are always kNew and need
  // no Finish. INVALID_ARGUMENT for sequence 0; FAILED_PRECONDITION for a superseded
  // incarnation or a sequence older than the window. A piece (key.piece() = v + 1) is a
  // duplicate when its key was applied whole or vshard v's piece of it was; a whole key
  // with pieces being applied or held is kInProgress (a stale attempt of a part whose
  // pieces were re-routed must not apply again); RESOURCE_EXHAUSTED beyond
  // max_piece_sequences. Thread-safe.
  absl::StatusOr<Claim> Begin(const PushKey& key);

  // What Begin would answer for `key`, without claiming it or changing any state:
  // kDuplicate (applied), kInProgress (claimed now) or kNew (neither, or unknown writer,
  // superseded incarnation, sequence outside the window). Thread-safe.
  Claim Peek(const PushKey& key) const;

  // Ends a kNew claim: `applied` marks the key done; false releases it so a retry applies
  // it. Thread-safe.
  void Finish(const PushKey& key, bool applied);

  size_t writers() const;
  // Sequences with pieces remembered, over every writer. Thread-safe.
  size_t piece_sequences() const;

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
  // Releases every held key as Release does; returns how many there were. Thread-safe.
  size_t ReleaseAll(bool applied);
  size_t held() const;

  // Adds the applied keys of `bytes` (another pod's Serialize) to this state: per writer,
  // a newer incarnation replaces this pod's, the same one adds its applied sequences, an
  // older one is ignored. A vshard copy carries its source's state (ps_core_migrate.cc),
  // so a push applied there before the copy is a duplicate here too. INVALID_ARGUMENT as
  // Restore, nothing changed then. Thread-safe.
  absl::Status Merge(absl::string_view bytes);

  // The applied keys (claims in progress are not included), as bytes for storage, and
  // back. With `only_vshards` (indexed by vshard), the pieces of other vshards are left
  // out: a vshard copy carries exactly its own pieces (whole keys are exact everywhere).
  // Restore replaces the state; INVALID_ARGUMENT for bytes it cannot read (or of another
  // window size). Bytes without pieces are the format before pieces. Thread-safe.
  std::string Serialize(const std::vector<bool>* only_vshards = nullptr) const;
  absl::Status Restore(absl::string_view bytes);

 private:
  // The vshards of one sequence's pieces: applied (`done`, which includes `held`), held
  // (Hold), claimed now.
  struct Pieces {
    absl::flat_hash_set<uint32_t> done, held, in_progress;
    bool empty() const { return done.empty() && in_progress.empty(); }
  };
  struct Writer {
    uint64_t incarnation = 0;
    uint64_t base = 1;  // done bits cover sequences [base, base + window)
    uint64_t last_used = 0;
    std::vector<uint64_t> done;  // ring of window bits, indexed by sequence % window
    absl::flat_hash_set<uint64_t> in_progress;
    absl::flat_hash_set<uint64_t> held;            // applied, not yet confirmed (Hold)
    absl::flat_hash_map<uint64_t, Pieces> pieces;  // by sequence, within the window
  };
  // Parses Serialize's bytes.
  absl::StatusOr<absl::flat_hash_map<uint64_t, Writer>> Parse(absl::string_view bytes) const;
  // The writer of `worker_id` at `incarnation` (created, or reset for a newer one); null
  // for an older incarnation.
  Writer* WriterFor(uint64_t worker_id, uint64_t incarnation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Begin for a piece (key.piece() != 0) of writer `w`, its window already moved.
  absl::StatusOr<Claim> BeginPiece(Writer& w, const PushKey& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What Begin answers for a known, in-window key, without claiming it.
  Claim Look(const Writer& w, const PushKey& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsDone(const Writer& w, uint64_t seq) const;
  void SetDone(Writer& w, uint64_t seq);
  void Advance(Writer& w, uint64_t seq);
  void EvictOldest() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PushDedupOptions options_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Writer> writers_ ABSL_GUARDED_BY(mu_);
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ps
