// Catalog: the tables and dense tensors of the cluster, each stored under its name with
// its spec normalized (embedding/spec.h). It owns the store keys `table/<name>` and
// `dense/<name>` (and, in `counters`, catalog_version: +1 per created entry; pods learn it
// from their heartbeats and create what is new).
//
// Every change is written to the store (synced) before memory changes; on error nothing
// changed. Thread-safety: every method is thread-safe, under one mutex. Lock order: this
// one, then CountersRecord's.
#pragma once

#include <map>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "master/counters_record.h"
#include "master/master_store.h"
#include "proto/master.pb.h"

namespace ps {

class Catalog {
 public:
  // `store` and `counters` must outlive this. Call Load before anything else.
  Catalog(MasterStore* store, CountersRecord* counters) : store_(store), counters_(counters) {}

  // Reads the stored specs. DATA_LOSS for a record that does not parse.
  absl::Status Load() ABSL_LOCKS_EXCLUDED(mu_);

  // The catalog RPCs of proto/master.proto. Create* is idempotent: the same spec again
  // answers created=false; another spec under the name is ALREADY_EXISTS; a spec that does
  // not normalize is INVALID_ARGUMENT. On error nothing changed.
  absl::Status CreateTable(const CreateTableRequest& req, CreateTableResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CreateDense(const CreateDenseRequest& req, CreateDenseResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ListTables(const ListTablesRequest& req, ListTablesResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The names of every table and dense tensor.
  std::set<std::string> Names() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Adds the normalized `spec` (an error from normalizing is returned as is) under `key`
  // to `specs`, unless an equal one is there; `what` names the kind in errors.
  template <typename Spec, typename Response>
  absl::Status Create(absl::StatusOr<Spec> spec, absl::string_view what,
                      std::string (*key)(absl::string_view), std::map<std::string, Spec>* specs,
                      Response* resp) ABSL_LOCKS_EXCLUDED(mu_);

  MasterStore* const store_;
  CountersRecord* const counters_;

  mutable absl::Mutex mu_ ABSL_ACQUIRED_BEFORE(counters_->write_mutex());
  std::map<std::string, TableSpec> tables_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, DenseSpec> dense_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps
