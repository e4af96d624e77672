// lifecycle-bench: pushes a Zipf id stream into one in-process pod (PsCore, the pod's own
// push path and eviction thread, no network) and reports, once a second and at the end,
// the resident rows, the process's RSS, rows evicted and push rows/s. For the figures of
// feature eviction (issue 17: max_rows bounds memory under an unbounded id space) and
// admission (rows created with and without admit_after). Batches are drawn before the
// clock starts (benchmarks/workload.h).
//
//   lifecycle-bench --rows=50000000 --dist=zipf:1.1 --max_rows=1000000 --batches=20000
//   lifecycle-bench --rows=50000000 --dist=zipf:1.1 --max_rows=0 --batches=20000
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "benchmarks/workload.h"
#include "common/base/binary_init.h"
#include "gflags/gflags.h"
#include "proto/packed.h"
#include "ps/ps_core.h"

DEFINE_uint64(rows, 50000000, "Distinct ids the stream draws from");
DEFINE_string(dist, "zipf:1.1", "Id distribution: uniform | zipf:S");
DEFINE_uint64(batch, 1024, "Ids per push");
DEFINE_uint64(batches, 20000, "Pushes in all (drawn before the clock starts)");
DEFINE_uint32(dim, 16, "Embedding dimension");
DEFINE_uint64(max_rows, 1000000, "EvictionSpec.max_rows of the table; 0: no cap");
DEFINE_uint64(ttl_s, 0, "EvictionSpec.ttl_seconds; 0: none");
DEFINE_bool(lru, false, "Evict the least recently (not frequently) updated rows");
DEFINE_uint32(admit_after, 0, "AdmissionSpec.min_count; 0 or 1: every id admitted");
DEFINE_int32(eviction_interval_ms, 1000, "How often the pod's eviction pass runs");
DEFINE_string(data_dir, "", "A durable pod's directory (empty: in memory)");
DEFINE_uint64(seed, 1, "Seed of the id stream");

namespace {

uint64_t RssBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

int main(int argc, char** argv) {
  ps::InitBinary(&argc, &argv,
                 "lifecycle-bench: Zipf pushes into one in-process pod with eviction/admission",
                 __FILE__);
  auto workload = ps::MakeWorkload(FLAGS_dist, FLAGS_rows, FLAGS_batch, FLAGS_batches, FLAGS_seed);
  if (!workload.ok()) {
    std::fprintf(stderr, "%s\n", workload.status().ToString().c_str());
    return 2;
  }
  ps::PsCoreOptions options;
  options.eviction_interval_ms = FLAGS_eviction_interval_ms;
  options.storage.db.dir = FLAGS_data_dir;
  auto core = ps::PsCore::Open(options, ps::ShardOwnership::All(256));
  if (!core.ok()) {
    std::fprintf(stderr, "%s\n", core.status().ToString().c_str());
    return 1;
  }
  ps::CreateTableRequest create;
  ps::TableSpec* spec = create.mutable_spec();
  spec->set_name("emb");
  spec->set_dim(FLAGS_dim);
  spec->mutable_optimizer()->set_kind(ps::OptimizerSpec::ADAGRAD);
  spec->mutable_eviction()->set_max_rows(FLAGS_max_rows);
  spec->mutable_eviction()->set_ttl_seconds(FLAGS_ttl_s);
  spec->mutable_eviction()->set_policy(FLAGS_lru ? ps::EvictionSpec::LRU : ps::EvictionSpec::LFU);
  spec->mutable_admission()->set_min_count(FLAGS_admit_after);
  ps::CreateTableResponse created;
  if (absl::Status s = (*core)->CreateTable(create, &created); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  auto table = (*core)->store().FindTable("emb");
  const std::string grads = ps::Pack<float>(std::vector<float>(FLAGS_batch * FLAGS_dim, 0.01f));
  std::atomic<bool> done{false};
  std::atomic<uint64_t> pushed{0};
  uint64_t peak_rows = 0, peak_rss = 0;
  const uint64_t rss_before = RssBytes();
  std::thread reporter([&] {
    const absl::Time start = absl::Now();
    while (!done.load()) {
      absl::SleepFor(absl::Seconds(1));
      const uint64_t rows = table->rows(), rss = RssBytes();
      peak_rows = std::max(peak_rows, rows);
      peak_rss = std::max(peak_rss, rss);
      std::printf("t=%5.1fs pushed=%llu rows=%llu rss=%.0fMB evicted=%llu\n",
                  absl::ToDoubleSeconds(absl::Now() - start),
                  static_cast<unsigned long long>(pushed.load()),
                  static_cast<unsigned long long>(rows), rss / 1e6,
                  static_cast<unsigned long long>(table->evicted()));
      std::fflush(stdout);
    }
  });
  const absl::Time start = absl::Now();
  uint64_t seq = 0;
  for (const auto& ids : workload->batches) {
    ps::PushRequest req;
    req.mutable_key()->set_worker_id(1);
    req.mutable_key()->set_incarnation(1);
    req.mutable_key()->set_sequence(++seq);
    ps::TableGrads* t = req.add_tables();
    t->set_table("emb");
    t->set_ids(ps::Pack<int64_t>(ids));
    t->set_grads(grads);
    ps::PushResponse resp;
    if (absl::Status s = (*core)->Push(req, &resp); !s.ok()) {
      std::fprintf(stderr, "push: %s\n", s.ToString().c_str());
      return 1;
    }
    pushed.fetch_add(ids.size());
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  done = true;
  reporter.join();
  ps::DescribeResponse d;
  (void)(*core)->Describe(ps::DescribeRequest(), &d);
  const ps::TableInfo& info = d.tables(0);
  std::printf(
      "RESULT dist=%s rows=%llu max_rows=%llu admit_after=%u pushed=%llu seconds=%.2f "
      "push_rows_per_s=%.0f final_rows=%llu peak_rows=%llu peak_rss_mb=%.0f "
      "rss_before_mb=%.0f row_bytes=%llu evicted=%llu admitted=%llu dropped=%llu\n",
      FLAGS_dist.c_str(), static_cast<unsigned long long>(FLAGS_rows),
      static_cast<unsigned long long>(FLAGS_max_rows), FLAGS_admit_after,
      static_cast<unsigned long long>(pushed.load()), seconds, pushed.load() / seconds,
      static_cast<unsigned long long>(info.rows()), static_cast<unsigned long long>(peak_rows),
      peak_rss / 1e6, rss_before / 1e6, static_cast<unsigned long long>(table->row_bytes()),
      static_cast<unsigned long long>(info.evicted()),
      static_cast<unsigned long long>(info.admitted()),
      static_cast<unsigned long long>(info.dropped_gradients()));
  // Where the memory is (docs/benchmarks.md, "Feature lifecycle"): the table's own
  // bytes (row arena and index), the C heap's bytes in use and free, and RSS before and
  // after handing free heap pages back (malloc_trim).
  const struct mallinfo2 heap = mallinfo2();
  const uint64_t rss_end = RssBytes();
  malloc_trim(0);
  const uint64_t rss_trimmed = RssBytes();
  std::printf(
      "MEMORY rows_x_row_bytes_mb=%.0f table_memory_mb=%.0f heap_in_use_mb=%.0f "
      "heap_free_mb=%.0f heap_mmapped_mb=%.0f rss_end_mb=%.0f rss_after_trim_mb=%.0f "
      "rss_growth_mb=%.0f\n",
      info.rows() * table->row_bytes() / 1e6, table->memory_bytes() / 1e6, heap.uordblks / 1e6,
      heap.fordblks / 1e6, heap.hblkhd / 1e6, rss_end / 1e6, rss_trimmed / 1e6,
      (rss_end - rss_before) / 1e6);
  return 0;
}
