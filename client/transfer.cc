#include "client/transfer.h"

#include <glog/logging.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/routing/hash.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/retry_policy.h"
#include "proto/export_file.h"
#include "proto/master.grpc.pb.h"
#include "proto/ps.grpc.pb.h"
#include "proto/wrong_shard.h"

namespace ps {
namespace {

namespace fs = std::filesystem;

bool Retryable(const grpc::Status& s) {
  return RetryPolicy::IsRetryable(static_cast<absl::StatusCode>(s.error_code()));
}

std::shared_ptr<grpc::Channel> Channel(const ChannelMaker& channels, const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  return channels.Make(address, args);
}

// The one retry policy (common/rpc/retry_policy.h) with ps-transfer's attempts and
// per-attempt deadline. Exports and imports are long calls: a slower start than a data
// call's (50 ms) and a shorter cap (2 s), as each attempt may itself take seconds.
RetryPolicy TransferPolicy(int deadline_ms, int max_attempts) {
  RetryOptions r;
  r.max_attempts = max_attempts;
  r.initial_backoff = absl::Milliseconds(50);
  r.max_backoff = absl::Seconds(2);
  r.attempt_timeout = absl::Milliseconds(deadline_ms);
  return RetryPolicy(r);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

absl::Status WriteFile(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << data;
    out.flush();
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot rename ", tmp, ": ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<Cluster> FromServers(const ClusterTarget& target, const ChannelMaker& channels) {
  Cluster c;
  c.channels = channels;
  c.pods = target.servers;
  c.up.assign(c.pods.size(), true);
  const absl::Time deadline = absl::Now() + absl::Milliseconds(target.connect_timeout_ms);
  for (size_t i = 0; i < c.pods.size(); ++i) {
    auto stub = ParameterServer::NewStub(Channel(channels, c.pods[i]));
    DescribeResponse d;
    grpc::Status s;
    for (;;) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      d.Clear();
      s = stub->Describe(&ctx, DescribeRequest(), &d);
      if (s.ok() || !Retryable(s) || absl::Now() > deadline) break;
      absl::SleepFor(absl::Milliseconds(200));
    }
    RETURN_IF_ERROR(FromGrpcStatus(s, absl::StrCat("Describe of pod ", c.pods[i])));
    if (i == 0) {
      c.num_vshards = d.num_vshards();
      c.owner.assign(c.num_vshards, UINT32_MAX);
    } else if (d.num_vshards() != c.num_vshards) {
      return absl::FailedPreconditionError(absl::StrCat("pod ", c.pods[i], " has ", d.num_vshards(),
                                                        " vshards, pod ", c.pods[0], " has ",
                                                        c.num_vshards));
    }
    c.epoch = std::max(c.epoch, d.epoch());
    const std::string& bits = d.owned_vshards();
    for (uint32_t v = 0; v < c.num_vshards; ++v) {
      if (v / 8 >= bits.size() || ((static_cast<uint8_t>(bits[v / 8]) >> (v % 8)) & 1) == 0) {
        continue;
      }
      if (c.owner[v] != UINT32_MAX) {
        return absl::FailedPreconditionError(absl::StrCat("vshard ", v, " is owned by both ",
                                                          c.pods[c.owner[v]], " and ", c.pods[i]));
      }
      c.owner[v] = static_cast<uint32_t>(i);
    }
  }
  for (uint32_t v = 0; v < c.num_vshards; ++v) {
    if (c.owner[v] == UINT32_MAX) {
      return absl::FailedPreconditionError(
          absl::StrCat("no pod of --servers owns vshard ", v, " of ", c.num_vshards));
    }
  }
  return c;
}

absl::StatusOr<Cluster> FromMaster(const ClusterTarget& target, const ChannelMaker& channels) {
  auto stub = Master::NewStub(Channel(channels, target.master));
  const absl::Time deadline = absl::Now() + absl::Milliseconds(target.connect_timeout_ms);
  absl::Status last;
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ShardMapResponse map;
    grpc::Status s = stub->GetShardMap(&ctx, GetShardMapRequest(), &map);
    if (s.ok()) {
      Cluster c;
      c.channels = channels;
      c.num_vshards = map.num_vshards();
      c.epoch = map.epoch();
      c.master = target.master;
      c.connect_timeout_ms = target.connect_timeout_ms;
      for (const PodInfo& p : map.pods()) {
        c.pods.push_back(p.address());
        c.up.push_back(p.state() == PodInfo::LIVE || p.state() == PodInfo::DRAINED);
      }
      last = absl::OkStatus();
      if (static_cast<uint32_t>(map.owner_size()) != c.num_vshards) {
        return absl::FailedPreconditionError("the master's map does not cover every vshard");
      }
      for (uint32_t v = 0; v < c.num_vshards && last.ok(); ++v) {
        const uint32_t o = map.owner(v);
        if (o >= static_cast<uint32_t>(map.pods_size())) {
          return absl::FailedPreconditionError(absl::StrCat("vshard ", v, " has no owner"));
        }
        if (map.pods(o).state() != PodInfo::LIVE) {
          last = absl::UnavailableError(
              absl::StrCat("pod ", map.pods(o).pod_id(), " (owner of vshard ", v, ") is not live"));
        }
        c.owner.push_back(o);
      }
      if (last.ok()) return c;
    } else {
      last = FromGrpcStatus(s, "GetShardMap from " + target.master);
      if (!Retryable(s)) return last;
    }
    if (absl::Now() > deadline) return last;
    absl::SleepFor(absl::Milliseconds(250));
  }
}

}  // namespace

absl::StatusOr<Cluster> DiscoverCluster(const ClusterTarget& target) {
  if (target.master.empty() == target.servers.empty()) {
    return absl::InvalidArgumentError("give either the master or the pods' addresses");
  }
  ASSIGN_OR_RETURN(ChannelMaker channels, ChannelMaker::Create(target.security));
  return target.master.empty() ? FromServers(target, channels) : FromMaster(target, channels);
}

absl::StatusOr<Cluster> RefreshCluster(const Cluster& cluster) {
  if (cluster.master.empty()) {
    return absl::FailedPreconditionError("the cluster was not read from a master");
  }
  ClusterTarget target;
  target.master = cluster.master;
  target.connect_timeout_ms = cluster.connect_timeout_ms;
  return FromMaster(target, cluster.channels);
}

absl::StatusOr<ExportManifest> ReadManifest(const std::string& part_dir) {
  ASSIGN_OR_RETURN(std::string json, ReadFile(part_dir + "/manifest.json"));
  ExportManifest m;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;  // a later minor version may add fields
  if (!google::protobuf::util::JsonStringToMessage(json, &m, options).ok()) {
    return absl::DataLossError(absl::StrCat(part_dir, "/manifest.json is not a valid manifest"));
  }
  if (m.format() != "ps-export") {
    return absl::InvalidArgumentError(absl::StrCat(part_dir, " is not a ps-export part"));
  }
  if (m.version() != 1) {
    return absl::UnimplementedError(
        absl::StrCat(part_dir, " has export version ", m.version(), "; this build reads 1"));
  }
  return m;
}

absl::StatusOr<ExportIndex> ExportCluster(const Cluster& cluster, const std::string& dir_in,
                                          const ExportClusterOptions& options) {
  const std::string dir = fs::absolute(dir_in).lexically_normal().string();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  if (fs::exists(dir + "/export.json")) {
    return absl::AlreadyExistsError(absl::StrCat(dir, " already holds an export"));
  }
  if (!options.since.empty()) RETURN_IF_ERROR(ParseExportCursor(options.since).status());
  std::vector<ExportResponse> responses(cluster.pods.size());
  std::vector<absl::Status> statuses(cluster.pods.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < cluster.pods.size(); ++i) {
    threads.emplace_back([&, i] {
      auto stub = PodTransfer::NewStub(Channel(cluster.channels, cluster.pods[i]));
      ExportRequest req;
      req.set_dir(absl::StrCat(dir, "/part-", i));
      req.set_since(options.since);
      statuses[i] =
          TransferPolicy(options.timeout_ms, 5)
              .Run([&](grpc::ClientContext* ctx) { return stub->Export(ctx, req, &responses[i]); },
                   absl::StrCat("Export on pod ", cluster.pods[i]));
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : statuses) RETURN_IF_ERROR(s);
  ExportIndex index;
  index.set_format("ps-export");
  index.set_version(1);
  index.set_created(absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone()));
  index.set_num_vshards(cluster.num_vshards);
  index.set_epoch(cluster.epoch);
  index.set_since(options.since);
  std::vector<ExportCursorEntry> cursor;
  for (size_t i = 0; i < cluster.pods.size(); ++i) {
    ExportIndex::Part* p = index.add_parts();
    p->set_dir(absl::StrCat("part-", i));
    p->set_pod(cluster.pods[i]);
    p->set_rows(responses[i].rows());
    p->set_dense(responses[i].dense());
    p->set_deleted(responses[i].deleted());
    p->set_whole(responses[i].whole());
    // An in-memory pod names no position (its next delta is whole).
    if (responses[i].cursor().empty()) continue;
    auto entries = ParseExportCursor(responses[i].cursor());
    if (!entries.ok()) {
      return absl::InternalError(absl::StrCat(
          "pod ", cluster.pods[i], " answered a damaged cursor: ", entries.status().message()));
    }
    cursor.insert(cursor.end(), entries->begin(), entries->end());
  }
  index.set_cursor(FormatExportCursor(cursor));
  google::protobuf::util::JsonPrintOptions json_options;
  json_options.add_whitespace = true;
  json_options.preserve_proto_field_names = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(index, &json, json_options).ok()) {
    return absl::InternalError("export index to JSON");
  }
  RETURN_IF_ERROR(WriteFile(dir + "/export.json", json));
  return index;
}

namespace {

// A request for each pod that owns some of `req`'s rows, tensors or deleted ids in
// `cluster` (the pods in the order met, each request's rows in `req`'s order), at the
// cluster's epoch. The one routing of ImportRows: of every request sent, and again of a
// request re-routed after a map change.
std::vector<std::pair<uint32_t, ImportRowsRequest>> SplitByOwner(const Cluster& cluster,
                                                                 ImportRowsRequest req) {
  std::vector<std::pair<uint32_t, ImportRowsRequest>> out;
  // Usually one owner (the request was made for one pod): then the request goes as is.
  std::optional<uint32_t> only;
  bool several = false;
  auto note = [&](uint32_t pod) {
    if (!only.has_value()) only = pod;
    several = several || *only != pod;
  };
  for (const auto* list : {&req.deletes(), &req.tables()}) {
    for (const TableRows& t : *list) {
      const uint64_t name_hash = NameHash(t.table());
      for (size_t i = 0; i < t.ids().size() / sizeof(int64_t) && !several; ++i) {
        int64_t id;
        std::memcpy(&id, t.ids().data() + i * sizeof(id), sizeof(id));
        note(cluster.owner[VShardOf(RouteHash(name_hash, id), cluster.num_vshards)]);
      }
    }
  }
  for (const DenseState& d : req.dense()) {
    note(cluster.owner[DenseVShard(d.name(), cluster.num_vshards)]);
  }
  if (!several && only.has_value()) {
    req.set_epoch(cluster.epoch);
    out.emplace_back(*only, std::move(req));
    return out;
  }
  std::vector<int> part_of(cluster.pods.size(), -1);
  auto part = [&](uint32_t pod) -> ImportRowsRequest& {
    if (part_of[pod] < 0) {
      part_of[pod] = static_cast<int>(out.size());
      out.emplace_back(pod, ImportRowsRequest());
      out.back().second.set_epoch(cluster.epoch);
    }
    return out[part_of[pod]].second;
  };
  auto owner = [&](uint64_t name_hash, int64_t id) {
    return cluster.owner[VShardOf(RouteHash(name_hash, id), cluster.num_vshards)];
  };
  // Rows of `from` (ids, and steps and values when `with_values`) into `add(part)`'s entry.
  auto split_rows = [&](const TableRows& from, bool with_values,
                        TableRows* (*add)(ImportRowsRequest*)) {
    const size_t n = from.ids().size() / sizeof(int64_t);
    const size_t row_bytes = n == 0 ? 0 : from.values().size() / n;
    const uint64_t name_hash = NameHash(from.table());
    std::vector<TableRows*> entry_of(cluster.pods.size(), nullptr);
    for (size_t i = 0; i < n; ++i) {
      int64_t id;
      std::memcpy(&id, from.ids().data() + i * sizeof(id), sizeof(id));
      const uint32_t pod = owner(name_hash, id);
      TableRows*& e = entry_of[pod];
      if (e == nullptr) {
        e = add(&part(pod));
        e->set_table(from.table());
      }
      e->mutable_ids()->append(from.ids().data() + i * sizeof(id), sizeof(id));
      if (!with_values) continue;
      e->mutable_steps()->append(from.steps().data() + i * sizeof(uint64_t), sizeof(uint64_t));
      e->mutable_values()->append(from.values().data() + i * row_bytes, row_bytes);
    }
  };
  for (const TableRows& d : req.deletes()) {
    split_rows(d, false, [](ImportRowsRequest* r) { return r->add_deletes(); });
  }
  for (const TableRows& t : req.tables()) {
    split_rows(t, true, [](ImportRowsRequest* r) { return r->add_tables(); });
  }
  for (DenseState& d : *req.mutable_dense()) {
    *part(cluster.owner[DenseVShard(d.name(), cluster.num_vshards)]).add_dense() = std::move(d);
  }
  return out;
}

// Sends ImportRows requests from a bounded queue on `inflight` threads, each to the
// owners of its rows under the newest map known (see ImportCluster for when it is read
// again); remembers the first error (after which queued work is dropped).
class Sender {
 public:
  Sender(const Cluster& cluster, const ImportOptions& options)
      : options_(options),
        policy_(TransferPolicy(options.deadline_ms, options.max_attempts)),
        cluster_(std::make_shared<const Cluster>(cluster)) {
    for (int i = 0; i < std::max(1, options.inflight); ++i) {
      threads_.emplace_back([this] { Run(); });
    }
  }
  ~Sender() { Close().IgnoreError(); }  // ImportCluster reads the status from Close

  // Queues a request; blocks while `inflight` requests wait.
  void Send(ImportRowsRequest req) {
    absl::MutexLock lock(&mu_);
    auto room = [this] { return queue_.size() < static_cast<size_t>(options_.inflight); };
    mu_.Await(absl::Condition(&room));
    queue_.push_back(Item{std::move(req), 0});
  }

  // Waits for everything queued; returns the first error.
  absl::Status Close() {
    {
      absl::MutexLock lock(&mu_);
      closing_ = true;
    }
    for (auto& t : threads_) t.join();
    threads_.clear();
    absl::MutexLock lock(&mu_);
    return status_;
  }
  absl::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  uint64_t installed() {
    absl::MutexLock lock(&mu_);
    return installed_;
  }
  uint64_t skipped() {
    absl::MutexLock lock(&mu_);
    return skipped_;
  }
  uint64_t invalid() {
    absl::MutexLock lock(&mu_);
    return invalid_;
  }
  uint64_t deleted() {
    absl::MutexLock lock(&mu_);
    return deleted_;
  }
  std::vector<std::string> invalid_rows() {
    absl::MutexLock lock(&mu_);
    return invalid_rows_;
  }

 private:
  // A request, and the map changes it has followed.
  struct Item {
    ImportRowsRequest req;
    int reroutes = 0;
  };
  // As ClientOptions::max_reroutes: the map changes one request follows before its error.
  static constexpr int kMaxReroutes = 200;

  void Run() {
    for (;;) {
      Item item;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this] { return !queue_.empty() || closing_; };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;
        item = std::move(queue_.front());
        queue_.pop_front();
        if (!status_.ok()) continue;  // drop after an error
      }
      std::shared_ptr<const Cluster> cluster = current();
      for (auto& [pod, req] : SplitByOwner(*cluster, std::move(item.req))) {
        SendTo(*cluster, pod, Item{std::move(req), item.reroutes});
      }
    }
  }

  // Sends `item` to pod `pod` of `cluster` under the retry policy. When the map changes
  // the owners of its rows (a wrong-shard refusal; a refresh before the third attempt on,
  // with a master), it goes back to the queue to be routed again.
  void SendTo(const Cluster& cluster, uint32_t pod, Item item) {
    const std::string& address = cluster.pods[pod];
    PodTransfer::Stub* stub = StubOf(cluster, address);
    const bool follows_master = !cluster.master.empty();
    ImportRowsResponse resp;
    absl::Status s;
    for (int n = 1;; ++n) {
      grpc::ClientContext ctx;
      ctx.set_deadline(policy_.AttemptDeadline());
      resp.Clear();
      const grpc::Status gs = stub->ImportRows(&ctx, item.req, &resp);
      s = RetryPolicy::Final(gs, "ImportRows on " + address, n);
      if (s.ok()) break;
      const bool wrong_shard =
          follows_master && item.reroutes < kMaxReroutes && WrongShardOf(s).has_value();
      if (!wrong_shard && !policy_.ShouldRetry(s.code(), n)) break;
      absl::SleepFor(policy_.Backoff(n));
      if (!follows_master || !(wrong_shard || RetryPolicy::RefreshMapBefore(n + 1))) continue;
      std::shared_ptr<const Cluster> now = Refresh(cluster.epoch);
      if (wrong_shard || !OwnsAll(*now, address, item.req)) {
        ++item.reroutes;
        absl::MutexLock lock(&mu_);
        queue_.push_front(std::move(item));  // routed again by the next free thread
        return;
      }
    }
    absl::MutexLock lock(&mu_);
    if (!s.ok() && status_.ok()) status_ = s;
    installed_ += resp.installed();
    skipped_ += resp.skipped();
    invalid_ += resp.invalid();
    deleted_ += resp.deleted();
    for (const std::string& r : resp.invalid_rows()) {
      if (invalid_rows_.size() < kNamedInvalid) invalid_rows_.push_back(r);
    }
  }

  // Whether the pod at `address` owns every row of `req` in `cluster`.
  static bool OwnsAll(const Cluster& cluster, const std::string& address,
                      const ImportRowsRequest& req) {
    auto parts = SplitByOwner(cluster, req);
    return parts.size() == 1 && cluster.pods[parts[0].first] == address;
  }

  std::shared_ptr<const Cluster> current() {
    absl::MutexLock lock(&mu_);
    return cluster_;
  }

  // The master's map, read again unless one newer than `seen_epoch` is known already; the
  // known one when the master cannot be read.
  std::shared_ptr<const Cluster> Refresh(uint64_t seen_epoch) {
    {
      absl::MutexLock lock(&mu_);
      if (cluster_->epoch > seen_epoch) return cluster_;
    }
    std::shared_ptr<const Cluster> known = current();
    absl::StatusOr<Cluster> fresh = RefreshCluster(*known);
    absl::MutexLock lock(&mu_);
    if (!fresh.ok()) {
      LOG(WARNING) << "import: cannot read the master's map again: " << fresh.status();
    } else if (fresh->epoch > cluster_->epoch) {
      LOG(INFO) << "import: the map moved from epoch " << cluster_->epoch << " to " << fresh->epoch
                << "; requests follow it";
      cluster_ = std::make_shared<const Cluster>(*std::move(fresh));
    }
    return cluster_;
  }

  PodTransfer::Stub* StubOf(const Cluster& cluster, const std::string& address) {
    absl::MutexLock lock(&mu_);
    auto& stub = stubs_[address];
    if (stub == nullptr) stub = PodTransfer::NewStub(Channel(cluster.channels, address));
    return stub.get();
  }

  static constexpr size_t kNamedInvalid = 100;

  const ImportOptions options_;
  const RetryPolicy policy_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  std::shared_ptr<const Cluster> cluster_ ABSL_GUARDED_BY(mu_);
  // By address; a stub lives as long as the Sender.
  absl::flat_hash_map<std::string, std::unique_ptr<PodTransfer::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  uint64_t installed_ ABSL_GUARDED_BY(mu_) = 0, skipped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t invalid_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t deleted_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> invalid_rows_ ABSL_GUARDED_BY(mu_);
};

// Reads a whole data file, checking it against its manifest entry: the header's spec,
// dim and slots, every block checksum, the record count, size and file checksum. `fn`
// gets every block.
absl::Status ReadDataFile(const std::string& path, ExportKind kind, const std::string& spec_bytes,
                          uint32_t dim, uint32_t slot_floats, const ExportFileInfo& info,
                          const std::function<absl::Status(const ExportBlock&)>& fn) {
  ASSIGN_OR_RETURN(auto reader, ExportFileReader::Open(path));
  if (reader->kind() != kind || reader->spec_bytes() != spec_bytes || reader->dim() != dim ||
      reader->slot_floats() != slot_floats) {
    return absl::DataLossError(
        absl::StrCat(path, ": its header does not match the manifest (spec, dim or slots)"));
  }
  ExportBlock block;
  for (;;) {
    ASSIGN_OR_RETURN(bool more, reader->Next(&block));
    if (!more) break;
    if (fn) RETURN_IF_ERROR(fn(block));
  }
  const ExportFileSummary& sum = reader->summary();
  if (sum.rows != info.rows() || sum.bytes != info.bytes() || sum.crc32c != info.crc32c()) {
    return absl::DataLossError(absl::StrCat(path, ": ", sum.rows, " records, ", sum.bytes,
                                            " bytes, crc32c ", sum.crc32c, "; the manifest says ",
                                            info.rows(), ", ", info.bytes(), ", ", info.crc32c()));
  }
  return absl::OkStatus();
}

struct Part {
  std::string dir;
  ExportManifest manifest;
};

absl::StatusOr<std::vector<Part>> ReadParts(const std::string& dir) {
  std::vector<Part> parts;
  if (fs::exists(dir + "/export.json")) {
    ASSIGN_OR_RETURN(std::string json, ReadFile(dir + "/export.json"));
    ExportIndex index;
    google::protobuf::util::JsonParseOptions options;
    options.ignore_unknown_fields = true;
    if (!google::protobuf::util::JsonStringToMessage(json, &index, options).ok() ||
        index.format() != "ps-export") {
      return absl::DataLossError(absl::StrCat(dir, "/export.json is not a valid export index"));
    }
    if (index.version() != 1) {
      return absl::UnimplementedError(absl::StrCat("export version ", index.version()));
    }
    for (const ExportIndex::Part& p : index.parts()) {
      const std::string part_dir = dir + "/" + p.dir();
      ASSIGN_OR_RETURN(ExportManifest m, ReadManifest(part_dir));
      parts.push_back({part_dir, std::move(m)});
    }
  } else if (fs::exists(dir + "/manifest.json")) {
    ASSIGN_OR_RETURN(ExportManifest m, ReadManifest(dir));
    parts.push_back({dir, std::move(m)});
  } else {
    return absl::NotFoundError(absl::StrCat(dir, " holds neither export.json nor manifest.json"));
  }
  return parts;
}

}  // namespace

absl::StatusOr<ImportResult> ImportCluster(const Cluster& cluster, const std::string& dir,
                                           const ImportOptions& options) {
  const absl::Time start = absl::Now();
  ImportResult result;
  ASSIGN_OR_RETURN(std::vector<Part> parts, ReadParts(dir));
  result.parts = parts.size();

  // Every table and tensor once, with one spec across the parts.
  absl::flat_hash_map<std::string, TableSpec> tables;
  absl::flat_hash_map<std::string, DenseSpec> dense;
  for (const Part& p : parts) {
    for (const ExportTableInfo& t : p.manifest.tables()) {
      auto [it, inserted] = tables.emplace(t.spec().name(), t.spec());
      if (!inserted && it->second.SerializeAsString() != t.spec().SerializeAsString()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "parts of ", dir, " disagree on the spec of table '", t.spec().name(), "'"));
      }
    }
    for (const ExportDenseInfo& d : p.manifest.dense()) {
      auto [it, inserted] = dense.emplace(d.spec().name(), d.spec());
      if (!inserted) {
        return absl::InvalidArgumentError(
            absl::StrCat("dense tensor '", d.spec().name(), "' is in two parts of ", dir));
      }
    }
  }

  if (options.verify_first) {
    for (const Part& p : parts) {
      for (const ExportTableInfo& t : p.manifest.tables()) {
        for (const ExportFileInfo& f : t.files()) {
          RETURN_IF_ERROR(ReadDataFile(p.dir + "/" + f.name(), ExportKind::kTableRows,
                                       t.spec().SerializeAsString(), t.dim(), t.slot_floats(), f,
                                       nullptr));
        }
        for (const ExportFileInfo& f : t.deleted_files()) {
          RETURN_IF_ERROR(ReadDataFile(p.dir + "/" + f.name(), ExportKind::kDeletedIds,
                                       t.spec().SerializeAsString(), 0, 0, f, nullptr));
        }
      }
      for (const ExportDenseInfo& d : p.manifest.dense()) {
        RETURN_IF_ERROR(ReadDataFile(p.dir + "/" + d.file().name(), ExportKind::kDense,
                                     d.spec().SerializeAsString(), static_cast<uint32_t>(d.numel()),
                                     d.slot_floats(), d.file(), nullptr));
      }
    }
  }

  // Create the catalog on every pod (idempotent; ALREADY_EXISTS for another spec).
  const RetryPolicy policy = TransferPolicy(options.deadline_ms, options.max_attempts);
  for (size_t p = 0; p < cluster.pods.size(); ++p) {
    if (!cluster.up[p]) continue;  // it learns the catalog from the master
    const std::string& pod = cluster.pods[p];
    auto stub = ParameterServer::NewStub(Channel(cluster.channels, pod));
    for (const auto& [name, spec] : tables) {
      CreateTableRequest req;
      *req.mutable_spec() = spec;
      CreateTableResponse resp;
      RETURN_IF_ERROR(
          policy.Run([&](grpc::ClientContext* ctx) { return stub->CreateTable(ctx, req, &resp); },
                     absl::StrCat("CreateTable '", name, "' on ", pod)));
    }
    for (const auto& [name, spec] : dense) {
      CreateDenseRequest req;
      *req.mutable_spec() = spec;
      CreateDenseResponse resp;
      RETURN_IF_ERROR(
          policy.Run([&](grpc::ClientContext* ctx) { return stub->CreateDense(ctx, req, &resp); },
                     absl::StrCat("CreateDense '", name, "' on ", pod)));
    }
  }

  const size_t num_pods = cluster.pods.size();
  // A delta's deletions first, all of them acknowledged before any row is installed.
  {
    Sender deleter(cluster, options);
    for (const Part& p : parts) {
      for (const ExportTableInfo& t : p.manifest.tables()) {
        const std::string& name = t.spec().name();
        const uint64_t name_hash = NameHash(name);
        std::vector<TableRows> pending(num_pods);
        std::vector<size_t> pending_ids(num_pods, 0);
        auto flush = [&](uint32_t pod) {
          if (pending_ids[pod] == 0) return;
          ImportRowsRequest req;
          req.set_epoch(cluster.epoch);
          *req.add_deletes() = std::move(pending[pod]);
          pending[pod] = TableRows();
          pending_ids[pod] = 0;
          deleter.Send(std::move(req));
        };
        for (const ExportFileInfo& f : t.deleted_files()) {
          RETURN_IF_ERROR(ReadDataFile(
              p.dir + "/" + f.name(), ExportKind::kDeletedIds, t.spec().SerializeAsString(), 0, 0,
              f, [&](const ExportBlock& b) -> absl::Status {
                RETURN_IF_ERROR(deleter.status());
                for (int64_t id : b.ids) {
                  const uint32_t pod =
                      cluster.owner[VShardOf(RouteHash(name_hash, id), cluster.num_vshards)];
                  if (pending_ids[pod] == 0) pending[pod].set_table(name);
                  pending[pod].mutable_ids()->append(reinterpret_cast<const char*>(&id), 8);
                  if (++pending_ids[pod] >= options.batch_rows) flush(pod);
                }
                result.deleted_ids += b.ids.size();
                return absl::OkStatus();
              }));
        }
        for (uint32_t pod = 0; pod < num_pods; ++pod) flush(pod);
      }
    }
    RETURN_IF_ERROR(deleter.Close());
    result.deleted = deleter.deleted();
  }

  Sender sender(cluster, options);
  for (const Part& p : parts) {
    for (const ExportTableInfo& t : p.manifest.tables()) {
      const std::string& name = t.spec().name();
      const uint64_t name_hash = NameHash(name);
      const size_t floats = size_t{t.dim()} + t.slot_floats();
      std::vector<TableRows> pending(num_pods);
      std::vector<size_t> pending_rows(num_pods, 0);
      auto flush = [&](uint32_t pod) {
        if (pending_rows[pod] == 0) return;
        ImportRowsRequest req;
        req.set_epoch(cluster.epoch);
        *req.add_tables() = std::move(pending[pod]);
        pending[pod] = TableRows();
        pending_rows[pod] = 0;
        sender.Send(std::move(req));
      };
      for (const ExportFileInfo& f : t.files()) {
        RETURN_IF_ERROR(ReadDataFile(
            p.dir + "/" + f.name(), ExportKind::kTableRows, t.spec().SerializeAsString(), t.dim(),
            t.slot_floats(), f, [&](const ExportBlock& b) -> absl::Status {
              RETURN_IF_ERROR(sender.status());
              for (size_t i = 0; i < b.ids.size(); ++i) {
                const uint32_t pod =
                    cluster.owner[VShardOf(RouteHash(name_hash, b.ids[i]), cluster.num_vshards)];
                TableRows& rows = pending[pod];
                if (pending_rows[pod] == 0) rows.set_table(name);
                rows.mutable_ids()->append(reinterpret_cast<const char*>(&b.ids[i]), 8);
                rows.mutable_steps()->append(reinterpret_cast<const char*>(&b.steps[i]), 8);
                rows.mutable_values()->append(
                    reinterpret_cast<const char*>(b.values.data() + i * floats),
                    floats * sizeof(float));
                if (++pending_rows[pod] >= options.batch_rows) flush(pod);
              }
              result.rows += b.ids.size();
              return absl::OkStatus();
            }));
      }
      for (uint32_t pod = 0; pod < num_pods; ++pod) flush(pod);
    }
    for (const ExportDenseInfo& d : p.manifest.dense()) {
      RETURN_IF_ERROR(
          ReadDataFile(p.dir + "/" + d.file().name(), ExportKind::kDense,
                       d.spec().SerializeAsString(), static_cast<uint32_t>(d.numel()),
                       d.slot_floats(), d.file(), [&](const ExportBlock& b) -> absl::Status {
                         for (size_t i = 0; i < b.ids.size(); ++i) {
                           ImportRowsRequest req;
                           req.set_epoch(cluster.epoch);
                           DenseState* s = req.add_dense();
                           s->set_name(d.spec().name());
                           s->set_step(b.steps[i]);
                           s->set_values(std::string(reinterpret_cast<const char*>(b.values.data()),
                                                     b.values.size() * sizeof(float)));
                           sender.Send(std::move(req));
                           ++result.dense;
                         }
                         return absl::OkStatus();
                       }));
    }
  }
  RETURN_IF_ERROR(sender.Close());
  result.installed = sender.installed();
  result.skipped = sender.skipped();
  result.invalid = sender.invalid();
  result.invalid_rows = sender.invalid_rows();
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return result;
}

}  // namespace ps
