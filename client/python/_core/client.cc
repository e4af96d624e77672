#include "client/python/_core/client.h"

#include <pybind11/stl.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "client/python/_core/arrays.h"
#include "client/python/_core/errors.h"

namespace ps::py {
namespace {

// A list argument's length, checked against the tables'.
size_t SameLength(const pyb::list& tables, const pyb::list& other, const char* what) {
  if (other.size() != tables.size()) {
    ThrowValueError(
        absl::StrCat(what, ": ", other.size(), " entries for ", tables.size(), " tables"));
  }
  return tables.size();
}

template <typename Message>
Message Parse(const std::string& bytes, const char* what) {
  Message m;
  if (!m.ParseFromString(bytes)) ThrowValueError(absl::StrCat("unreadable ", what));
  return m;
}

pyb::bytes Bytes(const google::protobuf::Message& m) { return pyb::bytes(m.SerializeAsString()); }

pyb::tuple PodTuple(const PodView& pod) { return pyb::make_tuple(pod.id, pod.address, pod.up); }

}  // namespace

Client::Client(const ClientOptions& options)
    : options_(options),
      callbacks_(std::make_shared<Callbacks>(std::make_shared<Notifier>())),
      raw_(options.security) {
  absl::StatusOr<std::unique_ptr<PsClient>> c;
  {
    pyb::gil_scoped_release unlocked;
    c = PsClient::Connect(options_);
  }
  if (!c.ok()) {
    callbacks_->notifier()->Close();
    ThrowStatus(c.status());
  }
  client_ = std::move(*c);
}

Client::Client(std::shared_ptr<PsClient> client, const ClientOptions& options)
    : options_(options),
      client_(std::move(client)),
      callbacks_(std::make_shared<Callbacks>(std::make_shared<Notifier>())),
      raw_(options.security) {}

Client::~Client() { Close(); }

void Client::Close() {
  if (client_ == nullptr) return;
  std::shared_ptr<PsClient> c = std::move(client_);
  client_ = nullptr;
  {
    pyb::gil_scoped_release unlocked;
    callbacks_->notifier()->WaitIdle();
    c.reset();  // the last reference waits for every call in flight (blocking ones too)
  }
  callbacks_->notifier()->Close();
}

std::shared_ptr<PsClient> Client::Get() const {
  if (client_ == nullptr) ThrowStatus(absl::CancelledError("the client is closed"));
  return client_;
}

absl::StatusOr<uint32_t> Client::Dim(const std::shared_ptr<PsClient>& c, const std::string& table) {
  auto it = dims_.find(table);
  if (it != dims_.end()) return it->second;
  absl::StatusOr<TableSpec> spec;
  {
    pyb::gil_scoped_release unlocked;
    spec = c->GetTable(table);
  }
  if (!spec.ok()) return spec.status();
  dims_[table] = spec->dim();
  return spec->dim();
}

absl::StatusOr<std::vector<ssize_t>> Client::Shape(const std::shared_ptr<PsClient>& c,
                                                   const std::string& name) {
  auto it = shapes_.find(name);
  if (it != shapes_.end()) return it->second;
  absl::StatusOr<DenseSpec> spec;
  {
    pyb::gil_scoped_release unlocked;
    spec = c->GetDense(name);
  }
  if (!spec.ok()) return spec.status();
  std::vector<ssize_t> shape(spec->shape().begin(), spec->shape().end());
  shapes_[name] = shape;
  return shape;
}

void Client::CreateTable(const std::string& spec) {
  auto c = Get();
  const TableSpec parsed = Parse<TableSpec>(spec, "TableSpec");
  absl::Status s;
  {
    pyb::gil_scoped_release unlocked;
    s = c->CreateTable(parsed);
  }
  ThrowIfError(s);
}

void Client::CreateDense(const std::string& spec) {
  auto c = Get();
  const DenseSpec parsed = Parse<DenseSpec>(spec, "DenseSpec");
  absl::Status s;
  {
    pyb::gil_scoped_release unlocked;
    s = c->CreateDense(parsed);
  }
  ThrowIfError(s);
}

pyb::bytes Client::GetTable(const std::string& name) {
  auto c = Get();
  absl::StatusOr<TableSpec> spec;
  {
    pyb::gil_scoped_release unlocked;
    spec = c->GetTable(name);
  }
  ThrowIfError(spec.status());
  return Bytes(*spec);
}

pyb::bytes Client::GetDense(const std::string& name) {
  auto c = Get();
  absl::StatusOr<DenseSpec> spec;
  {
    pyb::gil_scoped_release unlocked;
    spec = c->GetDense(name);
  }
  ThrowIfError(spec.status());
  return Bytes(*spec);
}

absl::Status Client::PlanPull(const std::shared_ptr<PsClient>& c, const pyb::list& tables,
                              const pyb::list& ids, const pyb::list& outs, ValueType value_type,
                              bool widen, std::vector<PullSpec>* specs, pyb::list* rows,
                              pyb::list* keep) {
  const size_t n = SameLength(tables, ids, "pull: ids");
  SameLength(tables, outs, "pull: out");
  specs->reserve(n);
  for (size_t i = 0; i < n; ++i) {
    std::string table = tables[i].cast<std::string>();
    const std::string what = absl::StrCat("pull of '", table, "'");
    const absl::Span<const int64_t> id_span = IdsOf(ids[i], what);
    absl::StatusOr<uint32_t> dim = Dim(c, table);
    if (!dim.ok()) return dim.status();
    const std::vector<ssize_t> shape = {static_cast<ssize_t>(id_span.size()),
                                        static_cast<ssize_t>(*dim)};
    pyb::object out = outs[i];
    PullSpec spec{std::move(table), id_span};
    if (value_type == FLOAT32 || (out.is_none() ? widen : IsFloat32Array(out))) {
      if (out.is_none()) out = NewFloats(shape);
      spec.out = OutRows(out, id_span.size(), *dim, what);  // widened if compact
    } else {
      if (out.is_none()) out = NewHalfRows(shape);
      spec.out_half = OutHalfRows(out, id_span.size(), *dim, what);
    }
    specs->push_back(std::move(spec));
    rows->append(out);
    keep->append(ids[i]);
    keep->append(out);
  }
  return absl::OkStatus();
}

namespace {

// `value_type` as a ps.ValueType, or ValueError.
ValueType CheckedValueType(int value_type) {
  if (!ValueType_IsValid(value_type)) {
    ThrowValueError(absl::StrCat("pull: unknown value_type ", value_type,
                                 " (0 float32, 1 bfloat16, 2 float16)"));
  }
  return static_cast<ValueType>(value_type);
}

}  // namespace

std::unique_ptr<Handle> Client::PullAsync(const pyb::list& tables, const pyb::list& ids,
                                          const pyb::list& outs, bool read_only, int value_type,
                                          bool widen) {
  auto c = Get();
  PullOptions options;
  options.read_only = read_only;
  options.value_type = CheckedValueType(value_type);
  std::vector<PullSpec> specs;
  pyb::list rows, keep;
  absl::Status planned =
      PlanPull(c, tables, ids, outs, options.value_type, widen, &specs, &rows, &keep);
  if (!planned.ok()) return Handle::Failed(std::move(planned), callbacks_);
  auto state = std::make_shared<CallState>(callbacks_->notifier());
  {
    pyb::gil_scoped_release unlocked;
    c->PullAsync(std::move(specs), options).Then([state](absl::Status s) {
      state->Complete(std::move(s));
    });
    c.reset();
  }
  return std::make_unique<Handle>(std::move(state), callbacks_, std::move(keep), std::move(rows));
}

pyb::list Client::Pull(const pyb::list& tables, const pyb::list& ids, const pyb::list& outs,
                       bool read_only, int value_type, bool widen) {
  auto c = Get();
  PullOptions options;
  options.read_only = read_only;
  options.value_type = CheckedValueType(value_type);
  std::vector<PullSpec> specs;
  pyb::list rows, keep;
  ThrowIfError(PlanPull(c, tables, ids, outs, options.value_type, widen, &specs, &rows, &keep));
  absl::Status s;
  {
    pyb::gil_scoped_release unlocked;
    s = c->Pull(std::move(specs), options);
    c.reset();
  }
  ThrowIfError(s);
  return rows;
}

absl::Status Client::PlanPush(const std::shared_ptr<PsClient>& c, const pyb::list& tables,
                              const pyb::list& ids, const pyb::list& grads, float learning_rate,
                              std::vector<PushSpec>* specs) {
  const size_t n = SameLength(tables, ids, "push: ids");
  SameLength(tables, grads, "push: grads");
  specs->reserve(n);
  for (size_t i = 0; i < n; ++i) {
    std::string table = tables[i].cast<std::string>();
    const std::string what = absl::StrCat("push to '", table, "'");
    const absl::Span<const int64_t> id_span = IdsOf(ids[i], what);
    absl::StatusOr<uint32_t> dim = Dim(c, table);
    if (!dim.ok()) return dim.status();
    const float* g = GradRows(grads[i], id_span.size(), *dim, what);
    specs->push_back(PushSpec{std::move(table), id_span, g, learning_rate});
  }
  return absl::OkStatus();
}

std::unique_ptr<Handle> Client::PushAsync(const pyb::list& tables, const pyb::list& ids,
                                          const pyb::list& grads, float learning_rate) {
  auto c = Get();
  std::vector<PushSpec> specs;
  absl::Status planned = PlanPush(c, tables, ids, grads, learning_rate, &specs);
  if (!planned.ok()) return Handle::Failed(std::move(planned), callbacks_);
  auto state = std::make_shared<CallState>(callbacks_->notifier());
  {
    pyb::gil_scoped_release unlocked;
    // The request is built (the arrays read) before PushAsync returns.
    c->PushAsync(std::move(specs)).Then([state](absl::Status s) { state->Complete(std::move(s)); });
    c.reset();
  }
  return std::make_unique<Handle>(std::move(state), callbacks_, pyb::none(), pyb::none());
}

void Client::Push(const pyb::list& tables, const pyb::list& ids, const pyb::list& grads,
                  float learning_rate) {
  auto c = Get();
  std::vector<PushSpec> specs;
  ThrowIfError(PlanPush(c, tables, ids, grads, learning_rate, &specs));
  absl::Status s;
  {
    pyb::gil_scoped_release unlocked;
    s = c->Push(std::move(specs));
    c.reset();
  }
  ThrowIfError(s);
}

pyb::list Client::PullDense(const std::vector<std::string>& names) {
  auto c = Get();
  pyb::list values;
  std::vector<float*> out;
  for (const std::string& name : names) {
    absl::StatusOr<std::vector<ssize_t>> shape = Shape(c, name);
    ThrowIfError(shape.status());
    pyb::array_t<float> a = NewFloats(*shape);
    out.push_back(a.mutable_data());
    values.append(a);
  }
  absl::Status s;
  {
    pyb::gil_scoped_release unlocked;
    s = c->PullDense(names, out);
    c.reset();
  }
  ThrowIfError(s);
  return values;
}

void Client::PushDense(const std::vector<std::string>& names, const pyb::list& grads,
                       float learning_rate) {
  auto c = Get();
  if (grads.size() != names.size()) {
    ThrowValueError(
        absl::StrCat("dense push: ", grads.size(), " gradients for ", names.size(), " tensors"));
  }
  std::vector<const float*> g;
  for (size_t i = 0; i < names.size(); ++i) {
    absl::StatusOr<std::vector<ssize_t>> shape = Shape(c, names[i]);
    ThrowIfError(shape.status());
    size_t numel = 1;
    for (ssize_t d : *shape) numel *= static_cast<size_t>(d);
    g.push_back(
        DenseValues(grads[i], numel, false, absl::StrCat("dense push to '", names[i], "'")));
  }
  absl::Status s;
  {
    pyb::gil_scoped_release unlocked;
    s = c->PushDense(names, g, learning_rate);
    c.reset();
  }
  ThrowIfError(s);
}

pyb::list Client::Stats() {
  auto c = Get();
  absl::StatusOr<std::vector<PodStats>> stats;
  {
    pyb::gil_scoped_release unlocked;
    stats = c->StatsByPod();
    c.reset();
  }
  ThrowIfError(stats.status());
  pyb::list out;
  for (const PodStats& s : *stats)
    out.append(pyb::make_tuple(s.pod.id, s.pod.address, Bytes(s.response)));
  return out;
}

pyb::list Client::Describe() {
  auto c = Get();
  absl::StatusOr<std::vector<PodDescription>> described;
  {
    pyb::gil_scoped_release unlocked;
    described = c->DescribeByPod();
    c.reset();
  }
  ThrowIfError(described.status());
  pyb::list out;
  for (const PodDescription& d : *described) {
    out.append(pyb::make_tuple(d.pod.id, d.pod.address, Bytes(d.response)));
  }
  return out;
}

pyb::tuple Client::ShardMap() {
  const ShardMapView view = Get()->shard_map();
  pyb::array_t<uint32_t> owner(static_cast<ssize_t>(view.owner.size()));
  std::copy(view.owner.begin(), view.owner.end(), owner.mutable_data());
  pyb::list pods;
  for (const PodView& p : view.pods) pods.append(PodTuple(p));
  return pyb::make_tuple(view.epoch, owner, pods);
}

pyb::tuple Client::NextPushKey() {
  const PushKey key = Get()->NextPushKey();
  return pyb::make_tuple(key.worker_id(), key.incarnation(), key.sequence());
}

uint64_t Client::worker_id() { return Get()->worker_id(); }

uint64_t Client::incarnation() { return Get()->incarnation(); }

void Client::SetIdentity(uint64_t worker_id, uint64_t incarnation) {
  absl::Status s = Get()->SetIdentity(worker_id, incarnation);
  if (s.code() == absl::StatusCode::kInvalidArgument) ThrowValueError(std::string(s.message()));
  ThrowIfError(s);
}

pyb::dict Client::ClientStatsDict() {
  const ClientStats s = Get()->client_stats();
  pyb::dict d;
  d["pulls"] = s.pulls;
  d["pushes"] = s.pushes;
  d["push_rpcs"] = s.push_rpcs;
  d["duplicate_pushes"] = s.duplicate_pushes;
  d["reused_keys"] = s.reused_keys;
  d["retries"] = s.retries;
  d["map_refreshes"] = s.map_refreshes;
  d["reroutes"] = s.reroutes;
  d["read_fallbacks"] = s.read_fallbacks;
  return d;
}

pyb::bytes Client::RawCall(const std::string& address, const std::string& method,
                           const std::string& request) {
  Get();  // refused once closed
  absl::StatusOr<std::string> answer;
  {
    pyb::gil_scoped_release unlocked;
    answer = raw_.Call(address, method, request, options_.deadline_ms);
  }
  ThrowIfError(answer.status());
  return pyb::bytes(*answer);
}

void BindClient(pyb::module_& m) {
  pyb::class_<ChannelSecurity>(m, "ChannelSecurity",
                               "common/rpc/transport_security.h ChannelSecurity")
      .def(pyb::init<>())
      .def_readwrite("ca_file", &ChannelSecurity::ca_file)
      .def_readwrite("cert_file", &ChannelSecurity::cert_file)
      .def_readwrite("key_file", &ChannelSecurity::key_file)
      .def_readwrite("server_name", &ChannelSecurity::server_name)
      .def_readwrite("auth_token", &ChannelSecurity::auth_token)
      .def_readwrite("reload_interval_s", &ChannelSecurity::reload_interval_s);

  pyb::class_<ClientOptions>(m, "ClientOptions", "client/ps_client.h ClientOptions")
      .def(pyb::init<>())
      .def_readwrite("master", &ClientOptions::master)
      .def_readwrite("map_refresh_ms", &ClientOptions::map_refresh_ms)
      .def_readwrite("max_reroutes", &ClientOptions::max_reroutes)
      .def_readwrite("connect_timeout_ms", &ClientOptions::connect_timeout_ms)
      .def_readwrite("servers", &ClientOptions::servers)
      .def_readwrite("num_vshards", &ClientOptions::num_vshards)
      .def_readwrite("deadline_ms", &ClientOptions::deadline_ms)
      .def_readwrite("max_attempts", &ClientOptions::max_attempts)
      .def_readwrite("initial_backoff_ms", &ClientOptions::initial_backoff_ms)
      .def_readwrite("max_backoff_ms", &ClientOptions::max_backoff_ms)
      .def_readwrite("channels_per_server", &ClientOptions::channels_per_server)
      .def_readwrite("completion_threads", &ClientOptions::completion_threads)
      .def_readwrite("max_message_bytes", &ClientOptions::max_message_bytes)
      .def_readwrite("worker_id", &ClientOptions::worker_id)
      .def_readwrite("incarnation", &ClientOptions::incarnation)
      .def_readwrite("security", &ClientOptions::security);

  pyb::class_<Client>(m, "Client", "The C++ PsClient (see client/python/_core/client.h).")
      .def(pyb::init<const ClientOptions&>(), pyb::arg("options"))
      .def("close", &Client::Close)
      .def_property_readonly("closed", &Client::closed)
      .def_property_readonly("callbacks", &Client::callbacks)
      .def("create_table", &Client::CreateTable, pyb::arg("spec"))
      .def("create_dense", &Client::CreateDense, pyb::arg("spec"))
      .def("get_table", &Client::GetTable, pyb::arg("name"))
      .def("get_dense", &Client::GetDense, pyb::arg("name"))
      .def("pull", &Client::Pull, pyb::arg("tables"), pyb::arg("ids"), pyb::arg("outs"),
           pyb::arg("read_only"), pyb::arg("value_type") = 0, pyb::arg("widen") = false)
      .def("pull_async", &Client::PullAsync, pyb::arg("tables"), pyb::arg("ids"), pyb::arg("outs"),
           pyb::arg("read_only"), pyb::arg("value_type") = 0, pyb::arg("widen") = false)
      .def("push", &Client::Push, pyb::arg("tables"), pyb::arg("ids"), pyb::arg("grads"),
           pyb::arg("learning_rate"))
      .def("push_async", &Client::PushAsync, pyb::arg("tables"), pyb::arg("ids"), pyb::arg("grads"),
           pyb::arg("learning_rate"))
      .def("pull_dense", &Client::PullDense, pyb::arg("names"))
      .def("push_dense", &Client::PushDense, pyb::arg("names"), pyb::arg("grads"),
           pyb::arg("learning_rate"))
      .def("stats", &Client::Stats)
      .def("describe", &Client::Describe)
      .def("shard_map", &Client::ShardMap)
      .def("next_push_key", &Client::NextPushKey)
      .def_property_readonly("worker_id", &Client::worker_id)
      .def_property_readonly("incarnation", &Client::incarnation)
      .def("set_identity", &Client::SetIdentity, pyb::arg("worker_id"), pyb::arg("incarnation"))
      .def("client_stats", &Client::ClientStatsDict)
      .def("raw_call", &Client::RawCall, pyb::arg("address"), pyb::arg("method"),
           pyb::arg("request"));
}

}  // namespace ps::py
