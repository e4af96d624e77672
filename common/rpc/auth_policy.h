// Which credential each RPC needs: the one table of roles, used by the pod's services
// (ps.ParameterServer, ps.PodTransfer) and the master's (ps.Master) through Authorizer
// (common/rpc/authorizer.h).
//
// Two roles:
//   worker  data and training calls: pull, push, describe, table creation, the master's
//           worker protocol (register, heartbeat, tasks, reports, leave), the shard map,
//           the catalog and status.
//   admin   control: a pod's assignments, vshard moves, checkpoints, export and import;
//           the master's drain, rebalance, checkpoint, job deletion; and the pods' own
//           registration with the master (it redirects the clients' traffic, so a worker
//           must not be able to register a pod in place of a lost one).
// An admin credential may call every worker method too.
//
// A method that is not in the table needs admin: a new RPC is closed until it is listed
// here (ps_server_security_test checks that every method of the services is listed).
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"

namespace ps {

enum class Role : uint8_t {
  kNone = 0,    // no valid credential
  kWorker = 1,  // the worker token (--auth_token_file)
  kAdmin = 2,   // the admin token (--admin_token_file) or an admin client certificate
};

// "none", "worker" or "admin".
absl::string_view RoleName(Role role);

// The role `method` (a full gRPC method name, "/ps.ParameterServer/Pull") needs. Unknown
// methods: kAdmin. Thread-safe; no allocation.
Role RequiredRole(absl::string_view method);

// Whether `method` is listed in the table (for the test that every RPC is).
bool IsListedMethod(absl::string_view method);

}  // namespace ps
