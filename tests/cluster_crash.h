// ps-crash-test's cluster mode (--replication=R >= 1): ps-master and several durable pods
// as child processes (tests/chaos_cluster.h), a push load through the C++ client, which
// follows the master's map (tests/exact_push_load.h), and pod kills under it: SIGKILL,
// optionally with the pod's data dir deleted (--lose_disk: a lost volume), a wait until
// the master has seen the pod go (its lease ran out, its vshards failed over when R >= 2),
// and a restart at a new address (or, with restart_in_place, a restart at once at its
// address, within its lease). Before each disk loss, and at R >= 2 with periodic
// durability before each kill (a crash then loses the log's unwritten tail, like a disk
// its whole copy), it waits until the master's map gives every vshard R copies again
// (re-replication), so no loss can take a last copy. At the end (after one more kill)
// every acknowledged push must be applied exactly once; with periodic durability at R = 1
// pushes acknowledged within --flush_ms of a kill may be lost, at R >= 2 none. With
// ack_leader (ps-master --replication_ack=leader, documented as weaker) a push
// acknowledged on its primary alone may be lost with that primary: losses are counted,
// not failed; duplicates, torn rows and failed pushes still fail the run.
//
// Call from the main thread (child processes die with the thread that started them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ps::integration {

struct ClusterCrashOptions {
  std::string master_binary, server_binary;
  uint32_t replication = 2;
  uint32_t pods = 3;
  uint32_t num_vshards = 64;
  std::string durability = "process";
  bool ack_leader = false;  // ps-master --replication_ack=leader (else all)
  int flush_ms = 100, materialize_ms = 300;
  std::vector<std::string> server_flags;  // more ps-server flags (e.g. --lazy_start)
  int lease_ms = 1000;  // the master's --lease_ms: how soon a dead primary is replaced
  int kills = 4;
  bool lose_disk = false;
  bool restart_in_place = false;  // plain kills: back at once at the same address
  double seconds = 10;
  int clients = 4;
  uint64_t seed = 1;
  double heal_timeout_s = 120;  // the wait for R copies before a loss
  bool keep_dir = false;
};

// Runs it; prints progress to the log and the JSON summary as the last line of stdout.
// 0: passed; 1: a loss, a duplicate, a failed push or a cluster that did not come back.
int RunClusterCrash(const ClusterCrashOptions& options);

}  // namespace ps::integration
