// Two pods in one process for the pod-side replication tests (ps_core_fill_test, and
// ps_core_replicate_test's twin of this setup): PsCores `a` and `b` whose replication
// batches go straight to each other's ReplicateRecords (InProcessSender), each holding
// table "emb" (Adam, dim kDim, normal init) and a write lease good for an hour; durable
// in a temporary directory when the test's parameter is true, in memory otherwise. With
// the assignment builder, the push maker and the row dump those tests compare with.
// Test-only (the ps_replica_test_pods library).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "ps/ps_core.h"

namespace ps::replica_test {

constexpr uint32_t kVShards = 16;
constexpr uint32_t kDim = 4;

// Delivers batches to cores by address; a closed gate holds every batch back (UNAVAILABLE,
// which the replicator retries) until opened. Thread-safe; the cores must outlive it.
class InProcessSender : public ReplicaSender {
 public:
  void Add(const std::string& address, PsCore* core);
  void Close();
  void Open();
  int calls();  // Send calls so far, refused ones included
  absl::Status Send(const ReplicaPeer& follower, const ReplicateRecordsRequest& req,
                    ReplicateRecordsResponse* resp) override;

 private:
  absl::Mutex mu_;
  std::map<std::string, PsCore*> cores_ ABSL_GUARDED_BY(mu_);
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

// Vshards [begin, end).
std::vector<uint32_t> Range(uint32_t begin, uint32_t end);

// Pod `pod`'s assignment at `epoch` (kVShards, factor 2): what it owns, receives and
// sends, its followers (pod ids; address "<id>:1") and what it follows, by primary.
Assignment Role(uint64_t epoch, const std::string& pod, const std::vector<uint32_t>& owned,
                const std::vector<std::string>& followers,
                const std::map<std::string, std::vector<uint32_t>>& following,
                const std::vector<uint32_t>& in = {}, const std::vector<uint32_t>& out = {});

// A push to "emb" of ids under key (worker, 1, seq); element i's gradient is
// g * (i % 7 + 1) / 3.
PushRequest MakePush(const std::vector<int64_t>& ids, float g, uint64_t worker, uint64_t seq);

// Creates table "emb" (as every pod of the fixture holds it) on `core`.
absl::Status CreateEmbTable(PsCore& core);

// id -> the "emb" row's bytes: weights, slots and step.
std::map<int64_t, std::string> Rows(PsCore& core);

// The fixture: pods a_ (address "a:1") and b_ ("b:1"), both known to sender_, both
// holding "emb"; no assignment yet. GetParam(): durable.
class ReplicaPairTest : public testing::TestWithParam<bool> {
 protected:
  void SetUp() override;
  void TearDown() override;

  // A pod named `name` (its data dir under root_ when durable) sending through sender_.
  std::unique_ptr<PsCore> Open(const std::string& name);

  std::string root_;
  std::shared_ptr<InProcessSender> sender_;
  std::unique_ptr<PsCore> a_, b_;
};

}  // namespace ps::replica_test
