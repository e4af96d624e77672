// A real full disk: a durable ps-server on a small tmpfs takes pushes until its log write
// fails with ENOSPC. That push and every later one must fail with UNAVAILABLE (never
// acknowledged), also once space is back; after SIGKILL and a restart on the same
// directory the pod holds exactly the acknowledged pushes (SGD with lr 1 from zeros and
// gradients that are multiples of 1/8, so every expected value is exact), and the refused
// push, retried with its key, applies once. Needs mount(2) (root); skipped otherwise.
#include <grpcpp/grpcpp.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/ps.grpc.pb.h"
#include "tests/process.h"

#ifndef PS_SERVER_BINARY
#error "PS_SERVER_BINARY must be defined"
#endif

namespace ps {
namespace {

using integration::ChildProcess;

constexpr uint32_t kDim = 16;
constexpr int kIdsPerPush = 512;

std::string Pack(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

class DiskFullTest : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    mnt_ = tmp_.path() + "/mnt";
    std::filesystem::create_directories(mnt_);
    if (::mount("tmpfs", mnt_.c_str(), "tmpfs", 0, "size=48m") != 0) {
      GTEST_SKIP() << "cannot mount a tmpfs (" << std::strerror(errno) << "); needs root";
    }
    mounted_ = true;
  }
  void TearDown() override {
    if (pod_ != nullptr) {
      pod_->Stop();
      if (HasFailure()) std::fprintf(stderr, "%s\n", integration::FileTail(Log()).c_str());
    }
    pod_.reset();
    if (mounted_) ::umount2(mnt_.c_str(), MNT_DETACH);
  }

  std::string Log() const { return tmp_.path() + "/ps.log"; }

  void StartPod() {
    pod_.reset();
    const std::string port_file = tmp_.path() + "/ps.port";
    unlink(port_file.c_str());
    auto child = ChildProcess::Start(
        {PS_SERVER_BINARY, "--host=127.0.0.1", "--port=0", "--port_file=" + port_file,
         "--num_vshards=16", "--data_dir=" + mnt_ + "/db", "--shutdown_grace_ms=1000"},
        Log());
    ASSERT_TRUE(child.ok()) << child.status();
    pod_ = std::move(child).value();
    auto port = integration::WaitForPortFile(port_file, *pod_, absl::Seconds(30));
    ASSERT_TRUE(port.ok()) << port.status();
    stub_ = ParameterServer::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", *port), grpc::InsecureChannelCredentials()));
  }

  grpc::Status Push(const PushRequest& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    PushResponse resp;
    return stub_->Push(&ctx, req, &resp);
  }

  integration::TempDir tmp_{"disk_full_test"};
  std::string mnt_;
  bool mounted_ = false;
  std::unique_ptr<ChildProcess> pod_;
  std::unique_ptr<ParameterServer::Stub> stub_;
};

TEST_F(DiskFullTest, FullDiskRefusesPushesAndRestartRecoversAcknowledged) {
  StartPod();
  if (HasFatalFailure()) return;
  {
    grpc::ClientContext ctx;
    CreateTableRequest req;
    req.mutable_spec()->set_name("t");
    req.mutable_spec()->set_dim(kDim);
    req.mutable_spec()->mutable_optimizer()->set_kind(OptimizerSpec::SGD);
    req.mutable_spec()->mutable_optimizer()->set_learning_rate(1);
    CreateTableResponse resp;
    ASSERT_TRUE(stub_->CreateTable(&ctx, req, &resp).ok());
  }
  // Leave a few MB free, so the log fills the disk within a few hundred pushes.
  const std::string filler = mnt_ + "/filler";
  {
    const auto space = std::filesystem::space(mnt_);
    const uint64_t fill = space.available > (6u << 20) ? space.available - (6u << 20) : 0;
    std::ofstream f(filler, std::ios::binary);
    std::vector<char> mb(1 << 20, 'x');
    for (uint64_t done = 0; done + mb.size() <= fill; done += mb.size())
      f.write(mb.data(), mb.size());
  }

  std::mt19937 rng(1);
  std::map<int64_t, std::vector<float>> expected;  // acknowledged pushes only
  auto make_push = [&](uint64_t seq) {
    PushRequest req;
    req.mutable_key()->set_worker_id(7);
    req.mutable_key()->set_incarnation(1);
    req.mutable_key()->set_sequence(seq);
    TableGrads* t = req.add_tables();
    t->set_table("t");
    std::vector<int64_t> ids(kIdsPerPush);
    std::vector<float> grads(ids.size() * kDim);
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<int64_t>(rng() % 4096) * 31 + i % 2;
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    grads.resize(ids.size() * kDim);
    for (float& g : grads) g = static_cast<float>(static_cast<int>(rng() % 33) - 16) / 8;
    t->set_ids(Pack(ids.data(), ids.size() * 8));
    t->set_grads(Pack(grads.data(), grads.size() * 4));
    return req;
  };
  auto apply = [&](const PushRequest& req) {
    const TableGrads& t = req.tables(0);
    const size_t n = t.ids().size() / 8;
    const int64_t* ids = reinterpret_cast<const int64_t*>(t.ids().data());
    const float* g = reinterpret_cast<const float*>(t.grads().data());
    for (size_t i = 0; i < n; ++i) {
      auto& row = expected[ids[i]];
      row.resize(kDim, 0.f);
      for (uint32_t j = 0; j < kDim; ++j) row[j] -= g[i * kDim + j];
    }
  };

  PushRequest refused;
  uint64_t seq = 1;
  int acknowledged = 0;
  for (; seq < 5000; ++seq) {
    PushRequest req = make_push(seq);
    grpc::Status s = Push(req);
    if (s.ok()) {
      apply(req);
      ++acknowledged;
      continue;
    }
    ASSERT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
    refused = req;
    break;
  }
  ASSERT_GT(acknowledged, 0);
  ASSERT_TRUE(refused.has_key()) << "the disk never filled";
  // Every later push fails too, also once space is back.
  EXPECT_EQ(Push(make_push(++seq)).error_code(), grpc::StatusCode::UNAVAILABLE);
  std::filesystem::remove(filler);
  EXPECT_EQ(Push(make_push(++seq)).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Push(refused).error_code(), grpc::StatusCode::UNAVAILABLE);

  pod_->Kill();
  StartPod();
  if (HasFatalFailure()) return;
  auto pull_all = [&](std::vector<int64_t>* ids) {
    ids->clear();
    for (const auto& [id, row] : expected) ids->push_back(id);
    PullRequest req;
    TableIds* t = req.add_tables();
    t->set_table("t");
    t->set_ids(Pack(ids->data(), ids->size() * 8));
    grpc::ClientContext ctx;
    PullResponse resp;
    EXPECT_TRUE(stub_->Pull(&ctx, req, &resp).ok());
    std::vector<float> out(ids->size() * kDim);
    if (resp.tables_size() == 1 && resp.tables(0).values().size() == out.size() * 4) {
      std::memcpy(out.data(), resp.tables(0).values().data(), out.size() * 4);
    }
    return out;
  };
  auto check = [&](const char* when) {
    std::vector<int64_t> ids;
    const std::vector<float> got = pull_all(&ids);
    size_t bad = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      for (uint32_t j = 0; j < kDim; ++j) bad += got[i * kDim + j] != expected[ids[i]][j];
    }
    EXPECT_EQ(bad, 0u) << when << ": " << bad << " values differ over " << ids.size() << " rows";
  };
  check("after restart");
  // The refused push was never acknowledged: retried with its key, it applies once.
  ASSERT_TRUE(Push(refused).ok());
  apply(refused);
  ASSERT_TRUE(Push(refused).ok());  // a duplicate now
  check("after the retry");
  std::fprintf(stderr, "acknowledged %d pushes before the disk was full\n", acknowledged);
}

}  // namespace
}  // namespace ps
