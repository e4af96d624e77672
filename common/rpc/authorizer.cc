#include "common/rpc/authorizer.h"

#include <glog/logging.h>
#include <grpc/grpc_security_constants.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ps {
namespace {

std::string Bearer(const std::string& token) {
  return token.empty() ? std::string() : "Bearer " + token;
}

// The properties of a verified client certificate that name who holds it.
constexpr const char* kIdentityProperties[] = {
    GRPC_X509_CN_PROPERTY_NAME, GRPC_X509_SAN_PROPERTY_NAME, GRPC_PEER_DNS_PROPERTY_NAME,
    GRPC_PEER_URI_PROPERTY_NAME, GRPC_PEER_SPIFFE_ID_PROPERTY_NAME};

bool HasIdentity(const grpc::ServerContextBase& ctx, const std::vector<std::string>& wanted) {
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return false;
  for (const char* property : kIdentityProperties) {
    for (const grpc::string_ref& value : auth->FindPropertyValues(property)) {
      const absl::string_view v(value.data(), value.size());
      for (const std::string& w : wanted) {
        if (v == w) return true;
      }
    }
  }
  return false;
}

}  // namespace

Authorizer::Authorizer(const ServerSecurity& security)
    : worker_bearer_(Bearer(security.auth_token)),
      admin_bearer_(Bearer(security.admin_token)),
      admin_identities_(security.admin_identities),
      open_(worker_bearer_.empty() && admin_bearer_.empty() && admin_identities_.empty()),
      admin_configured_(!admin_bearer_.empty() || !admin_identities_.empty()) {}

Role Authorizer::RoleOf(const grpc::ServerContextBase& ctx) const {
  Role role = Role::kNone;
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it != md.end()) {
    const std::string presented(it->second.data(), it->second.size());
    // Both comparisons always run: the time taken does not tell which token is close.
    const bool admin = !admin_bearer_.empty() && ConstantTimeEquals(presented, admin_bearer_);
    const bool worker = !worker_bearer_.empty() && ConstantTimeEquals(presented, worker_bearer_);
    if (admin) return Role::kAdmin;
    if (worker) role = Role::kWorker;
  }
  // The certificate may raise it (a pod presents the worker token and its certificate).
  if (!admin_identities_.empty() && HasIdentity(ctx, admin_identities_)) return Role::kAdmin;
  return role;
}

absl::Status Authorizer::Authorize(const grpc::ServerContextBase& ctx,
                                   absl::string_view method) const {
  if (open_) return absl::OkStatus();
  Role need = RequiredRole(method);
  // Without an admin credential, the worker token guards everything (as before roles).
  if (!admin_configured_) need = Role::kWorker;
  if (need == Role::kWorker && worker_bearer_.empty()) return absl::OkStatus();
  const Role have = RoleOf(ctx);
  if (have >= need) return absl::OkStatus();
  absl::Status refused;
  if (have == Role::kNone) {
    const bool carried = ctx.client_metadata().count("authorization") > 0;
    refused = absl::UnauthenticatedError(
        absl::StrCat(method, " needs the ", RoleName(need), " credential; the call carries ",
                     carried ? "a wrong token" : "no 'authorization: Bearer <token>' metadata"));
  } else {
    refused = absl::PermissionDeniedError(
        absl::StrCat(method, " needs the admin credential (--admin_token_file",
                     admin_identities_.empty() ? "" : ", or an admin client certificate",
                     "); the call carries the ", RoleName(have), " token"));
  }
  LOG_EVERY_N(WARNING, 100) << "refused a call from " << ctx.peer() << ": " << refused
                            << " (the first and every 100th refusal are logged)";
  return refused;
}

void Authorizer::LogConfiguration(absl::string_view server, absl::string_view control_calls) const {
  if (open_) {
    LOG(WARNING) << server << ": no --auth_token_file, --admin_token_file or --admin_identities: "
                 << "every call is unauthenticated, " << control_calls
                 << " included: anyone who reaches the port can make them";
    return;
  }
  if (!admin_configured_) {
    LOG(WARNING) << server << ": no admin credential (--admin_token_file or --admin_identities): "
                 << "the worker token also allows " << control_calls
                 << ", so every worker can make them";
    return;
  }
  LOG(INFO) << server << ": " << control_calls << " need the admin credential ("
            << (admin_bearer_.empty() ? "" : "admin token")
            << (!admin_bearer_.empty() && !admin_identities_.empty() ? " or " : "")
            << (admin_identities_.empty()
                    ? ""
                    : "a client certificate of " + absl::StrJoin(admin_identities_, ", "))
            << "); worker calls "
            << (worker_bearer_.empty() ? "are open (no --auth_token_file)"
                                       : "need the worker or the admin credential");
}

}  // namespace ps
