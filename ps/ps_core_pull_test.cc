// PsCore::Pull with compact values (PullRequest.value_type, issue 17): the pod narrows
// each stored float32 with common/base/half.h, and sizes and bounds the answer by the bytes
// it really sends.
#include <cstring>
#include <string>
#include <vector>

#include "common/base/half.h"
#include "embedding/row_source.h"
#include "gtest/gtest.h"
#include "proto/packed.h"
#include "ps/ps_core.h"

namespace ps {
namespace {

CreateTableRequest Table(const std::string& name, uint32_t dim) {
  CreateTableRequest req;
  TableSpec* spec = req.mutable_spec();
  spec->set_name(name);
  spec->set_dim(dim);
  spec->mutable_initializer()->set_kind(InitializerSpec::NORMAL);
  spec->mutable_initializer()->set_stddev(3.0f);
  spec->mutable_optimizer()->set_learning_rate(0.5f);
  return req;
}

PullRequest PullOf(const std::string& table, const std::vector<int64_t>& ids, ValueType type) {
  PullRequest req;
  TableIds* t = req.add_tables();
  t->set_table(table);
  t->set_ids(Pack<int64_t>(absl::MakeConstSpan(ids)));
  req.set_value_type(type);
  return req;
}

std::vector<int64_t> Ids(size_t n) {
  std::vector<int64_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = static_cast<int64_t>(i * 7919 + 3);
  return ids;
}

TEST(PsCorePullTest, CompactValuesAreTheStoredFloatsRoundedBitForBit) {
  PsCore core(PsCoreOptions(), ShardOwnership::All(16));
  CreateTableResponse cr;
  ASSERT_TRUE(core.CreateTable(Table("emb", 5), &cr).ok());
  const std::vector<int64_t> ids = Ids(200);
  // Values of every magnitude fp16 has to round, saturate or flush: normal rows scaled by
  // pushes of large and tiny gradients.
  PushRequest push;
  TableGrads* g = push.add_tables();
  g->set_table("emb");
  g->set_ids(Pack<int64_t>(absl::MakeConstSpan(ids)));
  std::vector<float> grads(ids.size() * 5);
  for (size_t i = 0; i < grads.size(); ++i) {
    grads[i] = (i % 3 == 0) ? 2.0e5f * static_cast<float>(i % 11) : 1e-6f * static_cast<float>(i);
  }
  g->set_grads(Pack<float>(absl::MakeConstSpan(grads)));
  PushResponse pr;
  ASSERT_TRUE(core.Push(push, &pr).ok());

  PullResponse f32, bf16, fp16;
  ASSERT_TRUE(core.Pull(PullOf("emb", ids, FLOAT32), &f32).ok());
  ASSERT_TRUE(core.Pull(PullOf("emb", ids, BFLOAT16), &bf16).ok());
  ASSERT_TRUE(core.Pull(PullOf("emb", ids, FLOAT16), &fp16).ok());
  const std::string& wide = f32.tables(0).values();
  ASSERT_EQ(wide.size(), ids.size() * 5 * sizeof(float));
  ASSERT_EQ(bf16.tables(0).values().size(), wide.size() / 2);
  ASSERT_EQ(fp16.tables(0).values().size(), wide.size() / 2);
  std::vector<float> values(wide.size() / 4);
  std::memcpy(values.data(), wide.data(), wide.size());
  std::vector<uint16_t> b(values.size()), h(values.size());
  std::memcpy(b.data(), bf16.tables(0).values().data(), b.size() * 2);
  std::memcpy(h.data(), fp16.tables(0).values().data(), h.size() * 2);
  int saturated = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(b[i], FloatToBf16(values[i])) << i << ": " << values[i];
    ASSERT_EQ(h[i], FloatToFp16(values[i])) << i << ": " << values[i];
    saturated += (h[i] & 0x7FFF) == 0x7C00;
  }
  EXPECT_GT(saturated, 0);  // the large rows went to Inf in fp16, as documented
  // The compact pulls created nothing and changed nothing.
  PullResponse again;
  ASSERT_TRUE(core.Pull(PullOf("emb", ids, FLOAT32), &again).ok());
  EXPECT_EQ(again.tables(0).values(), wide);
}

TEST(PsCorePullTest, UnknownValueTypeIsRefused) {
  PsCore core(PsCoreOptions(), ShardOwnership::All(16));
  CreateTableResponse cr;
  ASSERT_TRUE(core.CreateTable(Table("emb", 2), &cr).ok());
  PullResponse resp;
  absl::Status s = core.Pull(PullOf("emb", {1, 2}, static_cast<ValueType>(9)), &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("value_type 9"), std::string::npos) << s;
  EXPECT_EQ(core.store().FindTable("emb")->rows(), 0u);
}

// The answer-size bound counts the bytes really sent: 300 rows of 4 KiB of float32 do not
// fit a 1 MiB message, the same rows in bfloat16 (2 KiB each) do.
TEST(PsCorePullTest, AnswerBoundCountsTheCompactBytes) {
  PsCoreOptions o;
  o.max_message_bytes = 1 << 20;
  PsCore core(o, ShardOwnership::All(16));
  CreateTableResponse cr;
  ASSERT_TRUE(core.CreateTable(Table("wide", 1024), &cr).ok());
  PullResponse resp;
  EXPECT_EQ(core.Pull(PullOf("wide", Ids(300), FLOAT32), &resp).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(core.store().FindTable("wide")->rows(), 0u);
  resp.Clear();
  ASSERT_TRUE(core.Pull(PullOf("wide", Ids(300), FLOAT16), &resp).ok());
  EXPECT_EQ(resp.tables(0).values().size(), 300u * 1024 * 2);
  EXPECT_EQ(core.store().FindTable("wide")->rows(), 300u);
}

// A compact pull larger than one narrowing chunk pulls the table several times: a failed
// disk read must still leave no new rows (every row is read before any is created).
TEST(PsCorePullTest, ChunkedCompactPullWhoseDiskReadFailsCreatesNoRows) {
  class FailingSource final : public RowSource {
   public:
    absl::Status Read(absl::Span<const int64_t>, size_t, float*, uint64_t*, bool*) override {
      return absl::UnavailableError("disk read failed");
    }
  } failing;
  PsCore core(PsCoreOptions(), ShardOwnership::All(16));
  CreateTableResponse cr;
  ASSERT_TRUE(core.CreateTable(Table("cold", 4), &cr).ok());
  core.store().FindTable("cold")->SetRowSource(&failing);
  PullResponse resp;
  EXPECT_EQ(core.Pull(PullOf("cold", Ids(40000), BFLOAT16), &resp).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(core.store().FindTable("cold")->rows(), 0u);
}

}  // namespace
}  // namespace ps
