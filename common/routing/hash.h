// Hashing shared by the server, the C++ client and the Python client (which reimplements
// exactly these functions with numpy): routing of ids to vshards, lock striping and the
// seeds of row initializers. Changing any of them changes where every row lives.
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"

namespace ps {

// The splitmix64 finalizer: a bijective 64-bit mix with good avalanche.
inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// FNV-1a 64 of a table or tensor name.
inline uint64_t NameHash(absl::string_view name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

// The routing hash of row `id` of the table whose NameHash is `name_hash`.
inline uint64_t RouteHash(uint64_t name_hash, int64_t id) {
  return Mix64(name_hash ^ Mix64(static_cast<uint64_t>(id)));
}

// The vshard of a routing hash; num_vshards is a power of two.
inline uint32_t VShardOf(uint64_t route_hash, uint32_t num_vshards) {
  return static_cast<uint32_t>(route_hash & (num_vshards - 1));
}

// Dense tensors route as row 0 of their name.
inline uint32_t DenseVShard(absl::string_view name, uint32_t num_vshards) {
  return VShardOf(RouteHash(NameHash(name), 0), num_vshards);
}

}  // namespace ps
