#include "ps/storage/change_journal.h"

#include <glog/logging.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace ps {
namespace {

constexpr char kIdentityKey[] = "journal_id";
constexpr char kFloorKey[] = "journal_floor";
constexpr char kEntryPrefix[] = "journal/";
constexpr char kSizePrefix[] = "journal_size/";
constexpr size_t kIdBytes = 4 + 1 + 8;

void PutBE(std::string* out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetBE(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

std::string Key(const char* prefix, uint64_t seq) {
  std::string k = prefix;
  PutBE(&k, seq, 8);
  return k;
}

// The end of a prefix's key range: the prefix with its last byte incremented.
std::string End(const char* prefix) {
  std::string k = prefix;
  k.back() = static_cast<char>(k.back() + 1);
  return k;
}

uint64_t RandomNonZero() {
  std::random_device rd;
  for (;;) {
    const uint64_t v = (uint64_t{rd()} << 32) ^ rd();
    if (v != 0) return v;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChangeJournal>> ChangeJournal::Open(
    StorageDb* db, const ChangeJournalOptions& options) {
  std::unique_ptr<ChangeJournal> j(new ChangeJournal(db, options));
  absl::StatusOr<std::string> id = db->GetMeta(kIdentityKey);
  if (id.ok() && id->size() == 8) {
    j->identity_ = GetBE(id->data(), 8);
  } else if (id.ok() || absl::IsNotFound(id.status())) {
    j->identity_ = RandomNonZero();
    std::string v;
    PutBE(&v, j->identity_, 8);
    RETURN_IF_ERROR(db->WriteMeta({{kIdentityKey, v}}, {}, /*sync=*/true));
  } else {
    return id.status();
  }
  absl::MutexLock lock(&j->mu_);
  absl::StatusOr<std::string> floor = db->GetMeta(kFloorKey);
  if (floor.ok() && floor->size() == 8) {
    j->floor_ = GetBE(floor->data(), 8);
  } else if (!floor.ok() && !absl::IsNotFound(floor.status())) {
    return floor.status();
  }
  RETURN_IF_ERROR(db->ScanMeta(
      Key(kSizePrefix, j->floor_ + 1), End(kSizePrefix),
      [&](absl::string_view key, absl::string_view value) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        if (key.size() != sizeof(kSizePrefix) - 1 + 8 || value.size() != 16) {
          return absl::DataLossError(absl::StrCat("change journal: bad size record of ", key.size(),
                                                  "+", value.size(), " bytes"));
        }
        const uint64_t seq = GetBE(key.data() + key.size() - 8, 8);
        Entry e{seq, GetBE(value.data(), 8), GetBE(value.data() + 8, 8)};
        j->entries_.push_back(e);
        j->bytes_ += e.bytes;
        return absl::OkStatus();
      }));
  j->last_seq_ = j->floor_;
  if (!j->entries_.empty()) {
    j->last_seq_ = j->entries_.back().seq;
    j->last_tag_ = j->entries_.back().tag;
  }
  return j;
}

void ChangeJournal::Note(uint32_t table_no, int64_t id, ChangeKind kind) {
  PutBE(&noted_, table_no, 4);
  noted_.push_back(static_cast<char>(kind));
  PutBE(&noted_, static_cast<uint64_t>(id), 8);
}

absl::Status ChangeJournal::Commit() {
  if (noted_.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  const uint64_t seq = last_seq_ + 1;
  const uint64_t tag = RandomNonZero();
  std::string entry;
  entry.reserve(8 + noted_.size());
  PutBE(&entry, tag, 8);
  entry += noted_;
  std::string size;
  PutBE(&size, tag, 8);
  PutBE(&size, entry.size(), 8);
  RETURN_IF_ERROR(db_->WriteMeta({{Key(kEntryPrefix, seq), entry}, {Key(kSizePrefix, seq), size}},
                                 {}, /*sync=*/true));
  noted_.clear();
  entries_.push_back({seq, tag, entry.size()});
  bytes_ += entry.size();
  last_seq_ = seq;
  last_tag_ = tag;
  if (bytes_ > options_.max_bytes && entries_.size() > 1) {
    // Retention is best effort: a failure leaves more entries than asked, never fewer.
    if (absl::Status s = DropOldest(); !s.ok()) {
      LOG_EVERY_N(WARNING, 100) << "change journal: dropping old entries failed: " << s;
    }
  }
  return absl::OkStatus();
}

absl::Status ChangeJournal::DropOldest() {
  size_t n = 0;
  uint64_t bytes = bytes_;
  while (n + 1 < entries_.size() && bytes > options_.max_bytes) bytes -= entries_[n++].bytes;
  if (n == 0) return absl::OkStatus();
  const uint64_t floor = entries_[n - 1].seq;
  std::string v;
  PutBE(&v, floor, 8);
  RETURN_IF_ERROR(db_->WriteMeta({{kFloorKey, v}},
                                 {{Key(kEntryPrefix, 0), Key(kEntryPrefix, floor + 1)},
                                  {Key(kSizePrefix, 0), Key(kSizePrefix, floor + 1)}},
                                 /*sync=*/false));
  entries_.erase(entries_.begin(), entries_.begin() + n);
  bytes_ = bytes;
  floor_ = floor;
  dropped_ += n;
  return absl::OkStatus();
}

JournalPosition ChangeJournal::position() const {
  absl::MutexLock lock(&mu_);
  return {identity_, last_seq_, last_tag_};
}

absl::StatusOr<bool> ChangeJournal::Covers(const JournalPosition& since) const {
  if (since.identity != identity_) return false;
  absl::MutexLock lock(&mu_);
  if (since.seq > last_seq_) return false;
  if (since.seq == 0 ? floor_ > 0 : since.seq <= floor_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the cursor names change ", since.seq, " of this pod, but its change journal keeps only ",
        "the changes after ", floor_, " (--change_journal_mb): take a full export"));
  }
  if (since.seq == 0) return true;
  const uint64_t at = since.seq - floor_ - 1;  // seqs are consecutive after floor_
  if (at >= entries_.size()) return false;
  return entries_[at].seq == since.seq && entries_[at].tag == since.tag;
}

absl::Status ChangeJournal::ForEachSince(
    uint64_t since_seq,
    const std::function<absl::Status(uint32_t table_no, ChangeKind kind, int64_t id)>& fn) const {
  uint64_t last;
  {
    absl::MutexLock lock(&mu_);
    last = last_seq_;
  }
  if (since_seq >= last) return absl::OkStatus();
  return db_->ScanMeta(
      Key(kEntryPrefix, since_seq + 1), Key(kEntryPrefix, last + 1),
      [&](absl::string_view key, absl::string_view value) -> absl::Status {
        if (value.size() < 8 || (value.size() - 8) % kIdBytes != 0) {
          return absl::DataLossError(
              absl::StrCat("change journal entry of ", value.size(), " bytes is damaged"));
        }
        for (size_t at = 8; at < value.size(); at += kIdBytes) {
          const uint8_t kind = static_cast<uint8_t>(value[at + 4]);
          if (kind != 1 && kind != 2) {
            return absl::DataLossError(absl::StrCat("change journal: unknown kind ", kind));
          }
          RETURN_IF_ERROR(fn(static_cast<uint32_t>(GetBE(value.data() + at, 4)),
                             static_cast<ChangeKind>(kind),
                             static_cast<int64_t>(GetBE(value.data() + at + 5, 8))));
        }
        return absl::OkStatus();
      });
}

ChangeJournal::Stats ChangeJournal::stats() const {
  absl::MutexLock lock(&mu_);
  return {entries_.size(), bytes_, floor_, dropped_};
}

}  // namespace ps
