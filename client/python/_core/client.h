// elastic_ps._core.Client: the C++ PsClient (client/ps_client.h) for Python. elastic_ps'
// PsClient wraps it (argument conversion, protobuf messages, dicts); every protocol rule
// (routing, de-duplication, retries, push keys, re-routing, channels, TLS) is the C++
// library's.
//
// Every method is called with the GIL held and releases it for anything that may block
// (a call to a pod or the master, a wait). Arrays are used in place (client/python/_core/
// arrays.h). Errors raise elastic_ps.errors.PsError (ValueError for bad arguments).
// Thread-safe: Python threads may share a Client; close() waits for the calls in flight.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "client/ps_client.h"
#include "client/python/_core/handle.h"
#include "client/python/_core/raw_call.h"

namespace ps::py {

namespace pyb = pybind11;

class Client {
 public:
  // Connects (PsClient::Connect, the GIL released); raises PsError.
  explicit Client(const ClientOptions& options);
  // Uses a client made elsewhere (a WorkerSession's), which it shares.
  Client(std::shared_ptr<PsClient> client, const ClientOptions& options);
  ~Client();

  // Waits (GIL released) for the asynchronous calls made through this object, drops its
  // reference to the C++ client (the last one waits for every call in flight and closes
  // the channels) and ends the callback thread's loop. Later calls raise
  // PsError(CANCELLED). Idempotent.
  void Close();
  bool closed() const { return client_ == nullptr; }
  // The C++ client (shared, e.g. with a WorkerSession); PsError(CANCELLED) once closed.
  std::shared_ptr<PsClient> shared() const { return Get(); }
  const std::shared_ptr<Callbacks>& callbacks() const { return callbacks_; }

  // Catalog: specs as serialized TableSpec / DenseSpec.
  void CreateTable(const std::string& spec);
  void CreateDense(const std::string& spec);
  pyb::bytes GetTable(const std::string& name);
  pyb::bytes GetDense(const std::string& name);

  // Rows of tables[i] for ids[i] (int64 arrays) into outs[i] (a float32 (n, dim) array, or
  // None: a new one). Returns the handle; its value is the list of row arrays.
  // value_type (a ps.ValueType: 0 float32, 1 bfloat16, 2 float16) other than float32: the
  // values come 16-bit on the wire (ps_client.h, PullSpec); outs[i] float32 gets them
  // widened, a 16-bit array (see OutHalfRows) the raw bits, None a new array: int16 of the
  // raw bits, or float32 widened if `widen` (numpy has no bfloat16). ValueError for an
  // unknown value_type.
  std::unique_ptr<Handle> PullAsync(const pyb::list& tables, const pyb::list& ids,
                                    const pyb::list& outs, bool read_only, int value_type,
                                    bool widen);
  // As PullAsync, blocking; returns the list of row arrays.
  pyb::list Pull(const pyb::list& tables, const pyb::list& ids, const pyb::list& outs,
                 bool read_only, int value_type, bool widen);
  // Gradients grads[i] (float32 (n, dim) or flat) of ids[i] for tables[i]; the arrays are
  // read before this returns. learning_rate > 0 overrides the tables'.
  std::unique_ptr<Handle> PushAsync(const pyb::list& tables, const pyb::list& ids,
                                    const pyb::list& grads, float learning_rate);
  void Push(const pyb::list& tables, const pyb::list& ids, const pyb::list& grads,
            float learning_rate);

  // Dense tensors: new arrays of each tensor's shape; whole-tensor gradients.
  pyb::list PullDense(const std::vector<std::string>& names);
  void PushDense(const std::vector<std::string>& names, const pyb::list& grads,
                 float learning_rate);

  // [(pod id, address, serialized StatsResponse / DescribeResponse)] of the pods up.
  pyb::list Stats();
  pyb::list Describe();
  // (epoch, owner as a uint32 array, [(pod id, address, up)]).
  pyb::tuple ShardMap();
  // (worker_id, incarnation, sequence) of a fresh key.
  pyb::tuple NextPushKey();
  uint64_t worker_id();
  uint64_t incarnation();
  // PsClient::SetIdentity; ValueError for a zero id or incarnation.
  void SetIdentity(uint64_t worker_id, uint64_t incarnation);
  // PsClient::client_stats as {field: count}.
  pyb::dict ClientStatsDict();
  // PsClient.raw_call: one call to one pod as is; the answer's bytes.
  pyb::bytes RawCall(const std::string& address, const std::string& method,
                     const std::string& request);

 private:
  // The C++ client, or PsError(CANCELLED) once closed.
  std::shared_ptr<PsClient> Get() const;
  // A table's dim / a dense tensor's shape, cached (neither can change); the catalog is
  // asked (GIL released) the first time. Errors as GetTable.
  absl::StatusOr<uint32_t> Dim(const std::shared_ptr<PsClient>& c, const std::string& table);
  absl::StatusOr<std::vector<ssize_t>> Shape(const std::shared_ptr<PsClient>& c,
                                             const std::string& name);
  // The specs of a pull (ValueError for bad arrays); `outs` filled with the row arrays,
  // `keep` with every array the call uses. A catalog error is returned.
  absl::Status PlanPull(const std::shared_ptr<PsClient>& c, const pyb::list& tables,
                        const pyb::list& ids, const pyb::list& outs, ValueType value_type,
                        bool widen, std::vector<PullSpec>* specs, pyb::list* rows, pyb::list* keep);
  absl::Status PlanPush(const std::shared_ptr<PsClient>& c, const pyb::list& tables,
                        const pyb::list& ids, const pyb::list& grads, float learning_rate,
                        std::vector<PushSpec>* specs);

  const ClientOptions options_;
  std::shared_ptr<PsClient> client_;  // guarded by the GIL; null once closed
  const std::shared_ptr<Callbacks> callbacks_;
  RawCaller raw_;
  absl::flat_hash_map<std::string, uint32_t> dims_;                // guarded by the GIL
  absl::flat_hash_map<std::string, std::vector<ssize_t>> shapes_;  // guarded by the GIL
};

// Registers Client, ClientOptions and ChannelSecurity in `m`.
void BindClient(pyb::module_& m);

}  // namespace ps::py
