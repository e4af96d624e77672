#include "ps/replicator.h"

#include <glog/logging.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_status.h"
#include "proto/ps.grpc.pb.h"

namespace ps {
namespace {

class GrpcReplicaSender final : public ReplicaSender {
 public:
  GrpcReplicaSender(ChannelMaker channels, absl::Duration timeout)
      : channels_(std::move(channels)), timeout_(timeout) {}

  absl::Status Send(const ReplicaPeer& follower, const ReplicateRecordsRequest& req,
                    ReplicateRecordsResponse* resp) override {
    ParameterServer::Stub* stub = StubFor(follower.address());
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
    return FromGrpcStatus(stub->ReplicateRecords(&ctx, req, resp));
  }

 private:
  ParameterServer::Stub* StubFor(const std::string& address) {
    absl::MutexLock lock(&mu_);
    auto& stub = stubs_[address];
    if (stub == nullptr) {
      grpc::ChannelArguments args;
      args.SetMaxSendMessageSize(-1);
      stub = ParameterServer::NewStub(channels_.Make(address, args));
    }
    return stub.get();
  }

  const ChannelMaker channels_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<ParameterServer::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<ReplicaSender> NewGrpcReplicaSender(ChannelMaker channels, absl::Duration timeout) {
  return std::make_shared<GrpcReplicaSender>(std::move(channels), timeout);
}

// One shipped record's wait for its followers.
struct Replicator::Join {
  Join(int followers, Done d) : remaining(followers), done(std::move(d)) {}
  void Finish(const absl::Status& s) {
    if (!s.ok()) {
      absl::MutexLock lock(&mu);
      if (error.ok()) error = s;
    }
    if (remaining.fetch_sub(1) != 1) return;
    absl::Status result;
    {
      absl::MutexLock lock(&mu);
      result = error;
    }
    done(result);
  }
  std::atomic<int> remaining;
  Done done;
  absl::Mutex mu;
  absl::Status error ABSL_GUARDED_BY(mu);
};

struct Replicator::Entry {
  std::shared_ptr<const std::string> record;
  std::shared_ptr<Join> join;
};

struct Replicator::Stream {
  ReplicaPeer peer;
  // Guarded by Replicator::mu_.
  std::deque<Entry> queue;
  uint64_t queued_bytes = 0;
  uint64_t shipped = 0;  // records ever queued (held + queue.size() while running)
  uint64_t held = 0, failed_calls = 0;
  bool stop = false;
  absl::CondVar cv;
};

Replicator::Replicator(std::shared_ptr<ReplicaSender> sender, ReplicatorOptions options)
    : sender_(std::move(sender)), options_(options) {}

Replicator::~Replicator() {
  Abandon(absl::UnavailableError("the pod is shutting down"));
  // The senders hold no entry any more; wait until each has seen its stop.
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* threads) { return *threads == 0; }, &threads_));
}

void Replicator::SetFollowers(const std::string& pod_id, uint64_t epoch,
                              const std::vector<ReplicaPeer>& followers) {
  std::vector<std::pair<std::string, std::deque<Entry>>> removed;
  {
    absl::MutexLock lock(&mu_);
    pod_id_ = pod_id;
    epoch_ = std::max(epoch_, epoch);
    for (auto it = streams_.begin(); it != streams_.end();) {
      const bool kept = std::any_of(followers.begin(), followers.end(), [&](const ReplicaPeer& p) {
        return p.pod_id() == it->first && p.address() == it->second->peer.address();
      });
      if (kept) {
        ++it;
        continue;
      }
      removed.emplace_back(it->first, StopLocked(it->second.get()));
      it = streams_.erase(it);
    }
    AddStreamsLocked(epoch, followers);
  }
  for (auto& [id, queue] : removed) {
    LOG(WARNING) << "follower " << id << " left the ack set with " << queue.size()
                 << " records not acknowledged by it: they no longer wait for it";
    for (Entry& e : queue) e.join->Finish(absl::OkStatus());
  }
}

void Replicator::AddFollowers(const std::string& pod_id, uint64_t epoch,
                              const std::vector<ReplicaPeer>& followers) {
  absl::MutexLock lock(&mu_);
  pod_id_ = pod_id;
  epoch_ = std::max(epoch_, epoch);
  AddStreamsLocked(epoch, followers);
}

void Replicator::AddStreamsLocked(uint64_t epoch, const std::vector<ReplicaPeer>& followers) {
  for (const ReplicaPeer& p : followers) {
    if (streams_.count(p.pod_id()) > 0) continue;
    auto stream = std::make_shared<Stream>();
    stream->peer = p;
    streams_[p.pod_id()] = stream;
    ++threads_;
    std::thread([this, stream] { Run(stream.get()); }).detach();
    LOG(INFO) << "replicating to follower " << p.pod_id() << " at " << p.address() << " (epoch "
              << epoch << ")";
  }
}

std::deque<Replicator::Entry> Replicator::StopLocked(Stream* stream) {
  stream->stop = true;
  stream->cv.SignalAll();
  stream->queued_bytes = 0;
  return std::move(stream->queue);
}

void Replicator::SetEpoch(uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  epoch_ = std::max(epoch_, epoch);
}

bool Replicator::active() const {
  absl::MutexLock lock(&mu_);
  return !streams_.empty();
}

void Replicator::Ship(std::string record, Done done) {
  {
    absl::MutexLock lock(&mu_);
    if (!streams_.empty()) {
      auto join = std::make_shared<Join>(static_cast<int>(streams_.size()), std::move(done));
      auto shared = std::make_shared<const std::string>(std::move(record));
      for (auto& [id, stream] : streams_) {
        stream->queue.push_back({shared, join});
        stream->queued_bytes += shared->size();
        ++stream->shipped;
        stream->cv.Signal();
      }
      return;
    }
  }
  done(absl::OkStatus());
}

absl::Status Replicator::WaitHeld(absl::Time deadline) {
  struct Target {
    std::shared_ptr<Stream> stream;
    uint64_t shipped;
  };
  absl::MutexLock lock(&mu_);
  std::vector<Target> targets;
  for (auto& [id, stream] : streams_) targets.push_back({stream, stream->shipped});
  auto all_held = [&targets]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (const Target& t : targets) {
      if (!t.stream->stop && t.stream->held < t.shipped) return false;
    }
    return true;
  };
  if (mu_.AwaitWithDeadline(absl::Condition(&all_held), deadline)) return absl::OkStatus();
  for (const Target& t : targets) {
    if (!t.stream->stop && t.stream->held < t.shipped) {
      return absl::DeadlineExceededError(absl::StrCat(
          "follower ", t.stream->peer.pod_id(), " at ", t.stream->peer.address(), " holds ",
          t.stream->held, " of the ", t.shipped, " records shipped to it; still behind"));
    }
  }
  return absl::OkStatus();
}

void Replicator::Abandon(const absl::Status& why) {
  std::vector<std::deque<Entry>> queues;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, stream] : streams_) queues.push_back(StopLocked(stream.get()));
    streams_.clear();
  }
  for (auto& queue : queues) {
    for (Entry& e : queue) e.join->Finish(why);
  }
}

void Replicator::Run(Stream* stream) {
  absl::Duration backoff = options_.min_backoff;
  uint64_t failures = 0;
  for (;;) {
    ReplicateRecordsRequest req;
    size_t batch = 0;
    {
      absl::MutexLock lock(&mu_);
      while (!stream->stop && stream->queue.empty()) stream->cv.Wait(&mu_);
      if (stream->stop) {
        --threads_;
        return;
      }
      size_t bytes = 0;
      for (const Entry& e : stream->queue) {
        if (batch > 0 && bytes + e.record->size() > options_.max_batch_bytes) break;
        req.add_records(*e.record);
        bytes += e.record->size();
        ++batch;
      }
      req.set_epoch(epoch_);
      req.set_primary(pod_id_);
    }
    ReplicateRecordsResponse resp;
    absl::Status s = sender_->Send(stream->peer, req, &resp);
    std::vector<std::shared_ptr<Join>> held;
    {
      absl::MutexLock lock(&mu_);
      if (stream->stop) {  // whoever stopped the stream released its queue
        --threads_;
        return;
      }
      if (!s.ok()) {
        ++stream->failed_calls;
        if (failures++ % 50 == 0) {
          LOG(WARNING) << "replicating " << batch << " records to follower "
                       << stream->peer.pod_id() << " at " << stream->peer.address()
                       << " failed (attempt " << failures << ", retrying): " << s;
        }
        stream->cv.WaitWithTimeout(&mu_, backoff);
        backoff = std::min(options_.max_backoff, backoff * 2);
        continue;
      }
      if (failures > 0) {
        LOG(INFO) << "follower " << stream->peer.pod_id() << " reachable again after " << failures
                  << " failed calls";
      }
      failures = 0;
      backoff = options_.min_backoff;
      for (size_t i = 0; i < batch; ++i) {
        stream->queued_bytes -= stream->queue.front().record->size();
        held.push_back(std::move(stream->queue.front().join));
        stream->queue.pop_front();
      }
      stream->held += batch;
    }
    for (auto& join : held) join->Finish(absl::OkStatus());
  }
}

std::vector<Replicator::FollowerStats> Replicator::Stats() const {
  absl::MutexLock lock(&mu_);
  std::vector<FollowerStats> out;
  for (const auto& [id, stream] : streams_) {
    FollowerStats& f = out.emplace_back();
    f.pod_id = id;
    f.queued_records = stream->queue.size();
    f.queued_bytes = stream->queued_bytes;
    f.held_records = stream->held;
    f.failed_calls = stream->failed_calls;
  }
  return out;
}

}  // namespace ps
