// Hand-written protobuf wire format for the bulk messages of ps.proto, so that their large
// `bytes` fields (rows, ids, gradients) cross gRPC without being copied: an encoded message
// is a grpc::ByteBuffer whose large fields are slices of their own, moved out of the
// message; a decoded message gives those fields as pieces of the received slices.
//
// ps.proto stays the wire contract: what is written here parses with stock protobuf, and
// anything protobuf writes (in any slice split, with unknown fields) decodes here.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/ps.pb.h"

namespace ps::wire {

// Moves the large bytes fields of the message into the returned buffer (they become empty
// in *msg); the rest is copied. The buffer parses as the message did before the call.
// (A pod writes its PullResponse with PullResponseWriter below.)
grpc::ByteBuffer EncodePullRequest(PullRequest* msg);
grpc::ByteBuffer EncodePushRequest(PushRequest* msg);
// A ReplicateRecordsRequest: `header`'s fields (its `records` must be empty) and then
// `records`, in order, as its records. Each large record becomes a slice over the shared
// string itself, which the buffer keeps alive (a reference per slice) until gRPC has sent
// it: the records of a primary's replication stream reach the socket without a copy.
grpc::ByteBuffer EncodeReplicateRecordsRequest(
    const ReplicateRecordsRequest& header,
    absl::Span<const std::shared_ptr<const std::string>> records);

// Builds a PullResponse entry by entry, the values of each entry in a buffer of their own
// that becomes a slice of the message, so rows written there are never copied again.
// Not thread-safe.
class PullResponseWriter {
 public:
  PullResponseWriter() = default;
  PullResponseWriter(const PullResponseWriter&) = delete;
  PullResponseWriter& operator=(const PullResponseWriter&) = delete;

  void set_epoch(uint64_t epoch) { epoch_ = epoch; }
  // Adds an entry and returns its values buffer: `bytes` bytes, uninitialized, 64-byte
  // aligned, owned by the writer (then by the message) and valid until Finish.
  char* AddEntry(const std::string& table, size_t bytes);
  // The message; the writer is empty afterwards.
  grpc::ByteBuffer Finish();

 private:
  struct FreeDeleter {
    void operator()(char* p) const { std::free(p); }
  };
  struct Entry {
    std::string table;
    std::unique_ptr<char, FreeDeleter> values;
    size_t bytes = 0;
  };
  uint64_t epoch_ = 0;
  std::vector<Entry> entries_;
};

// The slices of a received buffer as views. The views live as long as *slices, which
// holds references to the buffer's memory (so the ByteBuffer itself may go).
std::vector<absl::string_view> Pieces(const grpc::ByteBuffer& buffer,
                                      std::vector<grpc::Slice>* slices);

// A forward cursor over a message held in pieces (e.g. the slices of a received buffer).
// Reads return false when the message ends early or is malformed. Not thread-safe; the
// pieces must outlive the reader.
class Reader {
 public:
  explicit Reader(absl::Span<const absl::string_view> pieces);

  size_t remaining() const { return remaining_; }
  bool ReadVarint(uint64_t* v);
  bool ReadFixed32(uint32_t* v);
  // The next n bytes, as views into the pieces (no copy).
  bool ReadPieces(size_t n, std::vector<absl::string_view>* out);
  // Copies the next n bytes to dst.
  bool CopyTo(char* dst, size_t n) {
    if (n <= left_in_piece_ && n <= remaining_) {  // the common case: within one piece
      std::memcpy(dst, cur_, n);
      cur_ += n;
      left_in_piece_ -= n;
      remaining_ -= n;
      return true;
    }
    return CopySlow(dst, n);
  }
  bool Skip(size_t n);
  // Skips the value of the field whose tag was just read, as protobuf skips an unknown
  // field: a varint, fixed32/64, length-delimited bytes, or a (deprecated) group up to its
  // matching end tag, nested at most 100 deep as protobuf's default recursion limit.
  // False for a malformed value or a stray end-group tag.
  bool SkipValue(uint64_t tag);

 private:
  bool CopySlow(char* dst, size_t n);
  void NextPiece();

  absl::Span<const absl::string_view> pieces_;
  size_t next_piece_ = 0;
  const char* cur_ = nullptr;
  size_t left_in_piece_ = 0;
  size_t remaining_ = 0;
};

// One entry of a decoded PullResponse: `values` is the packed float32 bytes, in pieces.
struct TableValuesView {
  std::string table;
  std::vector<absl::string_view> values;
  size_t values_bytes = 0;
};

// Decodes a PullResponse held in `pieces`; the views in *tables live as long as the
// pieces. INVALID_ARGUMENT (naming what was wrong) if the bytes are not a PullResponse.
absl::Status DecodePullResponse(absl::Span<const absl::string_view> pieces, uint64_t* epoch,
                                std::vector<TableValuesView>* tables);

}  // namespace ps::wire
