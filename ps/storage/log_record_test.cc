#include "ps/storage/log_record.h"

#include <gtest/gtest.h>

namespace ps {
namespace {

TEST(LogRecordTest, RoundTripsTablesAndDense) {
  PushKey key;
  key.set_worker_id(7);
  key.set_incarnation(2);
  key.set_sequence(99);
  const std::vector<int64_t> ids = {-5, 1LL << 40};
  const std::vector<uint64_t> steps = {3, 1};
  const std::vector<float> grads = {1, 2, 3, 4, 5, 6};
  LogRecordBuilder b(key, LogRecordBuilder::TableBytes("emb", 2, 3));
  b.AddTable("emb", 0.5f, 3, ids, steps, grads.data());
  b.AddDense("bias", 0, 12, {0.25f, -1});
  const std::string bytes = b.Finish();
  EXPECT_EQ(bytes.size(),
            25 + LogRecordBuilder::TableBytes("emb", 2, 3) + 1 + 2 + 4 + 4 + 8 + 4 + 8);

  auto rec = DecodeLogRecord(bytes);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->key.worker_id(), 7u);
  EXPECT_EQ(rec->key.incarnation(), 2u);
  EXPECT_EQ(rec->key.sequence(), 99u);
  ASSERT_EQ(rec->tables.size(), 1u);
  EXPECT_EQ(rec->tables[0].table, "emb");
  EXPECT_EQ(rec->tables[0].lr, 0.5f);
  EXPECT_EQ(rec->tables[0].dim, 3u);
  EXPECT_EQ(rec->tables[0].ids, ids);
  EXPECT_EQ(rec->tables[0].steps, steps);
  EXPECT_EQ(rec->tables[0].grads, grads);
  ASSERT_EQ(rec->dense.size(), 1u);
  EXPECT_EQ(rec->dense[0].name, "bias");
  EXPECT_EQ(rec->dense[0].step, 12u);
  EXPECT_EQ(rec->dense[0].grads, (std::vector<float>{0.25f, -1}));
}

TEST(LogRecordTest, RoundTripsDeletesAndDecays) {
  PushKey key;  // anonymous, as an eviction's record
  const std::vector<int64_t> ids = {9, -3, 1LL << 50};
  LogRecordBuilder b(key, 0);
  b.AddDelete("emb", ids);
  b.AddDecay("emb", {0, 7});
  b.AddAdmissionInstall("emb", "xyz");
  const std::string bytes = b.Finish();
  EXPECT_EQ(bytes.size(), 25u + 1 + 2 + 3 + 4 + 3 * 8 + 1 + 2 + 3 + 4 + 2 * 4 + 1 + 2 + 3 + 4 + 3);
  auto rec = DecodeLogRecord(bytes);
  ASSERT_TRUE(rec.ok()) << rec.status();
  ASSERT_EQ(rec->deletes.size(), 1u);
  EXPECT_EQ(rec->deletes[0].table, "emb");
  EXPECT_EQ(rec->deletes[0].ids, ids);
  ASSERT_EQ(rec->decays.size(), 1u);
  EXPECT_EQ(rec->decays[0].table, "emb");
  EXPECT_EQ(rec->decays[0].vshards, (std::vector<uint32_t>{0, 7}));
  ASSERT_EQ(rec->admission_installs.size(), 1u);
  EXPECT_EQ(rec->admission_installs[0].counters, "xyz");
  // Cut short: DATA_LOSS, never a read past the end.
  EXPECT_EQ(DecodeLogRecord(bytes.substr(0, bytes.size() - 1)).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(LogRecordTest, RoundTripsInstalls) {
  PushKey key;  // anonymous, as an import's record
  const std::vector<int64_t> ids = {9, -3};
  const std::vector<uint64_t> steps = {4, 0};
  const std::vector<float> values = {1, 2, 3, 4, 5, 6, 7, 8};  // 2 rows of 4 floats
  LogRecordBuilder b(key, 0);
  b.AddInstall("emb/x", 4, ids, steps, values);
  b.AddDenseInstall("w", 17, {0.5f, 1.5f, -2});
  auto rec = DecodeLogRecord(b.Finish());
  ASSERT_TRUE(rec.ok()) << rec.status();
  ASSERT_EQ(rec->installs.size(), 1u);
  EXPECT_EQ(rec->installs[0].table, "emb/x");
  EXPECT_EQ(rec->installs[0].row_floats, 4u);
  EXPECT_EQ(rec->installs[0].ids, ids);
  EXPECT_EQ(rec->installs[0].steps, steps);
  EXPECT_EQ(rec->installs[0].values, values);
  ASSERT_EQ(rec->dense_installs.size(), 1u);
  EXPECT_EQ(rec->dense_installs[0].name, "w");
  EXPECT_EQ(rec->dense_installs[0].step, 17u);
  EXPECT_EQ(rec->dense_installs[0].values, (std::vector<float>{0.5f, 1.5f, -2}));
  EXPECT_TRUE(rec->tables.empty());
  EXPECT_TRUE(rec->dense.empty());
}

// A whole key recorded exactly (a push routed under an older map) says so in its record,
// which a follower reads to record the key the same way; a record of before (version 1)
// reads as a whole key, and a piece's key is exact already (no mark).
TEST(LogRecordTest, CarriesAnExactKey) {
  PushKey key;
  key.set_worker_id(7);
  key.set_incarnation(2);
  key.set_sequence(99);
  const std::vector<int64_t> ids = {4, 5};
  const std::vector<uint64_t> steps = {1, 2};
  const std::vector<float> grads = {1, 2};
  LogRecordBuilder plain(key, 0);
  plain.AddTable("emb", 0.5f, 1, ids, steps, grads.data());
  const std::string whole = plain.Finish();
  EXPECT_EQ(whole[0], 1);  // the format of before, unchanged
  LogRecordBuilder marked(key, 0);
  marked.AddTable("emb", 0.5f, 1, ids, steps, grads.data());
  marked.SetKeyExact();
  const std::string exact = marked.Finish();
  EXPECT_EQ(exact.size(), whole.size());
  EXPECT_EQ(exact.substr(1), whole.substr(1));
  for (const std::string* bytes : {&whole, &exact}) {
    auto rec = DecodeLogRecord(*bytes);
    ASSERT_TRUE(rec.ok()) << rec.status();
    auto view = ParseLogRecord(*bytes);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(rec->key_exact, bytes == &exact);
    EXPECT_EQ(view->key_exact, bytes == &exact);
    EXPECT_EQ(rec->key.sequence(), 99u);
    EXPECT_EQ(rec->key.piece(), 0u);
    ASSERT_EQ(rec->tables.size(), 1u);
    EXPECT_EQ(rec->tables[0].ids, ids);
  }
  PushKey piece = key;
  piece.set_piece(3);
  LogRecordBuilder of_piece(piece, 0);
  of_piece.SetKeyExact();
  of_piece.AddTable("emb", 0.5f, 1, ids, steps, grads.data());
  auto rec = DecodeLogRecord(of_piece.Finish());
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->key.piece(), 3u);
  EXPECT_FALSE(rec->key_exact);
}

TEST(LogRecordTest, DamagedRecordsAreDataLoss) {
  PushKey key;
  key.set_worker_id(1);
  key.set_sequence(1);
  const std::vector<int64_t> ids = {1};
  const std::vector<uint64_t> steps = {1};
  const float grad = 1;
  LogRecordBuilder b(key, 0);
  b.AddTable("t", 0, 1, ids, steps, &grad);
  const std::string bytes = b.Finish();
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    if (cut == 25) continue;  // a record with no entries is well-formed
    auto rec = DecodeLogRecord(bytes.substr(0, cut));
    EXPECT_EQ(rec.status().code(), absl::StatusCode::kDataLoss) << "cut at " << cut;
  }
  std::string bad_version = bytes;
  bad_version[0] = 9;
  EXPECT_EQ(DecodeLogRecord(bad_version).status().code(), absl::StatusCode::kDataLoss);
}

TEST(LogRecordTest, ParsedInPlaceAsDecoded) {
  PushKey key;
  key.set_worker_id(3);
  key.set_sequence(8);
  const std::vector<int64_t> ids = {-5, 1LL << 40, 7};
  const std::vector<uint64_t> steps = {3, 1, 9};
  const std::vector<float> grads = {1, 2, 3, 4, 5, 6};
  const std::vector<float> values = {9, 8, 7, 6};
  LogRecordBuilder b(key, 0);
  b.AddTable("e", 0.5f, 2, ids, steps, grads.data());  // odd name length: unaligned arrays
  b.AddDense("bias", 0, 12, {0.25f, -1});
  b.AddInstall("emb/x", 4, {ids[2]}, {steps[2]}, values);
  const std::string bytes = b.Finish();
  auto rec = ParseLogRecord(bytes);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->key.worker_id(), 3u);
  EXPECT_EQ(rec->key.sequence(), 8u);
  EXPECT_TRUE(rec->has_dense);
  ASSERT_EQ(rec->tables.size(), 1u);
  const LogTableView& t = rec->tables[0];
  EXPECT_EQ(t.table, "e");
  EXPECT_EQ(t.lr, 0.5f);
  ASSERT_EQ(t.n, 3u);
  ASSERT_EQ(t.dim, 2u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(t.id(i), ids[i]);
    EXPECT_EQ(t.step(i), steps[i]);
    float g[2];
    std::memcpy(g, t.grad(i), sizeof(g));
    EXPECT_EQ(g[0], grads[2 * i]);
    EXPECT_EQ(g[1], grads[2 * i + 1]);
  }
  ASSERT_EQ(rec->installs.size(), 1u);
  EXPECT_EQ(rec->installs[0].table, "emb/x");
  EXPECT_EQ(rec->installs[0].id(0), 7);
  EXPECT_EQ(rec->installs[0].step(0), 9u);
  float v[4];
  std::memcpy(v, rec->installs[0].row(0), sizeof(v));
  EXPECT_EQ(std::vector<float>(v, v + 4), values);
  const size_t after_table = 25 + LogRecordBuilder::TableBytes("e", 3, 2);
  const size_t after_dense = after_table + 1 + 2 + 4 + 4 + 8 + 4 + 8;
  for (size_t cut = 26; cut < bytes.size(); ++cut) {
    if (cut == after_table || cut == after_dense) continue;  // well-formed prefixes
    EXPECT_EQ(ParseLogRecord(bytes.substr(0, cut)).status().code(), absl::StatusCode::kDataLoss)
        << "cut at " << cut;
  }
}

TEST(LogRecordBuilderTest, AdoptLogsTheEncodedRecordAsItIs) {
  PushKey key;
  key.set_worker_id(3);
  key.set_sequence(8);
  LogRecordBuilder primary(key, 0);
  const std::vector<int64_t> ids = {5, -7};
  const std::vector<uint64_t> steps = {2, 9};
  const std::vector<float> grads = {1, 2, 3, 4};
  primary.AddTable("t", 0.5f, 2, ids, steps, grads.data());
  const std::string encoded = primary.Finish();

  auto shared = std::make_shared<const std::string>(encoded);
  LogRecordBuilder follower(key, 0);
  EXPECT_FALSE(follower.has_entries());
  follower.Adopt(shared);
  EXPECT_TRUE(follower.has_entries());
  EXPECT_EQ(follower.FinishShared(), shared);  // the same bytes, not a copy
  EXPECT_FALSE(follower.has_entries());

  LogRecordBuilder copied(key, 0);
  copied.Adopt(shared);
  EXPECT_EQ(copied.Finish(), encoded);
}

}  // namespace
}  // namespace ps
