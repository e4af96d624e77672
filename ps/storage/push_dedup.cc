#include "ps/storage/push_dedup.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ps {

PushDedup::PushDedup(PushDedupOptions options) : options_(options) {}

bool PushDedup::IsDone(const Writer& w, uint64_t seq) const {
  const uint64_t slot = seq % options_.window;
  return (w.done[slot >> 6] >> (slot & 63)) & 1;
}

void PushDedup::SetDone(Writer& w, uint64_t seq) {
  const uint64_t slot = seq % options_.window;
  w.done[slot >> 6] |= uint64_t{1} << (slot & 63);
}

// Moves the window so that it ends at `seq`, clearing the slots that now stand for new,
// not yet applied sequences.
void PushDedup::Advance(Writer& w, uint64_t seq) {
  const uint64_t new_base = seq - options_.window + 1;
  if (new_base - w.base >= options_.window) {
    std::fill(w.done.begin(), w.done.end(), 0);
  } else {
    for (uint64_t s = w.base; s < new_base; ++s) {
      const uint64_t slot = s % options_.window;
      w.done[slot >> 6] &= ~(uint64_t{1} << (slot & 63));
    }
  }
  w.base = new_base;
  for (auto it = w.held.begin(); it != w.held.end();) {
    if (*it < new_base) {
      w.held.erase(it++);
    } else {
      ++it;
    }
  }
}

PushDedup::Writer* PushDedup::WriterFor(uint64_t worker_id, uint64_t incarnation) {
  auto it = writers_.find(worker_id);
  if (it == writers_.end()) {
    if (writers_.size() >= options_.max_writers) EvictOldest();
    it = writers_.emplace(worker_id, Writer()).first;
    it->second.incarnation = incarnation;
    it->second.done.assign((options_.window + 63) / 64, 0);
  }
  Writer& w = it->second;
  w.last_used = ++clock_;
  if (incarnation < w.incarnation) return nullptr;
  if (incarnation > w.incarnation) {
    w.incarnation = incarnation;
    w.base = 1;
    std::fill(w.done.begin(), w.done.end(), 0);
    w.in_progress.clear();
    w.held.clear();
  }
  return &w;
}

absl::StatusOr<PushDedup::Claim> PushDedup::Begin(const PushKey& key) {
  if (key.worker_id() == 0) return Claim::kNew;
  if (key.sequence() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("push from worker ", key.worker_id(), " has sequence 0 (must be > 0)"));
  }
  absl::MutexLock lock(&mu_);
  Writer* found = WriterFor(key.worker_id(), key.incarnation());
  if (found == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("push from worker ", key.worker_id(), " incarnation ", key.incarnation(),
                     " is superseded by incarnation ", writers_[key.worker_id()].incarnation));
  }
  Writer& w = *found;
  const uint64_t seq = key.sequence();
  if (seq < w.base) {
    return absl::FailedPreconditionError(absl::StrCat(
        "push sequence ", seq, " of worker ", key.worker_id(), " is older than the ",
        options_.window, " remembered (from ", w.base, "); it cannot be de-duplicated"));
  }
  if (seq >= w.base + options_.window) Advance(w, seq);
  if (w.held.contains(seq)) return Claim::kInProgress;
  if (IsDone(w, seq)) return Claim::kDuplicate;
  if (!w.in_progress.insert(seq).second) return Claim::kInProgress;
  return Claim::kNew;
}

PushDedup::Claim PushDedup::Peek(const PushKey& key) const {
  if (key.worker_id() == 0) return Claim::kNew;
  absl::MutexLock lock(&mu_);
  auto it = writers_.find(key.worker_id());
  if (it == writers_.end() || it->second.incarnation != key.incarnation()) return Claim::kNew;
  const Writer& w = it->second;
  const uint64_t seq = key.sequence();
  if (seq < w.base || seq >= w.base + options_.window) return Claim::kNew;
  if (w.held.contains(seq)) return Claim::kInProgress;
  if (IsDone(w, seq)) return Claim::kDuplicate;
  if (w.in_progress.contains(seq)) return Claim::kInProgress;
  return Claim::kNew;
}

void PushDedup::Finish(const PushKey& key, bool applied) {
  if (key.worker_id() == 0) return;
  absl::MutexLock lock(&mu_);
  auto it = writers_.find(key.worker_id());
  if (it == writers_.end() || it->second.incarnation != key.incarnation()) return;
  Writer& w = it->second;
  w.in_progress.erase(key.sequence());
  if (applied && key.sequence() >= w.base) SetDone(w, key.sequence());
}

void PushDedup::Hold(const PushKey& key) {
  if (key.worker_id() == 0 || key.sequence() == 0) return;
  absl::MutexLock lock(&mu_);
  Writer* w = WriterFor(key.worker_id(), key.incarnation());
  if (w == nullptr || key.sequence() < w->base) return;
  if (key.sequence() >= w->base + options_.window) Advance(*w, key.sequence());
  SetDone(*w, key.sequence());
  w->held.insert(key.sequence());
}

void PushDedup::Release(const PushKey& key, bool applied) {
  if (key.worker_id() == 0) return;
  absl::MutexLock lock(&mu_);
  auto it = writers_.find(key.worker_id());
  if (it == writers_.end() || it->second.incarnation != key.incarnation()) return;
  Writer& w = it->second;
  if (w.held.erase(key.sequence()) == 0 || applied) return;
  const uint64_t slot = key.sequence() % options_.window;
  w.done[slot >> 6] &= ~(uint64_t{1} << (slot & 63));
}

size_t PushDedup::ReleaseAll(bool applied) {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (auto& [id, w] : writers_) {
    n += w.held.size();
    if (!applied) {
      for (uint64_t seq : w.held) {
        const uint64_t slot = seq % options_.window;
        w.done[slot >> 6] &= ~(uint64_t{1} << (slot & 63));
      }
    }
    w.held.clear();
  }
  return n;
}

size_t PushDedup::held() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [id, w] : writers_) n += w.held.size();
  return n;
}

void PushDedup::EvictOldest() {
  auto oldest = writers_.begin();
  for (auto it = writers_.begin(); it != writers_.end(); ++it) {
    if (it->second.last_used < oldest->second.last_used) oldest = it;
  }
  if (oldest != writers_.end()) writers_.erase(oldest);
}

namespace {

template <typename T>
void Append(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

template <typename T>
bool Take(absl::string_view* in, T* v) {
  if (in->size() < sizeof(T)) return false;
  std::memcpy(v, in->data(), sizeof(T));
  in->remove_prefix(sizeof(T));
  return true;
}

}  // namespace

// Layout (host order, little-endian here): u32 window, u64 writers, then per writer
// u64 worker_id, u64 incarnation, u64 base, window/64 u64 words of done bits.
std::string PushDedup::Serialize() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  Append<uint32_t>(&out, options_.window);
  Append<uint64_t>(&out, writers_.size());
  for (const auto& [id, w] : writers_) {
    Append<uint64_t>(&out, id);
    Append<uint64_t>(&out, w.incarnation);
    Append<uint64_t>(&out, w.base);
    for (uint64_t word : w.done) Append<uint64_t>(&out, word);
  }
  return out;
}

absl::StatusOr<absl::flat_hash_map<uint64_t, PushDedup::Writer>> PushDedup::Parse(
    absl::string_view bytes) const {
  uint32_t window = 0;
  uint64_t count = 0;
  if (!Take(&bytes, &window) || !Take(&bytes, &count)) {
    return absl::InvalidArgumentError("push de-duplication state is truncated");
  }
  if (window != options_.window) {
    return absl::InvalidArgumentError(absl::StrCat("push de-duplication state has window ", window,
                                                   ", this pod uses ", options_.window));
  }
  const size_t words = (window + 63) / 64;
  // Each writer takes 24 bytes and its words: a count beyond what the bytes hold is corrupt
  // (and must not size an allocation).
  if (count > bytes.size() / (24 + words * 8)) {
    return absl::InvalidArgumentError("push de-duplication state is truncated");
  }
  absl::flat_hash_map<uint64_t, Writer> writers;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t id = 0;
    Writer w;
    w.done.resize(words);
    bool ok = Take(&bytes, &id) && Take(&bytes, &w.incarnation) && Take(&bytes, &w.base);
    for (size_t k = 0; ok && k < words; ++k) ok = Take(&bytes, &w.done[k]);
    if (!ok) return absl::InvalidArgumentError("push de-duplication state is truncated");
    writers.emplace(id, std::move(w));
  }
  if (!bytes.empty()) {
    return absl::InvalidArgumentError("push de-duplication state has trailing bytes");
  }
  return writers;
}

absl::Status PushDedup::Restore(absl::string_view bytes) {
  absl::StatusOr<absl::flat_hash_map<uint64_t, Writer>> writers = Parse(bytes);
  if (!writers.ok()) return writers.status();
  absl::MutexLock lock(&mu_);
  writers_ = *std::move(writers);
  return absl::OkStatus();
}

absl::Status PushDedup::Merge(absl::string_view bytes) {
  absl::StatusOr<absl::flat_hash_map<uint64_t, Writer>> theirs = Parse(bytes);
  if (!theirs.ok()) return theirs.status();
  const uint64_t window = options_.window;
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> seqs;
  for (const auto& [id, t] : *theirs) {
    Writer* w = WriterFor(id, t.incarnation);
    if (w == nullptr) continue;  // this pod has a newer incarnation of the writer
    // Their applied sequences, in increasing order (the window only moves forward).
    seqs.clear();
    for (size_t k = 0; k < t.done.size(); ++k) {
      for (uint64_t word = t.done[k]; word != 0; word &= word - 1) {
        const uint64_t slot = k * 64 + __builtin_ctzll(word);
        if (slot >= window) continue;
        seqs.push_back(t.base + (slot + window - t.base % window) % window);
      }
    }
    std::sort(seqs.begin(), seqs.end());
    for (uint64_t seq : seqs) {
      if (seq < w->base) continue;  // older than this pod remembers: refused here anyway
      if (seq >= w->base + window) Advance(*w, seq);
      SetDone(*w, seq);
    }
  }
  return absl::OkStatus();
}

size_t PushDedup::writers() const {
  absl::MutexLock lock(&mu_);
  return writers_.size();
}

}  // namespace ps
