// grpc-ceiling: what gRPC itself costs on this machine, with no parameter-server work.
//
// A server process answers every call with the same preallocated response (a shared slice:
// no copy, no table, no serialization); the client keeps --inflight calls in flight over
// --channels connections, starting the next call from each completion callback, and
// copies each response into its own buffer as PsClient does. The messages have the sizes
// of a pull (or, with --op=push, a push) of --batch rows of --dim floats. So rows/s here is
// what gRPC alone reaches on this machine with nothing else to do, and the CPU per call is
// gRPC's share of ours (see docs/benchmarks.md).
//
//   build/bin/grpc-ceiling --batch=1024 --dim=64 --inflight=8 --seconds=5
//
// The server is a forked child on 127.0.0.1 (port 0), stopped by process id. The last line
// is one JSON object: batch, dim, inflight, channels, rows_per_s, mb_per_s, calls_per_s,
// and the CPU time (user + system) per call of the server and of the client.
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/binary_init.h"
#include "common/base/work_pool.h"
#include "gflags/gflags.h"

DEFINE_int32(batch, 1024, "Rows per call (the request carries 8 bytes per row).");
DEFINE_int32(dim, 64, "Floats per row.");
DEFINE_string(op, "pull",
              "pull: the request carries 8 bytes per row (ids), the response 4 * dim (rows); "
              "push: the request carries 8 + 4 * dim bytes per row (ids and gradients), the "
              "response 16 bytes.");
DEFINE_int32(inflight, 8, "Calls kept in flight.");
DEFINE_int32(channels, 2, "Connections from the client to the server.");
DEFINE_double(seconds, 5, "Timed duration (after a 0.5 s warm-up).");
DEFINE_int32(client_cq_threads, 0,
             "0: the client uses gRPC's callback API; N: the completion-queue API, with N "
             "threads each polling its own queue.");
DEFINE_int32(server_cq_threads, 0,
             "0: the server uses gRPC's callback API; N: the completion-queue API, with N "
             "threads each polling its own queue and answering the calls it receives.");
DEFINE_int32(
    server_work_us, 0,
    "CPU time the server spins per call before answering (a stand-in for the table's work).");
DEFINE_int32(server_threads, 0,
             "If > 0, the server hands each call to one of this many threads before "
             "answering (as ps-server's --threads pool does); 0: it answers on gRPC's thread.");

namespace {

void Work() {
  if (FLAGS_server_work_us <= 0) return;
  timespec t0, t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
  do {
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  } while ((t.tv_sec - t0.tv_sec) * 1000000 + (t.tv_nsec - t0.tv_nsec) / 1000 <
           FLAGS_server_work_us);
}

double CpuSeconds(const rusage& u) {
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec +
         u.ru_stime.tv_usec * 1e-6;
}

grpc::ByteBuffer FixedBuffer(size_t bytes) {
  std::string data(bytes, '\x5a');
  grpc::Slice slice(data);
  return grpc::ByteBuffer(&slice, 1);
}

// Answers each call with `response` (copies of a ByteBuffer share its slices).
class Reactor final : public grpc::ServerGenericBidiReactor {
 public:
  Reactor(const grpc::ByteBuffer& response, ps::WorkPool* pool) : response_(response), pool_(pool) {
    StartRead(&request_);
  }
  void OnReadDone(bool ok) override;
  void Answer() {
    Work();
    StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
  }
  void OnWriteDone(bool) override {}
  void OnDone() override { delete this; }  // gRPC's reactor contract: the reactor owns itself

 private:
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  ps::WorkPool* pool_;
};

void Reactor::OnReadDone(bool ok) {
  if (!ok) {
    Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request"));
    return;
  }
  if (pool_ != nullptr) {
    // ps-server's own work pool, as its pulls and pushes use it.
    if (!pool_->TrySubmit([this] { Answer(); })) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "work queue is full"));
    }
  } else {
    Answer();
  }
}

class Service final : public grpc::CallbackGenericService {
 public:
  Service(size_t response_bytes, ps::WorkPool* pool)
      : response_(FixedBuffer(response_bytes)), pool_(pool) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    return new Reactor(response_, pool_);  // deletes itself in OnDone
  }

 private:
  const grpc::ByteBuffer response_;
  ps::WorkPool* pool_;
};

// A call of the completion-queue server: requested, read, answered, then requested again.
struct CqCall {
  grpc::AsyncGenericService* service;
  grpc::ServerCompletionQueue* cq;
  const grpc::ByteBuffer* response;
  std::unique_ptr<grpc::GenericServerContext> ctx;
  std::unique_ptr<grpc::GenericServerAsyncReaderWriter> stream;
  grpc::ByteBuffer request;
  enum { kRequested, kRead, kFinished } state = kRequested;

  void Request() {
    ctx = std::make_unique<grpc::GenericServerContext>();
    stream = std::make_unique<grpc::GenericServerAsyncReaderWriter>(ctx.get());
    state = kRequested;
    service->RequestCall(ctx.get(), stream.get(), cq, cq, this);
  }
  void Proceed(bool ok) {
    switch (state) {
      case kRequested:
        if (!ok) return;
        state = kRead;
        stream->Read(&request, this);
        return;
      case kRead:
        state = kFinished;
        Work();
        stream->WriteAndFinish(*response, grpc::WriteOptions(), grpc::Status::OK, this);
        return;
      case kFinished:
        Request();
        return;
    }
  }
};

// The server: gRPC's callback API (answering on gRPC's thread or, with --server_threads,
// on a WorkPool), or with --server_cq_threads the completion-queue API.
[[noreturn]] void Serve(int port_pipe, size_t response_bytes) {
  std::unique_ptr<ps::WorkPool> pool;
  if (FLAGS_server_threads > 0) {
    pool = std::make_unique<ps::WorkPool>(ps::WorkPoolOptions{FLAGS_server_threads, 1024});
  }
  Service service(response_bytes, pool.get());
  const grpc::ByteBuffer response = FixedBuffer(response_bytes);
  grpc::AsyncGenericService cq_service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.SetMaxSendMessageSize(64 << 20);
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs;
  if (FLAGS_server_cq_threads > 0) {
    builder.RegisterAsyncGenericService(&cq_service);
    for (int t = 0; t < FLAGS_server_cq_threads; ++t) cqs.push_back(builder.AddCompletionQueue());
  } else {
    builder.RegisterCallbackGenericService(&service);
  }
  auto server = builder.BuildAndStart();
  if (server == nullptr) _exit(1);
  std::vector<std::unique_ptr<CqCall>> calls;
  std::vector<std::thread> threads;
  for (auto& cq : cqs) {
    for (int k = 0; k < 16; ++k) {
      calls.push_back(std::make_unique<CqCall>());
      calls.back()->service = &cq_service;
      calls.back()->cq = cq.get();
      calls.back()->response = &response;
      calls.back()->Request();
    }
    threads.emplace_back([q = cq.get()] {
      void* tag;
      bool ok;
      while (q->Next(&tag, &ok)) static_cast<CqCall*>(tag)->Proceed(ok);
    });
  }
  if (write(port_pipe, &port, sizeof(port)) != sizeof(port)) _exit(1);
  close(port_pipe);
  pause();  // until the parent's SIGTERM; the default action ends the process
  _exit(0);
}

struct ClientState {
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  grpc::ByteBuffer request;
  std::atomic<bool> stop{false};
  std::atomic<bool> counting{false};
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> started{0};
  std::atomic<int> live{0};
  std::atomic<bool> failed{false};
  size_t response_bytes = 0;
  absl::Mutex mu;
  std::vector<std::unique_ptr<grpc::CompletionQueue>> cqs;
};

// One call slot: issues a call, and on completion copies the response out and issues the
// next, until stopped.
struct Slot {
  ClientState* state;
  std::unique_ptr<grpc::ClientContext> ctx;
  grpc::ByteBuffer response;
  std::vector<char> out;

  grpc::CompletionQueue* cq = nullptr;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call;
  grpc::Status status;

  void Start() {
    ctx = std::make_unique<grpc::ClientContext>();
    const uint64_t n = state->started.fetch_add(1);
    grpc::GenericStub& stub = *state->stubs[n % state->stubs.size()];
    if (cq != nullptr) {
      call = stub.PrepareUnaryCall(ctx.get(), "/bench.Ceiling/Pull", state->request, cq);
      call->StartCall();
      call->Finish(&response, &status, this);
      return;
    }
    stub.UnaryCall(ctx.get(), "/bench.Ceiling/Pull", grpc::StubOptions(), &state->request,
                   &response, [this](grpc::Status s) { Done(s); });
  }

  void Done(const grpc::Status& s) {
    if (!s.ok()) {
      std::fprintf(stderr, "grpc-ceiling: call failed: %s\n", s.error_message().c_str());
      state->failed = true;
    } else {
      std::vector<grpc::Slice> slices;
      (void)response.Dump(&slices);
      size_t at = 0;
      for (const grpc::Slice& sl : slices) {
        const size_t n = std::min(sl.size(), out.size() - at);
        std::memcpy(out.data() + at, sl.begin(), n);
        at += n;
      }
      if (state->counting.load(std::memory_order_relaxed)) state->calls.fetch_add(1);
    }
    if (state->stop.load() || state->failed.load()) {
      absl::MutexLock lock(&state->mu);
      state->live.fetch_sub(1);
      return;
    }
    Start();
  }
};

}  // namespace

int main(int argc, char** argv) {
  ps::InitBinary(&argc, &argv,
                 "Measures gRPC alone on loopback: a server answering every call with a "
                 "fixed response the size of a pull, and a client keeping calls in flight.\n"
                 "  grpc-ceiling --batch=1024 --dim=64 --inflight=8 --seconds=5",
                 __FILE__);
  if (FLAGS_batch < 1 || FLAGS_dim < 1 || FLAGS_inflight < 1 || FLAGS_channels < 1 ||
      !(FLAGS_seconds > 0)) {
    std::fprintf(stderr,
                 "grpc-ceiling: --batch, --dim, --inflight, --channels and --seconds "
                 "must be positive\n");
    return 2;
  }
  if (FLAGS_op != "pull" && FLAGS_op != "push") {
    std::fprintf(stderr, "grpc-ceiling: --op must be pull or push, not %s\n", FLAGS_op.c_str());
    return 2;
  }
  const size_t rows_bytes = size_t{4} * FLAGS_dim * FLAGS_batch;
  const size_t ids_bytes = size_t{8} * FLAGS_batch;
  const size_t request_bytes = FLAGS_op == "pull" ? ids_bytes : ids_bytes + rows_bytes;
  const size_t response_bytes = FLAGS_op == "pull" ? rows_bytes : 16;

  int fds[2];
  if (pipe(fds) != 0) return 1;
  const pid_t child = fork();  // before any gRPC state exists in this process
  if (child < 0) return 1;
  if (child == 0) {
    close(fds[0]);
    Serve(fds[1], response_bytes);
  }
  close(fds[1]);
  int port = 0;
  if (read(fds[0], &port, sizeof(port)) != sizeof(port)) {
    std::fprintf(stderr, "grpc-ceiling: the server did not start\n");
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    return 1;
  }
  close(fds[0]);

  ClientState state;
  state.response_bytes = response_bytes;
  state.request = FixedBuffer(request_bytes);
  for (int c = 0; c < FLAGS_channels; ++c) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    args.SetInt("bench.channel_index", c);
    auto channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                             grpc::InsecureChannelCredentials(), args);
    state.stubs.push_back(std::make_unique<grpc::GenericStub>(channel));
  }
  std::vector<std::thread> pollers;
  for (int t = 0; t < FLAGS_client_cq_threads; ++t) {
    state.cqs.push_back(std::make_unique<grpc::CompletionQueue>());
  }
  std::vector<std::unique_ptr<Slot>> slots;
  for (int i = 0; i < FLAGS_inflight; ++i) {
    auto slot = std::make_unique<Slot>();
    slot->state = &state;
    if (!state.cqs.empty()) slot->cq = state.cqs[i % state.cqs.size()].get();
    slot->out.resize(response_bytes);
    slots.push_back(std::move(slot));
  }
  state.live = FLAGS_inflight;
  for (auto& s : slots) s->Start();
  for (auto& cq : state.cqs) {
    pollers.emplace_back([q = cq.get()] {
      void* tag;
      bool ok;
      while (q->Next(&tag, &ok)) {
        Slot* slot = static_cast<Slot*>(tag);
        slot->Done(ok ? slot->status : grpc::Status(grpc::StatusCode::UNKNOWN, "cq"));
      }
    });
  }

  using Clock = std::chrono::steady_clock;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  rusage self0{}, self1{};
  getrusage(RUSAGE_SELF, &self0);
  // The child's CPU so far, from /proc (it has not exited).
  auto child_cpu = [child] {
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(child));
    FILE* f = std::fopen(path, "r");
    if (f == nullptr) return 0.0;
    char buf[1024];
    size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    buf[n] = 0;
    const char* p = std::strrchr(buf, ')');  // fields after the command name
    unsigned long utime = 0, stime = 0;
    if (p != nullptr) {
      std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime);
    }
    return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  };
  const double server0 = child_cpu();
  const auto t0 = Clock::now();
  state.counting = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(FLAGS_seconds));
  state.counting = false;
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  const uint64_t calls = state.calls.load();
  getrusage(RUSAGE_SELF, &self1);
  const double server1 = child_cpu();
  state.stop = true;
  while (state.live.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  for (auto& cq : state.cqs) cq->Shutdown();
  for (auto& t : pollers) t.join();
  kill(child, SIGTERM);
  waitpid(child, nullptr, 0);
  if (state.failed || calls == 0) return 1;

  const double per_s = calls / elapsed;
  std::printf(
      "{\"op\":\"%s\",\"batch\":%d,\"dim\":%d,\"inflight\":%d,\"channels\":%d,\"server_threads\":%"
      "d,"
      "\"rows_per_s\":%.0f,\"mb_per_s\":%.1f,\"calls_per_s\":%.0f,"
      "\"server_cpu_us_per_call\":%.1f,\"client_cpu_us_per_call\":%.1f}\n",
      FLAGS_op.c_str(), FLAGS_batch, FLAGS_dim, FLAGS_inflight, FLAGS_channels,
      FLAGS_server_threads, per_s * FLAGS_batch, per_s * rows_bytes / 1e6, per_s,
      (server1 - server0) / calls * 1e6, (CpuSeconds(self1) - CpuSeconds(self0)) / calls * 1e6);
  return 0;
}
