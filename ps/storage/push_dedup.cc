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
  for (auto it = w.pieces.begin(); it != w.pieces.end();) {
    // Claimed pieces stay until Finish, as claimed whole keys do.
    if (it->first < new_base && it->second.in_progress.empty()) {
      w.pieces.erase(it++);
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
    w.pieces.clear();
  }
  return &w;
}

PushDedup::Claim PushDedup::Look(const Writer& w, const PushKey& key) const {
  const uint64_t seq = key.sequence();
  if (w.held.contains(seq)) return Claim::kInProgress;
  if (IsDone(w, seq)) return Claim::kDuplicate;
  if (w.in_progress.contains(seq)) return Claim::kInProgress;
  auto p = w.pieces.find(seq);
  if (key.piece() == 0) {
    // A whole attempt of a part whose pieces were re-routed: never applied again here.
    if (p != w.pieces.end() && !p->second.empty()) return Claim::kInProgress;
    return Claim::kNew;
  }
  if (p == w.pieces.end()) return Claim::kNew;
  const uint32_t v = key.piece() - 1;
  if (p->second.held.contains(v) || p->second.in_progress.contains(v)) {
    return Claim::kInProgress;
  }
  if (p->second.done.contains(v)) return Claim::kDuplicate;
  return Claim::kNew;
}

absl::StatusOr<PushDedup::Claim> PushDedup::BeginPiece(Writer& w, const PushKey& key) {
  const Claim claim = Look(w, key);
  if (claim != Claim::kNew) return claim;
  auto p = w.pieces.find(key.sequence());
  if (p == w.pieces.end()) {
    if (w.pieces.size() >= options_.max_piece_sequences) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "worker ", key.worker_id(), " has re-routed pieces of ", w.pieces.size(),
          " pushes in this pod's window already (max ", options_.max_piece_sequences, ")"));
    }
    p = w.pieces.emplace(key.sequence(), Pieces()).first;
  }
  p->second.in_progress.insert(key.piece() - 1);
  return Claim::kNew;
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
  if (key.piece() != 0) return BeginPiece(w, key);
  const Claim claim = Look(w, key);
  if (claim != Claim::kNew) return claim;
  w.in_progress.insert(seq);
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
  return Look(w, key);
}

void PushDedup::Finish(const PushKey& key, bool applied) {
  if (key.worker_id() == 0) return;
  absl::MutexLock lock(&mu_);
  auto it = writers_.find(key.worker_id());
  if (it == writers_.end() || it->second.incarnation != key.incarnation()) return;
  Writer& w = it->second;
  if (key.piece() != 0) {
    auto p = w.pieces.find(key.sequence());
    if (p == w.pieces.end()) return;
    const uint32_t v = key.piece() - 1;
    p->second.in_progress.erase(v);
    if (applied && key.sequence() >= w.base) p->second.done.insert(v);
    if (p->second.empty()) w.pieces.erase(p);
    return;
  }
  w.in_progress.erase(key.sequence());
  if (applied && key.sequence() >= w.base) SetDone(w, key.sequence());
}

void PushDedup::Hold(const PushKey& key) {
  if (key.worker_id() == 0 || key.sequence() == 0) return;
  absl::MutexLock lock(&mu_);
  Writer* w = WriterFor(key.worker_id(), key.incarnation());
  if (w == nullptr || key.sequence() < w->base) return;
  if (key.sequence() >= w->base + options_.window) Advance(*w, key.sequence());
  if (key.piece() != 0) {
    Pieces& p = w->pieces[key.sequence()];
    p.done.insert(key.piece() - 1);
    p.held.insert(key.piece() - 1);
    return;
  }
  SetDone(*w, key.sequence());
  w->held.insert(key.sequence());
}

void PushDedup::Release(const PushKey& key, bool applied) {
  if (key.worker_id() == 0) return;
  absl::MutexLock lock(&mu_);
  auto it = writers_.find(key.worker_id());
  if (it == writers_.end() || it->second.incarnation != key.incarnation()) return;
  Writer& w = it->second;
  if (key.piece() != 0) {
    auto p = w.pieces.find(key.sequence());
    if (p == w.pieces.end()) return;
    const uint32_t v = key.piece() - 1;
    if (p->second.held.erase(v) == 0 || applied) return;
    p->second.done.erase(v);
    if (p->second.empty()) w.pieces.erase(p);
    return;
  }
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
    for (auto it = w.pieces.begin(); it != w.pieces.end();) {
      Pieces& p = it->second;
      n += p.held.size();
      if (!applied) {
        for (uint32_t v : p.held) p.done.erase(v);
      }
      p.held.clear();
      if (p.empty()) {
        w.pieces.erase(it++);
      } else {
        ++it;
      }
    }
  }
  return n;
}

size_t PushDedup::held() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [id, w] : writers_) {
    n += w.held.size();
    for (const auto& [seq, p] : w.pieces) n += p.held.size();
  }
  return n;
}

size_t PushDedup::piece_sequences() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [id, w] : writers_) n += w.pieces.size();
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
// u64 worker_id, u64 incarnation, u64 base, window/64 u64 words of done bits. Then, only
// when some piece is applied: u64 kPiecesTag, u64 count, per piece u64 worker_id,
// u64 sequence, u32 vshard (of a writer listed before, within its window).
constexpr uint64_t kPiecesTag = 0x3153454345495050;  // "PPIECES1"

std::string PushDedup::Serialize(const std::vector<bool>* only_vshards) const {
  absl::MutexLock lock(&mu_);
  std::string out;
  Append<uint32_t>(&out, options_.window);
  Append<uint64_t>(&out, writers_.size());
  std::string pieces;
  uint64_t count = 0;
  for (const auto& [id, w] : writers_) {
    Append<uint64_t>(&out, id);
    Append<uint64_t>(&out, w.incarnation);
    Append<uint64_t>(&out, w.base);
    for (uint64_t word : w.done) Append<uint64_t>(&out, word);
    for (const auto& [seq, p] : w.pieces) {
      for (uint32_t v : p.done) {
        if (only_vshards != nullptr && (v >= only_vshards->size() || !(*only_vshards)[v])) {
          continue;
        }
        Append<uint64_t>(&pieces, id);
        Append<uint64_t>(&pieces, seq);
        Append<uint32_t>(&pieces, v);
        ++count;
      }
    }
  }
  if (count > 0) {
    Append<uint64_t>(&out, kPiecesTag);
    Append<uint64_t>(&out, count);
    out += pieces;
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
    uint64_t tag = 0, pieces = 0;
    if (!Take(&bytes, &tag) || tag != kPiecesTag || !Take(&bytes, &pieces)) {
      return absl::InvalidArgumentError("push de-duplication state has trailing bytes");
    }
    if (pieces != bytes.size() / 20 || bytes.size() % 20 != 0) {
      return absl::InvalidArgumentError("push de-duplication state's pieces are truncated");
    }
    for (uint64_t i = 0; i < pieces; ++i) {
      uint64_t id = 0, seq = 0;
      uint32_t v = 0;
      Take(&bytes, &id);
      Take(&bytes, &seq);
      Take(&bytes, &v);
      auto it = writers.find(id);
      if (it == writers.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "push de-duplication state has a piece of worker ", id, ", which it does not list"));
      }
      Writer& w = it->second;
      if (seq < w.base || seq >= w.base + window) continue;  // outside its window: moot
      w.pieces[seq].done.insert(v);
    }
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
    // Their pieces: a piece adds to what this pod knows unless the key is whole here.
    for (const auto& [seq, p] : t.pieces) seqs.push_back(seq);
    std::sort(seqs.begin(), seqs.end());
    seqs.erase(std::unique(seqs.begin(), seqs.end()), seqs.end());
    for (uint64_t seq : seqs) {
      if (seq < w->base) continue;  // older than this pod remembers: refused here anyway
      if (seq >= w->base + window) Advance(*w, seq);
      auto p = t.pieces.find(seq);
      if (p == t.pieces.end() || IsDone(t, seq)) {
        SetDone(*w, seq);
        w->pieces.erase(seq);  // whole beats pieces
      } else if (!IsDone(*w, seq)) {
        w->pieces[seq].done.insert(p->second.done.begin(), p->second.done.end());
      }
    }
  }
  return absl::OkStatus();
}

size_t PushDedup::writers() const {
  absl::MutexLock lock(&mu_);
  return writers_.size();
}

}  // namespace ps
