// Test doubles of the client's unit tests that need a cluster around the client: a
// master that serves whatever shard map the test sets, a gRPC server for a scripted pod,
// the SGD "counter" table the tests push to, and a scripted pod's Describe answer; and the
// tables the export/import tests move between clusters. Used by client/failover_test.cc,
// client/wrong_shard_test.cc, client/transfer_test.cc and tests/export_import_test.cc;
// not part of ps_client.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
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

// The Describe answer of a scripted pod that owns all of `num_vshards` vshards at epoch 1
// and holds `table` (and `dense`, when given: its name is not empty).
void DescribeAll(uint32_t num_vshards, const TableSpec& table, const DenseSpec& dense,
                 DescribeResponse* resp);

}  // namespace ps::testing_fakes
