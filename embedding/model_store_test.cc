#include "embedding/model_store.h"

#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(ModelStoreTest, CreateIsIdempotentAndDetectsConflicts) {
  ModelStore store;
  TableSpec t;
  t.set_name("emb");
  t.set_dim(8);
  EXPECT_EQ(*store.CreateTable(t), true);
  EXPECT_EQ(*store.CreateTable(t), false);
  // The same spec with a default spelled out is the same table.
  TableSpec explicit_default = t;
  explicit_default.mutable_optimizer()->set_learning_rate(0.01f);
  EXPECT_EQ(*store.CreateTable(explicit_default), false);
  TableSpec other = t;
  other.set_dim(16);
  auto conflict = store.CreateTable(other);
  EXPECT_EQ(conflict.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(store.FindTable("emb"), nullptr);
  EXPECT_EQ(store.FindTable("nope"), nullptr);
  EXPECT_EQ(store.Tables().size(), 1u);
}

TEST(ModelStoreTest, DenseTensorsPullAndPush) {
  ModelStore store;
  DenseSpec d;
  d.set_name("mlp/w0");
  d.add_shape(2);
  d.add_shape(3);
  d.mutable_initializer()->set_kind(InitializerSpec::CONSTANT);
  d.mutable_initializer()->set_value(1.0f);
  d.mutable_optimizer()->set_learning_rate(0.5f);
  EXPECT_EQ(*store.CreateDense(d), true);
  auto w = store.FindDense("mlp/w0");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->numel(), 6u);
  std::vector<float> g = {1, 2, 3, 4, 5, 6}, out(6);
  w->Push(g.data(), 0);
  w->Pull(out.data());
  EXPECT_EQ(out, (std::vector<float>{0.5f, 0.0f, -0.5f, -1.0f, -1.5f, -2.0f}));
  EXPECT_EQ(w->step(), 1u);
  EXPECT_FALSE(store.CreateDense(DenseSpec()).ok());
}

}  // namespace
}  // namespace ps
