#include "ps/storage/push_dedup.h"

#include "gtest/gtest.h"

namespace ps {
namespace {

PushKey Key(uint64_t worker, uint64_t incarnation, uint64_t seq) {
  PushKey k;
  k.set_worker_id(worker);
  k.set_incarnation(incarnation);
  k.set_sequence(seq);
  return k;
}

using Claim = PushDedup::Claim;

// A request whose rows are in `vshards` (sorted), as PushDedup::Begin asks for them.
struct In {
  std::vector<uint32_t> vshards;
  std::vector<uint32_t> operator()() const { return vshards; }
};

// Vshard v's piece of key (worker, incarnation, seq): PushKey.piece = v + 1.
PushKey Piece(uint64_t worker, uint64_t incarnation, uint64_t seq, uint32_t v) {
  PushKey k = Key(worker, incarnation, seq);
  k.set_piece(v + 1);
  return k;
}

// The split part: the pieces of one key reach a pod at different times (its vshards came
// in several moves): each applies once, and a retry of each is a duplicate.
TEST(PushDedupTest, EachPieceOfAKeyAppliesOnce) {
  PushDedup d;
  EXPECT_EQ(*d.Begin(Piece(1, 1, 7, 3)), Claim::kNew);
  EXPECT_EQ(*d.Begin(Piece(1, 1, 7, 3)), Claim::kInProgress);
  d.Finish(Piece(1, 1, 7, 3), true);
  EXPECT_EQ(*d.Begin(Piece(1, 1, 7, 3)), Claim::kDuplicate);
  EXPECT_EQ(d.Peek(Piece(1, 1, 7, 5)), Claim::kNew);
  EXPECT_EQ(*d.Begin(Piece(1, 1, 7, 5)), Claim::kNew);  // the next piece: not a duplicate
  d.Finish(Piece(1, 1, 7, 5), true);
  EXPECT_EQ(*d.Begin(Piece(1, 1, 7, 5)), Claim::kDuplicate);
  // A failed piece may be retried.
  EXPECT_EQ(*d.Begin(Piece(1, 1, 7, 6)), Claim::kNew);
  d.Finish(Piece(1, 1, 7, 6), false);
  EXPECT_EQ(*d.Begin(Piece(1, 1, 7, 6)), Claim::kNew);
  d.Finish(Piece(1, 1, 7, 6), false);
  // A stale attempt of the whole part is never applied where its pieces were.
  EXPECT_EQ(*d.Begin(Key(1, 1, 7)), Claim::kInProgress);
  EXPECT_EQ(d.piece_sequences(), 1u);
}

// A key applied whole here (or copied from a pod that applied it whole) covers every piece.
TEST(PushDedupTest, AWholeKeyCoversItsPieces) {
  PushDedup d;
  EXPECT_EQ(*d.Begin(Key(1, 1, 9)), Claim::kNew);
  EXPECT_EQ(*d.Begin(Piece(1, 1, 9, 2)), Claim::kInProgress);  // the whole is being applied
  d.Finish(Key(1, 1, 9), true);
  EXPECT_EQ(*d.Begin(Piece(1, 1, 9, 2)), Claim::kDuplicate);
  EXPECT_EQ(*d.Begin(Piece(1, 1, 9, 4)), Claim::kDuplicate);
  PushDedup copy;
  ASSERT_TRUE(copy.Merge(d.Serialize()).ok());
  EXPECT_EQ(*copy.Begin(Piece(1, 1, 9, 4)), Claim::kDuplicate);
}

// A vshard copy carries exactly its vshards' pieces; the whole keys go everywhere.
TEST(PushDedupTest, ACopyCarriesOnlyItsVShardsPieces) {
  PushDedup d;
  for (uint32_t v : {1u, 2u}) {
    ASSERT_EQ(*d.Begin(Piece(1, 1, 5, v)), Claim::kNew);
    d.Finish(Piece(1, 1, 5, v), true);
  }
  ASSERT_EQ(*d.Begin(Key(1, 1, 6)), Claim::kNew);
  d.Finish(Key(1, 1, 6), true);
  std::vector<bool> moving(8, false);
  moving[2] = true;
  PushDedup dest;
  ASSERT_TRUE(dest.Merge(d.Serialize(&moving)).ok());
  EXPECT_EQ(*dest.Begin(Piece(1, 1, 5, 2)), Claim::kDuplicate);
  EXPECT_EQ(*dest.Begin(Piece(1, 1, 5, 1)), Claim::kNew);  // not moved: not known there
  // A whole key copied claims the copied vshards only.
  EXPECT_EQ(*dest.Begin(Key(1, 1, 6), In{{2}}), Claim::kDuplicate);
  EXPECT_EQ(*dest.Begin(Key(1, 1, 6), In{{3}}), Claim::kNew);
  // Stored and restored whole.
  PushDedup restored;
  ASSERT_TRUE(restored.Restore(d.Serialize()).ok());
  EXPECT_EQ(*restored.Begin(Piece(1, 1, 5, 1)), Claim::kDuplicate);
  EXPECT_EQ(*restored.Begin(Piece(1, 1, 5, 2)), Claim::kDuplicate);
  EXPECT_EQ(*restored.Begin(Piece(1, 1, 5, 3)), Claim::kNew);
  // Bytes whose piece count does not match what they hold are refused.
  std::string bytes = d.Serialize();
  bytes.pop_back();
  EXPECT_FALSE(restored.Restore(bytes).ok());
}

// Recovered pieces are held as whole keys are, then confirmed or forgotten; the window
// forgets old pieces.
TEST(PushDedupTest, PiecesAreHeldAndSlideOutOfTheWindow) {
  PushDedupOptions o;
  o.window = 64;
  o.max_piece_sequences = 2;
  PushDedup d(o);
  d.Hold(Piece(1, 1, 3, 4));
  d.Hold(Piece(1, 1, 4, 4));
  EXPECT_EQ(d.held(), 2u);
  EXPECT_EQ(*d.Begin(Piece(1, 1, 3, 4)), Claim::kInProgress);
  d.Release(Piece(1, 1, 3, 4), /*applied=*/true);
  d.Release(Piece(1, 1, 4, 4), /*applied=*/false);
  EXPECT_EQ(*d.Begin(Piece(1, 1, 3, 4)), Claim::kDuplicate);
  EXPECT_EQ(*d.Begin(Piece(1, 1, 4, 4)), Claim::kNew);
  d.Finish(Piece(1, 1, 4, 4), true);
  // Two sequences with pieces: a third is refused, not remembered without bound.
  EXPECT_EQ(d.Begin(Piece(1, 1, 5, 0)).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_EQ(*d.Begin(Key(1, 1, 200)), Claim::kNew);  // the window moves past them
  d.Finish(Key(1, 1, 200), true);
  EXPECT_EQ(d.piece_sequences(), 0u);
  EXPECT_EQ(*d.Begin(Piece(1, 1, 199, 0)), Claim::kNew);
}

TEST(PushDedupTest, AppliedOnceAcrossRetriesAndOutOfOrder) {
  PushDedup d;
  EXPECT_EQ(*d.Begin(Key(1, 1, 2)), Claim::kNew);
  EXPECT_EQ(*d.Begin(Key(1, 1, 1)), Claim::kNew);  // out of order is fine
  EXPECT_EQ(*d.Begin(Key(1, 1, 2)), Claim::kInProgress);
  d.Finish(Key(1, 1, 2), true);
  d.Finish(Key(1, 1, 1), true);
  EXPECT_EQ(*d.Begin(Key(1, 1, 2)), Claim::kDuplicate);
  EXPECT_EQ(*d.Begin(Key(1, 1, 1)), Claim::kDuplicate);
  EXPECT_EQ(*d.Begin(Key(2, 1, 1)), Claim::kNew);  // another writer
}

TEST(PushDedupTest, ReleasedClaimCanBeRetried) {
  PushDedup d;
  EXPECT_EQ(*d.Begin(Key(1, 1, 5)), Claim::kNew);
  d.Finish(Key(1, 1, 5), false);
  EXPECT_EQ(*d.Begin(Key(1, 1, 5)), Claim::kNew);
}

TEST(PushDedupTest, WindowSlidesAndRefusesTooOld) {
  PushDedupOptions o;
  o.window = 64;
  PushDedup d(o);
  for (uint64_t s = 1; s <= 200; ++s) {
    ASSERT_EQ(*d.Begin(Key(1, 1, s)), Claim::kNew) << s;
    d.Finish(Key(1, 1, s), true);
  }
  for (uint64_t s = 137; s <= 200; ++s) EXPECT_EQ(*d.Begin(Key(1, 1, s)), Claim::kDuplicate);
  auto old = d.Begin(Key(1, 1, 136));
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition);
  // A jump far ahead clears the whole window: the new slots are not mistaken for done.
  EXPECT_EQ(*d.Begin(Key(1, 1, 10000)), Claim::kNew);
  d.Finish(Key(1, 1, 10000), true);
  EXPECT_EQ(*d.Begin(Key(1, 1, 9999)), Claim::kNew);
}

TEST(PushDedupTest, NewIncarnationSupersedesOld) {
  PushDedup d;
  EXPECT_EQ(*d.Begin(Key(1, 1, 1)), Claim::kNew);
  d.Finish(Key(1, 1, 1), true);
  EXPECT_EQ(*d.Begin(Key(1, 2, 1)), Claim::kNew);  // same sequence, new incarnation
  auto stale = d.Begin(Key(1, 1, 2));
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.status().message().find("superseded"), std::string::npos);
}

TEST(PushDedupTest, AnonymousAndBadKeys) {
  PushDedup d;
  EXPECT_EQ(*d.Begin(Key(0, 0, 0)), Claim::kNew);
  EXPECT_EQ(*d.Begin(Key(0, 0, 0)), Claim::kNew);
  EXPECT_EQ(d.Begin(Key(3, 1, 0)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PushDedupTest, WritersAreBounded) {
  PushDedupOptions o;
  o.max_writers = 10;
  PushDedup d(o);
  for (uint64_t w = 1; w <= 50; ++w) {
    ASSERT_EQ(*d.Begin(Key(w, 1, 1)), Claim::kNew);
    d.Finish(Key(w, 1, 1), true);
  }
  EXPECT_EQ(d.writers(), 10u);
  EXPECT_EQ(*d.Begin(Key(50, 1, 1)), Claim::kDuplicate);  // recent writers are kept
}

}  // namespace
}  // namespace ps

namespace ps {
namespace {

TEST(PushDedupTest, HeldKeyWaitsUntilReleased) {
  PushDedup d;
  d.Hold(Key(1, 1, 3));
  d.Hold(Key(1, 1, 4));
  d.Hold(Key(0, 0, 0));  // anonymous: ignored
  EXPECT_EQ(d.held(), 2u);
  // Neither applied again nor answered "duplicate" while its followers may lack it.
  EXPECT_EQ(*d.Begin(Key(1, 1, 3)), Claim::kInProgress);
  EXPECT_EQ(d.Peek(Key(1, 1, 4)), Claim::kInProgress);
  EXPECT_EQ(*d.Begin(Key(1, 1, 5)), Claim::kNew);  // other keys as before
  d.Release(Key(1, 1, 3), /*applied=*/true);       // the ack set holds it
  d.Release(Key(1, 1, 4), /*applied=*/false);      // deposed: the new primary decides
  EXPECT_EQ(*d.Begin(Key(1, 1, 3)), Claim::kDuplicate);
  EXPECT_EQ(*d.Begin(Key(1, 1, 4)), Claim::kNew);
  EXPECT_EQ(d.held(), 0u);
}

TEST(PushDedupTest, ReleaseAllConfirmsOrForgets) {
  PushDedup d;
  d.Hold(Key(1, 1, 1));
  d.Hold(Key(2, 1, 9));
  EXPECT_EQ(d.ReleaseAll(/*applied=*/false), 2u);
  EXPECT_EQ(d.Peek(Key(1, 1, 1)), Claim::kNew);
  EXPECT_EQ(d.Peek(Key(2, 1, 9)), Claim::kNew);
  d.Hold(Key(1, 1, 2));
  EXPECT_EQ(d.ReleaseAll(/*applied=*/true), 1u);
  EXPECT_EQ(d.Peek(Key(1, 1, 2)), Claim::kDuplicate);
}

TEST(PushDedupTest, HeldKeysSurviveSerializeAsApplied) {
  // The stored state names a held key applied: the log record it came from is kept until
  // the hold ends, so a restart holds it again.
  PushDedup d;
  d.Hold(Key(1, 1, 7));
  PushDedup back;
  ASSERT_TRUE(back.Restore(d.Serialize()).ok());
  EXPECT_EQ(back.Peek(Key(1, 1, 7)), Claim::kDuplicate);
  EXPECT_EQ(back.held(), 0u);
}

TEST(PushDedupTest, MergeAddsAnotherPodsAppliedKeys) {
  PushDedupOptions o;
  o.window = 100;  // not a multiple of 64: slots wrap mid-word
  PushDedup source(o), dest(o);
  for (uint64_t s : {150, 151, 190, 230, 240}) {
    ASSERT_EQ(*source.Begin(Key(1, 2, s)), Claim::kNew);
    source.Finish(Key(1, 2, s), true);
  }
  ASSERT_EQ(*source.Begin(Key(1, 2, 239)), Claim::kNew);  // in progress: not carried
  ASSERT_EQ(*source.Begin(Key(3, 1, 1)), Claim::kNew);
  source.Finish(Key(3, 1, 1), true);
  // The destination knows writer 1's older incarnation and writer 4, which the source lacks.
  ASSERT_EQ(*dest.Begin(Key(1, 1, 5)), Claim::kNew);
  dest.Finish(Key(1, 1, 5), true);
  ASSERT_EQ(*dest.Begin(Key(4, 1, 8)), Claim::kNew);
  dest.Finish(Key(4, 1, 8), true);
  ASSERT_TRUE(dest.Merge(source.Serialize()).ok());
  // Sequences the source applied in its window (141..240) are duplicates here now.
  for (uint64_t s : {150, 151, 190, 230, 240}) {
    EXPECT_EQ(dest.Peek(Key(1, 2, s)), Claim::kDuplicate) << s;
  }
  EXPECT_EQ(dest.Peek(Key(1, 2, 239)), Claim::kNew);
  EXPECT_EQ(dest.Peek(Key(1, 2, 200)), Claim::kNew);
  EXPECT_EQ(dest.Begin(Key(1, 2, 100)).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(dest.Peek(Key(3, 1, 1)), Claim::kDuplicate);
  EXPECT_EQ(dest.Peek(Key(4, 1, 8)), Claim::kDuplicate);  // its own stays
  EXPECT_EQ(dest.Begin(Key(1, 1, 6)).status().code(), absl::StatusCode::kFailedPrecondition);
  // A newer incarnation here is kept; the source's older keys do not come back.
  PushDedup newer(o);
  ASSERT_EQ(*newer.Begin(Key(1, 3, 1)), Claim::kNew);
  newer.Finish(Key(1, 3, 1), true);
  ASSERT_TRUE(newer.Merge(source.Serialize()).ok());
  EXPECT_EQ(newer.Peek(Key(1, 3, 1)), Claim::kDuplicate);
  EXPECT_EQ(newer.Peek(Key(1, 2, 240)), Claim::kNew);
  // Bad bytes change nothing.
  EXPECT_EQ(dest.Merge("junk").code(), absl::StatusCode::kInvalidArgument);
  std::string huge_count =
      source.Serialize().substr(0, 4) + std::string("\xff\xff\xff\xff\xff\xff\xff\x0f", 8);
  EXPECT_EQ(dest.Merge(huge_count).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dest.Peek(Key(3, 1, 1)), Claim::kDuplicate);
}

// Per vshard (push_dedup.h): a key applied here stops counting for the vshards whose rows
// this pod drops or replaces by an import; the others keep it. (Before, the key outlived
// the rows: a retry of the dropped vshards' rows, once this pod held them again from a
// copy without the push, was answered "duplicate" and lost; migration_test at R = 2.)
TEST(PushDedupTest, ForgetDropsAKeyForTheForgottenVShardsOnly) {
  PushDedup d;
  ASSERT_EQ(*d.Begin(Key(1, 1, 4), In{{2, 5}}), Claim::kNew);
  d.Finish(Key(1, 1, 4), true);
  ASSERT_EQ(*d.Begin(Key(1, 1, 6), In{{7}}), Claim::kNew);
  d.Finish(Key(1, 1, 6), true);
  ASSERT_EQ(*d.Begin(Key(1, 1, 8), In{{2}}), Claim::kNew);  // in progress across the drop
  d.Forget({5, 7});
  d.Finish(Key(1, 1, 8), true);
  EXPECT_EQ(*d.Begin(Key(1, 1, 4), In{{2}}), Claim::kDuplicate);
  EXPECT_EQ(*d.Begin(Key(1, 1, 4), In{{5}}), Claim::kNew);  // its rows were dropped
  d.Finish(Key(1, 1, 4), true);
  EXPECT_EQ(*d.Begin(Key(1, 1, 4), In{{2, 5}}), Claim::kDuplicate);  // now both
  EXPECT_EQ(*d.Begin(Key(1, 1, 6), In{{7}}), Claim::kNew);
  d.Finish(Key(1, 1, 6), false);
  // Claimed before the drop, applied after: not for the vshards dropped meanwhile.
  EXPECT_EQ(*d.Begin(Key(1, 1, 8), In{{2}}), Claim::kDuplicate);
  EXPECT_EQ(*d.Begin(Key(1, 1, 8), In{{7}}), Claim::kNew);
  d.Finish(Key(1, 1, 8), false);
  // Without the request's vshards a partly known key is not answered either way.
  EXPECT_EQ(d.Peek(Key(1, 1, 4)), Claim::kInProgress);
  EXPECT_EQ(d.Peek(Key(1, 1, 8)), Claim::kInProgress);
  EXPECT_GE(d.layers(), 1u);
  // Stored and restored with its layers and pieces.
  PushDedup back;
  ASSERT_TRUE(back.Restore(d.Serialize()).ok());
  EXPECT_EQ(back.Peek(Key(1, 1, 8), In{{2}}), Claim::kDuplicate);
  EXPECT_EQ(back.Peek(Key(1, 1, 8), In{{7}}), Claim::kNew);
  EXPECT_EQ(back.Peek(Key(1, 1, 4), In{{2, 5}}), Claim::kDuplicate);
}

// A key known for some of a request's vshards is kPartial: BeginRest claims the others,
// whose rows alone apply.
TEST(PushDedupTest, APartlyAppliedKeyAppliesTheRestOnce) {
  PushDedup d;
  // A follower kept the rows of vshards 1 and 3 of a record (the part had more): those it
  // follows from that primary. A layer, not a piece per key.
  const std::vector<uint32_t> followed = {1, 3};
  ASSERT_EQ(*d.Begin(Key(2, 1, 9), In{{1, 3}}, &followed), Claim::kNew);
  d.Finish(Key(2, 1, 9), true, &followed);
  EXPECT_EQ(d.piece_sequences(), 0u);
  EXPECT_EQ(d.layers(), 1u);
  EXPECT_EQ(*d.Begin(Key(2, 1, 9), In{{1, 3}}), Claim::kDuplicate);
  EXPECT_EQ(*d.Begin(Key(2, 1, 9), In{{4}}), Claim::kNew);  // left out there: applies here
  d.Finish(Key(2, 1, 9), false);
  EXPECT_EQ(*d.Begin(Key(2, 1, 9), In{{3, 4}}), Claim::kPartial);
  std::vector<uint32_t> rest;
  ASSERT_EQ(*d.BeginRest(Key(2, 1, 9), In{{3, 4}}, &rest), Claim::kNew);
  EXPECT_EQ(rest, std::vector<uint32_t>{4});
  EXPECT_EQ(*d.Begin(Key(2, 1, 9), In{{4}}), Claim::kInProgress);
  d.Finish(Key(2, 1, 9), true);
  EXPECT_EQ(*d.Begin(Key(2, 1, 9), In{{1, 3, 4}}), Claim::kDuplicate);
  EXPECT_EQ(*d.Begin(Key(2, 1, 9), In{{5}}), Claim::kNew);
  d.Finish(Key(2, 1, 9), false);
  // A part that is whole here still costs a bit and no piece.
  ASSERT_EQ(*d.Begin(Key(2, 1, 10), In{{1}}), Claim::kNew);
  d.Finish(Key(2, 1, 10), true);
  EXPECT_EQ(*d.Begin(Key(2, 1, 10), In{{6}}), Claim::kDuplicate);
  EXPECT_EQ(d.piece_sequences(), 1u);
}

// A copy carries its vshards' keys exactly: those the source dropped or forgot for some of
// them do not claim those here, and the copy's keys claim no vshard this pod holds besides.
TEST(PushDedupTest, ACopyCarriesExactlyItsVShardsKeys) {
  PushDedup source, dest;
  ASSERT_EQ(*source.Begin(Key(1, 1, 1), In{{2, 3}}), Claim::kNew);
  source.Finish(Key(1, 1, 1), true);
  ASSERT_EQ(*source.Begin(Key(1, 1, 2), In{{2}}), Claim::kNew);
  source.Finish(Key(1, 1, 2), true);
  source.Forget({3});  // key 1's rows of vshard 3 are gone there
  std::vector<bool> moving(8, false);
  moving[2] = moving[3] = true;
  // The destination knew key 2 for vshard 5 (its own rows): that stays.
  ASSERT_EQ(*dest.Begin(Key(1, 1, 2), In{{5}}), Claim::kNew);
  dest.Finish(Key(1, 1, 2), true);
  dest.Forget({2, 3});  // as BeginImport does
  ASSERT_TRUE(dest.Merge(source.Serialize(&moving)).ok());
  EXPECT_EQ(dest.Peek(Key(1, 1, 1), In{{2}}), Claim::kDuplicate);
  EXPECT_EQ(dest.Peek(Key(1, 1, 1), In{{3}}), Claim::kNew);
  EXPECT_EQ(dest.Peek(Key(1, 1, 1), In{{5}}), Claim::kNew);  // not the copy's
  EXPECT_EQ(dest.Peek(Key(1, 1, 2), In{{2, 5}}), Claim::kDuplicate);
  EXPECT_EQ(dest.Peek(Key(1, 1, 2), In{{3}}), Claim::kNew);
  // A copy's bytes are not a pod's whole state.
  PushDedup other;
  EXPECT_EQ(other.Restore(source.Serialize(&moving)).code(), absl::StatusCode::kInvalidArgument);
}

// A copy's keys at their bound: every writer with max_layers layers, most of them claiming
// some of the copied vshards only, and pieces. SerializeParts cuts them in parts of the
// size asked (the export's chunk size), each merged on its own at the destination, and the
// destination then answers exactly as if it merged the whole state. (The whole state is
// ~9 KiB per writer; the import's receive budget assumed ~0.5 KiB: migrate_import.cc.)
TEST(PushDedupTest, ACopysKeysAtTheirBoundGoInPartsOfTheSizeAsked) {
  constexpr uint32_t kVShards = 32, kWriters = 200, kPieceSeqs = 4;
  const PushDedupOptions options;  // the defaults: window 4096, 16 layers
  PushDedup source(options);
  std::vector<uint32_t> all(kVShards);
  for (uint32_t v = 0; v < kVShards; ++v) all[v] = v;
  for (uint64_t r = 0; r < options.max_layers; ++r) {
    for (uint64_t w = 1; w <= kWriters; ++w) {
      ASSERT_EQ(*source.Begin(Key(w, 1, r + 1), In{all}), Claim::kNew);
      source.Finish(Key(w, 1, r + 1), true);
    }
    source.Forget({static_cast<uint32_t>(r)});  // a layer per writer: except {r, .., 15}
  }
  for (uint64_t w = 1; w <= kWriters; ++w) {
    for (uint32_t v = 0; v < kPieceSeqs; ++v) {
      ASSERT_EQ(*source.Begin(Piece(w, 1, 100 + v, v)), Claim::kNew);
      source.Finish(Piece(w, 1, 100 + v, v), true);
    }
  }
  ASSERT_EQ(source.layers(), kWriters * options.max_layers);
  std::vector<bool> moving(kVShards, false);
  for (uint32_t v = 0; v < 16; ++v) moving[v] = true;
  const std::string whole = source.Serialize(&moving);
  EXPECT_GT(whole.size(), kWriters * 8192u);
  PushDedup from_whole(options);
  ASSERT_TRUE(from_whole.Merge(whole).ok());
  // A part holds at least a writer's entry and one layer or piece (and the copy's list).
  const size_t unit = 84 + options.window / 4 + 4 * (16 + 16);
  for (const size_t max_bytes : {size_t{64} << 10, size_t{1}}) {
    const std::vector<std::string> parts = source.SerializeParts(&moving, max_bytes);
    EXPECT_GT(parts.size(), whole.size() / std::max<size_t>(max_bytes, unit)) << max_bytes;
    PushDedup dest(options);
    for (const std::string& part : parts) {
      EXPECT_LE(part.size(), std::max(max_bytes, unit)) << max_bytes;
      ASSERT_TRUE(dest.Merge(part).ok()) << max_bytes;
    }
    size_t duplicates = 0;
    for (uint64_t w = 1; w <= kWriters; ++w) {
      for (uint64_t seq : {1, 2, 8, 15, 16, 100, 101, 102, 103}) {
        for (uint32_t v = 0; v < kVShards; ++v) {
          const Claim want = from_whole.Peek(Key(w, 1, seq), In{{v}});
          ASSERT_EQ(dest.Peek(Key(w, 1, seq), In{{v}}), want)
              << "writer " << w << " seq " << seq << " vshard " << v << " parts of " << max_bytes;
          duplicates += want == Claim::kDuplicate;
        }
      }
    }
    EXPECT_GT(duplicates, kWriters * 30u);  // the copy does carry keys
  }
  // Without a bound, one part: Serialize's bytes.
  const std::vector<std::string> one = source.SerializeParts(&moving, SIZE_MAX);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0], whole);
}

// A held key released exactly (a recovered record whose key was recorded so) counts for
// its vshards only, as pieces.
TEST(PushDedupTest, ReleaseExactKeepsAHeldKeyForItsVShardsOnly) {
  PushDedup d;
  d.Hold(Key(1, 1, 5));
  EXPECT_EQ(d.Peek(Key(1, 1, 5), In{{2}}), Claim::kInProgress);
  d.ReleaseExact(Key(1, 1, 5), {2, 4});
  EXPECT_EQ(d.held(), 0u);
  EXPECT_EQ(d.Peek(Key(1, 1, 5), In{{2, 4}}), Claim::kDuplicate);
  EXPECT_EQ(d.Peek(Key(1, 1, 5), In{{3}}), Claim::kNew);
  ASSERT_EQ(*d.Begin(Key(1, 1, 5), In{{3}}), Claim::kNew);
  d.Finish(Key(1, 1, 5), true);
  EXPECT_EQ(d.Peek(Key(1, 1, 5), In{{2, 3, 4}}), Claim::kDuplicate);
  EXPECT_EQ(d.Peek(Key(1, 1, 5), In{{7}}), Claim::kNew);
  d.ReleaseExact(Key(1, 1, 6), {2});  // not held: nothing
  EXPECT_EQ(d.Peek(Key(1, 1, 6), In{{2}}), Claim::kNew);
}

// A held key released for some vshards (a follower's recovered record: the rows it kept)
// counts for those only.
TEST(PushDedupTest, ReleaseForKeepsAHeldKeyForItsVShardsOnly) {
  PushDedup d;
  d.Hold(Key(1, 1, 3));
  EXPECT_EQ(d.Peek(Key(1, 1, 3), In{{1}}), Claim::kInProgress);
  d.ReleaseFor(Key(1, 1, 3), {1, 2});
  EXPECT_EQ(d.held(), 0u);
  EXPECT_EQ(d.Peek(Key(1, 1, 3), In{{1, 2}}), Claim::kDuplicate);
  EXPECT_EQ(d.Peek(Key(1, 1, 3), In{{2, 6}}), Claim::kPartial);
  EXPECT_EQ(d.Peek(Key(1, 1, 3), In{{6}}), Claim::kNew);
}

// A request sent under an older map (a re-routed part keeps its key; a stale map sent the
// rest of its rows to other pods) counts for its own vshards only: a later piece of the
// part in another vshard this pod leads applies. (Before, it counted whole here and the
// later piece was answered "duplicate": migration_test at R = 2, after the drain.)
TEST(PushDedupTest, AnExactRequestCountsForItsOwnVShardsOnly) {
  PushDedup d;
  ASSERT_EQ(*d.Begin(Key(4, 1, 2), In{{22, 27}}, nullptr, /*exact=*/true), Claim::kNew);
  d.Finish(Key(4, 1, 2), true);
  EXPECT_EQ(d.Peek(Key(4, 1, 2), In{{22, 27}}), Claim::kDuplicate);
  EXPECT_EQ(*d.Begin(Key(4, 1, 2), In{{31}}), Claim::kNew);
  d.Finish(Key(4, 1, 2), true);
  EXPECT_EQ(d.Peek(Key(4, 1, 2), In{{22, 27, 31}}), Claim::kDuplicate);
}

// Layers are bounded per writer and leave with the window.
TEST(PushDedupTest, LayersAreBoundedAndSlideOutOfTheWindow) {
  PushDedupOptions o;
  o.window = 64;
  o.max_layers = 3;
  PushDedup d(o);
  for (uint32_t v = 0; v < 6; ++v) {
    ASSERT_EQ(*d.Begin(Key(1, 1, v + 1), In{{v, 10}}), Claim::kNew);
    d.Finish(Key(1, 1, v + 1), true);
    d.Forget({v});
  }
  EXPECT_LE(d.layers(), 3u);
  EXPECT_GT(d.layer_merges(), 0u);
  // The newest keys are exact; every key still counts for vshard 10, which no layer names.
  EXPECT_EQ(d.Peek(Key(1, 1, 6), In{{5}}), Claim::kNew);
  for (uint64_t s = 1; s <= 6; ++s) EXPECT_EQ(d.Peek(Key(1, 1, s), In{{10}}), Claim::kDuplicate);
  ASSERT_EQ(*d.Begin(Key(1, 1, 200)), Claim::kNew);
  d.Finish(Key(1, 1, 200), true);
  EXPECT_EQ(d.layers(), 0u);
}

}  // namespace
}  // namespace ps
