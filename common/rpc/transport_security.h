// Transport security of every gRPC endpoint: TLS (and mutual TLS) from PEM files, and
// bearer tokens. One implementation for servers (ps-server, ps-master) and clients
// (PsClient, ps-admin, ps-transfer, the pods' master agent, the master's pod control,
// ps-bench). Which token a call needs is common/rpc/authorizer.h's business.
//
// A token travels as the metadata `authorization: Bearer <token>`. Send it only over
// TLS outside a trusted network: in plain text anyone on the path can read it.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ps {

// A server's side. All empty: plain text, every call allowed.
struct ServerSecurity {
  std::string cert_file;  // PEM certificate chain; set with key_file: TLS
  std::string key_file;   // PEM private key
  std::string ca_file;    // PEM CA bundle; set: clients must present a certificate it signed
  // The credentials of the two roles (common/rpc/authorizer.h says what each allows).
  std::string auth_token;   // the worker token (--auth_token_file)
  std::string admin_token;  // the admin token (--admin_token_file)
  // Under mutual TLS (ca_file set): a client certificate whose common name or a subject
  // alternative name is one of these holds the admin role, as the admin token does.
  std::vector<std::string> admin_identities;
  // The three files are read again this often, so replaced certificates (a renewed
  // Kubernetes Secret) take effect without a restart, for new connections. A minute
  // matches how fast the kubelet updates mounted Secrets. 0: read once at start.
  int reload_interval_s = 60;
};

// Credentials for grpc::ServerBuilder::AddListeningPort. INVALID_ARGUMENT for an
// inconsistent set (a key without a certificate, a CA without either, admin identities
// without a CA), NOT_FOUND / PERMISSION_DENIED naming the file that cannot be read.
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
  // As Create, but for callers that make channels long after start (a client meeting a
  // new pod) and have no one to return an error to: when the files cannot be read, the
  // maker's channels never connect and fail every call with UNAVAILABLE naming the file
  // (the error is logged). So a vanished CA or key never turns into a plain-text channel
  // without the token. Never build `Create(...).value_or(ChannelMaker())`: that downgrades.
  static ChannelMaker CreateOrFailClosed(const ChannelSecurity& security);

  // A channel to `target`. With a failed CreateOrFailClosed, a channel whose calls all
  // fail with error().
  std::shared_ptr<grpc::Channel> Make(const std::string& target,
                                      grpc::ChannelArguments args = {}) const;
  bool tls() const { return tls_; }
  // OK, or why this maker's channels fail every call (CreateOrFailClosed).
  const absl::Status& error() const { return error_; }

 private:
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  std::string server_name_;
  std::string auth_token_;
  bool tls_ = false;
  absl::Status error_;
};

// Reads a token file: its content without surrounding whitespace. "" reads as no token.
// NOT_FOUND for a missing file, INVALID_ARGUMENT for an empty one or a token with spaces or
// control characters in it.
absl::StatusOr<std::string> ReadAuthTokenFile(const std::string& path);

// Reads a whole file (NOT_FOUND / PERMISSION_DENIED / INTERNAL naming it).
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Compares in time that depends on the lengths only, not on where the bytes differ.
bool ConstantTimeEquals(const std::string& a, const std::string& b);

}  // namespace ps
