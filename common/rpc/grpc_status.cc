#include "common/rpc/grpc_status.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <cstdint>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace ps {
namespace {

using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;
using google::protobuf::io::StringOutputStream;

// Field numbers of google.rpc.Status {int32 code = 1; string message = 2;
// repeated google.protobuf.Any details = 3;} and google.protobuf.Any {string type_url = 1;
// bytes value = 2;}. Written by hand: Debian ships no google/rpc/status.proto, and these
// five fields are the whole format.
constexpr uint32_t kStatusCode = 1, kStatusMessage = 2, kStatusDetails = 3;
constexpr uint32_t kAnyTypeUrl = 1, kAnyValue = 2;
constexpr uint32_t kVarint = 0, kLengthDelimited = 2;

constexpr uint32_t Tag(uint32_t field, uint32_t wire_type) { return (field << 3) | wire_type; }

void WriteBytes(CodedOutputStream* out, uint32_t field, absl::string_view bytes) {
  out->WriteTag(Tag(field, kLengthDelimited));
  out->WriteVarint32(static_cast<uint32_t>(bytes.size()));
  out->WriteRaw(bytes.data(), static_cast<int>(bytes.size()));
}

// The google.rpc.Status of `s`, its payloads as details.
std::string EncodeDetails(const absl::Status& s) {
  std::string encoded;
  {
    StringOutputStream stream(&encoded);
    CodedOutputStream out(&stream);
    out.WriteTag(Tag(kStatusCode, kVarint));
    out.WriteVarint32(static_cast<uint32_t>(s.code()));
    WriteBytes(&out, kStatusMessage, s.message());
    s.ForEachPayload([&out](absl::string_view type_url, const absl::Cord& value) {
      std::string any;
      {
        StringOutputStream any_stream(&any);
        CodedOutputStream any_out(&any_stream);
        WriteBytes(&any_out, kAnyTypeUrl, type_url);
        WriteBytes(&any_out, kAnyValue, std::string(value));
      }
      WriteBytes(&out, kStatusDetails, any);
    });
  }
  return encoded;
}

// Reads one length-delimited field's bytes.
bool ReadBytes(CodedInputStream* in, std::string* out) {
  uint32_t size;
  return in->ReadVarint32(&size) && in->ReadString(out, static_cast<int>(size));
}

// Skips a field this reader does not use; false on malformed input.
bool Skip(CodedInputStream* in, uint32_t tag) {
  switch (tag & 7) {
    case kVarint: {
      uint64_t unused;
      return in->ReadVarint64(&unused);
    }
    case 1:
      return in->Skip(8);
    case kLengthDelimited: {
      uint32_t size;
      return in->ReadVarint32(&size) && in->Skip(static_cast<int>(size));
    }
    case 5:
      return in->Skip(4);
    default:
      return false;
  }
}

// One google.protobuf.Any: false if malformed.
bool DecodeAny(absl::string_view bytes, std::string* type_url, std::string* value) {
  CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                      static_cast<int>(bytes.size()));
  while (uint32_t tag = in.ReadTag()) {
    if (tag == Tag(kAnyTypeUrl, kLengthDelimited)) {
      if (!ReadBytes(&in, type_url)) return false;
    } else if (tag == Tag(kAnyValue, kLengthDelimited)) {
      if (!ReadBytes(&in, value)) return false;
    } else if (!Skip(&in, tag)) {
      return false;
    }
  }
  return in.ConsumedEntireMessage() && !type_url->empty();
}

// Sets the details of a google.rpc.Status as payloads of `s`; stops at malformed input.
void DecodeDetails(const std::string& encoded, absl::Status* s) {
  CodedInputStream in(reinterpret_cast<const uint8_t*>(encoded.data()),
                      static_cast<int>(encoded.size()));
  while (uint32_t tag = in.ReadTag()) {
    if (tag == Tag(kStatusDetails, kLengthDelimited)) {
      std::string any, type_url, value;
      if (!ReadBytes(&in, &any)) return;
      if (DecodeAny(any, &type_url, &value)) s->SetPayload(type_url, absl::Cord(value));
    } else if (!Skip(&in, tag)) {
      return;
    }
  }
}

bool HasPayloads(const absl::Status& s) {
  bool any = false;
  s.ForEachPayload([&any](absl::string_view, const absl::Cord&) { any = true; });
  return any;
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  const auto code = static_cast<grpc::StatusCode>(s.code());
  if (!HasPayloads(s)) return grpc::Status(code, std::string(s.message()));
  return grpc::Status(code, std::string(s.message()), EncodeDetails(s));
}

absl::Status FromGrpcStatus(const grpc::Status& s, absl::string_view where) {
  if (s.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(s.error_code());
  absl::Status out = where.empty()
                         ? absl::Status(code, s.error_message())
                         : absl::Status(code, absl::StrCat(where, ": ", s.error_message()));
  if (!s.error_details().empty()) DecodeDetails(s.error_details(), &out);
  return out;
}

}  // namespace ps
