#include "client/test_fakes.h"

#include <cstring>
#include <random>
#include <tuple>
#include <utility>

namespace ps::testing_fakes {

std::unique_ptr<grpc::Server> Serve(std::initializer_list<grpc::Service*> services, int* port) {
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  for (grpc::Service* s : services) b.RegisterService(s);
  return b.BuildAndStart();
}

void FakeMaster::Set(ShardMapResponse map) {
  absl::MutexLock lock(&mu_);
  map_ = std::move(map);
}

grpc::Status FakeMaster::GetShardMap(grpc::ServerContext*, const GetShardMapRequest*,
                                     ShardMapResponse* resp) {
  absl::MutexLock lock(&mu_);
  *resp = map_;
  return grpc::Status::OK;
}

TableSpec CounterTable(const std::string& name, uint32_t dim) {
  TableSpec spec;
  spec.set_name(name);
  spec.set_dim(dim);
  spec.mutable_initializer()->set_kind(InitializerSpec::ZEROS);
  spec.mutable_optimizer()->set_kind(OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_learning_rate(1.0f);
  return spec;
}

DenseSpec CounterDense(const std::string& name, int64_t numel) {
  DenseSpec spec;
  spec.set_name(name);
  spec.add_shape(numel);
  spec.mutable_initializer()->set_kind(InitializerSpec::ZEROS);
  spec.mutable_optimizer()->set_kind(OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_learning_rate(1.0f);
  return spec;
}

TableSpec AdamSpec() {
  TableSpec t;
  t.set_name("emb/adam");
  t.set_dim(8);
  t.mutable_initializer()->set_kind(InitializerSpec::NORMAL);
  t.mutable_initializer()->set_stddev(0.1f);
  t.mutable_initializer()->set_seed(3);
  t.mutable_optimizer()->set_kind(OptimizerSpec::ADAM);
  t.mutable_optimizer()->set_learning_rate(0.01f);
  return t;
}

TableSpec FtrlSpec() {
  TableSpec t;
  t.set_name("ftrl");
  t.set_dim(4);
  t.mutable_optimizer()->set_kind(OptimizerSpec::FTRL);
  t.mutable_optimizer()->set_learning_rate(0.05f);
  t.mutable_optimizer()->set_ftrl_l1(0.001f);
  return t;
}

DenseSpec DenseW() {
  DenseSpec d;
  d.set_name("mlp/w");
  d.add_shape(3);
  d.add_shape(5);
  d.mutable_initializer()->set_kind(InitializerSpec::UNIFORM);
  d.mutable_initializer()->set_low(-1);
  d.mutable_initializer()->set_high(1);
  d.mutable_optimizer()->set_kind(OptimizerSpec::ADAM);
  return d;
}

void CreateTransferTables(PsClient& c) {
  ASSERT_TRUE(c.CreateTable(AdamSpec()).ok());
  ASSERT_TRUE(c.CreateTable(FtrlSpec()).ok());
  ASSERT_TRUE(c.CreateDense(DenseW()).ok());
}

void TrainTransferTables(PsClient& c, const std::vector<int64_t>& all, uint32_t seed, int rounds) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g;
  for (int r = 0; r < rounds; ++r) {
    std::vector<int64_t> ids;
    for (int64_t id : all) {
      if (rng() % 3 != 0) ids.push_back(id);  // rows get different step counts
    }
    std::vector<float> ga(ids.size() * 8), gf(ids.size() * 4), gd(15);
    for (float& x : ga) x = g(rng);
    for (float& x : gf) x = g(rng);
    for (float& x : gd) x = g(rng);
    ASSERT_TRUE(c.Push({{"emb/adam", ids, ga.data()}, {"ftrl", ids, gf.data()}}).ok());
    ASSERT_TRUE(c.PushDense({"mlp/w"}, {gd.data()}).ok());
  }
}

TransferSnapshot PullTransferTables(PsClient& c, const std::vector<int64_t>& ids) {
  TransferSnapshot s;
  s.adam.resize(ids.size() * 8);
  s.ftrl.resize(ids.size() * 4);
  s.dense.resize(15);
  EXPECT_TRUE(c.Pull({{"emb/adam", ids, s.adam.data()}, {"ftrl", ids, s.ftrl.data()}}).ok());
  EXPECT_TRUE(c.PullDense({"mlp/w"}, {s.dense.data()}).ok());
  return s;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

testing::AssertionResult BitEqual(const TransferSnapshot& a, const TransferSnapshot& b) {
  for (const auto& [name, x, y] :
       {std::tuple{"emb/adam", &a.adam, &b.adam}, std::tuple{"ftrl", &a.ftrl, &b.ftrl},
        std::tuple{"mlp/w", &a.dense, &b.dense}}) {
    if (!BitEqual(*x, *y)) return testing::AssertionFailure() << name << " differs";
  }
  return testing::AssertionSuccess();
}

void DescribeAll(uint32_t num_vshards, const TableSpec& table, const DenseSpec& dense,
                 DescribeResponse* resp) {
  *resp->add_tables()->mutable_spec() = table;
  if (!dense.name().empty()) *resp->add_dense()->mutable_spec() = dense;
  resp->set_num_vshards(num_vshards);
  resp->set_epoch(1);
  resp->set_owned_vshards(std::string((num_vshards + 7) / 8, '\xff'));
}

}  // namespace ps::testing_fakes
