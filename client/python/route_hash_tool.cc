// Prints the C++ routing hashes for the Python SDK's routing test.
//
// Input on stdin: a table name on the first line, then one signed 64-bit id per line.
// Output: "NAME_HASH <h>" then, per id, "<id> <RouteHash> <DenseVShard-style vshard of 256>".
// All values in decimal.
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>

#include "common/routing/hash.h"

int main() {
  std::string table;
  if (!std::getline(std::cin, table)) {
    std::fprintf(stderr, "route_hash_tool: expected a table name on the first line\n");
    return 2;
  }
  const uint64_t h = ps::NameHash(table);
  std::printf("NAME_HASH %llu\n", static_cast<unsigned long long>(h));
  std::printf("DENSE_VSHARD_256 %u\n", ps::DenseVShard(table, 256));
  long long id;
  while (std::cin >> id) {
    const uint64_t r = ps::RouteHash(h, static_cast<int64_t>(id));
    std::printf("%lld %llu %u\n", id, static_cast<unsigned long long>(r), ps::VShardOf(r, 256));
  }
  return 0;
}
