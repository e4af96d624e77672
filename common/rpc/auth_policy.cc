#include "common/rpc/auth_policy.h"

namespace ps {
namespace {

struct Entry {
  absl::string_view method;
  Role role;
};

// Every RPC of proto/ps.proto and proto/master.proto, with the role it needs.
constexpr Entry kTable[] = {
    // A pod's data path and its description.
    {"/ps.ParameterServer/CreateTable", Role::kWorker},
    {"/ps.ParameterServer/CreateDense", Role::kWorker},
    {"/ps.ParameterServer/Describe", Role::kWorker},
    {"/ps.ParameterServer/Pull", Role::kWorker},
    {"/ps.ParameterServer/Push", Role::kWorker},
    {"/ps.ParameterServer/PullDense", Role::kWorker},
    {"/ps.ParameterServer/PushDense", Role::kWorker},
    {"/ps.ParameterServer/Stats", Role::kWorker},
    // Pod control: assignments (an epoch and the vshards the pod keeps: a wrong one drops
    // rows from memory and disk), moves, checkpoints, export and import.
    {"/ps.ParameterServer/Checkpoint", Role::kAdmin},
    {"/ps.ParameterServer/ApplyAssignment", Role::kAdmin},
    {"/ps.ParameterServer/MigrateBegin", Role::kAdmin},
    {"/ps.ParameterServer/MigrateExport", Role::kAdmin},
    {"/ps.ParameterServer/MigrateImport", Role::kAdmin},
    // Replication: a primary ships its log records to its followers (as the admin role,
    // like a move's export calls).
    {"/ps.ParameterServer/ReplicateRecords", Role::kAdmin},
    {"/ps.PodTransfer/Export", Role::kAdmin},
    {"/ps.PodTransfer/ImportRows", Role::kAdmin},
    // The master: what workers and clients need.
    {"/ps.Master/GetShardMap", Role::kWorker},
    {"/ps.Master/CreateTable", Role::kWorker},
    {"/ps.Master/CreateDense", Role::kWorker},
    {"/ps.Master/ListTables", Role::kWorker},
    {"/ps.Master/RegisterWorker", Role::kWorker},
    {"/ps.Master/WorkerHeartbeat", Role::kWorker},
    {"/ps.Master/LeaveWorker", Role::kWorker},
    {"/ps.Master/CreateJob", Role::kWorker},
    {"/ps.Master/GetTask", Role::kWorker},
    {"/ps.Master/ReportTask", Role::kWorker},
    {"/ps.Master/Status", Role::kWorker},
    // The master: pods (their registration decides where clients send rows) and operators.
    {"/ps.Master/RegisterPod", Role::kAdmin},
    {"/ps.Master/PodHeartbeat", Role::kAdmin},
    {"/ps.Master/LeavePod", Role::kAdmin},
    {"/ps.Master/Drain", Role::kAdmin},
    {"/ps.Master/Rebalance", Role::kAdmin},
    {"/ps.Master/Checkpoint", Role::kAdmin},
    {"/ps.Master/DeleteJob", Role::kAdmin},
};

const Entry* Find(absl::string_view method) {
  for (const Entry& e : kTable) {
    if (e.method == method) return &e;
  }
  return nullptr;
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kWorker:
      return "worker";
    case Role::kAdmin:
      return "admin";
    case Role::kNone:
      break;
  }
  return "none";
}

Role RequiredRole(absl::string_view method) {
  const Entry* e = Find(method);
  return e == nullptr ? Role::kAdmin : e->role;
}

bool IsListedMethod(absl::string_view method) { return Find(method) != nullptr; }

}  // namespace ps
