// Test doubles of the client's unit tests that need a cluster around the client: a
// master that serves whatever shard map the test sets, a gRPC server for a scripted pod,
// the SGD "counter" table the tests push to, and a scripted pod's Describe answer; and the
// tables the export/import tests train, move between clusters and compare. Used by
// client/failover_test.cc, client/wrong_shard_test.cc, client/transfer_test.cc and
// tests/export_import_test.cc; not part of ps_client.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/ps_client.h"
#include "gtest/gtest.h"
#include "proto/master.grpc.pb.h"
#include "proto/ps.grpc.pb.h"

namespace ps::testing_fakes {

// Serves `services` on a free loopback port, written to *port. Each service must outlive
// the server.
std::unique_ptr<grpc::Server> Serve(std::initializer_list<grpc::Service*> services, int* port);

// A master that only serves the shard map the test sets (GetShardMap). Thread-safe.
class FakeMaster final : public Master::Service {
 public:
  void Set(ShardMapResponse map);
  grpc::Status GetShardMap(grpc::ServerContext*, const GetShardMapRequest*,
                           ShardMapResponse* resp) override;

 private:
  absl::Mutex mu_;
  ShardMapResponse map_ ABSL_GUARDED_BY(mu_);
};

// Table `name`: dim `dim`, zeros, SGD at learning rate 1, so a push of -1 adds 1 to every
// element.
TableSpec CounterTable(const std::string& name, uint32_t dim);
// Dense tensor `name` of `numel` floats, the same way.
DenseSpec CounterDense(const std::string& name, int64_t numel);

// The export/import tests' tables, whose rows carry optimizer state of different shapes:
// "emb/adam" (dim 8, Adam at 0.01, normal init with seed 3), "ftrl" (dim 4, FTRL at 0.05,
// l1 0.001) and the dense "mlp/w" (3 x 5, Adam, uniform init in [-1, 1]).
TableSpec AdamSpec();
TableSpec FtrlSpec();
DenseSpec DenseW();
// Creates the three through `c`.
void CreateTransferTables(PsClient& c);
// `rounds` rounds of pushes of normal gradients to about two thirds of `ids` each (so rows
// reach different steps) and to "mlp/w"; the same pushes for a given seed.
void TrainTransferTables(PsClient& c, const std::vector<int64_t>& ids, uint32_t seed, int rounds);
// Rows `ids` of both tables and the whole dense tensor, as pulled (raw floats).
struct TransferSnapshot {
  std::vector<float> adam, ftrl, dense;
};
TransferSnapshot PullTransferTables(PsClient& c, const std::vector<int64_t>& ids);
// Whether two float arrays, or two snapshots, are the same bit for bit (naming the part of
// a snapshot that differs).
bool BitEqual(const std::vector<float>& a, const std::vector<float>& b);
testing::AssertionResult BitEqual(const TransferSnapshot& a, const TransferSnapshot& b);

// The Describe answer of a scripted pod that owns all of `num_vshards` vshards at epoch 1
// and holds `table` (and `dense`, when given: its name is not empty).
void DescribeAll(uint32_t num_vshards, const TableSpec& table, const DenseSpec& dense,
                 DescribeResponse* resp);

}  // namespace ps::testing_fakes
