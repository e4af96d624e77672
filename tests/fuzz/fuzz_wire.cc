// libFuzzer harness: the packed wire format of the bulk messages (proto/wire.h,
// proto/packed.h), as the pod and the client parse them. An input is
//   u8 which message (mod 3: PullRequest, PushRequest, PullResponse), u8 how to cut the
//   message into pieces (as HTTP/2 frames cut a received buffer), then the message bytes.
// Checks (any mismatch aborts):
// - PullRequest / PushRequest, parsed as the pod parses them (gRPC's deserializer into
//   ps.proto's messages, then PackedView over ids and gradients): a packed view exists
//   exactly when the bytes are a whole number of values; the client's encoder
//   (EncodePullRequest / EncodePushRequest) writes what stock protobuf reads back as the
//   same message (less unknown fields).
// - PullResponse, decoded as the client decodes it (DecodePullResponse over the pieces):
//   whatever stock protobuf parses decodes here to the same epoch, names and values; and
//   a decoded entry's pieces hold exactly its values_bytes.
//
// Seeds: tests/fuzz/corpus/wire/ (tests/fuzz/make_corpus.py).
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/util/field_comparator.h>
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/string_view.h"
#include "proto/packed.h"
#include "proto/ps.pb.h"
#include "proto/wire.h"

namespace {

using google::protobuf::util::MessageDifferencer;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_wire: %s\n", what);
    std::abort();
  }
}

// Cuts `bytes` into pieces (some empty) with lengths drawn from `seed`.
std::vector<absl::string_view> Cut(absl::string_view bytes, uint8_t seed) {
  std::vector<absl::string_view> pieces;
  uint32_t state = seed * 2654435761u + 1;
  size_t at = 0;
  while (at < bytes.size()) {
    state = state * 1103515245u + 12345u;
    const size_t n =
        std::min<size_t>(bytes.size() - at, seed == 0 ? bytes.size() : (state >> 16) % 23);
    pieces.push_back(bytes.substr(at, n));
    at += n;
  }
  return pieces;
}

grpc::ByteBuffer ToBuffer(const std::vector<absl::string_view>& pieces) {
  std::vector<grpc::Slice> slices;
  for (absl::string_view p : pieces) slices.emplace_back(p.data(), p.size());
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  for (absl::string_view p : ps::wire::Pieces(buffer, &slices)) out.append(p.data(), p.size());
  return out;
}

template <typename T>
void CheckPacked(const std::string& bytes) {
  std::vector<T> scratch;
  auto view = ps::PackedView<T>(bytes, &scratch, "field", "t");
  Check(view.ok() == (bytes.size() % sizeof(T) == 0), "PackedView accepts exactly whole values");
  if (view.ok()) {
    Check(view->size() * sizeof(T) == bytes.size(), "PackedView covers the bytes");
    Check(bytes.empty() || std::memcmp(view->data(), bytes.data(), bytes.size()) == 0,
          "PackedView holds the bytes");
  }
}

// Parses as the pod does; re-encodes as the client does and checks protobuf agrees.
template <typename Msg>
void CheckRequest(const std::vector<absl::string_view>& pieces, grpc::ByteBuffer (*encode)(Msg*)) {
  grpc::ByteBuffer raw = ToBuffer(pieces);
  Msg msg;
  if (!grpc::SerializationTraits<Msg>::Deserialize(&raw, &msg).ok()) return;
  for (const auto& t : msg.tables()) {
    CheckPacked<int64_t>(t.ids());
    if constexpr (std::is_same_v<Msg, ps::PushRequest>) CheckPacked<float>(t.grads());
  }
  msg.DiscardUnknownFields();
  Msg copy = msg;
  const std::string encoded = Flatten(encode(&copy));
  Msg back;
  Check(back.ParseFromString(encoded), "protobuf parses what the client encodes");
  // A float field may hold a NaN (a push's learning_rate: the pod refuses it, the wire
  // carries it), which == never equals: NaNs compare equal here.
  google::protobuf::util::DefaultFieldComparator floats;
  floats.set_treat_nan_as_equal(true);
  MessageDifferencer differencer;
  differencer.set_field_comparator(&floats);
  Check(differencer.Compare(back, msg), "the client's encoding keeps the message");
}

void CheckPullResponse(absl::string_view bytes, const std::vector<absl::string_view>& pieces) {
  uint64_t epoch = 0;
  std::vector<ps::wire::TableValuesView> tables;
  const absl::Status s = ps::wire::DecodePullResponse(pieces, &epoch, &tables);
  if (s.ok()) {
    for (const auto& t : tables) {
      size_t n = 0;
      for (absl::string_view p : t.values) n += p.size();
      Check(n == t.values_bytes, "an entry's pieces hold its values_bytes");
    }
  } else {
    Check(s.code() == absl::StatusCode::kInvalidArgument, "a malformed answer is INVALID_ARGUMENT");
  }
  ps::PullResponse expected;
  if (!expected.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return;
  Check(s.ok(), "what protobuf parses decodes");
  Check(epoch == expected.epoch(), "the epoch decodes");
  Check(tables.size() == static_cast<size_t>(expected.tables_size()), "every entry decodes");
  for (size_t i = 0; i < tables.size(); ++i) {
    Check(tables[i].table == expected.tables(i).table(), "the table name decodes");
    std::string values;
    for (absl::string_view p : tables[i].values) values.append(p.data(), p.size());
    Check(values == expected.tables(i).values(), "the values decode");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Stock protobuf logs every string field with invalid UTF-8 it refuses: noise here.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const absl::string_view bytes(reinterpret_cast<const char*>(data) + 2, size - 2);
  const std::vector<absl::string_view> pieces = Cut(bytes, data[1]);
  switch (data[0] % 3) {
    case 0:
      CheckRequest<ps::PullRequest>(pieces, &ps::wire::EncodePullRequest);
      break;
    case 1:
      CheckRequest<ps::PushRequest>(pieces, &ps::wire::EncodePushRequest);
      break;
    default:
      CheckPullResponse(bytes, pieces);
      break;
  }
  return 0;
}
