// Exactly-once application of pushes keyed by (worker id, incarnation, sequence).
//
// Per writer (worker id) the pod keeps its latest incarnation and, for the last `window`
// sequences, which were applied; pushes in flight are claimed so that a retry arriving
// while the original is still being applied is told to retry later rather than being
// acknowledged early. A newer incarnation of a worker replaces the older one, whose pushes
// are refused from then on (that process is gone: the master gave its id a new incarnation).
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
  // incarnation or a sequence older than the window. Thread-safe.
  absl::StatusOr<Claim> Begin(const PushKey& key);

  // What Begin would answer for `key`, without claiming it or changing any state:
  // kDuplicate (applied), kInProgress (claimed now) or kNew (neither, or unknown writer,
  // superseded incarnation, sequence outside the window). Thread-safe.
  Claim Peek(const PushKey& key) const;

  // Ends a kNew claim: `applied` marks the key done; false releases it so a retry applies
  // it. Thread-safe.
  void Finish(const PushKey& key, bool applied);

  size_t writers() const;

  // The applied keys (claims in progress are not included), as bytes for storage, and
  // back. Restore replaces the state; INVALID_ARGUMENT for bytes it cannot read (or of
  // another window size). Thread-safe.
  std::string Serialize() const;
  absl::Status Restore(absl::string_view bytes);

 private:
  struct Writer {
    uint64_t incarnation = 0;
    uint64_t base = 1;  // done bits cover sequences [base, base + window)
    uint64_t last_used = 0;
    std::vector<uint64_t> done;  // ring of window bits, indexed by sequence % window
    absl::flat_hash_set<uint64_t> in_progress;
  };

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
