// A push load through the C++ client (which follows the master's map) whose outcome can be
// checked exactly, for the multi-process tests that kill, pause or wipe pods under it
// (ps-crash-test --replication, split_brain_test).
//
// The table is SGD at learning rate 1 over zero-initialized rows, so a push of -1 adds 1.
// Each push of load thread c with sequence s adds 1 to its own marker row
// ((c + 1) << 32 | s) and to 8 distinct rows of a shared set of 64, which every thread
// touches; each thread has one push in flight. Afterwards (CheckPushLoad) a marker of 1
// means applied once, 0 not applied, 2 or more applied twice, and every shared row must
// equal, in each element, the sum of the markers of the pushes that touched it.
//
// Thread-safety: Start, Stop and pushes() from one thread; the load runs on its own.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/ps_client.h"

namespace ps::integration {

inline constexpr int kLoadDim = 4;

// The table spec the load needs (create it before Start).
TableSpec ExactLoadTable(const std::string& name);

struct LoadPush {
  int64_t marker = 0;
  std::vector<int64_t> shared;
  absl::Time sent_at, done_at;  // the call's start and end
  bool acked = false;           // the client's Push returned OK
  std::string error;            // otherwise, why
  // The client's re-routes, retries and "duplicate" answers during this push (each load
  // thread has its own client and one push in flight): which pushes met a failover.
  uint64_t reroutes = 0, retries = 0, duplicates = 0;
};

class ExactPushLoad {
 public:
  // Starts `threads` threads pushing to `table`, each with its own client connected with
  // `client_options` (give it a retry budget that rides out the faults the test makes).
  static absl::StatusOr<std::unique_ptr<ExactPushLoad>> Start(const ClientOptions& client_options,
                                                              const std::string& table, int threads,
                                                              uint64_t seed);
  ~ExactPushLoad() { Stop(); }

  // Lets every thread finish its push in flight and joins them. Idempotent.
  void Stop();
  // Pushes finished so far (acknowledged or failed), in completion order.
  std::vector<LoadPush> pushes() const;
  uint64_t acked() const { return acked_.load(); }

 private:
  ExactPushLoad() = default;
  void Run(PsClient* client, int thread, uint64_t seed);

  std::string table_;
  std::vector<std::unique_ptr<PsClient>> clients_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> acked_{0};
  mutable absl::Mutex mu_;
  std::vector<LoadPush> pushes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

struct LoadCheck {
  uint64_t acked = 0, failed = 0;  // client calls that returned OK / an error
  uint64_t lost = 0;               // acknowledged, marker 0
  uint64_t duplicated = 0;         // marker >= 2
  uint64_t torn = 0;               // marker rows whose elements differ
  uint64_t shared_mismatches = 0;  // shared row elements != the sum of their pushes
  // For the log: the first few lost or duplicated pushes, and each shared row that differs
  // from its sum with the acknowledged pushes that touched it and met a fault (re-routed,
  // retried or answered "duplicate"): where to look in the client's and pods' logs.
  std::string problems;
  bool pass() const {
    return failed == 0 && lost == 0 && duplicated == 0 && torn == 0 && shared_mismatches == 0;
  }
};

// Reads every marker of `pushes` and the shared rows back through `client` (a training
// pull: from each vshard's primary) and checks them as the file comment says.
absl::StatusOr<LoadCheck> CheckPushLoad(PsClient& client, const std::string& table,
                                        const std::vector<LoadPush>& pushes);

}  // namespace ps::integration
