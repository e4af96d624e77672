#include "ps/replica_test_pods.h"

#include <stdlib.h>

#include <cstring>
#include <filesystem>

#include "common/base/status_macros.h"
#include "proto/packed.h"

namespace ps::replica_test {

void InProcessSender::Add(const std::string& address, PsCore* core) {
  absl::MutexLock lock(&mu_);
  cores_[address] = core;
}

void InProcessSender::Remove(const std::string& address) {
  absl::MutexLock lock(&mu_);
  cores_.erase(address);
}

void InProcessSender::Close() {
  absl::MutexLock lock(&mu_);
  open_ = false;
}

void InProcessSender::Open() {
  absl::MutexLock lock(&mu_);
  open_ = true;
}

int InProcessSender::calls() {
  absl::MutexLock lock(&mu_);
  return calls_;
}

absl::Status InProcessSender::Send(const ReplicaPeer& follower, const ReplicateRecordsRequest& req,
                                   ReplicateRecordsResponse* resp) {
  PsCore* core;
  {
    absl::MutexLock lock(&mu_);
    ++calls_;
    if (!open_) return absl::UnavailableError("gate closed");
    auto it = cores_.find(follower.address());
    if (it == cores_.end()) return absl::UnavailableError("no pod at " + follower.address());
    core = it->second;
  }
  absl::Notification done;
  absl::Status result;
  core->ReplicateRecords(req, resp, [&](absl::Status s) {
    result = s;
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

std::vector<uint32_t> Range(uint32_t begin, uint32_t end) {
  std::vector<uint32_t> v;
  for (uint32_t i = begin; i < end; ++i) v.push_back(i);
  return v;
}

Assignment Placement(uint64_t epoch, const std::vector<uint32_t>& owned,
                     const std::vector<uint32_t>& in, const std::vector<uint32_t>& out) {
  Assignment a;
  a.set_epoch(epoch);
  a.set_num_vshards(kVShards);
  for (uint32_t v : owned) a.add_owned(v);
  for (uint32_t v : in) a.add_moving_in(v);
  for (uint32_t v : out) a.add_moving_out(v);
  return a;
}

std::map<std::string, std::vector<uint32_t>> FollowingAll(const std::string& primary) {
  std::map<std::string, std::vector<uint32_t>> following;
  if (!primary.empty()) following[primary] = Range(0, kVShards);
  return following;
}

Assignment Role(uint64_t epoch, const std::string& pod, const std::vector<uint32_t>& owned,
                const std::vector<std::string>& followers,
                const std::map<std::string, std::vector<uint32_t>>& following,
                const std::vector<uint32_t>& in, const std::vector<uint32_t>& out) {
  Assignment a = Placement(epoch, owned, in, out);
  ReplicationRole* r = a.mutable_replication();
  r->set_pod_id(pod);
  r->set_factor(2);
  for (const std::string& f : followers) {
    ReplicaPeer* p = r->add_followers();
    p->set_pod_id(f);
    p->set_address(f + ":1");
  }
  for (const auto& [primary, vshards] : following) {
    FollowedVShards* f = r->add_following();
    f->set_primary(primary);
    for (uint32_t v : vshards) f->add_vshards(v);
  }
  return a;
}

PushRequest UnitPush(const std::vector<int64_t>& ids, uint64_t seq) {
  return MakePush(ids, std::vector<float>(ids.size() * kDim, -1.0f), 7, seq);
}

PushRequest MakePush(const std::vector<int64_t>& ids, float g, uint64_t worker, uint64_t seq) {
  std::vector<float> grads(ids.size() * kDim);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = g * static_cast<float>(i % 7 + 1) / 3.0f;
  return MakePush(ids, grads, worker, seq);
}

PushRequest MakePush(const std::vector<int64_t>& ids, const std::vector<float>& grads,
                     uint64_t worker, uint64_t seq) {
  PushRequest req;
  TableGrads* t = req.add_tables();
  t->set_table("emb");
  t->set_ids(Pack<int64_t>(ids));
  t->set_grads(Pack<float>(grads));
  req.mutable_key()->set_worker_id(worker);
  req.mutable_key()->set_incarnation(1);
  req.mutable_key()->set_sequence(seq);
  return req;
}

PendingPush::PendingPush(PsCore& core, const PushRequest& req) {
  core.PushAsync(req, &resp_, [this](absl::Status s) {
    result_ = s;
    done_.Notify();
  });
}

absl::Status PendingPush::Wait() {
  done_.WaitForNotification();
  return result_;
}

absl::Status Replicate(PsCore& core, uint64_t epoch, const std::string& primary,
                       const std::vector<std::string>& records) {
  ReplicateRecordsRequest req;
  req.set_epoch(epoch);
  req.set_primary(primary);
  for (const std::string& r : records) req.add_records(r);
  ReplicateRecordsResponse resp;
  auto done = std::make_shared<absl::Notification>();
  auto result = std::make_shared<absl::Status>();
  core.ReplicateRecords(req, &resp, [done, result](absl::Status s) {
    *result = s;
    done->Notify();
  });
  if (!done->WaitForNotificationWithTimeout(absl::Minutes(1))) {
    return absl::DeadlineExceededError("ReplicateRecords did not answer");
  }
  return *result;
}

absl::Status ImportRows(PsCore& core, const ImportRowsRequest& req, ImportRowsResponse* resp) {
  absl::Notification done;
  absl::Status result;
  core.ImportRows(req, resp, [&](absl::Status s) {
    result = s;
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

absl::Status BeginMove(PsCore& from, PsCore& to, uint64_t move,
                       const std::vector<uint32_t>& vshards) {
  MigrateBeginRequest begin;
  begin.set_move_id(move);
  for (uint32_t v : vshards) begin.add_vshards(v);
  MigrateBeginResponse begun;
  RETURN_IF_ERROR(from.MigrateBegin(begin, &begun));
  return to.BeginImport(move, vshards);
}

absl::Status CopyPhase(PsCore& from, PsCore& to, uint64_t move, MigrateExportRequest::Phase phase,
                       uint64_t max_bytes) {
  MigrateExportRequest req;
  req.set_move_id(move);
  req.set_phase(phase);
  req.set_max_bytes(max_bytes);
  for (;;) {
    MigrateExportResponse chunk;
    RETURN_IF_ERROR(from.MigrateExport(req, &chunk));
    uint64_t rows = 0, bytes = 0;
    RETURN_IF_ERROR(to.ImportChunk(chunk, &rows, &bytes));
    if (chunk.done()) return absl::OkStatus();
    req.set_cursor(chunk.next_cursor());
  }
}

TableSpec EmbSpec() {
  TableSpec spec;
  spec.set_name("emb");
  spec.set_dim(kDim);
  spec.mutable_optimizer()->set_kind(OptimizerSpec::ADAM);
  spec.mutable_initializer()->set_kind(InitializerSpec::NORMAL);
  spec.mutable_initializer()->set_stddev(0.1f);
  return spec;
}

TableSpec CountingSpec() {
  TableSpec spec = EmbSpec();
  spec.mutable_optimizer()->set_kind(OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_learning_rate(1.0f);
  spec.mutable_initializer()->Clear();
  spec.mutable_initializer()->set_kind(InitializerSpec::ZEROS);
  return spec;
}

TableSpec SpecOf(const std::string& name, OptimizerSpec::Kind optimizer) {
  TableSpec spec;
  spec.set_name(name);
  spec.set_dim(kDim);
  spec.mutable_optimizer()->set_kind(optimizer);
  return spec;
}

absl::Status CreateTable(PsCore& core, const TableSpec& spec) {
  CreateTableRequest req;
  *req.mutable_spec() = spec;
  CreateTableResponse resp;
  return core.CreateTable(req, &resp);
}

absl::Status CreateEmbTable(PsCore& core) { return CreateTable(core, EmbSpec()); }

std::map<int64_t, std::string> Rows(PsCore& core, const std::string& table) {
  std::map<int64_t, std::string> rows;
  auto t = core.store().FindTable(table);
  if (t == nullptr) return rows;
  const uint32_t dim = t->dim();
  t->ForEachRow([&](const RowView& r) {
    std::string& out = rows[r.id];
    out.append(reinterpret_cast<const char*>(r.weights), dim * sizeof(float));
    out.append(reinterpret_cast<const char*>(r.slots), t->slot_floats() * sizeof(float));
    out.append(reinterpret_cast<const char*>(&r.step), sizeof(r.step));
  });
  return rows;
}

std::vector<float> Weights(const std::string& row) {
  std::vector<float> w(kDim);
  if (row.size() >= kDim * sizeof(float)) std::memcpy(w.data(), row.data(), kDim * sizeof(float));
  return w;
}

void SetPeriodicUntimed(PsCoreOptions* pod) {
  pod->storage.log.durability = Durability::kPeriodic;
  pod->storage.log.flush_ms = 3600 * 1000;
  pod->storage.materialize_ms = 3600 * 1000;
  pod->eviction_interval_ms = 0;
}

void ReplicaPairFixture::SetUp() {
  options_ = Options();
  std::string templ = std::filesystem::temp_directory_path() / "ps_replica_test.XXXXXX";
  ASSERT_NE(mkdtemp(templ.data()), nullptr);
  root_ = templ;
  sender_ = std::make_shared<InProcessSender>();
  a_ = Open("a");
  b_ = Open("b");
  ASSERT_NE(a_, nullptr);
  ASSERT_NE(b_, nullptr);
  sender_->Add("a:1", a_.get());
  sender_->Add("b:1", b_.get());
  for (PsCore* core : {a_.get(), b_.get()}) {
    ASSERT_TRUE(CreateTable(*core, options_.emb).ok());
    core->RenewWriteLease(absl::Now() + absl::Hours(1));
  }
}

void ReplicaPairFixture::TearDown() {
  a_.reset();
  b_.reset();
  std::filesystem::remove_all(root_);
}

std::unique_ptr<PsCore> ReplicaPairFixture::Open(const std::string& name) {
  PsCoreOptions options = options_.pod;
  if (options_.durable) options.storage.db.dir = root_ + "/" + name;
  options.replica_sender = sender_;
  options.replicator.min_backoff = absl::Milliseconds(1);
  options.replicator.max_backoff = absl::Milliseconds(5);
  if (options_.per_pod) options_.per_pod(name, &options);
  auto core = PsCore::Open(options, *ShardOwnership::Create(kVShards, 0, {}));
  EXPECT_TRUE(core.ok()) << core.status();
  return core.ok() ? *std::move(core) : nullptr;
}

void ReplicaPairFixture::Stop(const std::string& name) {
  sender_->Remove(name + ":1");
  Pod(name).reset();
}

void ReplicaPairFixture::Restart(const std::string& name) {
  std::unique_ptr<PsCore>& pod = Pod(name);
  ASSERT_EQ(pod, nullptr) << name << " is running: Stop it first";
  pod = Open(name);
  ASSERT_NE(pod, nullptr);
  sender_->Add(name + ":1", pod.get());
  pod->RenewWriteLease(absl::Now() + absl::Hours(1));
}

void ReplicaPairFixture::Apply(PsCore& core, const Assignment& a) {
  ApplyAssignmentResponse resp;
  const absl::Status s = core.ApplyAssignment(a, &resp);
  ASSERT_TRUE(s.ok()) << s;
}

std::unique_ptr<PsCore>& ReplicaPairFixture::Pod(const std::string& name) {
  EXPECT_TRUE(name == "a" || name == "b") << "no pod " << name;
  return name == "a" ? a_ : b_;
}

ReplicaPairOptions ReplicaPairTest::Options() {
  ReplicaPairOptions options;
  options.durable = GetParam();
  return options;
}

std::string DurableOrInMemory(const testing::TestParamInfo<bool>& p) {
  return p.param ? "Durable" : "InMemory";
}

}  // namespace ps::replica_test
