// ps-bench: one pull/push workload against three targets, so they can be compared:
//   --target=inproc  the embedding engine called directly (the upper limit)
//   --target=grpc    our PS pods through the C++ client (--servers=host:port,...)
//   --target=redis   Redis: MGET for pull, MGET + client-side optimizer + MSET for push
// The last line printed is one JSON object with the figures.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <hiredis/hiredis.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "benchmarks/workload.h"
#include "client/ps_client.h"
#include "client/security_flags.h"
#include "common/base/binary_init.h"
#include "common/routing/hash.h"
#include "embedding/embedding_table.h"
#include "embedding/spec.h"

DEFINE_string(target, "inproc", "inproc | grpc | redis");
DEFINE_string(servers, "127.0.0.1:50051", "grpc: PS pods host:port,... in --shard order");
DEFINE_string(master, "",
              "grpc: the master's host:port; the pods and the shard map come from it "
              "(--servers and --num_vshards are then ignored).");
DEFINE_string(redis, "127.0.0.1:6379", "redis: host:port");
DEFINE_string(op, "pull", "pull | push | mixed (alternating pull and push)");
DEFINE_int32(dim, 64, "Floats per row.");
DEFINE_int32(batch, 1024, "Ids per pull/push.");
DEFINE_uint64(rows, 1000000, "Id space [0, rows); all rows are created before timing.");
DEFINE_string(dist, "uniform", "Id distribution: uniform | zipf:S");
DEFINE_int32(inflight, 8,
             "Operations outstanding at once: async handles for grpc, connections (each "
             "with its own thread) for redis.");
DEFINE_int32(threads, 2,
             "Driver threads (inproc: threads calling the table; grpc with "
             "--drive=threads: threads issuing the in-flight operations).");
DEFINE_double(seconds, 10, "Timed duration.");
DEFINE_string(optimizer, "adagrad", "sgd | momentum | adagrad | adam | ftrl");
DEFINE_uint32(num_vshards, 256, "grpc: the pods' --num_vshards.");
DEFINE_int32(channels, 2, "grpc: connections the client opens to each pod.");
DEFINE_int32(completion_threads, 1,
             "grpc: the client's completion threads (ClientOptions::completion_threads), "
             "which receive the pods' answers and run the calls' completions.");
DEFINE_bool(populate, true, "Create every row before timing (steady-state figures).");
DEFINE_bool(show_stats, false, "grpc: print each pod's counters after the run.");
DEFINE_string(drive, "callbacks",
              "grpc: how the in-flight operations are kept going. callbacks: each of the "
              "--inflight chains starts its next operation from the completion callback "
              "of the last (Handle::Then), on the client's threads; threads: --threads "
              "driver threads each wait on their handles in turn (Handle::Wait) and start "
              "the next.");

DEFINE_string(value_type, "float32",
              "grpc pulls: the values' type on the wire, float32 | bfloat16 | float16 (2 bytes "
              "a value, rounded to nearest even by the pod). MB/s counts the wire's bytes.");
DEFINE_bool(widen, false,
            "grpc pulls with --value_type=bfloat16|float16: widen the values to float32 into "
            "the caller's buffer (PullSpec::out) instead of taking the raw 16-bit values "
            "(PullSpec::out_half).");

namespace ps {
namespace {

using Clock = std::chrono::steady_clock;

// One started operation; calling it waits for completion.
using Waiter = std::function<absl::Status()>;

// A target runs operations on batches; `slot` is a per-in-flight buffer index.
class Target {
 public:
  virtual ~Target() = default;
  virtual absl::Status Setup(const TableSpec& spec) = 0;
  virtual Waiter StartPull(const std::vector<int64_t>& ids, float* out) = 0;
  virtual Waiter StartPush(const std::vector<int64_t>& ids, const float* grads) = 0;
  // Operations each driver thread keeps outstanding.
  virtual int inflight_per_thread() const { return 1; }
  virtual int threads() const { return FLAGS_threads; }
  // Targets that can run an operation with a completion callback (RunChains drives them
  // without driver threads): starts it and returns; done(status) runs when it finishes,
  // on another thread or on this one.
  virtual bool has_callbacks() const { return false; }
  virtual void StartThen(bool pull, const std::vector<int64_t>& ids, float* out, const float* grads,
                         std::function<void(absl::Status)> done) {
    done(absl::UnimplementedError("no completion callbacks"));
  }
};

Waiter Done(absl::Status s = absl::OkStatus()) {
  return [s] { return s; };
}

class InprocTarget : public Target {
 public:
  absl::Status Setup(const TableSpec& spec) override {
    auto t = EmbeddingTable::Create(spec);
    if (!t.ok()) return t.status();
    table_ = std::move(t).value();
    return absl::OkStatus();
  }
  Waiter StartPull(const std::vector<int64_t>& ids, float* out) override {
    table_->Pull(ids, out, false);
    return Done();
  }
  Waiter StartPush(const std::vector<int64_t>& ids, const float* grads) override {
    table_->Push(ids, grads, 0);
    return Done();
  }

 private:
  std::unique_ptr<EmbeddingTable> table_;
};

class GrpcTarget : public Target {
 public:
  absl::Status Setup(const TableSpec& spec) override {
    ClientOptions o;
    o.servers = absl::StrSplit(FLAGS_servers, ',', absl::SkipEmpty());
    o.master = FLAGS_master;
    o.num_vshards = FLAGS_num_vshards;
    o.channels_per_server = FLAGS_channels;
    o.completion_threads = FLAGS_completion_threads;
    auto security = ChannelSecurityFromFlags();
    if (!security.ok()) return security.status();
    o.security = *std::move(security);
    auto c = PsClient::Connect(o);
    if (!c.ok()) return c.status();
    client_ = std::move(c).value();
    table_ = spec.name();
    return client_->CreateTable(spec);
  }
  Waiter StartPull(const std::vector<int64_t>& ids, float* out) override {
    auto h = std::make_shared<Handle>(Pull(ids, out));
    return [h] { return h->Wait(); };
  }
  // The pull of --value_type: 16-bit values go raw into `out`'s first half unless --widen.
  Handle Pull(const std::vector<int64_t>& ids, float* out) {
    PullOptions options;
    options.value_type = value_type_;
    PullSpec spec{table_, ids};
    if (value_type_ == FLOAT32 || FLAGS_widen) {
      spec.out = out;
    } else {
      spec.out_half = reinterpret_cast<uint16_t*>(out);
    }
    return client_->PullAsync({std::move(spec)}, options);
  }
  void set_value_type(ValueType type) { value_type_ = type; }
  Waiter StartPush(const std::vector<int64_t>& ids, const float* grads) override {
    auto h = std::make_shared<Handle>(client_->PushAsync({{table_, ids, grads}}));
    return [h] { return h->Wait(); };
  }
  int inflight_per_thread() const override {
    return std::max(1, FLAGS_inflight / std::max(1, FLAGS_threads));
  }
  bool has_callbacks() const override { return FLAGS_drive == "callbacks"; }
  void StartThen(bool pull, const std::vector<int64_t>& ids, float* out, const float* grads,
                 std::function<void(absl::Status)> done) override {
    Handle h = pull ? Pull(ids, out) : client_->PushAsync({{table_, ids, grads}});
    h.Then(std::move(done));
  }

  void PrintStats() {
    auto stats = client_->Stats();
    if (!stats.ok()) {
      std::printf("stats unavailable: %s\n", stats.status().ToString().c_str());
      return;
    }
    for (size_t p = 0; p < stats->size(); ++p) {
      const StatsResponse& s = (*stats)[p];
      std::printf(
          "pod %zu: %lu rows, %.1f MB, %lu pulls (%lu rows), %lu pushes (%lu rows), "
          "%lu duplicate pushes, %lu refused non-finite, up %.0f s\n",
          p, (unsigned long)s.rows(), s.memory_bytes() / 1e6, (unsigned long)s.pull_requests(),
          (unsigned long)s.pulled_rows(), (unsigned long)s.push_requests(),
          (unsigned long)s.pushed_rows(), (unsigned long)s.duplicate_pushes(),
          (unsigned long)s.rejected_nonfinite(), s.uptime_seconds());
    }
  }

 private:
  std::unique_ptr<PsClient> client_;
  std::string table_;
  ValueType value_type_ = FLOAT32;
};

// Redis as a PS: key = table name + 8 id bytes, value = the row's weights and optimizer
// slots (packed floats) + 8 bytes of step count. Each connection is used by one thread.
class RedisTarget : public Target {
 public:
  absl::Status Setup(const TableSpec& spec) override {
    spec_ = *NormalizeTableSpec(spec);
    optimizer_ = std::make_unique<Optimizer>(spec_.optimizer());
    initializer_ = std::make_unique<Initializer>(spec_.initializer());
    prefix_ = spec_.name() + ":";
    std::vector<std::string> hp = absl::StrSplit(FLAGS_redis, ':');
    if (hp.size() != 2) return absl::InvalidArgumentError("--redis wants host:port");
    for (int i = 0; i < threads(); ++i) {
      redisContext* c = redisConnect(hp[0].c_str(), std::atoi(hp[1].c_str()));
      if (c == nullptr || c->err) {
        return absl::UnavailableError(
            absl::StrCat("cannot connect to redis at ", FLAGS_redis, ": ", c ? c->errstr : "?"));
      }
      conns_.emplace_back(c, &redisFree);
    }
    return absl::OkStatus();
  }
  int threads() const override { return std::max(1, FLAGS_inflight); }

  Waiter StartPull(const std::vector<int64_t>& ids, float* out) override {
    std::vector<std::string> values;
    if (auto s = MGet(ids, &values); !s.ok()) return Done(s);
    const size_t row_bytes = spec_.dim() * sizeof(float);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (values[i].empty()) {
        initializer_->Fill(NameHash(spec_.name()), ids[i], out + i * spec_.dim(), spec_.dim());
      } else {
        std::memcpy(out + i * spec_.dim(), values[i].data(), row_bytes);
      }
    }
    return Done();
  }

  Waiter StartPush(const std::vector<int64_t>& ids, const float* grads) override {
    std::vector<std::string> values;
    if (auto s = MGet(ids, &values); !s.ok()) return Done(s);
    const uint32_t dim = spec_.dim();
    const size_t floats = dim * (1 + optimizer_->slots());
    for (size_t i = 0; i < ids.size(); ++i) {
      std::string& v = values[i];
      if (v.empty()) {  // a new row: initial weights and slots
        v.assign(floats * sizeof(float) + 8, '\0');
        float* f = reinterpret_cast<float*>(v.data());
        initializer_->Fill(NameHash(spec_.name()), ids[i], f, dim);
        optimizer_->InitSlots(f + dim, dim);
      }
      float* f = reinterpret_cast<float*>(v.data());
      uint64_t step;
      std::memcpy(&step, v.data() + floats * sizeof(float), 8);
      optimizer_->Apply(0, f, f + dim, &step, grads + i * dim, dim);
      std::memcpy(v.data() + floats * sizeof(float), &step, 8);
    }
    return Done(MSet(ids, values));
  }

  // Writes initial rows for [0, rows) with pipelined MSETs (the populate phase).
  absl::Status Populate(uint64_t rows) {
    const uint32_t dim = spec_.dim();
    const size_t floats = dim * (1 + optimizer_->slots());
    std::vector<int64_t> ids;
    std::vector<std::string> values;
    for (uint64_t id = 0; id < rows; ++id) {
      std::string v(floats * sizeof(float) + 8, '\0');
      float* f = reinterpret_cast<float*>(v.data());
      initializer_->Fill(NameHash(spec_.name()), id, f, dim);
      optimizer_->InitSlots(f + dim, dim);
      ids.push_back(id);
      values.push_back(std::move(v));
      if (ids.size() == 1024 || id + 1 == rows) {
        if (auto s = MSet(ids, values); !s.ok()) return s;
        ids.clear();
        values.clear();
      }
    }
    return absl::OkStatus();
  }

 private:
  redisContext* Conn() {
    thread_local int index = next_.fetch_add(1);
    return conns_[index % conns_.size()].get();
  }

  std::string Key(int64_t id) const {
    std::string k = prefix_;
    k.append(reinterpret_cast<const char*>(&id), sizeof(id));
    return k;
  }

  absl::Status MGet(const std::vector<int64_t>& ids, std::vector<std::string>* values) {
    std::vector<std::string> keys;
    std::vector<const char*> argv = {"MGET"};
    std::vector<size_t> lens = {4};
    keys.reserve(ids.size());
    for (int64_t id : ids) {
      keys.push_back(Key(id));
      argv.push_back(keys.back().data());
      lens.push_back(keys.back().size());
    }
    auto* reply = static_cast<redisReply*>(
        redisCommandArgv(Conn(), static_cast<int>(argv.size()), argv.data(), lens.data()));
    if (reply == nullptr) return absl::UnavailableError("redis MGET failed");
    std::unique_ptr<redisReply, void (*)(void*)> guard(reply, freeReplyObject);
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != ids.size()) {
      return absl::InternalError("redis MGET: unexpected reply");
    }
    values->resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      redisReply* e = reply->element[i];
      if (e->type == REDIS_REPLY_STRING) (*values)[i].assign(e->str, e->len);
    }
    return absl::OkStatus();
  }

  absl::Status MSet(const std::vector<int64_t>& ids, const std::vector<std::string>& values) {
    std::vector<std::string> keys;
    std::vector<const char*> argv = {"MSET"};
    std::vector<size_t> lens = {4};
    keys.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      keys.push_back(Key(ids[i]));
      argv.push_back(keys.back().data());
      lens.push_back(keys.back().size());
      argv.push_back(values[i].data());
      lens.push_back(values[i].size());
    }
    auto* reply = static_cast<redisReply*>(
        redisCommandArgv(Conn(), static_cast<int>(argv.size()), argv.data(), lens.data()));
    if (reply == nullptr) return absl::UnavailableError("redis MSET failed");
    freeReplyObject(reply);
    return absl::OkStatus();
  }

  TableSpec spec_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Initializer> initializer_;
  std::string prefix_;
  std::vector<std::unique_ptr<redisContext, void (*)(redisContext*)>> conns_;
  std::atomic<int> next_{0};
};

absl::StatusOr<OptimizerSpec::Kind> ParseOptimizer(const std::string& name) {
  static const std::pair<const char*, OptimizerSpec::Kind> kinds[] = {
      {"sgd", OptimizerSpec::SGD},
      {"momentum", OptimizerSpec::MOMENTUM},
      {"adagrad", OptimizerSpec::ADAGRAD},
      {"adam", OptimizerSpec::ADAM},
      {"ftrl", OptimizerSpec::FTRL}};
  for (const auto& [n, k] : kinds) {
    if (name == n) return k;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown --optimizer '", name, "'"));
}

struct Result {
  uint64_t rows = 0;
  std::vector<double> latencies_us;
  absl::Status status;
};

// Keeps --inflight operations going with completion callbacks: chain c starts its next
// batch from the callback of its last, until `stop`; returns when every chain has ended.
// A chain's callbacks run one after another (each starts the next), so its Result needs
// no lock.
void RunChains(Target* target, const Workload& workload, const std::vector<float>& grads,
               const std::atomic<bool>& stop, std::vector<Result>* results) {
  struct Chain {
    std::vector<float> out;
    size_t next_batch = 0;
    uint64_t issued = 0;
    Clock::time_point started;
    std::function<void()> issue;
  };
  absl::Mutex mu;
  int live = FLAGS_inflight;
  std::vector<Chain> chains(FLAGS_inflight);
  results->assign(FLAGS_inflight, Result());
  for (int c = 0; c < FLAGS_inflight; ++c) {
    Chain& chain = chains[c];
    Result& r = (*results)[c];
    chain.out.resize(static_cast<size_t>(FLAGS_batch) * FLAGS_dim);
    chain.next_batch = static_cast<size_t>(c) * 7;
    chain.issue = [&, target] {
      const auto& ids = workload.batches[chain.next_batch++ % workload.batches.size()];
      const bool pull = FLAGS_op == "pull" || (FLAGS_op == "mixed" && chain.issued % 2 == 0);
      ++chain.issued;
      chain.started = Clock::now();
      target->StartThen(pull, ids, chain.out.data(), grads.data(), [&](absl::Status s) {
        if (s.ok()) {
          r.rows += FLAGS_batch;
          r.latencies_us.push_back(
              std::chrono::duration<double, std::micro>(Clock::now() - chain.started).count());
        } else {
          r.status = s;
        }
        if (s.ok() && !stop.load(std::memory_order_relaxed)) return chain.issue();
        absl::MutexLock lock(&mu);
        --live;
      });
    };
  }
  for (Chain& chain : chains) chain.issue();
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(
      +[](int* n) { return *n == 0; }, &live));
}

int Run() {
  auto kind = ParseOptimizer(FLAGS_optimizer);
  if (!kind.ok() || FLAGS_dim < 1 || FLAGS_batch < 1 || FLAGS_threads < 1 || FLAGS_inflight < 1 ||
      !(FLAGS_seconds > 0) || (FLAGS_op != "pull" && FLAGS_op != "push" && FLAGS_op != "mixed") ||
      (FLAGS_drive != "callbacks" && FLAGS_drive != "threads")) {
    std::fprintf(stderr, "ps-bench: bad flags (%s); see --help\n",
                 kind.ok() ? "check op/dim/batch/threads/inflight/seconds/drive"
                           : std::string(kind.status().message()).c_str());
    return 2;
  }
  TableSpec spec;
  spec.set_name(absl::StrCat("bench_d", FLAGS_dim, "_", FLAGS_optimizer));
  spec.set_dim(FLAGS_dim);
  spec.mutable_initializer()->set_kind(InitializerSpec::UNIFORM);
  spec.mutable_initializer()->set_low(-0.01f);
  spec.mutable_initializer()->set_high(0.01f);
  spec.mutable_optimizer()->set_kind(*kind);

  ValueType value_type;
  if (!ValueType_Parse(absl::AsciiStrToUpper(FLAGS_value_type), &value_type)) {
    std::fprintf(stderr, "ps-bench: unknown --value_type '%s' (float32, bfloat16, float16)\n",
                 FLAGS_value_type.c_str());
    return 2;
  }
  if (value_type != FLOAT32 && FLAGS_target != "grpc") {
    std::fprintf(stderr, "ps-bench: --value_type applies to --target=grpc only\n");
    return 2;
  }
  std::unique_ptr<Target> target;
  if (FLAGS_target == "inproc") {
    target = std::make_unique<InprocTarget>();
  } else if (FLAGS_target == "grpc") {
    auto grpc = std::make_unique<GrpcTarget>();
    grpc->set_value_type(value_type);
    target = std::move(grpc);
  } else if (FLAGS_target == "redis") {
    target = std::make_unique<RedisTarget>();
  } else {
    std::fprintf(stderr, "ps-bench: unknown --target '%s'\n", FLAGS_target.c_str());
    return 2;
  }
  if (auto s = target->Setup(spec); !s.ok()) {
    std::fprintf(stderr, "ps-bench: setup failed: %s\n", s.ToString().c_str());
    return 1;
  }

  const int threads = target->threads();
  const int per_thread = target->inflight_per_thread();
  const bool callbacks = target->has_callbacks();
  // Enough batches to cover the id space (up to 4096 of them), so the rows a run touches
  // are not just a cache-resident few.
  const size_t num_batches = std::clamp<size_t>(FLAGS_rows / FLAGS_batch, 64, 4096);
  auto workload = MakeWorkload(FLAGS_dist, FLAGS_rows, FLAGS_batch, num_batches, 42);
  if (!workload.ok()) {
    std::fprintf(stderr, "ps-bench: %s\n", workload.status().ToString().c_str());
    return 2;
  }
  std::vector<float> grads(static_cast<size_t>(FLAGS_batch) * FLAGS_dim);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.001f * static_cast<float>(i % 13) - 0.006f;

  if (FLAGS_populate) {
    const auto t0 = Clock::now();
    if (auto* redis = dynamic_cast<RedisTarget*>(target.get())) {
      if (auto s = redis->Populate(FLAGS_rows); !s.ok()) {
        std::fprintf(stderr, "ps-bench: populate failed: %s\n", s.ToString().c_str());
        return 1;
      }
    } else {
      std::vector<int64_t> ids;
      std::vector<float> out(static_cast<size_t>(FLAGS_batch) * FLAGS_dim);
      for (uint64_t id = 0; id < FLAGS_rows; ++id) {
        ids.push_back(static_cast<int64_t>(id));
        if (ids.size() == static_cast<size_t>(FLAGS_batch) || id + 1 == FLAGS_rows) {
          if (auto s = target->StartPull(ids, out.data())(); !s.ok()) {
            std::fprintf(stderr, "ps-bench: populate failed: %s\n", s.ToString().c_str());
            return 1;
          }
          ids.clear();
        }
      }
    }
    std::printf("populated %lu rows in %.1f s\n", static_cast<unsigned long>(FLAGS_rows),
                std::chrono::duration<double>(Clock::now() - t0).count());
  }

  std::vector<Result> results(threads);
  std::atomic<bool> stop{false};
  std::vector<std::thread> drivers;
  const auto start = Clock::now();
  if (callbacks) {
    drivers.emplace_back([&] { RunChains(target.get(), *workload, grads, stop, &results); });
  }
  for (int t = 0; !callbacks && t < threads; ++t) {
    drivers.emplace_back([&, t] {
      Result& r = results[t];
      std::vector<std::vector<float>> outs(
          per_thread, std::vector<float>(static_cast<size_t>(FLAGS_batch) * FLAGS_dim));
      struct Pending {
        Waiter wait;
        Clock::time_point started;
      };
      std::vector<Pending> ring(per_thread);
      size_t next_batch = t * 7;
      uint64_t issued = 0;
      auto issue = [&](int slot) {
        const auto& ids = workload->batches[next_batch++ % workload->batches.size()];
        const bool pull = FLAGS_op == "pull" || (FLAGS_op == "mixed" && issued % 2 == 0);
        ++issued;
        ring[slot].started = Clock::now();
        ring[slot].wait =
            pull ? target->StartPull(ids, outs[slot].data()) : target->StartPush(ids, grads.data());
      };
      for (int s = 0; s < per_thread; ++s) issue(s);
      for (int slot = 0;; slot = (slot + 1) % per_thread) {
        absl::Status s = ring[slot].wait();
        const auto now = Clock::now();
        if (!s.ok()) {
          r.status = s;
          stop = true;
          break;
        }
        r.rows += FLAGS_batch;
        r.latencies_us.push_back(
            std::chrono::duration<double, std::micro>(now - ring[slot].started).count());
        if (stop.load(std::memory_order_relaxed)) {
          // Drain the others before leaving.
          for (int k = 1; k < per_thread; ++k) (void)ring[(slot + k) % per_thread].wait();
          break;
        }
        issue(slot);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(FLAGS_seconds));
  stop = true;
  for (auto& d : drivers) d.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();

  uint64_t rows = 0;
  std::vector<double> lat;
  for (const Result& r : results) {
    if (!r.status.ok()) {
      std::fprintf(stderr, "ps-bench: operation failed: %s\n", r.status.ToString().c_str());
      return 1;
    }
    rows += r.rows;
    lat.insert(lat.end(), r.latencies_us.begin(), r.latencies_us.end());
  }
  std::sort(lat.begin(), lat.end());
  auto pct = [&](double p) {
    return lat.empty() ? 0.0 : lat[std::min(lat.size() - 1, static_cast<size_t>(p * lat.size()))];
  };
  if (auto* grpc = dynamic_cast<GrpcTarget*>(target.get()); grpc != nullptr && FLAGS_show_stats) {
    grpc->PrintStats();
  }
  const double rows_per_s = rows / elapsed;
  const size_t value_bytes = value_type == FLOAT32 ? sizeof(float) : sizeof(uint16_t);
  const double mb_per_s =
      rows_per_s * FLAGS_dim * (FLAGS_op == "pull" ? value_bytes : sizeof(float)) / 1e6;
  std::printf("%s %s: %.0f rows/s, %.0f MB/s, %lu ops, p50 %.0f us, p99 %.0f us\n",
              FLAGS_target.c_str(), FLAGS_op.c_str(), rows_per_s, mb_per_s,
              static_cast<unsigned long>(lat.size()), pct(0.5), pct(0.99));
  std::printf(
      "{\"target\":\"%s\",\"op\":\"%s\",\"dim\":%d,\"batch\":%d,\"inflight\":%d,\"threads\":%d,"
      "\"drive\":\"%s\",\"value_type\":\"%s\",\"widen\":%s,\"rows\":%lu,\"dist\":\"%s\","
      "\"optimizer\":\"%s\",\"seconds\":%.2f,\"rows_"
      "per_s\":%.0f,"
      "\"mb_per_s\":%.1f,\"p50_us\":%.0f,\"p99_us\":%.0f}\n",
      FLAGS_target.c_str(), FLAGS_op.c_str(), FLAGS_dim, FLAGS_batch,
      callbacks ? FLAGS_inflight : threads * per_thread, callbacks ? 0 : threads,
      callbacks ? "callbacks" : "threads", FLAGS_value_type.c_str(), FLAGS_widen ? "true" : "false",
      static_cast<unsigned long>(FLAGS_rows), FLAGS_dist.c_str(), FLAGS_optimizer.c_str(), elapsed,
      rows_per_s, mb_per_s, pct(0.5), pct(0.99));
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  ps::InitBinary(
      &argc, &argv,
      "ps-bench: pull/push throughput and latency of the PS against in-process and Redis.\n"
      "Usage: ps-bench --target=inproc|grpc|redis [--servers=h:p,... | --master=h:p] "
      "[--redis=h:p]\n"
      "                --op=pull|push|mixed --dim=64 --batch=1024 --rows=1000000\n"
      "                --dist=uniform|zipf:S --inflight=8 --seconds=10 --optimizer=adagrad",
      __FILE__);
  return ps::Run();
}
