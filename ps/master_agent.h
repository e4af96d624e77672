// The PS pod's side of the master: registers the pod under its stable identity, renews its
// lease by heartbeat, applies the vshard ownership the master assigns (a new epoch or a
// changed set) to the PsCore, and creates the master's catalog tables on the pod.
//
// Registration reports the identity of the pod's data (its database's storage id, or one
// drawn per process for a pod in memory), so the master can tell a pod that lost its volume
// from one that restarted with it (proto/master.proto, RegisterPodRequest.storage_id),
// and whether its log may lack records it acknowledged before a crash (periodic
// durability; RegisterPodRequest.log_tail_lost), until one registration succeeded.
//
// Everything runs on one background thread, so a pod starts serving at once, whether or
// not the master is up: until the first registration succeeds it owns no vshard and
// refuses data requests with FAILED_PRECONDITION, which clients retry after refreshing
// their map. While the master is unreachable the pod keeps its last ownership.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/transport_security.h"
#include "ps/ps_core.h"

namespace ps {

struct MasterAgentOptions {
  std::string master;          // the master's HOST:PORT; required
  std::string pod_id;          // stable identity, e.g. "ps-0" (the StatefulSet ordinal); required
  std::string address;         // HOST:PORT clients reach this pod at; required
  uint32_t num_vshards = 256;  // the pod's vshard count; the master refuses a mismatch
  // Deadline of each call to the master. Heartbeats come every lease/3, so 2 s fits the
  // default 10 s lease with room for one retry.
  absl::Duration rpc_timeout = absl::Seconds(2);
  // Wait between failed registration attempts (master down, identity still leased).
  absl::Duration retry_interval = absl::Milliseconds(200);
  // TLS and token towards the master. RegisterPod, PodHeartbeat and LeavePod are admin
  // calls (common/rpc/auth_policy.h): the token is the admin one when the cluster has one
  // (ps-server passes --admin_token_file's, else --auth_token_file's). Default: plain
  // text, no token.
  ChannelSecurity security;
};

class MasterAgent {
 public:
  // Starts the background thread. `core` must outlive the agent. INVALID_ARGUMENT when a
  // required option is missing; security file errors (ChannelMaker::Create).
  static absl::StatusOr<std::unique_ptr<MasterAgent>> Start(const MasterAgentOptions& options,
                                                            PsCore* core);
  // Stops the thread (waits for a call in flight, at most rpc_timeout).
  virtual ~MasterAgent() = default;

  // Whether the master has accepted this pod and its lease is being renewed. Thread-safe.
  virtual bool registered() const = 0;
  // Graceful shutdown: stops the heartbeats (the core is not touched afterwards) and, if
  // registered, deregisters the pod (Master.LeavePod) so the master sees it leave at once
  // instead of after its lease. Returns the master's answer. Call once.
  virtual absl::Status Leave() = 0;
};

// The address a pod advertises when none is given: `host:port`, with the machine's host
// name in place of a wildcard host (0.0.0.0, ::, empty).
std::string DefaultAdvertiseAddress(const std::string& host, int port);

}  // namespace ps
