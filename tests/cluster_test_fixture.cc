#include "tests/cluster_test_fixture.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ps::integration {

std::string BinaryPath(const char* env, const char* built) {
  const char* v = std::getenv(env);
  return v != nullptr && *v != '\0' ? v : built;
}

void ClusterProcessTest::SetUp() { ASSERT_FALSE(tmp_.path().empty()) << "mkdtemp failed"; }

void ClusterProcessTest::TearDown() {
  for (auto& [name, child] : children_) {
    if (child == nullptr) continue;
    child->Stop(absl::Seconds(3));
    if (HasFailure()) {
      std::fprintf(stderr, "---- %s (%s):\n%s\n", name.c_str(), child->Describe().c_str(),
                   FileTail(child->log_path(), 6000).c_str());
    }
  }
}

std::string ClusterProcessTest::Path(const std::string& name) const {
  return absl::StrCat(tmp_.path(), "/", name);
}

absl::StatusOr<int> ClusterProcessTest::StartServer(const std::string& name,
                                                    std::vector<std::string> argv, int port) {
  children_[name].reset();
  return StartServerProcess(std::move(argv), port, Path(name + ".port"), Path(name + ".log"),
                            absl::Seconds(60), &children_[name]);
}

absl::Status ClusterProcessTest::StartMaster(const std::vector<std::string>& flags, int port) {
  std::vector<std::string> argv = {master_binary_, "--data_dir=" + Path("master-db"),
                                   "--shutdown_grace_ms=200"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  absl::StatusOr<int> started = StartServer("master", std::move(argv), port);
  if (!started.ok()) return started.status();
  master_port_ = *started;
  master_address_ = absl::StrCat("127.0.0.1:", *started);
  master_ =
      Master::NewStub(grpc::CreateChannel(master_address_, grpc::InsecureChannelCredentials()));
  return absl::OkStatus();
}

absl::StatusOr<int> ClusterProcessTest::StartPod(int i, const std::vector<std::string>& flags,
                                                 int port) {
  std::vector<std::string> argv = {server_binary_,
                                   "--master=" + master_address_,
                                   absl::StrCat("--pod_id=ps-", i),
                                   "--data_dir=" + Path(absl::StrCat("ps-", i, "-data")),
                                   "--durability=process",
                                   "--shutdown_grace_ms=200"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return StartServer(absl::StrCat("ps-", i), std::move(argv), port);
}

std::vector<std::string> ClusterProcessTest::MetricsFlags(const std::string& name) const {
  return {"--metrics_port=0", "--metrics_port_file=" + Path(name + ".mport")};
}

absl::StatusOr<int> ClusterProcessTest::MetricsPort(const std::string& name) {
  auto it = children_.find(name);
  if (it == children_.end() || it->second == nullptr) {
    return absl::NotFoundError(absl::StrCat("no process ", name));
  }
  return WaitForPortFile(Path(name + ".mport"), *it->second, absl::Seconds(60));
}

void ClusterProcessTest::Kill(const std::string& name) {
  auto it = children_.find(name);
  if (it != children_.end() && it->second != nullptr) it->second->Kill();
}

ShardMapResponse ClusterProcessTest::Map() {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  ShardMapResponse resp;
  grpc::Status s = master_->GetShardMap(&ctx, GetShardMapRequest(), &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp;
}

PodInfo::State ClusterProcessTest::StateOf(const std::string& pod) {
  const ShardMapResponse map = Map();
  for (const PodInfo& p : map.pods()) {
    if (p.pod_id() == pod) return p.state();
  }
  return PodInfo::UNKNOWN;
}

}  // namespace ps::integration
