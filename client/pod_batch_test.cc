// PullBatch / PushBatch: every unique id goes to the pod the map names, once; a pull's
// scatter plan and duplicates point at the caller's rows; a push sums duplicate gradients;
// requests carry every table, the epoch, read_only or the push key.
#include "client/pod_batch.h"

#include <grpcpp/grpcpp.h>

#include <cstring>
#include <map>
#include <set>

#include "gtest/gtest.h"
#include "proto/ps.grpc.pb.h"

namespace ps::internal {
namespace {

template <typename Msg>
Msg Decode(grpc::ByteBuffer buffer) {
  Msg msg;
  EXPECT_TRUE(grpc::SerializationTraits<Msg>::Deserialize(&buffer, &msg).ok());
  return msg;
}

std::vector<int64_t> Unpack(const std::string& bytes) {
  std::vector<int64_t> ids(bytes.size() / sizeof(int64_t));
  std::memcpy(ids.data(), bytes.data(), bytes.size());
  return ids;
}

ShardMap Map(uint32_t pods) {
  auto map = ShardMap::FromOwners(
      [&] {
        std::vector<uint32_t> owner(64);
        for (uint32_t v = 0; v < 64; ++v) owner[v] = (v * 7) % pods;
        return owner;
      }(),
      pods, 9);
  EXPECT_TRUE(map.ok()) << map.status();
  return *map;
}

TEST(PodBatchTest, PullRoutesEachUniqueIdOnceAndPlansTheScatter) {
  const ShardMap map = Map(3);
  std::vector<int64_t> a, b;
  for (int i = 0; i < 200; ++i) a.push_back(i % 150 - 20);  // 50 repeats
  for (int i = 0; i < 40; ++i) b.push_back(i * 1000);
  float out_a[1], out_b[1];  // only the addresses matter
  PullBatch batch(map, /*read_only=*/true);
  PullDuplicates dups_a, dups_b;
  batch.Add("a", 4, out_a, a, {}, &dups_a);
  batch.Add("b", 8, out_b, b, {}, &dups_b);
  std::vector<PodRequest> parts = batch.Finish();
  ASSERT_EQ(parts.size(), 3u);

  std::map<std::string, std::set<uint32_t>> planned;  // positions with a row coming
  std::set<uint32_t> pods;
  for (PodRequest& part : parts) {
    EXPECT_TRUE(pods.insert(part.pod).second) << "one request per pod";
    const PullRequest req = Decode<PullRequest>(std::move(part.request));
    EXPECT_EQ(req.epoch(), 9u);
    EXPECT_TRUE(req.read_only());
    ASSERT_NE(part.scatter, nullptr);
    ASSERT_EQ(req.tables_size(), static_cast<int>(part.scatter->entries.size()));
    ASSERT_EQ(req.tables_size(), 2) << "every table in the pod's one request";
    for (int e = 0; e < req.tables_size(); ++e) {
      const PullScatter::Entry& entry = part.scatter->entries[e];
      EXPECT_EQ(req.tables(e).table(), entry.table);
      const std::vector<int64_t> ids = Unpack(req.tables(e).ids());
      ASSERT_EQ(ids.size(), entry.dest.size());
      const auto& spec = entry.table == "a" ? a : b;
      EXPECT_EQ(entry.out, entry.table == "a" ? out_a : out_b);
      EXPECT_EQ(entry.dim, entry.table == "a" ? 4u : 8u);
      for (size_t k = 0; k < ids.size(); ++k) {
        EXPECT_EQ(map.PodOf(NameHash(entry.table), ids[k]), part.pod);
        EXPECT_EQ(spec[entry.dest[k]], ids[k]);
        EXPECT_TRUE(planned[entry.table].insert(entry.dest[k]).second);
      }
    }
  }
  // Each position is either pulled or copied from the first occurrence of its id.
  EXPECT_EQ(planned["a"].size() + dups_a.rows.size(), a.size());
  EXPECT_EQ(planned["a"].size(), 150u);
  for (auto [i, first] : dups_a.rows) {
    EXPECT_EQ(a[i], a[first]);
    EXPECT_LT(first, i);
    EXPECT_TRUE(planned["a"].count(first));
  }
  EXPECT_EQ(planned["b"].size(), b.size());
  EXPECT_TRUE(dups_b.rows.empty());
}

// A re-route: ids already unique, with the caller's positions given.
TEST(PodBatchTest, PullKeepsTheGivenPositions) {
  const ShardMap map = Map(2);
  const std::vector<int64_t> ids = {5, 6, 7, 8, 9, 10};
  const std::vector<uint32_t> dest = {40, 41, 12, 3, 99, 0};
  float out[1];
  PullBatch batch(map, false);
  PullDuplicates none;
  batch.Add("t", 2, out, ids, dest, &none);
  std::map<int64_t, uint32_t> got;
  for (PodRequest& part : batch.Finish()) {
    const PullRequest req = Decode<PullRequest>(std::move(part.request));
    EXPECT_FALSE(req.read_only());
    const std::vector<int64_t> sent = Unpack(req.tables(0).ids());
    for (size_t k = 0; k < sent.size(); ++k) got[sent[k]] = part.scatter->entries[0].dest[k];
  }
  ASSERT_EQ(got.size(), ids.size());
  for (size_t k = 0; k < ids.size(); ++k) EXPECT_EQ(got[ids[k]], dest[k]);
  EXPECT_TRUE(none.rows.empty());
}

TEST(PodBatchTest, PushSumsDuplicatesAndCarriesTheKey) {
  const ShardMap map = Map(4);
  std::vector<int64_t> ids;
  std::vector<float> grads;
  std::map<int64_t, std::vector<float>> want;
  for (int i = 0; i < 300; ++i) {
    const int64_t id = (i * 37) % 101;  // 101 unique ids, repeated
    ids.push_back(id);
    auto& sum = want.try_emplace(id, std::vector<float>(3, 0.0f)).first->second;
    for (int j = 0; j < 3; ++j) {
      const float g = static_cast<float>(i * 3 + j) * 0.25f;
      grads.push_back(g);
      sum[j] += g;
    }
  }
  PushKey key;
  key.set_worker_id(7);
  key.set_incarnation(2);
  key.set_sequence(11);
  PushBatch batch(map, [&key] {
    PushKey k = key;
    key.set_sequence(key.sequence() + 1);
    return k;
  });
  batch.Add("t", 3, 0.5f, ids, grads.data());
  const std::vector<int64_t> other = {1, 2, 3};
  const std::vector<float> other_grads(6, 1.0f);
  batch.Add("u", 2, 0.0f, other, other_grads.data());

  std::map<int64_t, std::vector<float>> got;
  size_t u_rows = 0;
  std::set<uint64_t> sequences;  // one key per pod part
  std::vector<PodRequest> parts = batch.Finish();
  EXPECT_GT(parts.size(), 1u);
  for (PodRequest& part : parts) {
    EXPECT_EQ(part.scatter, nullptr);
    const PushRequest req = Decode<PushRequest>(std::move(part.request));
    EXPECT_EQ(req.epoch(), 9u);
    EXPECT_EQ(req.key().SerializeAsString(), part.key.SerializeAsString());
    EXPECT_EQ(req.key().worker_id(), 7u);
    EXPECT_EQ(req.key().incarnation(), 2u);
    EXPECT_GE(req.key().sequence(), 11u);
    EXPECT_TRUE(sequences.insert(req.key().sequence()).second) << req.key().sequence();
    for (const TableGrads& t : req.tables()) {
      const std::vector<int64_t> sent = Unpack(t.ids());
      const uint32_t dim = t.table() == "t" ? 3 : 2;
      ASSERT_EQ(t.grads().size(), sent.size() * dim * sizeof(float));
      EXPECT_EQ(t.learning_rate(), t.table() == "t" ? 0.5f : 0.0f);
      for (size_t k = 0; k < sent.size(); ++k) {
        EXPECT_EQ(map.PodOf(NameHash(t.table()), sent[k]), part.pod);
        if (t.table() == "u") {
          ++u_rows;
          continue;
        }
        std::vector<float> row(dim);
        std::memcpy(row.data(), t.grads().data() + k * dim * sizeof(float), dim * sizeof(float));
        EXPECT_TRUE(got.emplace(sent[k], row).second) << "id " << sent[k] << " sent twice";
      }
    }
  }
  EXPECT_EQ(got, want);  // summed in the order given, as the reference sums
  EXPECT_EQ(u_rows, other.size());
}

}  // namespace
}  // namespace ps::internal
