#include "proto/wire.h"

#include <gtest/gtest.h>

#include <random>

#include "absl/strings/escaping.h"
#include "google/protobuf/util/message_differencer.h"

namespace ps::wire {
namespace {

using google::protobuf::util::MessageDifferencer;

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  for (absl::string_view p : Pieces(buffer, &slices)) out.append(p.data(), p.size());
  return out;
}

std::string Floats(size_t n, float seed) {
  std::string s(n * sizeof(float), '\0');
  float* f = reinterpret_cast<float*>(s.data());
  for (size_t i = 0; i < n; ++i) f[i] = seed + 0.25f * static_cast<float>(i);
  return s;
}

// Splits `bytes` into pieces at random cut points (some empty) to mimic HTTP/2 frames.
std::vector<absl::string_view> RandomPieces(const std::string& bytes, std::mt19937* rng) {
  std::vector<absl::string_view> pieces;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t n = std::min<size_t>(bytes.size() - at, (*rng)() % 37);
    pieces.emplace_back(bytes.data() + at, n);
    at += n;
  }
  return pieces;
}

PullResponse SamplePullResponse() {
  PullResponse r;
  r.set_epoch(300);  // a two-byte varint
  auto* a = r.add_tables();
  a->set_table("small");
  a->set_values(Floats(3, 1));  // below the own-slice threshold: copied
  auto* b = r.add_tables();
  b->set_table("big");
  b->set_values(Floats(64 * 100, 2));  // its own slice
  auto* c = r.add_tables();
  c->set_values(Floats(1000, 3));  // no name: proto3 omits the field
  return r;
}

TEST(WireTest, PullResponseWriterMatchesProtobuf) {
  const PullResponse original = SamplePullResponse();
  PullResponseWriter writer;
  writer.set_epoch(original.epoch());
  for (const TableValues& t : original.tables()) {
    char* values = writer.AddEntry(t.table(), t.values().size());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(values) % alignof(float), 0u);
    std::memcpy(values, t.values().data(), t.values().size());
  }
  writer.AddEntry("empty", 0);  // proto3 writes neither an empty name nor empty values
  PullResponse expected = original;
  expected.add_tables()->set_table("empty");
  const std::string bytes = Flatten(writer.Finish());
  EXPECT_EQ(bytes, expected.SerializeAsString());
  PullResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  EXPECT_TRUE(MessageDifferencer::Equals(parsed, expected));
}

TEST(WireTest, PullRequestAndPushRequestParseWithProtobuf) {
  PullRequest pull;
  pull.set_epoch(7);
  pull.set_read_only(true);
  pull.set_value_type(BFLOAT16);  // issue 17: the compact value type reaches the pod
  for (int t = 0; t < 2; ++t) {
    auto* e = pull.add_tables();
    e->set_table("t" + std::to_string(t));
    e->set_ids(std::string(8 * (t == 0 ? 5 : 1000), static_cast<char>(t + 1)));
  }
  PullRequest pull_copy = pull;
  EXPECT_EQ(Flatten(EncodePullRequest(&pull_copy)), pull.SerializeAsString());

  PushRequest push;
  push.set_epoch(1);
  push.mutable_key()->set_worker_id(uint64_t{1} << 40);
  push.mutable_key()->set_sequence(9);  // incarnation 0: omitted
  auto* g = push.add_tables();
  g->set_table("emb");
  g->set_ids(std::string(8 * 512, '\x01'));
  g->set_grads(Floats(512 * 16, -1));
  g->set_learning_rate(0.5f);
  auto* h = push.add_tables();
  h->set_table("other");
  h->set_ids(std::string(8, '\x02'));
  h->set_grads(Floats(4, 0));
  h->set_learning_rate(-0.0f);  // protobuf writes -0.0 (its bits are not zero)
  PushRequest push_copy = push;
  const std::string bytes = Flatten(EncodePushRequest(&push_copy));
  EXPECT_EQ(bytes, push.SerializeAsString());
  PushRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  EXPECT_TRUE(MessageDifferencer::Equals(parsed, push));

  PushRequest keyless;  // no key: nothing written for it
  keyless.add_tables()->set_table("x");
  PushRequest keyless_copy = keyless;
  EXPECT_EQ(Flatten(EncodePushRequest(&keyless_copy)), keyless.SerializeAsString());

  PushRequest piece = push;  // a re-routed piece's key (PushKey.piece) is written too
  piece.mutable_key()->set_piece(17);
  PushRequest piece_copy = piece;
  EXPECT_EQ(Flatten(EncodePushRequest(&piece_copy)), piece.SerializeAsString());
}

TEST(WireTest, ReplicateRecordsRequestIsProtobufsAndHoldsTheRecordsUntilSent) {
  ReplicateRecordsRequest header;
  header.set_epoch(12);
  header.set_primary("ps-0");
  header.set_stream(uint64_t{1} << 63);
  header.set_first(300);
  header.set_restart(true);
  std::vector<std::shared_ptr<const std::string>> records = {
      std::make_shared<const std::string>(Floats(4000, 1)),  // a slice of its own
      std::make_shared<const std::string>("tiny"),           // copied
      std::make_shared<const std::string>(),                 // empty: still an element
      std::make_shared<const std::string>(Floats(300, 2))};
  ReplicateRecordsRequest expected = header;
  for (const auto& r : records) expected.add_records(*r);
  std::string bytes;
  {
    grpc::ByteBuffer buffer = EncodeReplicateRecordsRequest(header, records);
    EXPECT_GT(records[0].use_count(), 1);  // the buffer holds the record, not a copy
    bytes = Flatten(buffer);
  }
  EXPECT_EQ(records[0].use_count(), 1);  // released with the buffer
  EXPECT_EQ(records[3].use_count(), 1);
  EXPECT_EQ(bytes, expected.SerializeAsString());
  ReplicateRecordsRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  EXPECT_TRUE(MessageDifferencer::Equals(parsed, expected));

  ReplicateRecordsRequest unnumbered;  // zero fields and no records: an empty message
  EXPECT_EQ(Flatten(EncodeReplicateRecordsRequest(unnumbered, {})), "");
}

TEST(WireTest, DecodesProtobufBytesInAnySliceSplit) {
  const PullResponse original = SamplePullResponse();
  const std::string bytes = original.SerializeAsString();
  std::mt19937 rng(1);
  for (int round = 0; round < 50; ++round) {
    std::vector<absl::string_view> pieces = RandomPieces(bytes, &rng);
    uint64_t epoch;
    std::vector<TableValuesView> tables;
    ASSERT_TRUE(DecodePullResponse(pieces, &epoch, &tables).ok());
    EXPECT_EQ(epoch, 300u);
    ASSERT_EQ(tables.size(), 3u);
    for (int t = 0; t < 3; ++t) {
      EXPECT_EQ(tables[t].table, original.tables(t).table());
      std::string values;
      for (absl::string_view p : tables[t].values) values.append(p.data(), p.size());
      EXPECT_EQ(values, original.tables(t).values());
      EXPECT_EQ(tables[t].values_bytes, values.size());
    }
  }
}

TEST(WireTest, DecodeSkipsUnknownFields) {
  PullResponse original = SamplePullResponse();
  std::string bytes = original.SerializeAsString();
  // Unknown top-level fields of every wire type: 15 varint, 14 fixed64, 13 bytes, 12 fixed32.
  bytes += std::string("\x78\x96\x01", 3) + std::string("\x71", 1) + std::string(8, 'x') +
           std::string("\x6a\x02zz", 4) + std::string("\x65", 1) + std::string(4, 'y');
  uint64_t epoch;
  std::vector<TableValuesView> tables;
  std::vector<absl::string_view> one = {bytes};
  ASSERT_TRUE(DecodePullResponse(one, &epoch, &tables).ok());
  EXPECT_EQ(tables.size(), 3u);
  PullResponse parsed;  // protobuf agrees the bytes are valid
  ASSERT_TRUE(parsed.ParseFromString(bytes));
}

// Found by tests/fuzz/fuzz_wire.cc (corpus/wire/regression-empty_group): unknown fields of
// the deprecated group wire type (3 start, 4 end), which protobuf skips, were refused.
// Each case decodes exactly when stock protobuf parses it.
TEST(WireTest, DecodeSkipsUnknownGroupsAsProtobufDoes) {
  const std::string base = SamplePullResponse().SerializeAsString();
  struct Case {
    std::string suffix;
    bool valid;
  };
  const Case cases[] = {
      {"\x63\x64", true},                   // empty group 12
      {"\x63\x78\x05\x65zzzz\x64", true},   // group 12 holding a varint and a fixed32
      {"\x63\x5b\x5c\x6a\x01q\x64", true},  // group 11 nested in 12, then bytes
      {"\x12\x05\x63\x64\x0a\x01t", true},  // an empty group inside a table entry
      {"\x63\x5c", false},                  // ends group 11 inside group 12
      {"\x64", false},                      // an end without a start
      {"\x63\x78\x05", false},              // a group that never ends
      {"\x63\x7e\x64", false},              // wire type 6 inside a group
  };
  for (const Case& c : cases) {
    const std::string bytes = base + c.suffix;
    PullResponse parsed;
    ASSERT_EQ(parsed.ParseFromString(bytes), c.valid) << absl::CHexEscape(c.suffix);
    uint64_t epoch;
    std::vector<TableValuesView> tables;
    std::vector<absl::string_view> one = {bytes};
    const absl::Status s = DecodePullResponse(one, &epoch, &tables);
    EXPECT_EQ(s.ok(), c.valid) << absl::CHexEscape(c.suffix) << ": " << s;
    if (c.valid) {
      EXPECT_EQ(tables.size(), static_cast<size_t>(parsed.tables_size()));
    }
  }
  // Nesting deeper than protobuf's recursion limit is refused by both.
  std::string deep = base;
  for (int i = 0; i < 101; ++i) deep += '\x63';
  for (int i = 0; i < 101; ++i) deep += '\x64';
  PullResponse parsed;
  EXPECT_FALSE(parsed.ParseFromString(deep));
  uint64_t epoch;
  std::vector<TableValuesView> tables;
  std::vector<absl::string_view> one = {deep};
  EXPECT_FALSE(DecodePullResponse(one, &epoch, &tables).ok());
}

TEST(WireTest, DecodeRefusesTruncatedOrOverrunningInput) {
  const std::string bytes = SamplePullResponse().SerializeAsString();
  uint64_t epoch;
  std::vector<TableValuesView> tables;
  for (size_t cut : {size_t{1}, size_t{4}, bytes.size() / 2, bytes.size() - 1}) {
    std::vector<absl::string_view> pieces = {absl::string_view(bytes.data(), cut)};
    EXPECT_EQ(DecodePullResponse(pieces, &epoch, &tables).code(),
              absl::StatusCode::kInvalidArgument)
        << "cut at " << cut;
  }
  // An entry whose values field claims more bytes than the entry holds.
  const std::string overrun(
      "\x12\x04\x12\x05"
      "abcdef",
      10);
  std::vector<absl::string_view> pieces = {overrun};
  EXPECT_FALSE(DecodePullResponse(pieces, &epoch, &tables).ok());
}

// Found by tests/fuzz/fuzz_wire.cc (corpus/wire/regression-length_past_entry): a table
// entry of 2 bytes whose name length is a varint running past the entry's end. The
// length was then checked against (bytes left - entry end), which wrapped: the decoder
// sized the name from the varint, a 10 GB allocation from a 53-byte answer.
TEST(WireTest, DecodeRefusesALengthThatRunsPastItsEntry) {
  const std::string bytes =
      std::string("\x12\x02\x0a\xff\xff\xff\xe5", 7) + std::string(42, '\x28') + "\xff\xff";
  PullResponse parsed;
  ASSERT_FALSE(parsed.ParseFromString(bytes));
  uint64_t epoch;
  std::vector<TableValuesView> tables;
  std::vector<absl::string_view> one = {bytes};
  EXPECT_EQ(DecodePullResponse(one, &epoch, &tables).code(), absl::StatusCode::kInvalidArgument);
}

TEST(WireTest, ReaderCopiesAcrossPieces) {
  const std::string bytes = "abcdefghijklmnopqrstuvwxyz";
  std::mt19937 rng(2);
  std::vector<absl::string_view> pieces = RandomPieces(bytes, &rng);
  Reader r(pieces);
  std::string out(bytes.size(), '\0');
  for (size_t at = 0; at < bytes.size(); at += 5) {
    ASSERT_TRUE(r.CopyTo(out.data() + at, std::min<size_t>(5, bytes.size() - at)));
  }
  EXPECT_EQ(out, bytes);
  EXPECT_EQ(r.remaining(), 0u);
  char c;
  EXPECT_FALSE(r.CopyTo(&c, 1));
}

}  // namespace
}  // namespace ps::wire
