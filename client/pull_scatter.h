// Where a pull's rows go in the caller's buffers: each pod's answer is scattered as it
// arrives (on the completion thread that received it, while the rows are in cache), and
// the rows of repeated ids are copied from their first occurrence once every pod answered.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/ps.pb.h"
#include "proto/value_type.h"

namespace ps::internal {

// Where one pull RPC's rows go: for entry e of its request (one table), the answer's row
// k is written to entries[e].out + entries[e].dest[k] * the entry's out_row_bytes. The
// answer's values are of type `wire` (the request's value_type); an entry either takes
// them as they are (float32, or the raw 16-bit values) or, `widen`, widens 16-bit values
// to float32 (exact: common/base/half.h) while scattering them.
struct PullScatter {
  struct Entry {
    std::string table;
    void* out = nullptr;
    uint32_t dim = 0;
    bool widen = false;
    std::vector<uint32_t> dest;
  };
  ValueType wire = FLOAT32;
  std::vector<Entry> entries;

  // Bytes of one row in the answer, and in the caller's buffer.
  size_t wire_row_bytes(const Entry& e) const { return e.dim * ValueTypeBytes(wire); }
  size_t out_row_bytes(const Entry& e) const {
    return e.dim * (e.widen ? sizeof(float) : ValueTypeBytes(wire));
  }
};

// Decodes a pod's PullResponse (`response`, emptied: the rows are read in place) and
// writes its rows where `scatter` says. INTERNAL, naming `pod`, when the answer does not
// match the request (not a PullResponse, another number of tables or of values). Not
// thread-safe for one buffer; distinct RPCs of a call write disjoint rows.
absl::Status ScatterRows(const PullScatter& scatter, grpc::ByteBuffer* response,
                         absl::string_view pod);

// The repeated ids of one table of a pull: row `i` of `out` is a copy of row `first`,
// rows being row_bytes long.
struct PullDuplicates {
  void* out = nullptr;
  size_t row_bytes = 0;
  std::vector<std::pair<uint32_t, uint32_t>> rows;  // (i, first)
};

// Copies every duplicate row from its first occurrence (once every RPC's rows are in).
void CopyDuplicates(const std::vector<PullDuplicates>& dups);

}  // namespace ps::internal
