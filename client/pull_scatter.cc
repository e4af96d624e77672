#include "client/pull_scatter.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "proto/wire.h"

namespace ps::internal {

absl::Status ScatterRows(const PullScatter& scatter, grpc::ByteBuffer* response,
                         absl::string_view pod) {
  std::vector<grpc::Slice> slices;
  std::vector<absl::string_view> pieces = wire::Pieces(*response, &slices);
  response->Clear();  // the slices hold the memory from here
  uint64_t epoch;
  std::vector<wire::TableValuesView> tables;
  absl::Status s = wire::DecodePullResponse(pieces, &epoch, &tables);
  if (!s.ok()) return absl::InternalError(absl::StrCat("pod ", pod, ": ", s.message()));
  const auto& entries = scatter.entries;
  if (tables.size() != entries.size()) {
    return absl::InternalError(
        absl::StrCat("pod ", pod, " answered ", tables.size(), " tables for ", entries.size()));
  }
  for (size_t e = 0; e < entries.size(); ++e) {
    const PullScatter::Entry& entry = entries[e];
    const size_t row_bytes = entry.dim * sizeof(float);
    if (tables[e].values_bytes != entry.dest.size() * row_bytes) {
      return absl::InternalError(absl::StrCat("pod ", pod, " answered a pull of '", entry.table,
                                              "' with the wrong number of values"));
    }
    char* out = reinterpret_cast<char*>(entry.out);
    wire::Reader values(tables[e].values);
    for (uint32_t i : entry.dest) values.CopyTo(out + i * row_bytes, row_bytes);
  }
  return absl::OkStatus();
}

void CopyDuplicates(const std::vector<PullDuplicates>& dups) {
  for (const PullDuplicates& table : dups) {
    const size_t row_bytes = table.dim * sizeof(float);
    char* out = reinterpret_cast<char*>(table.out);
    for (auto [i, first] : table.rows) {
      std::memcpy(out + i * row_bytes, out + first * row_bytes, row_bytes);
    }
  }
}

}  // namespace ps::internal
