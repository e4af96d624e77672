// The server-side check of every RPC of the pod's and the master's services: which role
// the call's credentials give (worker token, admin token, or under mutual TLS an admin
// client certificate) against the role its method needs (common/rpc/auth_policy.h).
// grpc.health.v1 and reflection are not checked (probes stay open).
//
// What is configured decides what is checked:
//   nothing                  every call passes (a trusted network); a warning at start
//                            says pod control is unauthenticated
//   worker token only        that token is needed for every call, pod control included,
//                            as before roles existed (every worker can control pods: a
//                            warning at start says so)
//   admin credential only    admin methods need it; worker methods are open
//   both                     worker methods need either credential, admin methods the
//                            admin one
// A call without a valid credential gets UNAUTHENTICATED; one with the worker token on an
// admin method PERMISSION_DENIED.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/rpc/auth_policy.h"
#include "common/rpc/transport_security.h"

namespace ps {

class Authorizer {
 public:
  // From a server's security: its worker token (auth_token), admin token and admin
  // identities. The default checks nothing.
  explicit Authorizer(const ServerSecurity& security = {});

  // The role the call's credentials give: kAdmin for the admin token or a client
  // certificate naming an admin identity, kWorker for the worker token, else kNone.
  // Tokens are compared in time that does not depend on where they differ.
  Role RoleOf(const grpc::ServerContextBase& ctx) const;

  // OK if the call may run `method` (a full method name, "/ps.Master/Drain");
  // UNAUTHENTICATED without a valid credential; PERMISSION_DENIED, naming the method and
  // the role it needs, for a worker credential on an admin method. Refusals are logged
  // (the first, then one in 100) with the peer's address. Thread-safe.
  absl::Status Authorize(const grpc::ServerContextBase& ctx, absl::string_view method) const;

  // Every call passes (nothing configured).
  bool open() const { return open_; }
  bool admin_configured() const { return admin_configured_; }

  // What a server logs at start: one line on what is checked, and warnings for the
  // configurations above that leave control calls open to workers or to anyone.
  // `control_calls` names the server's control calls for the warning, e.g.
  // "pod-control calls (ApplyAssignment, Migrate*, Checkpoint, Export, ImportRows)".
  void LogConfiguration(absl::string_view server, absl::string_view control_calls) const;

 private:
  const std::string worker_bearer_;  // "Bearer <token>", empty when no worker token
  const std::string admin_bearer_;   // "Bearer <token>", empty when no admin token
  const std::vector<std::string> admin_identities_;
  const bool open_;
  const bool admin_configured_;
};

}  // namespace ps
