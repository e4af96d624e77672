// The role table and the Authorizer, through a real in-process server on loopback: a
// generic service answers every method with what Authorizer::Authorize says of the call.
#include "common/rpc/authorizer.h"

#include <gmock/gmock.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/test_certs.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

constexpr char kPull[] = "/ps.ParameterServer/Pull";
constexpr char kAssign[] = "/ps.ParameterServer/ApplyAssignment";
constexpr char kImportRows[] = "/ps.PodTransfer/ImportRows";
constexpr char kDrain[] = "/ps.Master/Drain";
constexpr char kGetTask[] = "/ps.Master/GetTask";
constexpr char kRegisterPod[] = "/ps.Master/RegisterPod";

TEST(AuthPolicyTest, WorkersGetTheDataPathAndTasksAdminsTheControl) {
  for (const char* m : {kPull, "/ps.ParameterServer/Push", "/ps.ParameterServer/PullDense",
                        "/ps.ParameterServer/PushDense", "/ps.ParameterServer/Describe",
                        "/ps.ParameterServer/Stats", "/ps.ParameterServer/CreateTable",
                        "/ps.Master/RegisterWorker", "/ps.Master/WorkerHeartbeat", kGetTask,
                        "/ps.Master/ReportTask", "/ps.Master/LeaveWorker", "/ps.Master/GetShardMap",
                        "/ps.Master/ListTables", "/ps.Master/Status", "/ps.Master/CreateJob"}) {
    EXPECT_EQ(RequiredRole(m), Role::kWorker) << m;
    EXPECT_TRUE(IsListedMethod(m)) << m;
  }
  for (const char* m :
       {kAssign, "/ps.ParameterServer/MigrateBegin", "/ps.ParameterServer/MigrateExport",
        "/ps.ParameterServer/MigrateImport", "/ps.ParameterServer/Checkpoint",
        "/ps.PodTransfer/Export", kImportRows, kDrain, "/ps.Master/Rebalance",
        "/ps.Master/Checkpoint", "/ps.Master/DeleteJob", kRegisterPod, "/ps.Master/PodHeartbeat",
        "/ps.Master/LeavePod"}) {
    EXPECT_EQ(RequiredRole(m), Role::kAdmin) << m;
    EXPECT_TRUE(IsListedMethod(m)) << m;
  }
  // Not listed: closed to workers.
  EXPECT_FALSE(IsListedMethod("/ps.Master/DropEverything"));
  EXPECT_EQ(RequiredRole("/ps.Master/DropEverything"), Role::kAdmin);
  EXPECT_EQ(RequiredRole(""), Role::kAdmin);
  EXPECT_EQ(RoleName(Role::kAdmin), "admin");
}

// Answers every call with the Authorizer's verdict on it.
class Verdicts final : public grpc::CallbackGenericService {
 public:
  explicit Verdicts(const Authorizer* auth) : auth_(auth) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    class Reactor final : public grpc::ServerGenericBidiReactor {
     public:
      explicit Reactor(grpc::Status s) { Finish(s); }
      void OnDone() override { delete this; }
    };
    return new Reactor(ToGrpcStatus(auth_->Authorize(*ctx, ctx->method())));
  }

 private:
  const Authorizer* const auth_;
};

class Server {
 public:
  explicit Server(const ServerSecurity& security) : auth_(security), verdicts_(&auth_) {
    auto creds = MakeServerCredentials(security);
    EXPECT_TRUE(creds.ok()) << creds.status();
    if (!creds.ok()) return;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", *creds, &port_);
    builder.RegisterCallbackGenericService(&verdicts_);
    server_ = builder.BuildAndStart();
    EXPECT_GT(port_, 0);
  }
  ~Server() {
    if (server_) server_->Shutdown();
  }
  std::string address() const { return absl::StrCat("localhost:", port_); }
  const Authorizer& auth() const { return auth_; }

 private:
  Authorizer auth_;
  Verdicts verdicts_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

grpc::Status Call(const Server& server, const ChannelSecurity& security,
                  const std::string& method) {
  auto maker = ChannelMaker::Create(security);
  EXPECT_TRUE(maker.ok()) << maker.status();
  grpc::GenericStub stub(maker->Make(server.address()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice empty("");
  grpc::ByteBuffer req(&empty, 1), resp;
  grpc::Status result;
  absl::Notification done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &req, &resp, [&](grpc::Status s) {
    result = s;
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

ChannelSecurity Token(const std::string& token) {
  ChannelSecurity s;
  s.auth_token = token;
  return s;
}

TEST(AuthorizerTest, NothingConfiguredLetsEveryCallThrough) {
  Server server(ServerSecurity{});
  EXPECT_TRUE(server.auth().open());
  for (const char* m : {kPull, kAssign, kImportRows, kDrain, "/ps.Master/Unknown"}) {
    EXPECT_TRUE(Call(server, Token(""), m).ok()) << m;
  }
}

TEST(AuthorizerTest, WorkerTokenIsRefusedForControlCallsAndTheAdminTokenPasses) {
  ServerSecurity security;
  security.auth_token = "worker-secret";
  security.admin_token = "admin-secret";
  Server server(security);
  for (const char* m : {kPull, kGetTask}) {
    EXPECT_TRUE(Call(server, Token("worker-secret"), m).ok()) << m;
    EXPECT_TRUE(Call(server, Token("admin-secret"), m).ok()) << m;  // admin may work too
    EXPECT_EQ(Call(server, Token(""), m).error_code(), grpc::StatusCode::UNAUTHENTICATED) << m;
    EXPECT_EQ(Call(server, Token("wrong"), m).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  for (const char* m : {kAssign, kImportRows, kDrain, kRegisterPod, "/ps.Master/NotListedYet"}) {
    grpc::Status s = Call(server, Token("worker-secret"), m);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << m;
    EXPECT_THAT(s.error_message(), HasSubstr(m));
    EXPECT_THAT(s.error_message(), HasSubstr("admin"));
    EXPECT_TRUE(Call(server, Token("admin-secret"), m).ok()) << m;
    EXPECT_EQ(Call(server, Token(""), m).error_code(), grpc::StatusCode::UNAUTHENTICATED) << m;
    // A token that is neither (a prefix of the admin one, say) is no credential at all.
    EXPECT_EQ(Call(server, Token("admin-secre"), m).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
}

TEST(AuthorizerTest, OneTokenAloneGuardsEverythingAsBeforeRoles) {
  ServerSecurity security;
  security.auth_token = "shared";
  Server server(security);
  EXPECT_FALSE(server.auth().admin_configured());
  for (const char* m : {kPull, kAssign, kDrain}) {
    EXPECT_TRUE(Call(server, Token("shared"), m).ok()) << m;
    EXPECT_EQ(Call(server, Token(""), m).error_code(), grpc::StatusCode::UNAUTHENTICATED) << m;
  }
}

TEST(AuthorizerTest, AnAdminTokenAloneGuardsControlAndLeavesWorkerCallsOpen) {
  ServerSecurity security;
  security.admin_token = "admin-secret";
  Server server(security);
  EXPECT_TRUE(Call(server, Token(""), kPull).ok());
  EXPECT_EQ(Call(server, Token(""), kAssign).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Call(server, Token("admin-secret"), kAssign).ok());
}

TEST(AuthorizerTest, AnAdminClientCertificateHoldsTheAdminRoleUnderMutualTls) {
  TestCerts certs;
  if (!certs.ok()) GTEST_SKIP() << "openssl is missing";
  ServerSecurity security;
  security.cert_file = certs.file("server.crt");
  security.key_file = certs.file("server.key");
  security.ca_file = certs.file("ca.crt");
  security.auth_token = "worker-secret";
  security.admin_identities = {"ps-admin"};  // the common name of make-certs.sh's admin.crt
  Server server(security);
  auto as = [&](const std::string& who, const std::string& token) {
    ChannelSecurity c;
    c.ca_file = certs.file("ca.crt");
    c.cert_file = certs.file(who + ".crt");
    c.key_file = certs.file(who + ".key");
    c.auth_token = token;
    return c;
  };
  EXPECT_TRUE(Call(server, as("admin", ""), kAssign).ok());
  EXPECT_TRUE(Call(server, as("admin", "worker-secret"), kAssign).ok());  // both: admin
  EXPECT_TRUE(Call(server, as("admin", ""), kPull).ok());
  EXPECT_TRUE(Call(server, as("client", "worker-secret"), kPull).ok());
  EXPECT_EQ(Call(server, as("client", "worker-secret"), kAssign).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Call(server, as("client", ""), kAssign).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // Identities mean nothing without client certificates: refused at start.
  ServerSecurity no_ca = security;
  no_ca.ca_file.clear();
  EXPECT_EQ(MakeServerCredentials(no_ca).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps
