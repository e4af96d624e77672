// elastic_ps.routing's functions, computed by the C++ routing rules themselves
// (common/routing/hash.h, vshards.h, shard_map.h): the Python SDK has no copy of them.
#include "client/python/_core/routing.h"

#include <pybind11/numpy.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "client/python/_core/arrays.h"
#include "client/python/_core/errors.h"
#include "common/routing/hash.h"
#include "common/routing/shard_map.h"
#include "common/routing/vshards.h"
#include "common/rpc/transport_security.h"

namespace ps::py {
namespace {

uint32_t CheckedVShards(uint64_t num_vshards) {
  absl::Status s = CheckNumVShards(num_vshards);
  if (!s.ok()) ThrowValueError(std::string(s.message()));
  return static_cast<uint32_t>(num_vshards);
}

// `name` as the bytes NameHash reads: a str's UTF-8, or bytes as they are.
std::string NameBytes(pyb::handle name) {
  if (pyb::isinstance<pyb::str>(name)) return name.cast<std::string>();
  return std::string(pyb::bytes(pyb::reinterpret_borrow<pyb::object>(name)));
}

template <typename Out, typename Fn>
pyb::array_t<Out> MapIds(pyb::handle ids, const char* what, Fn fn) {
  absl::Span<const int64_t> in = IdsOf(ids, what);
  pyb::array_t<Out> out(static_cast<ssize_t>(in.size()));
  Out* o = out.mutable_data();
  for (size_t i = 0; i < in.size(); ++i) o[i] = fn(in[i]);
  return out;
}

}  // namespace

void BindRouting(pyb::module_& m) {
  m.def(
      "name_hash", [](pyb::handle name) { return NameHash(NameBytes(name)); }, pyb::arg("name"),
      "NameHash (FNV-1a 64) of a table or tensor name (str as UTF-8, or bytes).");
  m.def(
      "mix64", [](uint64_t x) { return Mix64(x); }, pyb::arg("x"), "Mix64 of one uint64.");
  m.def(
      "mix64_array",
      [](pyb::handle ids) {
        return MapIds<uint64_t>(ids, "mix64",
                                [](int64_t x) { return Mix64(static_cast<uint64_t>(x)); });
      },
      pyb::arg("values"), "Mix64 of every element of an int64 array (uint64 bit patterns).");
  m.def(
      "route_hash",
      [](uint64_t table_hash, pyb::handle ids) {
        return MapIds<uint64_t>(ids, "route_hash",
                                [table_hash](int64_t id) { return RouteHash(table_hash, id); });
      },
      pyb::arg("table_hash"), pyb::arg("ids"), "RouteHash of every id (an int64 array).");
  m.def(
      "vshards",
      [](uint64_t table_hash, pyb::handle ids, uint64_t num_vshards) {
        const uint32_t v = CheckedVShards(num_vshards);
        return MapIds<uint32_t>(ids, "vshards", [table_hash, v](int64_t id) {
          return VShardOf(RouteHash(table_hash, id), v);
        });
      },
      pyb::arg("table_hash"), pyb::arg("ids"), pyb::arg("num_vshards"),
      "The vshard of every id (an int64 array) of the table whose NameHash is table_hash.");
  m.def(
      "dense_vshard",
      [](pyb::handle name, uint64_t num_vshards) {
        return DenseVShard(NameBytes(name), CheckedVShards(num_vshards));
      },
      pyb::arg("name"), pyb::arg("num_vshards"), "The vshard of a dense tensor.");
  m.def("check_num_vshards", &CheckedVShards, pyb::arg("num_vshards"),
        "num_vshards if it is a power of two in [1, 65536]; else ValueError.");
  m.def(
      "static_owners",
      [](uint64_t num_vshards, uint64_t num_pods) {
        const uint32_t v = CheckedVShards(num_vshards);
        absl::StatusOr<ShardMap> map =
            ShardMap::Static(v, static_cast<uint32_t>(std::min<uint64_t>(num_pods, UINT32_MAX)));
        if (!map.ok()) ThrowValueError(std::string(map.status().message()));
        pyb::array_t<uint32_t> owner(v);
        for (uint32_t s = 0; s < v; ++s) owner.mutable_data()[s] = map->PodOfVShard(s);
        return owner;
      },
      pyb::arg("num_vshards"), pyb::arg("num_pods"),
      "owner[v] of the static map of num_pods pods (ps-server --shard=i/num_pods).");
  m.def(
      "read_auth_token_file",
      [](const std::string& path) {
        absl::StatusOr<std::string> token = ReadAuthTokenFile(path);
        if (!token.ok()) ThrowStatus(token.status());
        return *token;
      },
      pyb::arg("path"), "The token in a file (common/rpc/transport_security.h ReadAuthTokenFile).");
}

}  // namespace ps::py
