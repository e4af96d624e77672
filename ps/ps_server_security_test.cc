// A pod with a shared token and TLS, in process: every PS RPC (the raw Pull/Push included)
// refuses a call without the token or with a wrong one with UNAUTHENTICATED, accepts the
// right one, and leaves grpc.health.v1 open; readiness is the health of kReadinessService.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/ps_client.h"
#include "common/rpc/test_certs.h"
#include "proto/ps.grpc.pb.h"
#include "ps/ps_server.h"

namespace ps {
namespace {

class PsServerSecurityTest : public testing::Test {
 protected:
  void SetUp() override {
    if (!certs_.ok()) GTEST_SKIP() << "openssl is missing";
    PsServerOptions o;
    o.host = "127.0.0.1";
    o.security.cert_file = certs_.file("server.crt");
    o.security.key_file = certs_.file("server.key");
    o.security.auth_token = "s3cret";
    o.start_ready = false;
    auto server = PsServer::Start(o, ShardOwnership::All(64));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
  }

  ClientOptions Options(const std::string& token) const {
    ClientOptions o;
    o.servers = {address_};
    o.num_vshards = 64;
    o.max_attempts = 2;
    o.deadline_ms = 3000;
    o.security.ca_file = certs_.file("ca.crt");
    o.security.auth_token = token;
    return o;
  }

  // grpc.health.v1 Check of `service` (an empty name: the server) without a token; the
  // serialized answer's last byte is the status (1 SERVING, 2 NOT_SERVING).
  int Health(const std::string& service) {
    auto channels = ChannelMaker::Create(Options("").security);
    grpc::GenericStub stub(channels->Make(address_));
    std::string req;
    if (!service.empty()) req = std::string("\x0a", 1) + char(service.size()) + service;
    grpc::Slice slice(req);
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
    grpc::Status status;
    absl::Notification done;
    stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                   [&](grpc::Status s) {
                     status = s;
                     done.Notify();
                   });
    done.WaitForNotification();
    if (!status.ok()) return -status.error_code();
    std::vector<grpc::Slice> slices;
    (void)response.Dump(&slices);
    std::string bytes;
    for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    return bytes.empty() ? 0 : bytes.back();
  }

  TestCerts certs_;
  std::unique_ptr<PsServer> server_;
  std::string address_;
};

TEST_F(PsServerSecurityTest, TokenIsRequiredOnEveryRpc) {
  TableSpec spec;
  spec.set_name("t");
  spec.set_dim(2);
  std::vector<int64_t> ids = {1, 2};
  std::vector<float> values(4, 1.0f);
  for (const std::string& token : {std::string(""), std::string("wrong")}) {
    auto client = PsClient::Connect(Options(token));
    // Connect itself asks the pod (Describe): refused.
    ASSERT_EQ(client.status().code(), absl::StatusCode::kUnauthenticated) << client.status();
  }
  auto client = PsClient::Connect(Options("s3cret"));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->CreateTable(spec).ok());
  EXPECT_TRUE((*client)->Push({{"t", ids, values.data()}}).ok());
  EXPECT_TRUE((*client)->Pull({{"t", ids, values.data()}}).ok());

  // Calls with a wrong token, straight through a stub.
  auto channels = ChannelMaker::Create(Options("wrong").security);
  auto stub = ParameterServer::NewStub(channels->Make(address_));
  // The raw Pull and Push, and the migration RPCs (MigrateImport runs on its own pool).
  for (const char* method :
       {"/ps.ParameterServer/Pull", "/ps.ParameterServer/Push", "/ps.ParameterServer/MigrateImport",
        "/ps.ParameterServer/MigrateBegin", "/ps.ParameterServer/MigrateExport",
        "/ps.ParameterServer/ApplyAssignment"}) {
    grpc::GenericStub raw(channels->Make(address_));
    grpc::Slice empty("");
    grpc::ByteBuffer req(&empty, 1), resp;
    grpc::ClientContext ctx;
    grpc::Status status;
    absl::Notification done;
    raw.UnaryCall(&ctx, method, grpc::StubOptions(), &req, &resp, [&](grpc::Status s) {
      status = s;
      done.Notify();
    });
    done.WaitForNotification();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << method;
  }
  grpc::ClientContext ctx;
  StatsResponse stats;
  EXPECT_EQ(stub->Stats(&ctx, StatsRequest(), &stats).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(PsServerSecurityTest, HealthStaysOpenAndReportsReadiness) {
  EXPECT_EQ(Health(""), 1);                 // SERVING: the process is up
  EXPECT_EQ(Health(kReadinessService), 2);  // NOT_SERVING: started not ready
  server_->SetReady(true);
  EXPECT_EQ(Health(kReadinessService), 1);
  server_->Shutdown(0);
}

}  // namespace
}  // namespace ps
