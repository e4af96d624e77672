// Micro-benchmarks of the embedding engine's hot loops (Google Benchmark):
//   build/bin/embedding-microbench
#include <benchmark/benchmark.h>

#include <random>

#include "absl/synchronization/mutex.h"
#include "embedding/embedding_table.h"

namespace ps {
namespace {

std::unique_ptr<EmbeddingTable> MakeTable(int dim, OptimizerSpec::Kind kind, int rows) {
  TableSpec spec;
  spec.set_name("bench");
  spec.set_dim(dim);
  spec.mutable_initializer()->set_kind(InitializerSpec::UNIFORM);
  spec.mutable_initializer()->set_low(-0.01f);
  spec.mutable_initializer()->set_high(0.01f);
  spec.mutable_optimizer()->set_kind(kind);
  auto t = std::move(EmbeddingTable::Create(spec)).value();
  std::vector<int64_t> ids(rows);
  for (int i = 0; i < rows; ++i) ids[i] = i;
  std::vector<float> out(static_cast<size_t>(rows) * dim);
  t->Pull(ids, out.data(), false);
  return t;
}

// 1024 batches of uniform ids over [0, rows): the rows touched do not fit in cache, as
// on a real pod.
std::vector<std::vector<int64_t>> Batches(int rows, int batch, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int64_t>> batches(1024, std::vector<int64_t>(batch));
  for (auto& b : batches) {
    for (auto& id : b) id = static_cast<int64_t>(rng() % rows);
  }
  return batches;
}

void BM_Pull(benchmark::State& state) {
  const int dim = state.range(0), rows = 1 << 20, batch = 1024;
  auto t = MakeTable(dim, OptimizerSpec::ADAGRAD, rows);
  auto batches = Batches(rows, batch, 1);
  std::vector<float> out(static_cast<size_t>(batch) * dim);
  size_t k = 0;
  for (auto _ : state) t->Pull(batches[k++ % batches.size()], out.data(), false);
  state.SetItemsProcessed(state.iterations() * batch);
}
BENCHMARK(BM_Pull)->Arg(16)->Arg(64)->Arg(128);

void BM_Push(benchmark::State& state) {
  const int dim = 64, rows = 1 << 20, batch = 1024;
  auto t = MakeTable(dim, static_cast<OptimizerSpec::Kind>(state.range(0)), rows);
  auto batches = Batches(rows, batch, 2);
  std::vector<float> grads(static_cast<size_t>(batch) * dim, 0.001f);
  size_t k = 0;
  for (auto _ : state) t->Push(batches[k++ % batches.size()], grads.data(), 0);
  state.SetItemsProcessed(state.iterations() * batch);
  state.SetLabel(OptimizerSpec::Kind_Name(static_cast<OptimizerSpec::Kind>(state.range(0))));
}
BENCHMARK(BM_Push)->DenseRange(0, 4);

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
