#include "client/pull_scatter.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/half.h"
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
  std::vector<uint16_t> narrow;  // a widened entry's row, as it came
  for (size_t e = 0; e < entries.size(); ++e) {
    const PullScatter::Entry& entry = entries[e];
    const size_t wire_row = scatter.wire_row_bytes(entry);
    const size_t out_row = scatter.out_row_bytes(entry);
    if (tables[e].values_bytes != entry.dest.size() * wire_row) {
      return absl::InternalError(absl::StrCat("pod ", pod, " answered a pull of '", entry.table,
                                              "' with the wrong number of values"));
    }
    char* out = static_cast<char*>(entry.out);
    wire::Reader values(tables[e].values);
    if (!entry.widen) {
      for (uint32_t i : entry.dest) values.CopyTo(out + i * out_row, wire_row);
      continue;
    }
    narrow.resize(entry.dim);
    auto widen = scatter.wire == BFLOAT16 ? Bf16sToFloats : Fp16sToFloats;
    for (uint32_t i : entry.dest) {
      values.CopyTo(reinterpret_cast<char*>(narrow.data()), wire_row);
      widen(narrow.data(), entry.dim, reinterpret_cast<float*>(out + i * out_row));
    }
  }
  return absl::OkStatus();
}

void CopyDuplicates(const std::vector<PullDuplicates>& dups) {
  for (const PullDuplicates& table : dups) {
    const size_t row_bytes = table.row_bytes;
    char* out = static_cast<char*>(table.out);
    for (auto [i, first] : table.rows) {
      std::memcpy(out + i * row_bytes, out + first * row_bytes, row_bytes);
    }
  }
}

}  // namespace ps::internal
