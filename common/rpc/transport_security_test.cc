#include "common/rpc/transport_security.h"

#include <gmock/gmock.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/health_check_service_interface.h>
#include <gtest/gtest.h>

#include <fstream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/rpc/test_certs.h"

namespace ps {
namespace {

// Answers every call of an unknown method with UNIMPLEMENTED: a callback service, so that
// the server (whose only real service is grpc.health.v1) runs on callbacks.
class NothingElse final : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    class Reactor final : public grpc::ServerGenericBidiReactor {
     public:
      Reactor() { Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "")); }
      void OnDone() override { delete this; }
    };
    return new Reactor;
  }
};

// A server with the default health service, under the given credentials.
class HealthServer {
 public:
  explicit HealthServer(const ServerSecurity& security) {
    auto creds = MakeServerCredentials(security);
    EXPECT_TRUE(creds.ok()) << creds.status();
    if (!creds.ok()) return;
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", *creds, &port_);
    builder.RegisterCallbackGenericService(&nothing_else_);
    server_ = builder.BuildAndStart();
    EXPECT_GT(port_, 0) << "the test server did not start";
  }
  ~HealthServer() {
    if (server_) server_->Shutdown();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int port_ = 0;
  NothingElse nothing_else_;
  std::unique_ptr<grpc::Server> server_;
};

// grpc.health.v1.Health/Check over a channel made by `maker` (an empty request).
grpc::Status Check(const ChannelMaker& maker, const std::string& address) {
  grpc::GenericStub stub(maker.Make(address));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  grpc::Slice empty("");  // an empty HealthCheckRequest
  grpc::ByteBuffer req(&empty, 1), resp;
  grpc::Status result;
  absl::Notification done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &req, &resp,
                 [&](grpc::Status s) {
                   result = s;
                   done.Notify();
                 });
  done.WaitForNotification();
  return result;
}

ChannelMaker Maker(const ChannelSecurity& s) {
  auto m = ChannelMaker::Create(s);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *m : ChannelMaker();
}

class TlsTest : public ::testing::Test {
 protected:
  // One set of certificates for the suite (each set costs seconds of key generation); the
  // tests that replace or remove files use copies of their own.
  static void SetUpTestSuite() { shared_certs_ = std::make_unique<TestCerts>(); }
  static void TearDownTestSuite() { shared_certs_.reset(); }
  void SetUp() override {
    if (!certs_.ok()) GTEST_SKIP() << "openssl is missing: cannot make test certificates";
  }
  ServerSecurity Server(bool mutual) const {
    ServerSecurity s;
    s.cert_file = certs_.file("server.crt");
    s.key_file = certs_.file("server.key");
    if (mutual) s.ca_file = certs_.file("ca.crt");
    return s;
  }
  ChannelSecurity Client(bool with_cert) const {
    ChannelSecurity s;
    s.ca_file = certs_.file("ca.crt");
    if (with_cert) {
      s.cert_file = certs_.file("client.crt");
      s.key_file = certs_.file("client.key");
    }
    return s;
  }
  static inline std::unique_ptr<TestCerts> shared_certs_;
  const TestCerts& certs_ = *shared_certs_;
};

TEST_F(TlsTest, PlainTextClientIsRefusedByATlsServer) {
  HealthServer server(Server(false));
  EXPECT_EQ(Check(ChannelMaker(), server.address()).error_code(), grpc::StatusCode::UNAVAILABLE);
  // The same server answers a TLS client (so the refusal above was the TLS handshake).
  EXPECT_TRUE(Check(Maker(Client(false)), server.address()).ok());
}

TEST_F(TlsTest, TlsClientIsAccepted) {
  HealthServer server(Server(false));
  grpc::Status s = Check(Maker(Client(false)), server.address());
  EXPECT_TRUE(s.ok()) << s.error_message();
  // By name too (the certificate names localhost).
  s = Check(Maker(Client(false)), server.address().replace(0, 9, "localhost"));
  EXPECT_TRUE(s.ok()) << s.error_message();
}

TEST_F(TlsTest, ServerOfAnotherCaIsRefused) {
  HealthServer server(Server(false));
  ChannelSecurity c;
  c.ca_file = certs_.file("other/ca.crt");
  EXPECT_EQ(Check(Maker(c), server.address()).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, ServerNameMustMatchTheCertificate) {
  HealthServer server(Server(false));
  ChannelSecurity c = Client(false);
  c.server_name = "not-the-server.example";
  EXPECT_EQ(Check(Maker(c), server.address()).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, MutualTlsRequiresAClientCertificateOfTheCa) {
  HealthServer server(Server(true));
  EXPECT_EQ(Check(Maker(Client(false)), server.address()).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  ChannelSecurity rogue = Client(false);
  rogue.cert_file = certs_.file("other/client.crt");
  rogue.key_file = certs_.file("other/client.key");
  EXPECT_EQ(Check(Maker(rogue), server.address()).error_code(), grpc::StatusCode::UNAVAILABLE);
  grpc::Status s = Check(Maker(Client(true)), server.address());
  EXPECT_TRUE(s.ok()) << s.error_message();
}

// Copies `from` over `to` the way the kubelet updates a mounted Secret: atomically.
void Replace(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  std::ofstream(to + ".new", std::ios::binary) << in.rdbuf();
  ASSERT_EQ(std::rename((to + ".new").c_str(), to.c_str()), 0);
}

TEST_F(TlsTest, ReplacedCertificatesTakeEffectWithoutARestart) {
  const std::string cert = certs_.file("live.crt"), key = certs_.file("live.key");
  Replace(certs_.file("server.crt"), cert);
  Replace(certs_.file("server.key"), key);
  ServerSecurity security;
  security.cert_file = cert;
  security.key_file = key;
  security.reload_interval_s = 1;
  HealthServer server(security);
  ChannelSecurity old_ca = Client(false), new_ca;
  new_ca.ca_file = certs_.file("other/ca.crt");
  // Dialed by IP, checked against the name the certificates carry.
  old_ca.server_name = new_ca.server_name = "localhost";
  EXPECT_TRUE(Check(Maker(old_ca), server.address()).ok());
  EXPECT_EQ(Check(Maker(new_ca), server.address()).error_code(), grpc::StatusCode::UNAVAILABLE);

  // A certificate of the other CA replaces it: new connections get it within the interval.
  Replace(certs_.file("other/server.key"), key);
  Replace(certs_.file("other/server.crt"), cert);
  bool switched = false;
  for (int i = 0; i < 50 && !switched; ++i) {
    absl::SleepFor(absl::Milliseconds(200));
    switched = Check(Maker(new_ca), server.address()).ok();
  }
  EXPECT_TRUE(switched) << "the server kept its old certificate";
  EXPECT_EQ(Check(Maker(old_ca), server.address()).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, VanishedTlsFilesFailClosedInsteadOfFallingBackToPlainText) {
  // A copy of the CA that can vanish, and a plain-text server that would answer anyone.
  const std::string ca = certs_.file("vanishing-ca.crt");
  Replace(certs_.file("ca.crt"), ca);
  HealthServer tls_server(Server(false));
  HealthServer plain_server(ServerSecurity{});
  ChannelSecurity security = Client(false);
  security.ca_file = ca;
  security.auth_token = "secret";
  ChannelMaker present = ChannelMaker::CreateOrFailClosed(security);
  EXPECT_TRUE(present.error().ok()) << present.error();
  EXPECT_TRUE(Check(present, tls_server.address()).ok());

  ASSERT_EQ(std::remove(ca.c_str()), 0);
  ChannelMaker vanished = ChannelMaker::CreateOrFailClosed(security);
  EXPECT_EQ(vanished.error().code(), absl::StatusCode::kUnavailable);
  // Every call fails, naming the file, against the plain-text server too: nothing went
  // out in plain text (a downgraded channel would have been answered OK there).
  for (const std::string& address : {plain_server.address(), tls_server.address()}) {
    grpc::Status s = Check(vanished, address);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << address;
    EXPECT_THAT(s.error_message(), ::testing::HasSubstr("vanishing-ca.crt")) << address;
  }
  // The completion-queue API (the client's raw calls) too.
  auto channel = vanished.Make(plain_server.address());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  grpc::Slice empty("");
  grpc::ByteBuffer req(&empty, 1), resp;
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", req, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&resp, &status, reinterpret_cast<void*>(1));
  void* tag;
  bool ok;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("vanishing-ca.crt"));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  // The channel never connects anywhere.
  EXPECT_FALSE(
      channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::milliseconds(200)));
}

TEST(TransportSecurityTest, InconsistentOptionsAreRefused) {
  ServerSecurity s;
  s.key_file = "/x.key";
  EXPECT_EQ(MakeServerCredentials(s).status().code(), absl::StatusCode::kInvalidArgument);
  s = ServerSecurity();
  s.ca_file = "/ca.crt";
  EXPECT_EQ(MakeServerCredentials(s).status().code(), absl::StatusCode::kInvalidArgument);
  s = ServerSecurity();
  s.cert_file = "/nonexistent/server.crt";
  s.key_file = "/nonexistent/server.key";
  auto missing = MakeServerCredentials(s);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), ::testing::HasSubstr("server.crt"));
  ChannelSecurity c;
  c.cert_file = "/client.crt";
  c.key_file = "/client.key";
  EXPECT_EQ(ChannelMaker::Create(c).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MakeServerCredentials(ServerSecurity()).ok());
  EXPECT_FALSE(ChannelMaker::Create(ChannelSecurity())->tls());
}

TEST(TransportSecurityTest, ReadsAndTrimsTokenFiles) {
  const std::string path = ::testing::TempDir() + "/token";
  std::ofstream(path) << "  s3cr3t-token\n";
  EXPECT_EQ(*ReadAuthTokenFile(path), "s3cr3t-token");
  std::ofstream(path) << " \n";
  EXPECT_EQ(ReadAuthTokenFile(path).status().code(), absl::StatusCode::kInvalidArgument);
  std::ofstream(path) << "two words";
  EXPECT_EQ(ReadAuthTokenFile(path).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadAuthTokenFile(path + ".missing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*ReadAuthTokenFile(""), "");
}

TEST(TransportSecurityTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("Bearer abc", "Bearer abc"));
  EXPECT_FALSE(ConstantTimeEquals("Bearer abc", "Bearer abd"));
  EXPECT_FALSE(ConstantTimeEquals("Bearer abc", "Bearer ab"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

}  // namespace
}  // namespace ps
