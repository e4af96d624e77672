#include "client/security_flags.h"

#include <gflags/gflags.h>

#include <string>

DEFINE_string(tls_ca, "",
              "PEM CA bundle: talk TLS to the master and the pods, verifying them against it.");
DEFINE_string(tls_cert, "", "PEM client certificate, for a cluster that requires mutual TLS.");
DEFINE_string(tls_key, "", "PEM private key of --tls_cert.");
DEFINE_string(tls_server_name, "",
              "Name to check the servers' certificates for instead of the host dialed.");
DEFINE_string(auth_token_file, "",
              "File holding the cluster's worker token (or its one shared token), sent as "
              "`authorization: Bearer` when --admin_token_file is not given.");
DEFINE_string(admin_token_file, "",
              "File holding the cluster's admin token (the servers' --admin_token_file), sent "
              "instead of --auth_token_file's: drain, rebalance, checkpoint, export and import "
              "need it.");

namespace ps {

absl::StatusOr<ChannelSecurity> ChannelSecurityFromFlags() {
  ChannelSecurity security;
  security.ca_file = FLAGS_tls_ca;
  security.cert_file = FLAGS_tls_cert;
  security.key_file = FLAGS_tls_key;
  security.server_name = FLAGS_tls_server_name;
  absl::StatusOr<std::string> token = ReadAuthTokenFile(
      FLAGS_admin_token_file.empty() ? FLAGS_auth_token_file : FLAGS_admin_token_file);
  if (!token.ok()) return token.status();
  security.auth_token = *std::move(token);
  return security;
}

}  // namespace ps
