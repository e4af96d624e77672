#include "common/rpc/transport_security.h"

#include <glog/logging.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <grpcpp/support/client_interceptor.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ps {
namespace {

// Adds the bearer token to every call's initial metadata.
class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* value) : value_(value) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", *value_});
    }
    methods->Proceed();
  }

 private:
  const std::string* const value_;
};

class TokenInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::string token) : value_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(&value_);  // owned by gRPC's call (its API)
  }

 private:
  const std::string value_;
};

// Fails every call of its channel with `status` without sending anything: it takes the
// call over (hijacks it) before its first byte and answers it itself.
class FailingInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit FailingInterceptor(const grpc::Status* status) : status_(status) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    const bool first =
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_INITIAL_METADATA);
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_RECV_MESSAGE)) {
      methods->FailHijackedRecvMessage();
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_RECV_STATUS)) {
      *methods->GetRecvStatus() = *status_;
    }
    if (first) {
      methods->Hijack();
    } else {
      methods->Proceed();
    }
  }

 private:
  const grpc::Status* const status_;
};

class FailingInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit FailingInterceptorFactory(const absl::Status& status)
      : status_(grpc::StatusCode::UNAVAILABLE, std::string(status.message())) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new FailingInterceptor(&status_);  // owned by gRPC's call (its API)
  }

 private:
  const grpc::Status status_;
};

absl::Status CheckPairs(const std::string& what, const std::string& cert, const std::string& key) {
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a certificate and its key go together; got certificate '", cert,
                     "' and key '", key, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string why = absl::StrCat("cannot read ", path, ": ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(why);
    if (err == EACCES) return absl::PermissionDeniedError(why);
    return absl::InternalError(why);
  }
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

absl::StatusOr<std::string> ReadAuthTokenFile(const std::string& path) {
  if (path.empty()) return std::string();
  absl::StatusOr<std::string> content = ReadFileToString(path);
  if (!content.ok()) return content.status();
  std::string token(absl::StripAsciiWhitespace(*content));
  if (token.empty())
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is empty"));
  for (char c : token) {
    if (c <= ' ' || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token file ", path, " holds whitespace or control characters inside the token"));
    }
  }
  return token;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerSecurity& security) {
  if (absl::Status s = CheckPairs("server TLS", security.cert_file, security.key_file); !s.ok()) {
    return s;
  }
  if (!security.admin_identities.empty() && security.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "admin identities are client certificates' names: they need mutual TLS (a client CA)");
  }
  if (security.cert_file.empty()) {
    if (!security.ca_file.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("a client CA (", security.ca_file,
                                                     ") needs a server certificate and key too"));
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions options(
      security.ca_file.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                               : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  absl::StatusOr<std::string> cert = ReadFileToString(security.cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFileToString(security.key_file);
  if (!key.ok()) return key.status();
  pair.cert_chain = *std::move(cert);
  pair.private_key = *std::move(key);
  options.pem_key_cert_pairs.push_back(std::move(pair));
  if (!security.ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadFileToString(security.ca_file);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
  }
  if (security.reload_interval_s <= 0) return grpc::SslServerCredentials(options);
  // The files were readable just now (errors name them at start); from here gRPC reads
  // them again every interval and uses what it last read successfully.
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      security.key_file, security.cert_file, security.ca_file, security.reload_interval_s);
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  if (!security.ca_file.empty()) tls.watch_root_certs();
  tls.set_cert_request_type(options.client_certificate_request);
  return grpc::experimental::TlsServerCredentials(tls);
}

ChannelMaker::ChannelMaker() : credentials_(grpc::InsecureChannelCredentials()) {}

absl::StatusOr<ChannelMaker> ChannelMaker::Create(const ChannelSecurity& security) {
  if (absl::Status s = CheckPairs("client TLS", security.cert_file, security.key_file); !s.ok()) {
    return s;
  }
  ChannelMaker maker;
  maker.auth_token_ = security.auth_token;
  maker.server_name_ = security.server_name;
  if (security.ca_file.empty()) {
    if (!security.cert_file.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("a client certificate (", security.cert_file,
                                                     ") needs the CA of the servers too"));
    }
    return maker;
  }
  grpc::SslCredentialsOptions options;
  absl::StatusOr<std::string> ca = ReadFileToString(security.ca_file);
  if (!ca.ok()) return ca.status();
  options.pem_root_certs = *std::move(ca);
  if (!security.cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadFileToString(security.cert_file);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFileToString(security.key_file);
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *std::move(cert);
    options.pem_private_key = *std::move(key);
  }
  if (security.reload_interval_s <= 0) {
    maker.credentials_ = grpc::SslCredentials(options);
  } else {
    auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        security.key_file, security.cert_file, security.ca_file, security.reload_interval_s);
    grpc::experimental::TlsChannelCredentialsOptions tls;
    tls.set_certificate_provider(provider);
    tls.watch_root_certs();
    if (!security.cert_file.empty()) tls.watch_identity_key_cert_pairs();
    tls.set_verify_server_certs(true);
    tls.set_check_call_host(true);
    maker.credentials_ = grpc::experimental::TlsCredentials(tls);
  }
  maker.tls_ = true;
  return maker;
}

ChannelMaker ChannelMaker::CreateOrFailClosed(const ChannelSecurity& security) {
  absl::StatusOr<ChannelMaker> maker = Create(security);
  if (maker.ok()) return *std::move(maker);
  ChannelMaker failing;
  failing.error_ = absl::UnavailableError(
      absl::StrCat("TLS is configured but its files cannot be read, so no channel is made (never "
                   "plain text instead): ",
                   maker.status().message()));
  LOG(ERROR) << failing.error_.message();
  return failing;
}

std::shared_ptr<grpc::Channel> ChannelMaker::Make(const std::string& target,
                                                  grpc::ChannelArguments args) const {
  if (!error_.ok()) {
    // Never connects: the address is no socket, and every call is answered by the
    // interceptor before it is sent.
    std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> creators;
    creators.push_back(std::make_unique<FailingInterceptorFactory>(error_));
    return grpc::experimental::CreateCustomChannelWithInterceptors(
        "unix:/dev/null/ps-fail-closed", grpc::InsecureChannelCredentials(), args,
        std::move(creators));
  }
  if (tls_ && !server_name_.empty()) args.SetSslTargetNameOverride(server_name_);
  if (auth_token_.empty()) return grpc::CreateCustomChannel(target, credentials_, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> creators;
  creators.push_back(std::make_unique<TokenInterceptorFactory>(auth_token_));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, credentials_, args,
                                                                 std::move(creators));
}

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  // Every byte of the longer input is visited whatever the contents.
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

}  // namespace ps
