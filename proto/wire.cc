#include "proto/wire.h"

#include <algorithm>
#include <memory>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ps::wire {
namespace {

enum WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLength = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5
};
// How deep groups may nest in a skipped field (protobuf's default recursion limit).
constexpr int kMaxGroupDepth = 100;

// Bytes fields from this size travel as slices of their own; smaller ones are copied into
// the surrounding slice (a slice costs an allocation and an iovec entry).
constexpr size_t kOwnSliceBytes = 1024;

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// The size of a length-delimited field with a one-byte tag (field numbers < 16), or 0 for
// an empty one, which proto3 does not write.
size_t LengthFieldSize(size_t len) { return len == 0 ? 0 : 1 + VarintSize(len) + len; }
size_t VarintFieldSize(uint64_t v) { return v == 0 ? 0 : 1 + VarintSize(v); }
size_t Fixed32FieldSize(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits == 0 ? 0 : 5;
}

// Builds a message as a list of slices: small fields gather in one buffer, large bytes
// fields become slices of their own, moved in.
class Writer {
 public:
  void Varint(uint64_t v) {
    while (v >= 0x80) {
      buf_.push_back(static_cast<char>(v | 0x80));
      v >>= 7;
    }
    buf_.push_back(static_cast<char>(v));
  }
  void Tag(uint32_t field, WireType type) { Varint((field << 3) | type); }
  void VarintField(uint32_t field, uint64_t v) {
    if (v == 0) return;
    Tag(field, kVarint);
    Varint(v);
  }
  void FloatField(uint32_t field, float f) {
    if (Fixed32FieldSize(f) == 0) return;
    Tag(field, kFixed32);
    buf_.append(reinterpret_cast<const char*>(&f), 4);
  }
  void MessageHeader(uint32_t field, size_t len) {
    Tag(field, kLength);
    Varint(len);
  }
  void StringField(uint32_t field, const std::string& s) {
    if (s.empty()) return;
    MessageHeader(field, s.size());
    buf_.append(s);
  }
  // Writes *bytes as a length-delimited field; a large one is moved into its own slice
  // and *bytes is left empty.
  void BytesField(uint32_t field, std::string* bytes) {
    if (bytes->size() < kOwnSliceBytes) {
      StringField(field, *bytes);
      return;
    }
    MessageHeader(field, bytes->size());
    Flush();
    // The slice owns the string from here; gRPC destroys it when the bytes are sent.
    auto owned = std::make_unique<std::string>(std::move(*bytes));
    bytes->clear();
    void* data = owned->data();
    const size_t size = owned->size();
    slices_.emplace_back(data, size, &DeleteString, owned.release());
  }
  // Writes *bytes as a length-delimited field; a large one becomes a slice of its own over
  // the shared string, which the slice keeps alive (one reference) until it is sent.
  void SharedBytesField(uint32_t field, const std::shared_ptr<const std::string>& bytes) {
    if (bytes->size() < kOwnSliceBytes) {
      StringField(field, *bytes);
      return;
    }
    MessageHeader(field, bytes->size());
    Flush();
    auto ref = std::make_unique<std::shared_ptr<const std::string>>(bytes);
    // gRPC only reads a slice's bytes; the non-const pointer is its constructor's type.
    void* data = const_cast<char*>(bytes->data());
    slices_.emplace_back(data, bytes->size(), &DropShared, ref.release());
  }
  // Appends `bytes` bytes at `data` as a slice of their own; the slice owns them and
  // gRPC calls free(data) once they are sent.
  void OwnMalloced(char* data, size_t bytes) {
    Flush();
    slices_.emplace_back(data, bytes, &std::free);
  }
  grpc::ByteBuffer Finish() {
    Flush();
    return grpc::ByteBuffer(slices_.data(), slices_.size());
  }

 private:
  static void DeleteString(void* s) { std::unique_ptr<std::string>(static_cast<std::string*>(s)); }
  static void DropShared(void* ref) {
    std::unique_ptr<std::shared_ptr<const std::string>>(
        static_cast<std::shared_ptr<const std::string>*>(ref));
  }
  void Flush() {
    if (buf_.empty()) return;
    slices_.emplace_back(buf_.data(), buf_.size());  // copies
    buf_.clear();
  }

  std::string buf_;
  std::vector<grpc::Slice> slices_;
};

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed PullResponse: ", what));
}

}  // namespace

char* PullResponseWriter::AddEntry(const std::string& table, size_t bytes) {
  Entry& e = entries_.emplace_back();
  e.table = table;
  e.bytes = bytes;
  char* p = static_cast<char*>(std::malloc(std::max<size_t>(bytes, 1)));
  if (p == nullptr) throw std::bad_alloc();
  e.values.reset(p);
  return p;
}

grpc::ByteBuffer PullResponseWriter::Finish() {
  Writer w;
  w.VarintField(1, epoch_);
  for (Entry& e : entries_) {
    w.MessageHeader(2, LengthFieldSize(e.table.size()) + LengthFieldSize(e.bytes));
    w.StringField(1, e.table);
    if (e.bytes > 0) {
      w.MessageHeader(2, e.bytes);
      w.OwnMalloced(e.values.release(), e.bytes);
    }
  }
  entries_.clear();
  epoch_ = 0;
  return w.Finish();
}

grpc::ByteBuffer EncodePullRequest(PullRequest* msg) {
  Writer w;
  w.VarintField(1, msg->epoch());
  for (TableIds& t : *msg->mutable_tables()) {
    w.MessageHeader(2, LengthFieldSize(t.table().size()) + LengthFieldSize(t.ids().size()));
    w.StringField(1, t.table());
    w.BytesField(2, t.mutable_ids());
  }
  w.VarintField(3, msg->read_only() ? 1 : 0);
  w.VarintField(4, static_cast<uint64_t>(msg->value_type()));
  return w.Finish();
}

grpc::ByteBuffer EncodePushRequest(PushRequest* msg) {
  Writer w;
  w.VarintField(1, msg->epoch());
  if (msg->has_key()) {
    const PushKey& k = msg->key();
    w.MessageHeader(2, VarintFieldSize(k.worker_id()) + VarintFieldSize(k.incarnation()) +
                           VarintFieldSize(k.sequence()) + VarintFieldSize(k.piece()));
    w.VarintField(1, k.worker_id());
    w.VarintField(2, k.incarnation());
    w.VarintField(3, k.sequence());
    w.VarintField(4, k.piece());
  }
  for (TableGrads& t : *msg->mutable_tables()) {
    w.MessageHeader(3, LengthFieldSize(t.table().size()) + LengthFieldSize(t.ids().size()) +
                           LengthFieldSize(t.grads().size()) + Fixed32FieldSize(t.learning_rate()));
    w.StringField(1, t.table());
    w.BytesField(2, t.mutable_ids());
    w.BytesField(3, t.mutable_grads());
    w.FloatField(4, t.learning_rate());
  }
  return w.Finish();
}

grpc::ByteBuffer EncodeReplicateRecordsRequest(
    const ReplicateRecordsRequest& header,
    absl::Span<const std::shared_ptr<const std::string>> records) {
  Writer w;
  w.VarintField(1, header.epoch());
  w.StringField(2, header.primary());
  for (const std::shared_ptr<const std::string>& r : records) {
    if (r->empty()) {  // proto3 writes an empty repeated element too
      w.MessageHeader(3, 0);
      continue;
    }
    w.SharedBytesField(3, r);
  }
  w.VarintField(4, header.stream());
  w.VarintField(5, header.first());
  w.VarintField(6, header.restart() ? 1 : 0);
  return w.Finish();
}

std::vector<absl::string_view> Pieces(const grpc::ByteBuffer& buffer,
                                      std::vector<grpc::Slice>* slices) {
  slices->clear();
  std::vector<absl::string_view> pieces;
  if (!buffer.Dump(slices).ok()) return pieces;
  pieces.reserve(slices->size());
  for (const grpc::Slice& s : *slices) {
    pieces.emplace_back(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return pieces;
}

Reader::Reader(absl::Span<const absl::string_view> pieces) : pieces_(pieces) {
  for (absl::string_view p : pieces_) remaining_ += p.size();
  NextPiece();
}

void Reader::NextPiece() {
  while (next_piece_ < pieces_.size()) {
    absl::string_view p = pieces_[next_piece_++];
    if (!p.empty()) {
      cur_ = p.data();
      left_in_piece_ = p.size();
      return;
    }
  }
  cur_ = nullptr;
  left_in_piece_ = 0;
}

bool Reader::ReadVarint(uint64_t* v) {
  uint64_t result = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    uint8_t b;
    if (!CopyTo(reinterpret_cast<char*>(&b), 1)) return false;
    result |= uint64_t{b & 0x7fu} << shift;
    if ((b & 0x80) == 0) {
      *v = result;
      return true;
    }
  }
  return false;  // more than 10 bytes
}

bool Reader::ReadFixed32(uint32_t* v) { return CopyTo(reinterpret_cast<char*>(v), 4); }

bool Reader::CopySlow(char* dst, size_t n) {
  if (n > remaining_) return false;
  remaining_ -= n;
  while (n > 0) {
    if (left_in_piece_ == 0) NextPiece();
    const size_t take = std::min(n, left_in_piece_);
    std::memcpy(dst, cur_, take);
    dst += take;
    cur_ += take;
    left_in_piece_ -= take;
    n -= take;
  }
  return true;
}

bool Reader::ReadPieces(size_t n, std::vector<absl::string_view>* out) {
  if (n > remaining_) return false;
  remaining_ -= n;
  while (n > 0) {
    if (left_in_piece_ == 0) NextPiece();
    const size_t take = std::min(n, left_in_piece_);
    out->emplace_back(cur_, take);
    cur_ += take;
    left_in_piece_ -= take;
    n -= take;
  }
  return true;
}

bool Reader::Skip(size_t n) {
  if (n > remaining_) return false;
  remaining_ -= n;
  while (n > 0) {
    if (left_in_piece_ == 0) NextPiece();
    const size_t take = std::min(n, left_in_piece_);
    cur_ += take;
    left_in_piece_ -= take;
    n -= take;
  }
  return true;
}

bool Reader::SkipValue(uint64_t tag) {
  // The field numbers of the groups being skipped, innermost last.
  std::vector<uint64_t> open_groups;
  for (;;) {
    uint64_t v;
    bool ok = true;
    switch (tag & 7) {
      case kVarint:
        ok = ReadVarint(&v);
        break;
      case kFixed64:
        ok = Skip(8);
        break;
      case kLength:
        ok = ReadVarint(&v) && Skip(v);
        break;
      case kFixed32:
        ok = Skip(4);
        break;
      case kStartGroup:
        if (open_groups.size() >= kMaxGroupDepth) return false;
        open_groups.push_back(tag >> 3);
        break;
      case kEndGroup:
        if (open_groups.empty() || open_groups.back() != tag >> 3) return false;
        open_groups.pop_back();
        break;
      default:
        return false;  // wire types 6 and 7 do not exist
    }
    if (!ok) return false;
    if (open_groups.empty()) return true;
    if (!ReadVarint(&tag)) return false;  // the next field inside the group
  }
}

absl::Status DecodePullResponse(absl::Span<const absl::string_view> pieces, uint64_t* epoch,
                                std::vector<TableValuesView>* tables) {
  Reader r(pieces);
  *epoch = 0;
  tables->clear();
  while (r.remaining() > 0) {
    uint64_t tag, v;
    if (!r.ReadVarint(&tag)) return Malformed("truncated tag");
    const uint32_t type = tag & 7;
    if (tag >> 3 == 1 && type == kVarint) {
      if (!r.ReadVarint(epoch)) return Malformed("truncated epoch");
      continue;
    }
    if (tag >> 3 != 2 || type != kLength) {
      if (!r.SkipValue(tag)) return Malformed(absl::StrCat("bad field with tag ", tag));
      continue;
    }
    uint64_t len;
    if (!r.ReadVarint(&len) || len > r.remaining()) return Malformed("truncated table entry");
    const size_t end = r.remaining() - len;
    TableValuesView& t = tables->emplace_back();
    while (r.remaining() > end) {
      if (!r.ReadVarint(&tag)) return Malformed("truncated tag in table entry");
      const uint32_t field = tag >> 3;
      if ((field == 1 || field == 2) && (tag & 7) == kLength) {
        // The length's varint may itself run past the entry (then remaining() < end).
        if (!r.ReadVarint(&v) || r.remaining() < end || v > r.remaining() - end) {
          return Malformed("field overruns its table entry");
        }
        if (field == 1) {
          t.table.resize(v);
          if (v > 0) r.CopyTo(t.table.data(), v);
        } else {  // a repeated singular field: the last one wins, as in protobuf
          t.values.clear();
          r.ReadPieces(v, &t.values);
          t.values_bytes = v;
        }
      } else if (!r.SkipValue(tag)) {
        return Malformed(absl::StrCat("bad field with tag ", tag, " in table entry"));
      }
    }
    if (r.remaining() != end) return Malformed("field overruns its table entry");
  }
  return absl::OkStatus();
}

}  // namespace ps::wire
