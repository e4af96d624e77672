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
  EXPECT_EQ(*dest.Begin(Key(1, 1, 6)), Claim::kDuplicate);
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

}  // namespace
}  // namespace ps
