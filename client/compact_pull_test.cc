// Compact pulls through the client (issue 17): bfloat16 / fp16 values from in-process pods
// on loopback, raw into a 16-bit buffer or widened into float32, scattered in request
// order with duplicates, equal bit for bit to the float32 pull's values rounded.
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/ps_client.h"
#include "common/base/half.h"
#include "gtest/gtest.h"
#include "ps/ps_server.h"

namespace ps {
namespace {

class CompactPullTest : public testing::Test {
 protected:
  void SetUp() override {
    constexpr int kPods = 3;
    ClientOptions options;
    for (int i = 0; i < kPods; ++i) {
      PsServerOptions o;
      o.host = "127.0.0.1";
      auto own = ShardOwnership::FromStaticShard(absl::StrCat(i, "/", kPods), 64);
      ASSERT_TRUE(own.ok()) << own.status();
      auto server = PsServer::Start(o, *own);
      ASSERT_TRUE(server.ok()) << server.status();
      options.servers.push_back(absl::StrCat("127.0.0.1:", (*server)->port()));
      servers_.push_back(std::move(server).value());
    }
    options.num_vshards = 64;
    options.deadline_ms = 10000;
    auto c = PsClient::Connect(options);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(c).value();
    TableSpec spec;
    spec.set_name("emb");
    spec.set_dim(kDim);
    spec.mutable_initializer()->set_kind(InitializerSpec::NORMAL);
    spec.mutable_initializer()->set_stddev(2.0f);
    ASSERT_TRUE(client_->CreateTable(spec).ok());
    // Ids with repeats, in no order: the scatter and the duplicate copy both matter.
    for (int i = 0; i < 500; ++i) ids_.push_back((i * 7919) % 331 - 40);
  }

  static constexpr uint32_t kDim = 7;
  std::vector<std::unique_ptr<PsServer>> servers_;
  std::unique_ptr<PsClient> client_;
  std::vector<int64_t> ids_;
};

TEST_F(CompactPullTest, RawAndWidenedValuesAreTheFloat32ValuesRounded) {
  std::vector<float> f32(ids_.size() * kDim);
  ASSERT_TRUE(client_->Pull({{"emb", ids_, f32.data()}}).ok());
  for (ValueType type : {BFLOAT16, FLOAT16}) {
    SCOPED_TRACE(ValueType_Name(type));
    auto narrow = type == BFLOAT16 ? FloatToBf16 : FloatToFp16;
    auto widen = type == BFLOAT16 ? Bf16ToFloat : Fp16ToFloat;
    std::vector<uint16_t> raw(f32.size(), 0xFFFF);
    std::vector<float> widened(f32.size(), -1.0f);
    PullOptions options;
    options.value_type = type;
    PullSpec as_raw{"emb", ids_};
    as_raw.out_half = raw.data();
    PullSpec as_float{"emb", ids_, widened.data()};
    ASSERT_TRUE(client_->Pull({as_raw, as_float}, options).ok());
    for (size_t i = 0; i < f32.size(); ++i) {
      ASSERT_EQ(raw[i], narrow(f32[i])) << i;
      const float want = widen(narrow(f32[i]));
      ASSERT_EQ(std::memcmp(&widened[i], &want, sizeof want), 0) << i;
    }
  }
}

TEST_F(CompactPullTest, OutputsThatDoNotFitTheTypeAreRefused) {
  std::vector<float> f32(ids_.size() * kDim);
  std::vector<uint16_t> raw(ids_.size() * kDim);
  PullSpec both{"emb", ids_, f32.data()};
  both.out_half = raw.data();
  PullOptions bf16;
  bf16.value_type = BFLOAT16;
  EXPECT_EQ(client_->Pull({both}, bf16).code(), absl::StatusCode::kInvalidArgument);
  PullSpec half_only{"emb", ids_};
  half_only.out_half = raw.data();
  EXPECT_EQ(client_->Pull({half_only}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Pull({PullSpec{"emb", ids_}}, bf16).code(),
            absl::StatusCode::kInvalidArgument);
  PullOptions unknown;
  unknown.value_type = static_cast<ValueType>(7);
  EXPECT_EQ(client_->Pull({{"emb", ids_, f32.data()}}, unknown).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps
