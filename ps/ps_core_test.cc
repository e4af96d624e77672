#include "ps/ps_core.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/routing/hash.h"
#include "embedding/row_source.h"
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
  bad.push_back({nan, absl::StatusCode::kInvalidArgument, "non-finite gradient (nan) at id 3"});
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

// A pod behind the client's map (just started on an empty data dir, before its master told
// it the catalog) cannot tell an unknown table from one it was not told of yet: retryable.
TEST_F(PsCoreTest, UnknownTableUnderANewerMapIsRetryable) {
  PushRequest unknown = MakePush({1}, {1, 1});
  unknown.mutable_tables(0)->set_table("nope");
  PushResponse resp;
  EXPECT_EQ(core_.Push(unknown, &resp).code(), absl::StatusCode::kNotFound);
  unknown.set_epoch(core_.ownership()->epoch() + 1);
  absl::Status s = core_.Push(unknown, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("'nope'"), std::string::npos) << s;
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
    EXPECT_NE(s.message().find(absl::StrCat("(-inf) at id ", 100 + bad / 2, " element ", bad % 2)),
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

// A pod that does not know a table (it lost its disk and owns nothing yet) refuses ids of
// vshards it does not own as such, so the client re-routes them; a permanent NOT_FOUND
// failed a push whose other parts had applied (crash_test_lazy_start_r2).
TEST_F(PsCoreTest, UnknownTableIdsOfVShardsNotOwnedAreWrongShard) {
  core_.SetOwnership(*ShardOwnership::Create(16, 3, {0, 1, 2, 3, 4, 5, 6, 7}));
  int64_t foreign = 0;
  while (VShardOf(RouteHash(NameHash("nope"), foreign), 16) < 8) ++foreign;
  int64_t own = 0;
  while (VShardOf(RouteHash(NameHash("nope"), own), 16) >= 8) ++own;
  PushRequest unknown = MakePush({foreign}, {1, 1});
  unknown.mutable_tables(0)->set_table("nope");
  PushResponse resp;
  absl::Status s = core_.Push(unknown, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("'nope'"), std::string::npos) << s;
  unknown.mutable_tables(0)->set_ids(Pack<int64_t>(std::vector<int64_t>{own}));
  EXPECT_EQ(core_.Push(unknown, &resp).code(), absl::StatusCode::kNotFound);
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

CreateTableRequest TableRequest(const std::string& name, uint32_t dim, OptimizerSpec::Kind kind,
                                float lr) {
  CreateTableRequest req;
  req.mutable_spec()->set_name(name);
  req.mutable_spec()->set_dim(dim);
  req.mutable_spec()->mutable_optimizer()->set_kind(kind);
  req.mutable_spec()->mutable_optimizer()->set_learning_rate(lr);
  return req;
}

PushRequest PushTo(const std::string& table, std::vector<int64_t> ids, std::vector<float> grads) {
  PushRequest req;
  TableGrads* t = req.add_tables();
  t->set_table(table);
  t->set_ids(Pack<int64_t>(ids));
  t->set_grads(Pack<float>(grads));
  return req;
}

PullRequest PullOf(const std::string& table, std::vector<int64_t> ids) {
  PullRequest req;
  TableIds* t = req.add_tables();
  t->set_table(table);
  t->set_ids(Pack<int64_t>(ids));
  return req;
}

// Issue 15, item 3: FTRL with a gradient of 1e20 left its row NaN forever; Adagrad's
// accumulator went Inf and froze the row; SGD with learning_rate = 1e30 (accepted by
// CreateTable) gave -Inf. Now the table is refused at creation, and a push whose
// gradients could overflow an update is refused whole, counted, nothing applied.
TEST_F(PsCoreTest, UpdatesThatCouldOverflowAreRefusedWhole) {
  CreateTableResponse cr;
  absl::Status sgd = core_.CreateTable(TableRequest("sgd", 2, OptimizerSpec::SGD, 1e30f), &cr);
  EXPECT_EQ(sgd.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(sgd.message().find("learning_rate = 1e+30"), std::string::npos) << sgd;
  EXPECT_EQ(core_.store().FindTable("sgd"), nullptr);
  ASSERT_TRUE(core_.CreateTable(TableRequest("ftrl", 2, OptimizerSpec::FTRL, 0.05f), &cr).ok());
  ASSERT_TRUE(
      core_.CreateTable(TableRequest("adagrad", 2, OptimizerSpec::ADAGRAD, 0.1f), &cr).ok());

  PushResponse resp;
  ASSERT_TRUE(core_.Push(PushTo("ftrl", {1}, {0.5f, 0.5f}), &resp).ok());
  for (const char* table : {"ftrl", "adagrad"}) {
    // A good entry first, then the 1e20 gradient: neither is applied.
    PushRequest req = PushTo(table, {1, 2}, {0.5f, 0.5f, 0.25f, 0.25f});
    TableGrads* huge = req.add_tables();
    huge->set_table(table);
    huge->set_ids(Pack<int64_t>(std::vector<int64_t>{3}));
    huge->set_grads(Pack<float>(std::vector<float>{1e20f, 0}));
    absl::Status s = core_.Push(req, &resp);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << table;
    EXPECT_NE(s.message().find("gradient of 1e+20 at id 3 element 0, beyond +-1e+12"),
              std::string::npos)
        << s;
    EXPECT_NE(s.message().find("clip_value"), std::string::npos) << s;
  }
  EXPECT_EQ(core_.store().FindTable("adagrad")->rows(), 0u);
  EXPECT_EQ(core_.store().FindTable("ftrl")->rows(), 1u);  // the first push only
  core_.store().FindTable("ftrl")->Inspect(1, [](const RowView& r) { EXPECT_EQ(r.step, 1u); });
  // A push's own learning rate is held to the spec's range too.
  PushRequest lr = PushTo("adagrad", {1}, {1, 1});
  lr.mutable_tables(0)->set_learning_rate(1e30f);
  absl::Status s = core_.Push(lr, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("learning_rate 1e+30 for 'adagrad'"), std::string::npos) << s;
  EXPECT_EQ(core_.refusals().gradient_too_large, 2u);
  // The dense path too.
  CreateDenseRequest dreq;
  dreq.mutable_spec()->set_name("bias");
  dreq.mutable_spec()->add_shape(2);
  dreq.mutable_spec()->mutable_optimizer()->set_kind(OptimizerSpec::FTRL);
  CreateDenseResponse dresp;
  ASSERT_TRUE(core_.CreateDense(dreq, &dresp).ok());
  DensePushRequest dpush;
  dpush.add_tensors()->set_name("bias");
  dpush.mutable_tensors(0)->set_grads(Pack<float>(std::vector<float>{0, -1e20f}));
  s = core_.PushDense(dpush, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("gradient of -1e+20 at element 1"), std::string::npos) << s;
  EXPECT_EQ(core_.store().FindDense("bias")->step(), 0u);
  EXPECT_EQ(core_.refusals().gradient_too_large, 3u);
}

// A table that clips takes any finite gradient: the clipped one keeps the update finite.
TEST_F(PsCoreTest, ClippingTablesTakeLargeGradientsClipped) {
  CreateTableRequest req = TableRequest("clipped", 2, OptimizerSpec::SGD, 1.0f);
  req.mutable_spec()->set_clip_value(2.0f);
  CreateTableResponse cr;
  ASSERT_TRUE(core_.CreateTable(req, &cr).ok());
  PushResponse resp;
  ASSERT_TRUE(core_.Push(PushTo("clipped", {1}, {1e20f, -0.5f}), &resp).ok());
  PullResponse pulled;
  ASSERT_TRUE(core_.Pull(PullOf("clipped", {1}), &pulled).ok());
  std::vector<float> row(2);
  std::memcpy(row.data(), pulled.tables(0).values().data(), 8);
  EXPECT_EQ(row, (std::vector<float>{-2.0f, 0.5f}));  // zeros initializer, lr 1
  // NaN stays refused.
  EXPECT_EQ(core_.Push(PushTo("clipped", {1}, {std::nanf(""), 0}), &resp).code(),
            absl::StatusCode::kInvalidArgument);
  CreateDenseRequest dreq;
  dreq.mutable_spec()->set_name("w");
  dreq.mutable_spec()->add_shape(2);
  dreq.mutable_spec()->set_clip_norm(1.0f);
  dreq.mutable_spec()->mutable_optimizer()->set_learning_rate(1.0f);
  CreateDenseResponse dresp;
  ASSERT_TRUE(core_.CreateDense(dreq, &dresp).ok());
  DensePushRequest dpush;
  dpush.add_tensors()->set_name("w");
  dpush.mutable_tensors(0)->set_grads(Pack<float>(std::vector<float>{3e20f, 4e20f}));
  ASSERT_TRUE(core_.PushDense(dpush, &resp).ok());
  std::vector<float> w(2);
  core_.store().FindDense("w")->Pull(w.data());
  EXPECT_NEAR(w[0], -0.6f, 1e-6);
  EXPECT_NEAR(w[1], -0.8f, 1e-6);
}

// Issue 15, item 4: a 600-byte pull of 200k ids of a dim-1024 table made the pod build an
// 800 MB answer before the send limit refused it, and the failed pull had created 200,000
// rows. The answer's size is now checked first: RESOURCE_EXHAUSTED naming the limit, no
// row created, nothing allocated for it.
TEST_F(PsCoreTest, PullsAnsweringMoreThanOneMessageAreRefusedBeforeAnyRow) {
  PsCoreOptions o;
  o.max_message_bytes = 1 << 20;
  PsCore small(o, ShardOwnership::All(16));
  CreateTableResponse cr;
  ASSERT_TRUE(small.CreateTable(TableRequest("wide", 1024, OptimizerSpec::SGD, 1), &cr).ok());
  ASSERT_TRUE(small.CreateTable(TableRequest("narrow", 2, OptimizerSpec::SGD, 1), &cr).ok());
  std::vector<int64_t> ids(300);  // 300 rows of 4 KiB: 1.2 MB
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
  PullRequest req = PullOf("narrow", {1, 2, 3});
  *req.add_tables() = PullOf("wide", ids).tables(0);
  PullResponse resp;
  absl::Status s = small.Pull(req, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("more than this pod's largest message (1048576 bytes"),
            std::string::npos)
      << s;
  EXPECT_EQ(small.store().FindTable("wide")->rows(), 0u);
  EXPECT_EQ(small.store().FindTable("narrow")->rows(), 0u);
  EXPECT_EQ(resp.tables_size(), 0);
  EXPECT_EQ(small.refusals().answer_too_large, 1u);
  // 250 rows (1,024,000 bytes of values plus framing) fit.
  ids.resize(250);
  ASSERT_TRUE(small.Pull(PullOf("wide", ids), &resp).ok());
  EXPECT_EQ(small.store().FindTable("wide")->rows(), 250u);
}

// A table whose rows are read back from disk (memory budget, lazy start) may fail that
// read: a pull of several tables then creates no rows in any of them.
TEST_F(PsCoreTest, PullWhoseDiskReadFailsCreatesNoRows) {
  class FailingSource final : public RowSource {
   public:
    absl::Status Read(absl::Span<const int64_t>, size_t, float*, uint64_t*, bool*) override {
      return absl::UnavailableError("disk read failed");
    }
  } failing;
  CreateTableResponse cr;
  ASSERT_TRUE(core_.CreateTable(TableRequest("cold", 2, OptimizerSpec::SGD, 1), &cr).ok());
  core_.store().FindTable("cold")->SetRowSource(&failing);
  PullRequest req = PullOf("emb", {1, 2, 3});
  *req.add_tables() = PullOf("cold", {4, 5}).tables(0);
  PullResponse resp;
  EXPECT_EQ(core_.Pull(req, &resp).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(core_.store().FindTable("emb")->rows(), 0u);
  EXPECT_EQ(core_.store().FindTable("cold")->rows(), 0u);
}

// Issue 15, item 4: a dense pull naming a 4 MB tensor 200 times made the pod build an
// 800 MB answer. Repeated names are refused, and so is an answer over the limit.
TEST_F(PsCoreTest, DensePullsAreBoundedAndNameEachTensorOnce) {
  PsCoreOptions o;
  o.max_message_bytes = 8 << 20;
  PsCore small(o, ShardOwnership::All(16));
  auto dense = [](const std::string& name, int64_t numel) {
    CreateDenseRequest req;
    req.mutable_spec()->set_name(name);
    req.mutable_spec()->add_shape(numel);
    return req;
  };
  CreateDenseResponse cr;
  ASSERT_TRUE(small.CreateDense(dense("a", 512 << 10), &cr).ok());  // 2 MiB
  ASSERT_TRUE(small.CreateDense(dense("b", 512 << 10), &cr).ok());
  DensePullRequest twice;
  twice.add_names("a");
  twice.add_names("b");
  twice.add_names("a");
  DensePullResponse resp;
  absl::Status s = small.PullDense(twice, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("names tensor 'a' more than once"), std::string::npos) << s;
  // A tensor whose state (weights, no slots for SGD) would not fit one message is refused
  // at creation: 8 MiB less the margin for a move's first chunk.
  s = small.CreateDense(dense("huge", 1 << 20), &cr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--max_message_mb"), std::string::npos) << s;
  CreateDenseRequest adam = dense("adam", 300 << 10);  // 1.2 MB, 3.6 MB with its slots
  adam.mutable_spec()->mutable_optimizer()->set_kind(OptimizerSpec::ADAM);
  s = small.CreateDense(adam, &cr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  ASSERT_TRUE(small.CreateDense(dense("c", 512 << 10), &cr).ok());
  DensePullRequest all;
  all.add_names("a");
  all.add_names("b");
  all.add_names("c");
  ASSERT_TRUE(small.PullDense(all, &resp).ok());  // 6 MiB
  CreateDenseResponse more;
  ASSERT_TRUE(small.CreateDense(dense("d", 512 << 10), &more).ok());
  all.add_names("d");  // 8 MiB and framing
  resp.Clear();
  s = small.PullDense(all, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("8388608 bytes"), std::string::npos) << s;
  EXPECT_EQ(resp.tensors_size(), 0);
}

TEST_F(PsCoreTest, DescribeAndTableCountAreBounded) {
  PsCoreOptions o;
  o.max_tables = 3;
  PsCore small(o, ShardOwnership::All(16));
  CreateTableResponse cr;
  for (const char* name : {"a", "b", "c"}) {
    ASSERT_TRUE(small.CreateTable(TableRequest(name, 2, OptimizerSpec::SGD, 1), &cr).ok());
  }
  absl::Status s = small.CreateTable(TableRequest("d", 2, OptimizerSpec::SGD, 1), &cr);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("max_tables = 3"), std::string::npos) << s;
  // Creating an existing table again is still idempotent.
  EXPECT_TRUE(small.CreateTable(TableRequest("a", 2, OptimizerSpec::SGD, 1), &cr).ok());
  EXPECT_FALSE(cr.created());

  PsCoreOptions tiny;
  tiny.max_message_bytes = 100;
  PsCore core(tiny, ShardOwnership::All(16));
  const std::string name(60, 'x');  // two specs of 60-character names: over 100 bytes
  ASSERT_TRUE(core.CreateTable(TableRequest(name + "1", 2, OptimizerSpec::SGD, 1), &cr).ok());
  ASSERT_TRUE(core.CreateTable(TableRequest(name + "2", 2, OptimizerSpec::SGD, 1), &cr).ok());
  DescribeResponse resp;
  s = core.Describe(DescribeRequest(), &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(resp.tables_size(), 0);
}

}  // namespace
}  // namespace ps
