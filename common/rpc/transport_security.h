// Transport security of every gRPC endpoint: TLS (and mutual TLS) from PEM files, and a
// shared bearer token. One implementation for servers (ps-server, ps-master) and clients
// (PsClient, ps-admin, the pods' master agent, ps-bench).
//
// The token travels as the metadata `authorization: Bearer <token>`. Send it only over
// TLS outside a trusted network: in plain text anyone on the path can read it.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ps {

// A server's side. All empty: plain text, no token.
struct ServerSecurity {
  std::string cert_file;   // PEM certificate chain; set with key_file: TLS
  std::string key_file;    // PEM private key
  std::string ca_file;     // PEM CA bundle; set: clients must present a certificate it signed
  std::string auth_token;  // non-empty: calls must carry it (TokenAuthenticator)
  // The three files are read again this often, so replaced certificates (a renewed
  // Kubernetes Secret) take effect without a restart, for new connections. A minute
  // matches how fast the kubelet updates mounted Secrets. 0: read once at start.
  int reload_interval_s = 60;
};

// Credentials for grpc::ServerBuilder::AddListeningPort. INVALID_ARGUMENT for an
// inconsistent set (a key without a certificate, a CA without either), NOT_FOUND /
// PERMISSION_DENIED naming the file that cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerSecurity& security);

// A client's side. All empty: plain text, no token.
struct ChannelSecurity {
  std::string ca_file;    // set: TLS, the server's certificate verified against this CA
  std::string cert_file;  // client certificate (with key_file) for mutual TLS
  std::string key_file;
  // The name checked against the server's certificate instead of the target's host (e.g.
  // when dialing an IP). Empty: the target's host.
  std::string server_name;
  std::string auth_token;  // non-empty: sent with every call
  // As ServerSecurity::reload_interval_s, for the CA and the client certificate.
  int reload_interval_s = 60;
};

// Makes channels with the credentials and token of a ChannelSecurity.
// Copyable; thread-safe.
class ChannelMaker {
 public:
  // Plain text, no token.
  ChannelMaker();
  // Reads the files. Errors as MakeServerCredentials.
  static absl::StatusOr<ChannelMaker> Create(const ChannelSecurity& security);

  std::shared_ptr<grpc::Channel> Make(const std::string& target,
                                      grpc::ChannelArguments args = {}) const;
  bool tls() const { return tls_; }

 private:
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  std::string server_name_;
  std::string auth_token_;
  bool tls_ = false;
};

// Reads a token file: its content without surrounding whitespace. "" reads as no token.
// NOT_FOUND for a missing file, INVALID_ARGUMENT for an empty one or a token with spaces or
// control characters in it.
absl::StatusOr<std::string> ReadAuthTokenFile(const std::string& path);

// Reads a whole file (NOT_FOUND / PERMISSION_DENIED / INTERNAL naming it).
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// The server-side token check, used by every handler of the PS and master services (the
// health service stays open for probes).
class TokenAuthenticator {
 public:
  // An empty token lets every call through.
  explicit TokenAuthenticator(std::string token = "")
      : expected_("Bearer " + token), enabled_(!token.empty()) {}
  // OK, or UNAUTHENTICATED when the call's `authorization` metadata is missing or is not
  // "Bearer <token>". The comparison takes the same time wherever the values differ.
  absl::Status Check(const grpc::ServerContextBase& ctx) const;
  bool enabled() const { return enabled_; }

 private:
  const std::string expected_;
  const bool enabled_;
};

// Compares in time that depends on the lengths only, not on where the bytes differ.
bool ConstantTimeEquals(const std::string& a, const std::string& b);

}  // namespace ps
