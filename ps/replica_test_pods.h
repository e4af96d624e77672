// Two pods in one process for the pod-side replication tests (ps_core_replicate_test,
// ps_core_recovered_log_test, ps_core_fill_test): PsCores `a` and `b` whose replication
// batches go straight to each other's ReplicateRecords (InProcessSender), each holding
// table "emb" (by default Adam, dim kDim, normal init) and a write lease good for an hour;
// durable in a temporary directory or in memory, as the test's options say; a durable pod
// can be stopped and opened again on its disk. With the assignment builder, the push maker,
// a push in flight, waiting forms of the pods' asynchronous calls, a live move's copy and
// the row dump those tests compare with (pod_transfer_test uses the last few too).
// Test-only (the ps_replica_test_pods library).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "ps/ps_core.h"

namespace ps::replica_test {

constexpr uint32_t kVShards = 16;
constexpr uint32_t kDim = 4;

// Delivers batches to cores by address; a closed gate, or an address no core is added at
// (or one removed), holds every batch back (UNAVAILABLE, which the replicator retries) until
// opened. Thread-safe; a core must outlive its entry (Remove it before it goes).
class InProcessSender : public ReplicaSender {
 public:
  void Add(const std::string& address, PsCore* core);
  void Remove(const std::string& address);
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

// An assignment at `epoch` of kVShards without replication: what the pod owns, receives
// and sends.
Assignment Placement(uint64_t epoch, const std::vector<uint32_t>& owned,
                     const std::vector<uint32_t>& in = {}, const std::vector<uint32_t>& out = {});

// What a pod that follows every vshard of `primary` follows, by primary (Role's
// `following`); nothing if `primary` is empty.
std::map<std::string, std::vector<uint32_t>> FollowingAll(const std::string& primary);

// Pod `pod`'s assignment at `epoch` (kVShards, factor 2): what it owns, receives and
// sends, its followers (pod ids; address "<id>:1") and what it follows, by primary.
Assignment Role(uint64_t epoch, const std::string& pod, const std::vector<uint32_t>& owned,
                const std::vector<std::string>& followers,
                const std::map<std::string, std::vector<uint32_t>>& following,
                const std::vector<uint32_t>& in = {}, const std::vector<uint32_t>& out = {});

// A push to "emb" of ids under key (worker, 1, seq); element i's gradient is
// g * (i % 7 + 1) / 3.
PushRequest MakePush(const std::vector<int64_t>& ids, float g, uint64_t worker, uint64_t seq);
// The same with the gradients given: ids.size() * kDim floats, row after row.
PushRequest MakePush(const std::vector<int64_t>& ids, const std::vector<float>& grads,
                     uint64_t worker, uint64_t seq);

// A push to "emb" of gradient -1 to every element of rows `ids` under key (7, 1, seq): on
// a CountingSpec table each application adds 1 to every weight it touches.
PushRequest UnitPush(const std::vector<int64_t>& ids, uint64_t seq);

// A push sent with PsCore::PushAsync at construction, and its answer. The core answers
// it once (on destruction at the latest), so the object must outlive the core or be
// waited for. Thread-safe (done, Wait).
class PendingPush {
 public:
  PendingPush(PsCore& core, const PushRequest& req);
  PendingPush(const PendingPush&) = delete;
  PendingPush& operator=(const PendingPush&) = delete;

  bool done() const { return done_.HasBeenNotified(); }
  // Waits for the answer and returns it.
  absl::Status Wait();

 private:
  PushResponse resp_;
  absl::Status result_;  // written once, before done_
  absl::Notification done_;
};

// Hands `records` (from `primary` at `epoch`) to core.ReplicateRecords and waits for its
// answer (DEADLINE_EXCEEDED if none comes within a minute).
absl::Status Replicate(PsCore& core, uint64_t epoch, const std::string& primary,
                       const std::vector<std::string>& records);

// Hands `req` to core.ImportRows and waits for its answer (in *resp).
absl::Status ImportRows(PsCore& core, const ImportRowsRequest& req, ImportRowsResponse* resp);

// A live move of `vshards` from `from` to `to` as the master runs it, after both applied
// the assignment that says so: BeginMove starts move `move` (MigrateBegin on `from`,
// BeginImport on `to`); CopyPhase exports every chunk of `phase` from `from` (at most
// `max_bytes` a chunk; 0: the pod's default) and imports it into `to`. The first error
// is returned.
absl::Status BeginMove(PsCore& from, PsCore& to, uint64_t move,
                       const std::vector<uint32_t>& vshards);
absl::Status CopyPhase(PsCore& from, PsCore& to, uint64_t move, MigrateExportRequest::Phase phase,
                       uint64_t max_bytes = 0);

// The fixture's "emb" table: Adam, dim kDim, normal init (stddev 0.1).
TableSpec EmbSpec();
// An "emb" table whose rows count pushes: dim kDim, SGD at learning rate 1, zero rows.
TableSpec CountingSpec();
// A table `name` of dim kDim with `optimizer` and the default initializer (a second table
// beside "emb").
TableSpec SpecOf(const std::string& name, OptimizerSpec::Kind optimizer);

// Creates `spec` on `core`; CreateEmbTable creates EmbSpec(), as the fixture's pods hold
// it by default.
absl::Status CreateTable(PsCore& core, const TableSpec& spec);
absl::Status CreateEmbTable(PsCore& core);

// id -> the `table` row's bytes: weights, slots and step; empty if there is no such table.
std::map<int64_t, std::string> Rows(PsCore& core, const std::string& table = "emb");
// The weights of a row as Rows dumps it.
std::vector<float> Weights(const std::string& row);

// How the fixture makes its pods.
struct ReplicaPairOptions {
  // Each pod in a data dir of its own under the fixture's temporary directory; in memory
  // (and empty when opened again) otherwise.
  bool durable = false;
  // What each pod is opened with; the fixture sets the data dir, the sender and the
  // replicator's backoff (1 to 5 ms, so a test waits little on a closed gate) on a copy.
  PsCoreOptions pod;
  // The "emb" table both pods start with.
  TableSpec emb = EmbSpec();
  // When set, called with the pod's name ("a" or "b") and its copy of `pod` each time the
  // fixture opens it (Restart too), after the fixture's settings: what differs between
  // the pods, e.g. a kill point for one of them.
  std::function<void(const std::string& name, PsCoreOptions* pod)> per_pod;
};

// Periodic durability (--durability=periodic) whose timed fsync and materialization never
// come within a test (an hour), eviction off: an acknowledgement that waited for the log
// waited for an fsync it asked for (ps/synced_acks.h).
void SetPeriodicUntimed(PsCoreOptions* pod);

// The fixture: pods a_ (address "a:1") and b_ ("b:1"), both known to sender_, both
// holding "emb"; no assignment yet. Subclasses say how in Options().
class ReplicaPairFixture : public testing::Test {
 protected:
  // Read once, by SetUp. Default: in memory, EmbSpec().
  virtual ReplicaPairOptions Options() { return {}; }

  void SetUp() override;
  void TearDown() override;

  // A pod named `name` (its data dir under root_ when durable) sending through sender_;
  // null (and a test failure) if it does not open.
  std::unique_ptr<PsCore> Open(const std::string& name);
  // Stops pod `name` ("a" or "b"; its pending pushes fail): the sender no longer reaches it.
  void Stop(const std::string& name);
  // Opens pod `name` again on its data dir with what its disk recovered, reachable through
  // the sender again, with a write lease good for an hour. Call after Stop.
  void Restart(const std::string& name);
  // Applies assignment `a` to `core` (a test failure if it is refused).
  void Apply(PsCore& core, const Assignment& a);

  std::string root_;
  std::shared_ptr<InProcessSender> sender_;
  std::unique_ptr<PsCore> a_, b_;

 private:
  std::unique_ptr<PsCore>& Pod(const std::string& name);

  ReplicaPairOptions options_;
};

// The fixture run twice: GetParam() is whether the pods are durable.
class ReplicaPairTest : public ReplicaPairFixture, public testing::WithParamInterface<bool> {
 protected:
  ReplicaPairOptions Options() override;
};

// Names the instances of a ReplicaPairTest "Durable" and "InMemory".
std::string DurableOrInMemory(const testing::TestParamInfo<bool>& p);

}  // namespace ps::replica_test
