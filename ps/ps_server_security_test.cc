// A pod's security, in process:
// - with a shared token and TLS, every PS RPC (the raw Pull/Push included) refuses a call
//   without the token or with a wrong one with UNAUTHENTICATED, accepts the right one, and
//   leaves grpc.health.v1 open; readiness is the health of kReadinessService;
// - with a worker and an admin token, pod control (ApplyAssignment, Migrate*, Checkpoint,
//   Export, ImportRows) refuses the worker token with PERMISSION_DENIED and takes the admin
//   one; an absurd epoch is refused; checkpoint and export paths stay under their roots;
// - every RPC of the services is in the role table;
// - a client whose TLS files vanished fails its calls instead of talking plain text.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/pod.h"
#include "client/ps_client.h"
#include "common/rpc/auth_policy.h"
#include "common/rpc/test_certs.h"
#include "proto/master.grpc.pb.h"
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

// ---- Roles, epochs and paths.

namespace fs = std::filesystem;

class PodControlTest : public testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ps_server_security_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    tmp_ = fs::canonical(tmpl).string();
    PsServerOptions o;
    o.host = "127.0.0.1";
    o.security.auth_token = "worker-token";
    o.security.admin_token = "admin-token";
    o.core.storage.db.dir = tmp_ + "/data";
    o.checkpoint_root = tmp_ + "/checkpoints";
    o.export_root = tmp_ + "/exports";
    auto server = PsServer::Start(o, ShardOwnership::All(64));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    address_ = absl::StrCat("127.0.0.1:", server_->port());

    // A table with rows, pushed with the worker token.
    ClientOptions c;
    c.servers = {address_};
    c.num_vshards = 64;
    c.security.auth_token = "worker-token";
    auto client = PsClient::Connect(c);
    ASSERT_TRUE(client.ok()) << client.status();
    TableSpec spec;
    spec.set_name("t");
    spec.set_dim(2);
    spec.mutable_optimizer()->set_kind(OptimizerSpec::SGD);  // no slots
    ASSERT_TRUE((*client)->CreateTable(spec).ok());
    std::vector<float> grads(ids_.size() * 2, 1.0f);
    ASSERT_TRUE((*client)->Push({{"t", ids_, grads.data()}}).ok());
    ASSERT_TRUE((*client)->Pull({{"t", ids_, rows_.data()}}).ok());
  }
  void TearDown() override {
    server_.reset();
    fs::remove_all(tmp_);
  }

  std::shared_ptr<grpc::Channel> Channel(const std::string& token) const {
    ChannelSecurity security;
    security.auth_token = token;
    return ChannelMaker::Create(security)->Make(address_);
  }
  // Calls `method` of service `Service` with `token`.
  template <typename Service, typename Stub, typename Req, typename Resp>
  grpc::Status Call(const std::string& token,
                    grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*),
                    const Req& req, Resp* resp = nullptr) const {
    auto stub = Service::NewStub(Channel(token));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    Resp ignored;
    return ((*stub).*method)(&ctx, req, resp == nullptr ? &ignored : resp);
  }
  grpc::Status Assign(const std::string& token, uint64_t epoch, std::vector<uint32_t> owned) {
    Assignment a;
    a.set_epoch(epoch);
    a.set_num_vshards(64);
    for (uint32_t v : owned) a.add_owned(v);
    return Call<ParameterServer>(token, &ParameterServer::Stub::ApplyAssignment, a);
  }
  grpc::Status Checkpoint(const std::string& token, const std::string& dir) {
    PodCheckpointRequest req;
    req.set_dir(dir);
    return Call<ParameterServer>(token, &ParameterServer::Stub::Checkpoint, req);
  }
  grpc::Status Export(const std::string& token, const std::string& dir) {
    ExportRequest req;
    req.set_dir(dir);
    return Call<PodTransfer>(token, &PodTransfer::Stub::Export, req);
  }
  // The rows as the pod serves them now, through the worker token.
  std::vector<float> Rows() {
    std::vector<float> rows(rows_.size(), -1.0f);
    ClientOptions c;
    c.servers = {address_};
    c.num_vshards = 64;
    c.security.auth_token = "worker-token";
    c.max_attempts = 1;
    auto client = PsClient::Connect(c);
    EXPECT_TRUE(client.ok()) << client.status();
    if (client.ok()) EXPECT_TRUE((*client)->Pull({{"t", ids_, rows.data()}}).ok());
    return rows;
  }
  static std::vector<uint32_t> AllVShards() {
    std::vector<uint32_t> all(64);
    for (uint32_t v = 0; v < 64; ++v) all[v] = v;
    return all;
  }

  std::string tmp_;
  std::unique_ptr<PsServer> server_;
  std::string address_;
  std::vector<int64_t> ids_ = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> rows_ = std::vector<float>(16);
};

TEST_F(PodControlTest, TheWorkerTokenIsRefusedForPodControl) {
  const grpc::StatusCode denied = grpc::StatusCode::PERMISSION_DENIED;
  // The attack of the issue: a worker detaching the pod (epoch 2^64-1, no vshards).
  EXPECT_EQ(Assign("worker-token", std::numeric_limits<uint64_t>::max(), {}).error_code(), denied);
  EXPECT_EQ(Assign("worker-token", 2, {}).error_code(), denied);
  EXPECT_EQ(Checkpoint("worker-token", "c1").error_code(), denied);
  EXPECT_EQ(Export("worker-token", "e1").error_code(), denied);
  EXPECT_EQ(Call<PodTransfer>("worker-token", &PodTransfer::Stub::ImportRows, ImportRowsRequest())
                .error_code(),
            denied);
  EXPECT_EQ(Call<ParameterServer>("worker-token", &ParameterServer::Stub::MigrateBegin,
                                  MigrateBeginRequest())
                .error_code(),
            denied);
  EXPECT_EQ(Call<ParameterServer>("worker-token", &ParameterServer::Stub::MigrateExport,
                                  MigrateExportRequest())
                .error_code(),
            denied);
  EXPECT_EQ(Call<ParameterServer>("worker-token", &ParameterServer::Stub::MigrateImport,
                                  MigrateImportRequest())
                .error_code(),
            denied);
  // Nothing happened: the pod owns all its vshards, serves its rows, wrote nothing.
  EXPECT_EQ(server_->core().ownership()->owned_count(), 64u);
  EXPECT_EQ(Rows(), rows_);
  EXPECT_FALSE(fs::exists(tmp_ + "/checkpoints/c1"));
  EXPECT_FALSE(fs::exists(tmp_ + "/exports/e1"));
  // Without any token: UNAUTHENTICATED.
  EXPECT_EQ(Assign("", 2, {}).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(PodControlTest, TheAdminTokenControlsThePodAndMayWorkToo) {
  EXPECT_TRUE(Assign("admin-token", 5, AllVShards()).ok());
  EXPECT_EQ(server_->core().ownership()->epoch(), 5u);
  grpc::Status s = Checkpoint("admin-token", "c1");
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(fs::exists(tmp_ + "/checkpoints/c1/CURRENT"));
  s = Export("admin-token", tmp_ + "/exports/e1");
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(fs::exists(tmp_ + "/exports/e1/manifest.json"));
  // One row of table t (SGD, dim 2): id 100 at step 1.
  ImportRowsRequest import;
  TableRows* rows = import.add_tables();
  rows->set_table("t");
  const int64_t id = 100;
  const uint64_t step = 1;
  const float values[2] = {0.5f, 0.25f};
  rows->set_ids(std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
  rows->set_steps(std::string(reinterpret_cast<const char*>(&step), sizeof(step)));
  rows->set_values(std::string(reinterpret_cast<const char*>(values), sizeof(values)));
  ImportRowsResponse imported;
  s = Call<PodTransfer>("admin-token", &PodTransfer::Stub::ImportRows, import, &imported);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(imported.installed(), 1u);
  StatsResponse stats;
  EXPECT_TRUE(
      Call<ParameterServer>("admin-token", &ParameterServer::Stub::Stats, StatsRequest(), &stats)
          .ok());
}

TEST_F(PodControlTest, AnAbsurdEpochIsRefusedAndTheRowsStay) {
  ASSERT_TRUE(Assign("admin-token", 7, AllVShards()).ok());
  grpc::Status s = Assign("admin-token", std::numeric_limits<uint64_t>::max(), {});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("18446744073709551615"));
  EXPECT_EQ(Assign("admin-token", 7 + (uint64_t{1} << 32) + 1, {}).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(server_->core().ownership()->epoch(), 7u);
  EXPECT_EQ(server_->core().ownership()->owned_count(), 64u);
  EXPECT_EQ(Rows(), rows_);
  // A real next epoch still applies.
  EXPECT_TRUE(Assign("admin-token", 8 + (uint64_t{1} << 32) - 1, AllVShards()).ok());
}

TEST_F(PodControlTest, CheckpointAndExportPathsStayUnderTheirRoots) {
  fs::create_directories(tmp_ + "/elsewhere");
  fs::create_directories(tmp_ + "/exports");
  fs::create_symlink(tmp_ + "/elsewhere", tmp_ + "/exports/link");
  const grpc::StatusCode bad = grpc::StatusCode::INVALID_ARGUMENT;
  for (const std::string& dir : {tmp_ + "/elsewhere/c", std::string("../elsewhere/c"),
                                 tmp_ + "/data/c", tmp_ + "/checkpoints/../elsewhere/c",
                                 std::string("/etc/ps-checkpoint"), tmp_ + "/checkpoints"}) {
    EXPECT_EQ(Checkpoint("admin-token", dir).error_code(), bad) << dir;
  }
  for (const std::string& dir : {tmp_ + "/elsewhere/e", std::string("../data"), std::string("link"),
                                 std::string("link/e"), tmp_ + "/checkpoints/e"}) {
    EXPECT_EQ(Export("admin-token", dir).error_code(), bad) << dir;
  }
  EXPECT_TRUE(fs::is_empty(tmp_ + "/elsewhere"));
  // Under the roots, relative or absolute, it works.
  EXPECT_TRUE(Checkpoint("admin-token", tmp_ + "/checkpoints/ckpt-1/ps-0").ok());
  EXPECT_TRUE(fs::exists(tmp_ + "/checkpoints/ckpt-1/ps-0/CURRENT"));
  EXPECT_TRUE(Export("admin-token", "e2").ok());
  EXPECT_TRUE(fs::exists(tmp_ + "/exports/e2/manifest.json"));
}

TEST(PodWithoutRootsTest, PathTakingCallsAreRefused) {
  char tmpl[] = "/tmp/ps_server_security_test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  PsServerOptions o;
  o.host = "127.0.0.1";
  o.core.storage.db.dir = std::string(tmpl) + "/data";
  auto server = PsServer::Start(o, ShardOwnership::All(64));
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*server)->port()),
                                     grpc::InsecureChannelCredentials());
  grpc::ClientContext c1, c2;
  PodCheckpointRequest checkpoint;
  checkpoint.set_dir(std::string(tmpl) + "/c");
  PodCheckpointResponse cresp;
  grpc::Status s = ParameterServer::NewStub(channel)->Checkpoint(&c1, checkpoint, &cresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("--checkpoint_root"));
  ExportRequest exp;
  exp.set_dir(std::string(tmpl) + "/e");
  ExportResponse eresp;
  s = PodTransfer::NewStub(channel)->Export(&c2, exp, &eresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("--export_root"));
  server->reset();
  fs::remove_all(tmpl);
}

TEST(AuthPolicyCoverageTest, EveryMethodOfTheServicesIsInTheRoleTable) {
  for (const char* name : {ParameterServer::service_full_name(), PodTransfer::service_full_name(),
                           Master::service_full_name()}) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    ASSERT_NE(service, nullptr) << name;
    for (int i = 0; i < service->method_count(); ++i) {
      const std::string method =
          absl::StrCat("/", service->full_name(), "/", service->method(i)->name());
      EXPECT_TRUE(IsListedMethod(method))
          << method << " is not in common/rpc/auth_policy.cc: it needs the admin role until listed";
    }
  }
}

TEST(FailClosedTest, AClientWhoseTlsFilesVanishedRefusesPlainText) {
  // A plain-text pod that answers anyone: a downgraded channel would be served.
  PsServerOptions o;
  o.host = "127.0.0.1";
  auto server = PsServer::Start(o, ShardOwnership::All(64));
  ASSERT_TRUE(server.ok()) << server.status();
  ClientOptions options;
  options.servers = {absl::StrCat("127.0.0.1:", (*server)->port())};
  options.num_vshards = 64;
  options.security.ca_file = "/nonexistent/vanished-ca.crt";  // was there at Connect
  options.security.auth_token = "secret";
  // The client meets a pod (a new address after a map change) after the CA vanished.
  std::shared_ptr<internal::Pod> pod = internal::MakePod(options, "ps-0", options.servers[0]);
  ASSERT_FALSE(pod->stubs.empty());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  DescribeResponse resp;
  grpc::Status s = pod->stubs[0]->Describe(&ctx, DescribeRequest(), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("vanished-ca.crt"));
}

}  // namespace
}  // namespace ps
