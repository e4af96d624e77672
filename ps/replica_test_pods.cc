#include "ps/replica_test_pods.h"

#include <stdlib.h>

#include <filesystem>

#include "absl/synchronization/notification.h"
#include "proto/packed.h"

namespace ps::replica_test {

void InProcessSender::Add(const std::string& address, PsCore* core) {
  absl::MutexLock lock(&mu_);
  cores_[address] = core;
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
    core = cores_[follower.address()];
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

Assignment Role(uint64_t epoch, const std::string& pod, const std::vector<uint32_t>& owned,
                const std::vector<std::string>& followers,
                const std::map<std::string, std::vector<uint32_t>>& following,
                const std::vector<uint32_t>& in, const std::vector<uint32_t>& out) {
  Assignment a;
  a.set_epoch(epoch);
  a.set_num_vshards(kVShards);
  for (uint32_t v : owned) a.add_owned(v);
  for (uint32_t v : in) a.add_moving_in(v);
  for (uint32_t v : out) a.add_moving_out(v);
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

PushRequest MakePush(const std::vector<int64_t>& ids, float g, uint64_t worker, uint64_t seq) {
  PushRequest req;
  TableGrads* t = req.add_tables();
  t->set_table("emb");
  t->set_ids(Pack<int64_t>(ids));
  std::vector<float> grads(ids.size() * kDim);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = g * static_cast<float>(i % 7 + 1) / 3.0f;
  t->set_grads(Pack<float>(grads));
  req.mutable_key()->set_worker_id(worker);
  req.mutable_key()->set_incarnation(1);
  req.mutable_key()->set_sequence(seq);
  return req;
}

absl::Status CreateEmbTable(PsCore& core) {
  CreateTableRequest req;
  req.mutable_spec()->set_name("emb");
  req.mutable_spec()->set_dim(kDim);
  req.mutable_spec()->mutable_optimizer()->set_kind(OptimizerSpec::ADAM);
  req.mutable_spec()->mutable_initializer()->set_kind(InitializerSpec::NORMAL);
  req.mutable_spec()->mutable_initializer()->set_stddev(0.1f);
  CreateTableResponse resp;
  return core.CreateTable(req, &resp);
}

std::map<int64_t, std::string> Rows(PsCore& core) {
  std::map<int64_t, std::string> rows;
  auto t = core.store().FindTable("emb");
  if (t == nullptr) return rows;
  t->ForEachRow([&](const RowView& r) {
    std::string& out = rows[r.id];
    out.append(reinterpret_cast<const char*>(r.weights), kDim * sizeof(float));
    out.append(reinterpret_cast<const char*>(r.slots), t->slot_floats() * sizeof(float));
    out.append(reinterpret_cast<const char*>(&r.step), sizeof(r.step));
  });
  return rows;
}

void ReplicaPairTest::SetUp() {
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
    ASSERT_TRUE(CreateEmbTable(*core).ok());
    core->RenewWriteLease(absl::Now() + absl::Hours(1));
  }
}

void ReplicaPairTest::TearDown() {
  a_.reset();
  b_.reset();
  std::filesystem::remove_all(root_);
}

std::unique_ptr<PsCore> ReplicaPairTest::Open(const std::string& name) {
  PsCoreOptions options;
  if (GetParam()) options.storage.db.dir = root_ + "/" + name;
  options.replica_sender = sender_;
  options.replicator.min_backoff = absl::Milliseconds(1);
  options.replicator.max_backoff = absl::Milliseconds(5);
  auto core = PsCore::Open(options, *ShardOwnership::Create(kVShards, 0, {}));
  EXPECT_TRUE(core.ok()) << core.status();
  return core.ok() ? *std::move(core) : nullptr;
}

}  // namespace ps::replica_test
