// The client's counters behind PsClient::client_stats: bumped by the pieces that see the
// events (SparseCalls and DenseCalls: calls and push answers; RpcRunner: retries and
// re-routes; Router: map refreshes).
#pragma once

#include <atomic>
#include <cstdint>

#include "client/ps_client.h"

namespace ps::internal {

// Thread-safe (relaxed atomics: each counter is exact, a snapshot is not one instant).
struct ClientCounters {
  std::atomic<uint64_t> pulls{0};
  std::atomic<uint64_t> pushes{0};
  std::atomic<uint64_t> push_rpcs{0};
  std::atomic<uint64_t> duplicate_pushes{0};
  std::atomic<uint64_t> reused_keys{0};
  std::atomic<uint64_t> retries{0};
  std::atomic<uint64_t> map_refreshes{0};
  std::atomic<uint64_t> reroutes{0};
  std::atomic<uint64_t> read_fallbacks{0};

  ClientStats Snapshot() const {
    ClientStats s;
    s.pulls = pulls.load(std::memory_order_relaxed);
    s.pushes = pushes.load(std::memory_order_relaxed);
    s.push_rpcs = push_rpcs.load(std::memory_order_relaxed);
    s.duplicate_pushes = duplicate_pushes.load(std::memory_order_relaxed);
    s.reused_keys = reused_keys.load(std::memory_order_relaxed);
    s.retries = retries.load(std::memory_order_relaxed);
    s.map_refreshes = map_refreshes.load(std::memory_order_relaxed);
    s.reroutes = reroutes.load(std::memory_order_relaxed);
    s.read_fallbacks = read_fallbacks.load(std::memory_order_relaxed);
    return s;
  }
};

}  // namespace ps::internal
