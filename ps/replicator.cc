#include "ps/replicator.h"

#include <glog/logging.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <random>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/rpc/grpc_status.h"
#include "proto/ps.grpc.pb.h"
#include "proto/wire.h"

namespace ps {
namespace {

class GrpcReplicaSender final : public ReplicaSender {
 public:
  GrpcReplicaSender(ChannelMaker channels, absl::Duration timeout)
      : channels_(std::move(channels)), timeout_(timeout) {}

  absl::Status Send(const ReplicaPeer& follower, const ReplicateRecordsRequest& req,
                    ReplicateRecordsResponse* resp) override {
    ReplicateRecordsRequest header = req;
    header.clear_records();
    std::vector<std::shared_ptr<const std::string>> records;
    records.reserve(req.records_size());
    for (const std::string& r : req.records()) {
      records.push_back(std::make_shared<const std::string>(r));
    }
    return SendRecords(follower, header, records, resp);
  }

  // A raw call: the records go into the request as slices over their own bytes, never
  // copied into a protobuf serialization (the follower parses the stock message).
  absl::Status SendRecords(const ReplicaPeer& follower, const ReplicateRecordsRequest& header,
                           absl::Span<const std::shared_ptr<const std::string>> records,
                           ReplicateRecordsResponse* resp) override {
    grpc::GenericStub* stub = StubFor(follower.address());
    grpc::ByteBuffer request = wire::EncodeReplicateRecordsRequest(header, records);
    grpc::ByteBuffer response;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
    absl::Notification answered;
    grpc::Status status;
    stub->UnaryCall(&ctx, "/ps.ParameterServer/ReplicateRecords", grpc::StubOptions(), &request,
                    &response, [&](grpc::Status s) {
                      status = std::move(s);
                      answered.Notify();
                    });
    answered.WaitForNotification();
    if (!status.ok()) return FromGrpcStatus(status);
    if (!grpc::SerializationTraits<ReplicateRecordsResponse>::Deserialize(&response, resp).ok()) {
      return absl::InternalError(
          absl::StrCat("follower ", follower.pod_id(), " at ", follower.address(),
                       " answered ReplicateRecords with a message that does not parse"));
    }
    return absl::OkStatus();
  }

 private:
  grpc::GenericStub* StubFor(const std::string& address) {
    absl::MutexLock lock(&mu_);
    auto& stub = stubs_[address];
    if (stub == nullptr) {
      grpc::ChannelArguments args;
      args.SetMaxSendMessageSize(-1);
      stub = std::make_unique<grpc::GenericStub>(channels_.Make(address, args));
    }
    return stub.get();
  }

  const ChannelMaker channels_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<grpc::GenericStub>> stubs_ ABSL_GUARDED_BY(mu_);
};

// A random non-zero stream id: a follower tells this pod's streams (and its restarts) apart.
uint64_t NewStreamId() {
  static absl::Mutex mu(absl::kConstInit);
  static std::mt19937_64 rng ABSL_GUARDED_BY(mu){std::random_device{}()};
  absl::MutexLock lock(&mu);
  uint64_t id = 0;
  while (id == 0) id = rng();
  return id;
}

}  // namespace

absl::Status ReplicaSender::SendRecords(
    const ReplicaPeer& follower, const ReplicateRecordsRequest& header,
    absl::Span<const std::shared_ptr<const std::string>> records, ReplicateRecordsResponse* resp) {
  ReplicateRecordsRequest req = header;
  for (const auto& r : records) req.add_records(*r);
  return Send(follower, req, resp);
}

std::shared_ptr<ReplicaSender> NewGrpcReplicaSender(ChannelMaker channels, absl::Duration timeout) {
  return std::make_shared<GrpcReplicaSender>(std::move(channels), timeout);
}

// One shipped record's wait for its followers.
struct Replicator::Join {
  Join(int followers, Done d) : remaining(followers), done(std::move(d)) {}
  // Its `done` gets `s` (if not OK) whatever the followers answer (Depose).
  void Poison(const absl::Status& s) {
    absl::MutexLock lock(&mu);
    if (error.ok()) error = s;
  }
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
  absl::Time shipped;  // when Ship queued it: the age of the queue's head is the lag
};

struct Replicator::Stream {
  ReplicaPeer peer;
  uint64_t id = 0;  // names this stream to the follower (ReplicateRecordsRequest.stream)
  // Guarded by Replicator::mu_. Records are numbered from 0 in the stream; the follower
  // holds every record below `held`, and queue[i] is record held + i.
  std::deque<Entry> queue;
  uint64_t queued_bytes = 0;
  uint64_t shipped = 0;  // records ever queued (held + queue.size() while running)
  uint64_t held = 0, failed_calls = 0, sent_calls = 0, sent_bytes = 0;
  // The window: the next record to send, the calls in flight and their record bytes.
  uint64_t next_send = 0;
  int inflight = 0;
  int current_inflight = 0;  // of them, of the current generation
  uint64_t inflight_bytes = 0;
  // Bumped by a failed call of the current generation, which resends from `held`; the
  // generation's first batch carries `restart`, and the others wait until it is answered
  // (`opened`), so a follower that does not know the stream learns it first.
  uint64_t generation = 0;
  bool opened = false;
  absl::Time resume_at = absl::InfinitePast();  // backoff after a failed call
  absl::Duration backoff;
  uint64_t failures = 0;  // consecutive failed calls
  // Answered batches [first, end) that do not start at `held` yet (an earlier one is
  // still in flight), by first.
  std::map<uint64_t, uint64_t> answered;
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
  Reassign(pod_id, epoch, followers, nullptr);
}

void Replicator::Depose(const std::string& pod_id, uint64_t epoch,
                        const std::vector<ReplicaPeer>& followers, const Outcome& outcome) {
  Reassign(pod_id, epoch, followers, &outcome);
}

void Replicator::Reassign(const std::string& pod_id, uint64_t epoch,
                          const std::vector<ReplicaPeer>& followers, const Outcome* outcome) {
  std::vector<std::pair<std::string, std::deque<Entry>>> removed;
  // Deposed: each queued record's outcome, computed once (its streams share its Join).
  absl::flat_hash_map<const Join*, absl::Status> outcomes;
  auto outcome_of = [&](const Entry& e) -> const absl::Status& {
    auto [it, added] = outcomes.try_emplace(e.join.get());
    if (added) it->second = (*outcome)(*e.record);
    return it->second;
  };
  size_t failed = 0;
  {
    absl::MutexLock lock(&mu_);
    pod_id_ = pod_id;
    epoch_ = std::max(epoch_, epoch);
    // A follower still in the ack set at another address (it registered, or restarted
    // elsewhere) keeps its queue: those records still wait for it, sent to the new address.
    std::map<std::string, std::deque<Entry>> readdressed;
    for (auto it = streams_.begin(); it != streams_.end();) {
      auto peer = std::find_if(followers.begin(), followers.end(),
                               [&](const ReplicaPeer& p) { return p.pod_id() == it->first; });
      if (outcome != nullptr && peer != followers.end()) {
        // Still in the ack set (here or at a new address): its records keep waiting for it.
        for (const Entry& e : it->second->queue) {
          const absl::Status& s = outcome_of(e);
          if (!s.ok()) e.join->Poison(s);
        }
      }
      if (peer != followers.end() && peer->address() == it->second->peer.address()) {
        ++it;
        continue;
      }
      if (peer != followers.end()) {
        readdressed[it->first] = StopLocked(it->second.get());
      } else {
        removed.emplace_back(it->first, StopLocked(it->second.get()));
      }
      it = streams_.erase(it);
    }
    AddStreamsLocked(epoch, followers, &readdressed);
    if (outcome != nullptr) {
      for (auto& [id, queue] : removed) {
        for (const Entry& e : queue) outcome_of(e);
      }
      for (const auto& [join, s] : outcomes) failed += !s.ok();
    }
  }
  if (outcome != nullptr && !outcomes.empty()) {
    LOG(WARNING) << "deposed at epoch " << epoch << " with " << outcomes.size()
                 << " records not yet held by every follower: " << failed
                 << " of them fail (they hold rows of vshards this pod no longer leads), the "
                    "others complete here";
  }
  for (auto& [id, queue] : removed) {
    LOG(WARNING) << "follower " << id << " left the ack set with " << queue.size()
                 << " records not acknowledged by it: they no longer wait for it";
    for (Entry& e : queue) {
      e.join->Finish(outcome != nullptr ? outcomes.at(e.join.get()) : absl::OkStatus());
    }
  }
}

void Replicator::AddFollowers(const std::string& pod_id, uint64_t epoch,
                              const std::vector<ReplicaPeer>& followers) {
  absl::MutexLock lock(&mu_);
  pod_id_ = pod_id;
  epoch_ = std::max(epoch_, epoch);
  AddStreamsLocked(epoch, followers, nullptr);
}

void Replicator::AddStreamsLocked(uint64_t epoch, const std::vector<ReplicaPeer>& followers,
                                  std::map<std::string, std::deque<Entry>>* queues) {
  for (const ReplicaPeer& p : followers) {
    if (streams_.count(p.pod_id()) > 0) continue;
    auto stream = std::make_shared<Stream>();
    stream->peer = p;
    stream->id = NewStreamId();
    stream->backoff = options_.min_backoff;
    auto q = queues != nullptr ? queues->find(p.pod_id())
                               : std::map<std::string, std::deque<Entry>>::iterator();
    if (queues != nullptr && q != queues->end()) {  // readdressed: its records still wait
      stream->queue = std::move(q->second);
      for (const Entry& e : stream->queue) stream->queued_bytes += e.record->size();
      stream->shipped = stream->queue.size();
    }
    streams_[p.pod_id()] = stream;
    const int senders = std::max(1, options_.window);
    threads_ += senders;
    for (int i = 0; i < senders; ++i) {
      std::thread([this, stream] { Run(stream.get()); }).detach();
    }
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
  Ship(std::make_shared<const std::string>(std::move(record)), std::move(done));
}

void Replicator::Ship(std::shared_ptr<const std::string> record, Done done) {
  {
    absl::MutexLock lock(&mu_);
    if (!streams_.empty()) {
      auto join = std::make_shared<Join>(static_cast<int>(streams_.size()), std::move(done));
      const std::shared_ptr<const std::string>& shared = record;
      const absl::Time now = absl::Now();
      for (auto& [id, stream] : streams_) {
        stream->queue.push_back({shared, join, now});
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
    std::string pod;
    std::shared_ptr<Stream> stream;
    uint64_t shipped;
  };
  absl::MutexLock lock(&mu_);
  std::vector<Target> targets;
  for (auto& [id, stream] : streams_) targets.push_back({id, stream, stream->shipped});
  auto all_held = [this, &targets]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (Target& t : targets) {
      if (t.stream->stop) {
        // A stream stopped because its follower left the ack set holds nothing back. One
        // stopped because the follower is listed at a new address moved its records, not
        // yet held, to the new stream: wait for that one (before, the gate counted them
        // held, a round truncated their records while their keys were in progress, and
        // after a SIGKILL a retry applied twice: ps-crash-test --kills=8 --seed=43).
        auto now = streams_.find(t.pod);
        if (now == streams_.end() || now->second == t.stream) continue;
        t.stream = now->second;
        t.shipped = now->second->shipped;
      }
      if (t.stream->held < t.shipped) return false;
    }
    return true;
  };
  if (mu_.AwaitWithDeadline(absl::Condition(&all_held), deadline)) {
    // Every record is held; the callbacks of the batches that made them so have returned.
    const uint64_t before = next_callbacks_;
    auto returned = [this, before]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return running_callbacks_.empty() || *running_callbacks_.begin() >= before;
    };
    if (mu_.AwaitWithDeadline(absl::Condition(&returned), deadline)) return absl::OkStatus();
    return absl::DeadlineExceededError("callbacks of held records still running");
  }
  if (all_held()) return absl::OkStatus();
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
  for (;;) {
    ReplicateRecordsRequest req;  // the header: the records go in `batch`, not copied
    std::vector<std::shared_ptr<const std::string>> batch;
    ReplicaPeer peer;
    uint64_t first = 0, end = 0, bytes = 0, generation = 0;
    {
      absl::MutexLock lock(&mu_);
      // A batch may go when records wait unsent, the window has room and no backoff runs;
      // while a generation's first batch (restart) is unanswered it goes alone.
      for (;;) {
        if (stream->stop) {
          --threads_;
          return;
        }
        // The restart batch does not wait for calls of older generations: the follower
        // may hold those back until the records before them come again.
        const bool ready =
            stream->next_send < stream->held + stream->queue.size() &&
            (stream->opened ? stream->inflight < options_.window &&
                                  stream->inflight_bytes < options_.max_inflight_bytes
                            : stream->current_inflight == 0);
        if (ready && absl::Now() >= stream->resume_at) break;
        if (ready) {
          stream->cv.WaitWithDeadline(&mu_, stream->resume_at);
        } else {
          stream->cv.Wait(&mu_);
        }
      }
      first = stream->next_send;
      for (size_t i = first - stream->held; i < stream->queue.size(); ++i) {
        const std::shared_ptr<const std::string>& record = stream->queue[i].record;
        if (end > first && bytes + record->size() > options_.max_batch_bytes) break;
        batch.push_back(record);
        bytes += record->size();
        end = first + batch.size();
      }
      req.set_epoch(epoch_);
      req.set_primary(pod_id_);
      req.set_stream(stream->id);
      req.set_first(first);
      req.set_restart(!stream->opened);
      generation = stream->generation;
      stream->next_send = end;
      // Another sender may take what is left.
      if (end < stream->held + stream->queue.size() && stream->opened) stream->cv.Signal();
      ++stream->inflight;
      ++stream->current_inflight;
      stream->inflight_bytes += bytes;
      peer = stream->peer;  // SetFollowers may change its address
    }
    ReplicateRecordsResponse resp;
    absl::Status s = sender_->SendRecords(peer, req, batch, &resp);
    batch.clear();  // the sender may still hold them until they are on the wire
    std::vector<std::shared_ptr<Join>> held;
    uint64_t ticket = 0;
    {
      absl::MutexLock lock(&mu_);
      if (stream->stop) {  // whoever stopped the stream released its queue
        --threads_;
        return;
      }
      --stream->inflight;
      if (generation == stream->generation) --stream->current_inflight;
      stream->inflight_bytes -= bytes;
      stream->cv.SignalAll();  // the window has room again
      if (!s.ok()) {
        ++stream->failed_calls;
        // A failure of an older generation was resent already.
        if (generation == stream->generation) {
          if (stream->failures++ % 50 == 0) {
            LOG(WARNING) << "replicating records " << first << ".." << end - 1 << " to follower "
                         << stream->peer.pod_id() << " at " << stream->peer.address()
                         << " failed (attempt " << stream->failures << ", resending from record "
                         << stream->held << "): " << s;
          }
          ++stream->generation;
          stream->current_inflight = 0;
          stream->opened = false;
          stream->next_send = stream->held;
          stream->resume_at = absl::Now() + stream->backoff;
          stream->backoff = std::min(options_.max_backoff, stream->backoff * 2);
        }
        continue;
      }
      if (generation == stream->generation) {
        if (stream->failures > 0) {
          LOG(INFO) << "follower " << stream->peer.pod_id() << " reachable again after "
                    << stream->failures << " failed calls";
        }
        stream->failures = 0;
        stream->backoff = options_.min_backoff;
        stream->opened = true;
      }
      ++stream->sent_calls;
      stream->sent_bytes += bytes;
      // The follower applies a stream's records in number order, so it holds [first, end);
      // they count once every record before them is answered too.
      uint64_t& answered_end = stream->answered[first];
      answered_end = std::max(answered_end, end);
      while (!stream->answered.empty() && stream->answered.begin()->first <= stream->held) {
        const uint64_t to = stream->answered.begin()->second;
        stream->answered.erase(stream->answered.begin());
        for (; stream->held < to; ++stream->held) {
          stream->queued_bytes -= stream->queue.front().record->size();
          held.push_back(std::move(stream->queue.front().join));
          stream->queue.pop_front();
        }
      }
      stream->next_send = std::max(stream->next_send, stream->held);
      if (!held.empty()) {
        ticket = next_callbacks_++;
        running_callbacks_.insert(ticket);
      }
    }
    if (held.empty()) continue;
    for (auto& join : held) join->Finish(absl::OkStatus());
    absl::MutexLock lock(&mu_);
    running_callbacks_.erase(ticket);
  }
}

std::vector<Replicator::FollowerStats> Replicator::Stats() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  std::vector<FollowerStats> out;
  for (const auto& [id, stream] : streams_) {
    FollowerStats& f = out.emplace_back();
    f.pod_id = id;
    f.queued_records = stream->queue.size();
    f.queued_bytes = stream->queued_bytes;
    f.held_records = stream->held;
    f.failed_calls = stream->failed_calls;
    f.sent_calls = stream->sent_calls;
    f.sent_bytes = stream->sent_bytes;
    f.lag = stream->queue.empty() ? absl::ZeroDuration() : now - stream->queue.front().shipped;
  }
  return out;
}

}  // namespace ps
