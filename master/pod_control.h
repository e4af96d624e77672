// How the master drives PS pods during a vshard move: its calls to the pods' migration RPCs
// (proto/ps.proto). An interface so that MasterCore stays transport-independent and unit
// tests can stand in for the pods.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/rpc/transport_security.h"
#include "proto/ps.pb.h"

namespace ps {

class PodControl {
 public:
  virtual ~PodControl() = default;
  // Each calls the pod at `address` and returns its status. Thread-safe.
  virtual absl::Status ApplyAssignment(const std::string& address, const Assignment& req) = 0;
  virtual absl::Status MigrateBegin(const std::string& address, const MigrateBeginRequest& req,
                                    MigrateBeginResponse* resp) = 0;
  // Returns once the destination holds the vshards durably (or failed).
  virtual absl::Status MigrateImport(const std::string& address, const MigrateImportRequest& req,
                                     MigrateImportResponse* resp) = 0;
  // The pod's PodCheckpoint (a cluster checkpoint).
  virtual absl::Status Checkpoint(const std::string& address, const PodCheckpointRequest& req,
                                  PodCheckpointResponse* resp) = 0;
};

struct GrpcPodControlOptions {
  // ApplyAssignment is tiny; a pod that does not answer in 2 s learns it by heartbeat.
  absl::Duration assign_timeout = absl::Seconds(2);
  // A move or checkpoint waits this long for a pod's connection (a pod restarting at its
  // address); then it fails (the move is aborted).
  absl::Duration connect_timeout = absl::Seconds(5);
  // MigrateBegin scans the source's rows for the vshards.
  absl::Duration begin_timeout = absl::Seconds(60);
  // A whole copy; a dead pod fails it at once (the connection breaks), so this only
  // bounds a hung one.
  absl::Duration import_timeout = absl::Minutes(30);
  // Credentials and token of the calls to pods (default: plain text).
  ChannelMaker channels;
};

// PodControl over gRPC, with one channel per pod address (kept).
std::shared_ptr<PodControl> NewGrpcPodControl(const GrpcPodControlOptions& options = {});

}  // namespace ps
