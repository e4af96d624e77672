// The command-line flags of a client binary's transport security (ps-admin, ps-transfer,
// ps-bench): --tls_ca, --tls_cert, --tls_key, --tls_server_name, --auth_token_file,
// --admin_token_file. Linking this library defines them; each main() turns them into a
// ChannelSecurity.
#pragma once

#include "absl/status/statusor.h"
#include "common/rpc/transport_security.h"

namespace ps {

// The ChannelSecurity the flags describe, with the token read from --admin_token_file
// when it is given (ps-admin's and ps-transfer's calls are admin calls: drain, rebalance,
// checkpoint, export, import), else from --auth_token_file (a cluster with one shared
// token, or ps-bench's worker calls). Under mutual TLS the certificate may carry the admin
// role instead (the servers' --admin_identities). INVALID_ARGUMENT for an unreadable or
// empty token file. Call after flag parsing.
absl::StatusOr<ChannelSecurity> ChannelSecurityFromFlags();

}  // namespace ps
