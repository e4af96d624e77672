#include "ps/storage/change_journal.h"

#include <glog/logging.h>

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace ps {
namespace {

constexpr char kLegacyIdentityKey[] = "journal_id";
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
  j->identity_ = db->identity();
  // A database whose journal an older version started has its own identity for cursors:
  // the cursors it printed stay valid (a damaged value names nothing).
  absl::StatusOr<std::string> legacy = db->GetMeta(kLegacyIdentityKey);
  if (legacy.ok() && legacy->size() == 8) {
    j->legacy_identity_ = GetBE(legacy->data(), 8);
  } else if (!legacy.ok() && !absl::IsNotFound(legacy.status())) {
    return legacy.status();
  }
  absl::MutexLock lock(&j->mu_);
  absl::StatusOr<std::string> floor = db->GetMeta(kFloorKey);
  if (floor.ok() && floor->size() == 8) {
    j->floor_ = GetBE(floor->data(), 8);
  } else if (!floor.ok() && !absl::IsNotFound(floor.status())) {
    return floor.status();
  }
  uint64_t run_first = 0;  // the first seq of a run of 0-byte (merged) seqs
  RETURN_IF_ERROR(db->ScanMeta(
      Key(kSizePrefix, j->floor_ + 1), End(kSizePrefix),
      [&](absl::string_view key, absl::string_view value) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        if (key.size() != sizeof(kSizePrefix) - 1 + 8 || value.size() != 16) {
          return absl::DataLossError(absl::StrCat("change journal: bad size record of ", key.size(),
                                                  "+", value.size(), " bytes"));
        }
        const uint64_t seq = GetBE(key.data() + key.size() - 8, 8);
        if (seq != j->floor_ + 1 + j->entries_.size()) {
          return absl::DataLossError(absl::StrCat("change journal: entry ", seq, " follows ",
                                                  j->floor_ + j->entries_.size()));
        }
        Entry e{seq, GetBE(value.data(), 8), GetBE(value.data() + 8, 8), seq};
        if (run_first == 0 && e.bytes == 0) run_first = seq;
        if (run_first != 0) e.first = run_first;
        if (e.bytes != 0) run_first = 0;
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
  {
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
    entries_.push_back({seq, tag, entry.size(), seq});
    bytes_ += entry.size();
    last_seq_ = seq;
    last_tag_ = tag;
  }
  // Merging and retention are best effort: a failure leaves more entries than asked (or
  // unmerged ones), never fewer.
  if (absl::Status s = MaybeMerge(); !s.ok()) {
    LOG_EVERY_N(WARNING, 100) << "change journal: merging old entries failed: " << s;
  }
  absl::MutexLock lock(&mu_);
  if (bytes_ > options_.max_bytes && entries_.size() > 1) {
    if (absl::Status s = DropOldest(); !s.ok()) {
      LOG_EVERY_N(WARNING, 100) << "change journal: dropping old entries failed: " << s;
    }
  }
  return absl::OkStatus();
}

absl::Status ChangeJournal::MaybeMerge() {
  // The plan, under the lock: the rounds older than the newest keep_rounds that come
  // after the last merged entry (the tail), and that entry (the base) if the merge may
  // read it too.
  uint64_t from = 0, to = 0, base_bytes = 0, tail_bytes = 0;
  {
    absl::MutexLock lock(&mu_);
    if (entries_.size() <= options_.keep_rounds || options_.max_bytes == 0) {
      return absl::OkStatus();
    }
    const size_t end = entries_.size() - options_.keep_rounds;  // entries_[0, end) may merge
    size_t tail = end;
    while (tail > 0 && entries_[tail - 1].first == entries_[tail - 1].seq &&
           entries_[tail - 1].bytes != 0) {
      tail--;
    }
    if (tail == end) return absl::OkStatus();
    for (size_t i = tail; i < end; ++i) tail_bytes += entries_[i].bytes;
    // entries_[tail - 1], if any, ends a merged range (or a damaged-looking 0-byte run
    // cut by retention: then it is not merged again).
    const bool has_base = tail > 0 && entries_[tail - 1].bytes != 0;
    if (has_base) base_bytes = entries_[tail - 1].bytes;
    // Merge once the tail is as large as the base (each byte is rewritten a bounded number
    // of times), or sooner when the journal is over its bound (merging before dropping).
    if (tail_bytes < options_.merge_min_bytes ||
        (tail_bytes < base_bytes && bytes_ <= options_.max_bytes)) {
      return absl::OkStatus();
    }
    const bool with_base = has_base && base_bytes + tail_bytes <= options_.merge_max_bytes;
    // (Retention may have dropped the first seqs of the base's range.)
    from = with_base ? std::max(entries_[tail - 1].first, floor_ + 1) : entries_[tail].seq;
    if (!with_base) base_bytes = 0;
    to = entries_[end - 1].seq;
    // A merge of one round rewrites it for nothing.
    if (from == to) return absl::OkStatus();
  }
  // The ids of seqs [from, to], sorted by (table, id), each once (delete wins).
  struct Id {
    uint32_t table_no;
    uint8_t kind;
    uint64_t id;  // as stored (big-endian order = unsigned order)
    bool operator<(const Id& o) const {
      return table_no != o.table_no ? table_no < o.table_no : id < o.id;
    }
  };
  std::vector<Id> ids;
  ids.reserve((base_bytes + tail_bytes) / kIdBytes);
  RETURN_IF_ERROR(db_->ScanMeta(
      Key(kEntryPrefix, from), Key(kEntryPrefix, to + 1),
      [&](absl::string_view, absl::string_view value) -> absl::Status {
        if (value.size() < 8 || (value.size() - 8) % kIdBytes != 0) {
          return absl::DataLossError(
              absl::StrCat("change journal entry of ", value.size(), " bytes is damaged"));
        }
        for (size_t at = 8; at < value.size(); at += kIdBytes) {
          ids.push_back({static_cast<uint32_t>(GetBE(value.data() + at, 4)),
                         static_cast<uint8_t>(value[at + 4]), GetBE(value.data() + at + 5, 8)});
        }
        return absl::OkStatus();
      }));
  std::sort(ids.begin(), ids.end());
  std::vector<std::pair<std::string, std::string>> puts;
  std::string merged;
  uint64_t to_tag = 0;
  {
    absl::MutexLock lock(&mu_);
    to_tag = entries_[to - floor_ - 1].tag;
  }
  PutBE(&merged, to_tag, 8);
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    uint8_t kind = ids[i].kind;
    while (++j < ids.size() && !(ids[i] < ids[j])) kind = std::max(kind, ids[j].kind);
    PutBE(&merged, ids[i].table_no, 4);
    merged.push_back(static_cast<char>(kind));
    PutBE(&merged, ids[i].id, 8);
    i = j;
  }
  const size_t merged_ids = (merged.size() - 8) / kIdBytes;
  std::vector<Id>().swap(ids);
  absl::MutexLock lock(&mu_);
  // Only this writer changes entries_, so the plan still holds.
  const size_t first_at = from - floor_ - 1, last_at = to - floor_ - 1;
  uint64_t freed = 0;
  for (size_t i = first_at; i < last_at; ++i) {
    if (entries_[i].bytes == 0) continue;
    std::string v;
    PutBE(&v, entries_[i].tag, 8);
    PutBE(&v, 0, 8);
    puts.emplace_back(Key(kSizePrefix, entries_[i].seq), std::move(v));
  }
  std::string size;
  PutBE(&size, to_tag, 8);
  PutBE(&size, merged.size(), 8);
  puts.emplace_back(Key(kSizePrefix, to), std::move(size));
  puts.emplace_back(Key(kEntryPrefix, to), std::move(merged));
  const uint64_t merged_bytes = puts.back().second.size();
  RETURN_IF_ERROR(db_->WriteMeta(puts, {{Key(kEntryPrefix, from), Key(kEntryPrefix, to)}},
                                 /*sync=*/false));
  for (size_t i = first_at; i <= last_at; ++i) {
    freed += entries_[i].bytes;
    entries_[i].bytes = 0;
    entries_[i].first = from;
  }
  entries_[last_at].bytes = merged_bytes;
  bytes_ = bytes_ - freed + merged_bytes;
  merges_++;
  VLOG(1) << "change journal: merged entries " << from << ".." << to << " (" << freed
          << " bytes) into one of " << merged_ids << " ids (" << merged_bytes << " bytes)";
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
  if (!Names(since.identity)) return false;
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
  Stats s;
  s.entries = entries_.size();
  s.bytes = bytes_;
  s.floor = floor_;
  s.dropped = dropped_;
  s.merges = merges_;
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (it->first != it->seq) {
      s.merged_through = it->seq;
      break;
    }
  }
  return s;
}

}  // namespace ps
