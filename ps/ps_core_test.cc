#include "ps/ps_core.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/routing/hash.h"
#include "gtest/gtest.h"
#include "proto/packed.h"

namespace ps {
namespace {

class PsCoreTest : public testing::Test {
 protected:
  PsCoreTest() : core_(PsCoreOptions(), ShardOwnership::All(16)) {
    CreateTableRequest req;
    req.mutable_spec()->set_name("emb");
    req.mutable_spec()->set_dim(2);
    req.mutable_spec()->mutable_optimizer()->set_learning_rate(1.0f);
    CreateTableResponse resp;
    EXPECT_TRUE(core_.CreateTable(req, &resp).ok());
  }

  PushRequest MakePush(std::vector<int64_t> ids, std::vector<float> grads, uint64_t seq = 0) {
    PushRequest req;
    TableGrads* t = req.add_tables();
    t->set_table("emb");
    t->set_ids(Pack<int64_t>(ids));
    t->set_grads(Pack<float>(grads));
    if (seq > 0) {
      req.mutable_key()->set_worker_id(7);
      req.mutable_key()->set_incarnation(1);
      req.mutable_key()->set_sequence(seq);
    }
    return req;
  }

  std::vector<float> PullRows(std::vector<int64_t> ids) {
    PullRequest req;
    TableIds* t = req.add_tables();
    t->set_table("emb");
    t->set_ids(Pack<int64_t>(ids));
    PullResponse resp;
    EXPECT_TRUE(core_.Pull(req, &resp).ok());
    const std::string& v = resp.tables(0).values();
    std::vector<float> out(v.size() / 4);
    std::memcpy(out.data(), v.data(), v.size());
    return out;
  }

  PsCore core_;
};

TEST_F(PsCoreTest, PushThenPull) {
  PushResponse resp;
  ASSERT_TRUE(core_.Push(MakePush({1, 2}, {1, 2, 3, 4}), &resp).ok());
  EXPECT_EQ(PullRows({2, 1}), (std::vector<float>{-3, -4, -1, -2}));
}

TEST_F(PsCoreTest, RetriedKeyedPushAppliesOnce) {
  PushResponse r1, r2;
  ASSERT_TRUE(core_.Push(MakePush({1}, {1, 1}, 5), &r1).ok());
  ASSERT_TRUE(core_.Push(MakePush({1}, {1, 1}, 5), &r2).ok());
  EXPECT_FALSE(r1.duplicate());
  EXPECT_TRUE(r2.duplicate());
  EXPECT_EQ(PullRows({1}), (std::vector<float>{-1, -1}));
  StatsResponse stats;
  ASSERT_TRUE(core_.Stats(StatsRequest(), &stats).ok());
  EXPECT_EQ(stats.duplicate_pushes(), 1u);
}

TEST_F(PsCoreTest, BadPushesAreRefusedWholeWithPreciseCodes) {
  struct Bad {
    PushRequest req;
    absl::StatusCode code;
    std::string fragment;
  };
  std::vector<Bad> bad;
  bad.push_back({PushRequest(), absl::StatusCode::kInvalidArgument, "no tables"});
  PushRequest unknown = MakePush({1}, {1, 1});
  unknown.mutable_tables(0)->set_table("nope");
  bad.push_back({unknown, absl::StatusCode::kNotFound, "'nope'"});
  bad.push_back({MakePush({1, 2}, {1, 1, 1}), absl::StatusCode::kInvalidArgument,
                 "3 gradient floats for 2 ids of dim 2"});
  bad.push_back({MakePush({}, {}), absl::StatusCode::kInvalidArgument, "no ids"});
  PushRequest ragged = MakePush({1}, {1, 1});
  ragged.mutable_tables(0)->mutable_ids()->push_back('x');
  bad.push_back({ragged, absl::StatusCode::kInvalidArgument, "not a multiple of 8"});
  // The second table entry has a NaN: the first must not be applied either.
  PushRequest nan = MakePush({1}, {1, 1});
  TableGrads* second = nan.add_tables();
  second->set_table("emb");
  std::vector<int64_t> ids = {3};
  std::vector<float> grads = {0, std::numeric_limits<float>::quiet_NaN()};
  second->set_ids(Pack<int64_t>(ids));
  second->set_grads(Pack<float>(grads));
  bad.push_back({nan, absl::StatusCode::kInvalidArgument, "non-finite gradient (nan) for id 3"});
  PushRequest inf = MakePush({4}, {std::numeric_limits<float>::infinity(), 0});
  bad.push_back({inf, absl::StatusCode::kInvalidArgument, "non-finite"});
  PushRequest lr = MakePush({1}, {1, 1});
  lr.mutable_tables(0)->set_learning_rate(-1);
  bad.push_back({lr, absl::StatusCode::kInvalidArgument, "learning_rate -1"});
  for (const Bad& b : bad) {
    PushResponse resp;
    absl::Status s = core_.Push(b.req, &resp);
    EXPECT_EQ(s.code(), b.code) << s;
    EXPECT_NE(s.message().find(b.fragment), std::string::npos) << s;
  }
  EXPECT_EQ(core_.store().FindTable("emb")->rows(), 0u);
  StatsResponse stats;
  ASSERT_TRUE(core_.Stats(StatsRequest(), &stats).ok());
  EXPECT_EQ(stats.rejected_nonfinite(), 2u);
}

// The first non-finite gradient is named exactly, wherever it falls among the 16-float
// blocks the check tests at once.
TEST_F(PsCoreTest, NonFiniteGradientIsLocatedExactly) {
  std::vector<int64_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back(100 + i);
  for (size_t bad : {size_t{0}, size_t{15}, size_t{16}, size_t{37}, size_t{64}, size_t{79}}) {
    std::vector<float> grads(ids.size() * 2, 0.5f);
    grads[bad] = -std::numeric_limits<float>::infinity();
    if (bad + 3 < grads.size()) grads[bad + 3] = std::numeric_limits<float>::quiet_NaN();
    PushResponse resp;
    absl::Status s = core_.Push(MakePush(ids, grads), &resp);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(absl::StrCat("(-inf) for id ", 100 + bad / 2, " element ", bad % 2)),
              std::string::npos)
        << s;
  }
  EXPECT_EQ(core_.store().FindTable("emb")->rows(), 0u);
}

TEST_F(PsCoreTest, OversizedBatchIsRefused) {
  PsCoreOptions o;
  o.max_batch_rows = 4;
  PsCore small(o, ShardOwnership::All(16));
  CreateTableRequest req;
  req.mutable_spec()->set_name("emb");
  req.mutable_spec()->set_dim(2);
  CreateTableResponse cr;
  ASSERT_TRUE(small.CreateTable(req, &cr).ok());
  PushResponse resp;
  absl::Status s = small.Push(MakePush({1, 2, 3, 4, 5}, std::vector<float>(10, 0)), &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("max_batch_rows = 4"), std::string::npos) << s;
}

TEST_F(PsCoreTest, IdsOfVShardsNotOwnedAreRefused) {
  // Own only the vshards of the first of two static pods.
  core_.SetOwnership(*ShardOwnership::Create(16, 3, {0, 1, 2, 3, 4, 5, 6, 7}));
  int64_t foreign = 0;
  while (VShardOf(RouteHash(NameHash("emb"), foreign), 16) < 8) ++foreign;
  PushResponse resp;
  absl::Status s = core_.Push(MakePush({foreign}, {1, 1}), &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("at epoch 3"), std::string::npos) << s;
  PullRequest pull;
  pull.add_tables()->set_table("emb");
  pull.mutable_tables(0)->set_ids(Pack<int64_t>(std::vector<int64_t>{foreign}));
  PullResponse presp;
  EXPECT_EQ(core_.Pull(pull, &presp).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(PsCoreTest, DuplicateTableWithAnotherSpec) {
  CreateTableRequest req;
  req.mutable_spec()->set_name("emb");
  req.mutable_spec()->set_dim(3);
  CreateTableResponse resp;
  EXPECT_EQ(core_.CreateTable(req, &resp).code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(PsCoreTest, DenseRoundTrip) {
  CreateDenseRequest req;
  req.mutable_spec()->set_name("bias");
  req.mutable_spec()->add_shape(3);
  req.mutable_spec()->mutable_optimizer()->set_learning_rate(1.0f);
  CreateDenseResponse cr;
  ASSERT_TRUE(core_.CreateDense(req, &cr).ok());
  DensePushRequest push;
  DenseGrads* g = push.add_tensors();
  g->set_name("bias");
  g->set_grads(Pack<float>(std::vector<float>{1, 2, 3}));
  PushResponse presp;
  ASSERT_TRUE(core_.PushDense(push, &presp).ok());
  g->set_grads(Pack<float>(std::vector<float>{1, 2}));
  EXPECT_EQ(core_.PushDense(push, &presp).code(), absl::StatusCode::kInvalidArgument);
  DensePullRequest pull;
  pull.add_names("bias");
  DensePullResponse resp;
  ASSERT_TRUE(core_.PullDense(pull, &resp).ok());
  std::vector<float> out(3);
  std::memcpy(out.data(), resp.tensors(0).values().data(), 12);
  EXPECT_EQ(out, (std::vector<float>{-1, -2, -3}));
  pull.add_names("missing");
  EXPECT_EQ(core_.PullDense(pull, &resp).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ps
