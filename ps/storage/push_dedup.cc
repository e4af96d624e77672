#include "ps/storage/push_dedup.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace ps {

PushDedup::PushDedup(PushDedupOptions options) : options_(options) {}

namespace {

bool Has(const std::vector<uint32_t>& sorted, uint32_t v) {
  return std::binary_search(sorted.begin(), sorted.end(), v);
}

std::vector<uint32_t> Union(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  std::vector<uint32_t> out;
  std::set_union(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

std::vector<uint32_t> Minus(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  std::vector<uint32_t> out;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

std::vector<uint32_t> Both(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  std::vector<uint32_t> out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

bool AnyBit(const std::vector<uint64_t>& bits) {
  for (uint64_t word : bits) {
    if (word != 0) return true;
  }
  return false;
}

}  // namespace

bool PushDedup::IsSet(const std::vector<uint64_t>& bits, uint64_t seq) const {
  const uint64_t slot = seq % options_.window;
  return (bits[slot >> 6] >> (slot & 63)) & 1;
}

void PushDedup::SetBit(std::vector<uint64_t>& bits, uint64_t seq) const {
  const uint64_t slot = seq % options_.window;
  bits[slot >> 6] |= uint64_t{1} << (slot & 63);
}

void PushDedup::ClearBit(std::vector<uint64_t>& bits, uint64_t seq) const {
  const uint64_t slot = seq % options_.window;
  bits[slot >> 6] &= ~(uint64_t{1} << (slot & 63));
}

void PushDedup::ClearApplied(Writer& w, uint64_t seq) const {
  ClearBit(w.done, seq);
  for (Layer& l : w.layers) ClearBit(l.bits, seq);
}

bool PushDedup::HasPartialState(const Writer& w, uint64_t seq) const {
  if (w.pieces.contains(seq)) return true;
  for (const Layer& l : w.layers) {
    if (IsSet(l.bits, seq)) return true;
  }
  return false;
}

bool PushDedup::AppliedFor(const Writer& w, uint64_t seq, uint32_t v) const {
  if (IsDone(w, seq)) return true;
  for (const Layer& l : w.layers) {
    if (IsSet(l.bits, seq) && Has(l.vshards, v) != l.except) return true;
  }
  auto p = w.pieces.find(seq);
  return p != w.pieces.end() && p->second.done.contains(v);
}

PushDedup::Layer& PushDedup::LayerFor(Writer& w, const std::vector<uint32_t>& vshards,
                                      bool except) {
  for (Layer& l : w.layers) {
    if (l.except == except && l.vshards == vshards) return l;
  }
  Layer& added = w.layers.emplace_back();
  added.bits.assign(w.done.size(), 0);
  added.vshards = vshards;
  added.except = except;
  if (w.layers.size() > std::max<size_t>(options_.max_layers, 2)) {
    // The two oldest become one that claims, for each of their keys, only the vshards both
    // claim (their keys may then apply again on the others).
    Layer& a = w.layers[0];
    const Layer& b = w.layers[1];
    if (a.except && b.except) {
      a.vshards = Union(a.vshards, b.vshards);
    } else if (!a.except && !b.except) {
      a.vshards = Both(a.vshards, b.vshards);
    } else {
      a.vshards = a.except ? Minus(b.vshards, a.vshards) : Minus(a.vshards, b.vshards);
      a.except = false;
    }
    for (size_t k = 0; k < a.bits.size(); ++k) a.bits[k] |= b.bits[k];
    w.layers.erase(w.layers.begin() + 1);
    ++layer_merges_;
  }
  return w.layers.back();
}

void PushDedup::SetInLayer(Writer& w, uint64_t seq, const std::vector<uint32_t>& vshards,
                           bool except) {
  if (!except && vshards.empty()) return;  // claims nothing
  if (except && vshards.empty()) return SetDone(w, seq);
  SetBit(LayerFor(w, vshards, except).bits, seq);
}

// Moves the window so that it ends at `seq`, clearing the slots that now stand for new,
// not yet applied sequences.
void PushDedup::Advance(Writer& w, uint64_t seq) {
  const uint64_t new_base = seq - options_.window + 1;
  auto clear = [&](std::vector<uint64_t>& bits) {
    if (new_base - w.base >= options_.window) {
      std::fill(bits.begin(), bits.end(), 0);
      return;
    }
    for (uint64_t s = w.base; s < new_base; ++s) ClearBit(bits, s);
  };
  clear(w.done);
  for (auto it = w.layers.begin(); it != w.layers.end();) {
    clear(it->bits);
    it = AnyBit(it->bits) ? it + 1 : w.layers.erase(it);
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
    if (it->first < new_base && it->second.in_progress.empty() && it->second.claim.empty()) {
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
    w.layers.clear();
    w.forgotten_claims.clear();
  }
  return &w;
}

PushDedup::Claim PushDedup::Look(const Writer& w, const PushKey& key, const VShardsFn* vshards,
                                 std::vector<uint32_t>* request_out,
                                 std::vector<uint32_t>* applied_out) const {
  const uint64_t seq = key.sequence();
  if (!w.held.empty() && w.held.contains(seq)) return Claim::kInProgress;
  if (IsDone(w, seq)) return Claim::kDuplicate;  // applied whole: every vshard
  if (w.in_progress.contains(seq)) return Claim::kInProgress;
  auto p = w.pieces.find(seq);
  if (key.piece() != 0) {
    const uint32_t v = key.piece() - 1;
    if (p != w.pieces.end() && (p->second.held.contains(v) || p->second.in_progress.contains(v) ||
                                Has(p->second.claim, v))) {
      return Claim::kInProgress;
    }
    return AppliedFor(w, seq, v) ? Claim::kDuplicate : Claim::kNew;
  }
  if (p != w.pieces.end() &&
      (!p->second.in_progress.empty() || !p->second.claim.empty() || !p->second.held.empty())) {
    return Claim::kInProgress;  // some vshards of it are being applied or confirmed now
  }
  if ((p == w.pieces.end() && w.layers.empty()) || !HasPartialState(w, seq)) return Claim::kNew;
  // Applied here for some vshards: which of the request's?
  if (vshards == nullptr) return Claim::kInProgress;
  std::vector<uint32_t> request = (*vshards)();
  std::vector<uint32_t> applied;
  for (uint32_t v : request) {
    if (AppliedFor(w, seq, v)) applied.push_back(v);
  }
  Claim claim = Claim::kPartial;
  if (applied.empty()) {
    claim = Claim::kNew;
  } else if (applied.size() == request.size()) {
    claim = Claim::kDuplicate;
  }
  if (request_out != nullptr) *request_out = std::move(request);
  if (applied_out != nullptr) *applied_out = std::move(applied);
  return claim;
}

absl::StatusOr<PushDedup::Claim> PushDedup::BeginPiece(Writer& w, const PushKey& key) {
  const Claim claim = Look(w, key, nullptr);
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

absl::StatusOr<PushDedup::Writer*> PushDedup::Claimable(const PushKey& key) {
  if (key.sequence() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("push from worker ", key.worker_id(), " has sequence 0 (must be > 0)"));
  }
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
  return &w;
}

absl::StatusOr<PushDedup::Claim> PushDedup::Begin(const PushKey& key) {
  if (key.worker_id() == 0) return Claim::kNew;
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Writer * w, Claimable(key));
  if (key.piece() != 0) return BeginPiece(*w, key);
  const Claim claim = Look(*w, key, nullptr);
  if (claim == Claim::kNew) w->in_progress.insert(key.sequence());
  return claim;
}

absl::StatusOr<PushDedup::Claim> PushDedup::Begin(const PushKey& key, VShardsFn vshards,
                                                  const std::vector<uint32_t>* part, bool exact) {
  if (key.worker_id() == 0) return Claim::kNew;
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Writer * found, Claimable(key));
  Writer& w = *found;
  if (key.piece() != 0) return BeginPiece(w, key);
  const uint64_t seq = key.sequence();
  if (!exact && w.layers.empty() && w.pieces.empty() && w.held.empty()) {
    // The common case, as before layers: a bit per key.
    if (IsDone(w, seq)) return Claim::kDuplicate;
    if (!w.in_progress.insert(seq).second) return Claim::kInProgress;
    return Claim::kNew;
  }
  std::vector<uint32_t> request;
  bool asked = false;
  auto counting = [&] {
    asked = true;
    return vshards();
  };
  const VShardsFn counted(counting);
  const Claim claim = Look(w, key, &counted, &request);
  if (claim != Claim::kNew) return claim;
  if (!asked && !exact) {
    // The common case: a bit when applied (in a part's layer for a part, Finish).
    w.in_progress.insert(seq);
    return claim;
  }
  // Recorded per vshard: the key is known here for other vshards, or the request's rows
  // may be only some of those its part has in vshards this pod holds.
  if (!asked) request = vshards();
  auto p = w.pieces.find(seq);
  if (p == w.pieces.end()) {
    if (w.pieces.size() >= options_.max_piece_sequences) {
      return absl::ResourceExhaustedError(
          absl::StrCat("worker ", key.worker_id(), " has pushes applied for some vshards only in ",
                       w.pieces.size(), " sequences of this pod's window already (max ",
                       options_.max_piece_sequences, ")"));
    }
    p = w.pieces.emplace(seq, Pieces()).first;
  }
  p->second.claim = std::move(request);
  return claim;
}

absl::StatusOr<PushDedup::Claim> PushDedup::BeginRest(const PushKey& key, VShardsFn vshards,
                                                      std::vector<uint32_t>* rest) {
  rest->clear();
  if (key.worker_id() == 0 || key.piece() != 0) return Claim::kInProgress;
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Writer * found, Claimable(key));
  Writer& w = *found;
  std::vector<uint32_t> request, applied;
  const Claim claim = Look(w, key, &vshards, &request, &applied);
  if (claim != Claim::kPartial) return claim == Claim::kNew ? Claim::kInProgress : claim;
  *rest = Minus(request, applied);
  auto p = w.pieces.find(key.sequence());
  if (p == w.pieces.end()) {
    if (w.pieces.size() >= options_.max_piece_sequences) {
      return absl::ResourceExhaustedError(
          absl::StrCat("worker ", key.worker_id(), " has pushes applied for some vshards only in ",
                       w.pieces.size(), " sequences of this pod's window already (max ",
                       options_.max_piece_sequences, ")"));
    }
    p = w.pieces.emplace(key.sequence(), Pieces()).first;
  }
  p->second.claim = *rest;
  return Claim::kNew;
}

const PushDedup::Writer* PushDedup::Known(const PushKey& key) const {
  auto it = writers_.find(key.worker_id());
  if (it == writers_.end() || it->second.incarnation != key.incarnation()) return nullptr;
  const Writer& w = it->second;
  const uint64_t seq = key.sequence();
  if (seq < w.base || seq >= w.base + options_.window) return nullptr;
  return &w;
}

PushDedup::Claim PushDedup::Peek(const PushKey& key) const {
  if (key.worker_id() == 0) return Claim::kNew;
  absl::MutexLock lock(&mu_);
  const Writer* w = Known(key);
  return w == nullptr ? Claim::kNew : Look(*w, key, nullptr);
}

PushDedup::Claim PushDedup::Peek(const PushKey& key, VShardsFn vshards) const {
  if (key.worker_id() == 0) return Claim::kNew;
  absl::MutexLock lock(&mu_);
  const Writer* w = Known(key);
  return w == nullptr ? Claim::kNew : Look(*w, key, &vshards);
}

void PushDedup::Finish(const PushKey& key, bool applied, const std::vector<uint32_t>* part) {
  if (key.worker_id() == 0) return;
  absl::MutexLock lock(&mu_);
  auto it = writers_.find(key.worker_id());
  if (it == writers_.end() || it->second.incarnation != key.incarnation()) return;
  Writer& w = it->second;
  const uint64_t seq = key.sequence();
  if (key.piece() != 0) {
    auto p = w.pieces.find(seq);
    if (p == w.pieces.end()) return;
    const uint32_t v = key.piece() - 1;
    // Not claimed any more: Forget dropped its vshard while it applied.
    if (p->second.in_progress.erase(v) > 0 && applied && seq >= w.base) p->second.done.insert(v);
    if (p->second.empty()) w.pieces.erase(p);
    return;
  }
  if (w.in_progress.erase(seq) > 0) {
    auto f = w.forgotten_claims.empty() ? w.forgotten_claims.end() : w.forgotten_claims.find(seq);
    if (applied && seq >= w.base) {
      if (part != nullptr) {
        SetInLayer(w, seq, f == w.forgotten_claims.end() ? *part : Minus(*part, f->second),
                   /*except=*/false);
      } else if (f == w.forgotten_claims.end()) {
        SetDone(w, seq);
      } else {
        SetInLayer(w, seq, f->second, /*except=*/true);
      }
    }
    if (f != w.forgotten_claims.end()) w.forgotten_claims.erase(f);
    return;
  }
  auto p = w.pieces.find(seq);
  if (p == w.pieces.end() || p->second.claim.empty()) return;
  if (applied && seq >= w.base) {
    for (uint32_t v : p->second.claim) {
      // UINT32_MAX: all forgotten (Forget); with `part`, only those vshards applied.
      if (v == UINT32_MAX || (part != nullptr && !Has(*part, v))) continue;
      p->second.done.insert(v);
    }
  }
  p->second.claim.clear();
  if (p->second.empty()) w.pieces.erase(p);
}

void PushDedup::Forget(const std::vector<uint32_t>& unsorted) {
  std::vector<uint32_t> vshards = unsorted;
  std::sort(vshards.begin(), vshards.end());
  vshards.erase(std::unique(vshards.begin(), vshards.end()), vshards.end());
  if (vshards.empty()) return;
  absl::MutexLock lock(&mu_);
  for (auto& [id, w] : writers_) {
    for (auto it = w.layers.begin(); it != w.layers.end();) {
      it->vshards = it->except ? Union(it->vshards, vshards) : Minus(it->vshards, vshards);
      it = (!it->except && it->vshards.empty()) ? w.layers.erase(it) : it + 1;
    }
    // Layers that became alike are one.
    for (size_t i = 0; i < w.layers.size(); ++i) {
      for (size_t j = i + 1; j < w.layers.size();) {
        if (w.layers[j].except == w.layers[i].except &&
            w.layers[j].vshards == w.layers[i].vshards) {
          for (size_t k = 0; k < w.done.size(); ++k) w.layers[i].bits[k] |= w.layers[j].bits[k];
          w.layers.erase(w.layers.begin() + j);
        } else {
          ++j;
        }
      }
    }
    if (AnyBit(w.done)) {
      Layer& l = LayerFor(w, vshards, /*except=*/true);
      for (size_t k = 0; k < w.done.size(); ++k) l.bits[k] |= w.done[k];
      std::fill(w.done.begin(), w.done.end(), 0);
    }
    for (uint64_t seq : w.in_progress) {
      std::vector<uint32_t>& f = w.forgotten_claims[seq];
      f = Union(f, vshards);
    }
    for (auto it = w.pieces.begin(); it != w.pieces.end();) {
      Pieces& p = it->second;
      for (uint32_t v : vshards) {
        p.done.erase(v);
        p.held.erase(v);
        p.in_progress.erase(v);
      }
      if (!p.claim.empty()) {
        p.claim = Minus(p.claim, vshards);
        // Emptied: the claim stays as a marker with no vshard (Finish records nothing).
        if (p.claim.empty()) p.claim.push_back(UINT32_MAX);
      }
      if (p.empty() && p.held.empty()) {
        w.pieces.erase(it++);
      } else {
        ++it;
      }
    }
  }
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
  ClearApplied(w, key.sequence());
}

void PushDedup::ReleaseFor(const PushKey& key, const std::vector<uint32_t>& vshards) {
  if (key.worker_id() == 0) return;
  if (key.piece() != 0) return Release(key, /*applied=*/true);
  absl::MutexLock lock(&mu_);
  Writer* w = UnholdForRecord(key);
  if (w != nullptr) SetInLayer(*w, key.sequence(), vshards, /*except=*/false);
}

PushDedup::Writer* PushDedup::UnholdForRecord(const PushKey& key) {
  auto it = writers_.find(key.worker_id());
  if (it == writers_.end() || it->second.incarnation != key.incarnation()) return nullptr;
  Writer& w = it->second;
  if (w.held.erase(key.sequence()) == 0) return nullptr;
  ClearApplied(w, key.sequence());
  return &w;
}

void PushDedup::ReleaseExact(const PushKey& key, const std::vector<uint32_t>& vshards) {
  if (key.worker_id() == 0) return;
  if (key.piece() != 0) return Release(key, /*applied=*/true);
  absl::MutexLock lock(&mu_);
  Writer* held = UnholdForRecord(key);
  if (held == nullptr) return;
  Writer& w = *held;
  const uint64_t seq = key.sequence();
  auto p = w.pieces.find(seq);
  if (p == w.pieces.end() && w.pieces.size() >= options_.max_piece_sequences) {
    return SetInLayer(w, seq, vshards, /*except=*/false);
  }
  if (p == w.pieces.end()) p = w.pieces.emplace(seq, Pieces()).first;
  p->second.done.insert(vshards.begin(), vshards.end());
}

size_t PushDedup::ReleaseAll(bool applied) {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (auto& [id, w] : writers_) {
    n += w.held.size();
    if (!applied) {
      for (uint64_t seq : w.held) ClearApplied(w, seq);
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

size_t PushDedup::layers() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [id, w] : writers_) n += w.layers.size();
  return n;
}

uint64_t PushDedup::layer_merges() const {
  absl::MutexLock lock(&mu_);
  return layer_merges_;
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
// u64 worker_id, u64 incarnation, u64 base, window/64 u64 words of done bits. Then
// sections, each only when not empty, in this order:
//  - kPiecesTag, u64 count, per piece u64 worker_id, u64 sequence, u32 vshard (of a
//    writer listed before, within its window);
//  - kLayersTag, u64 count, per layer u64 worker_id, u32 except (0 or 1), u32 vshard
//    count, the vshards (u32, sorted), window/64 u64 words of bits;
//  - kOnlyTag, u64 vshard count, the vshards (u32, sorted): the state is of these vshards
//    only (a copy's), so its done bits and layers claim no others.
constexpr uint64_t kPiecesTag = 0x3153454345495050;  // "PPIECES1"
constexpr uint64_t kLayersTag = 0x3153524559414c50;  // "PLAYERS1"
constexpr uint64_t kOnlyTag = 0x31594c4e4f5f5f50;    // "P__ONLY1"

namespace {

// Writes Serialize's format in parts of at most `max_bytes` each (see SerializeParts): each
// a whole state of the writers it lists, with their layers and pieces, or some of them (a
// writer is listed again, without done bits, in the parts that hold the rest of its
// layers and pieces). A part holds at least one writer's entry and one layer or piece,
// so a part is bigger than `max_bytes` only if these alone are.
class PartWriter {
 public:
  PartWriter(uint32_t window, const std::vector<uint32_t>* only, size_t max_bytes)
      : window_(window), words_((window + 63) / 64), only_(only), max_bytes_(max_bytes) {
    StartPart();
  }

  void AddWriter(uint64_t id, uint64_t incarnation, uint64_t base,
                 const std::vector<uint64_t>& done) {
    if (writer_count_ > 0 && Size() + WriterBytes() > max_bytes_) Flush();
    id_ = id;
    incarnation_ = incarnation;
    base_ = base;
    AppendWriter(&done);
    holds_more_ = false;
  }
  void AddLayer(bool except, const std::vector<uint32_t>& vshards,
                const std::vector<uint64_t>& bits) {
    MakeRoom(16 + 4 * vshards.size() + 8 * words_ + (layer_count_ == 0 ? 16 : 0));
    Append<uint64_t>(&layers_, id_);
    Append<uint32_t>(&layers_, except ? 1 : 0);
    Append<uint32_t>(&layers_, static_cast<uint32_t>(vshards.size()));
    for (uint32_t v : vshards) Append<uint32_t>(&layers_, v);
    for (uint64_t word : bits) Append<uint64_t>(&layers_, word);
    ++layer_count_;
  }
  void AddPiece(uint64_t seq, uint32_t v) {
    MakeRoom(20 + (piece_count_ == 0 ? 16 : 0));
    Append<uint64_t>(&pieces_, id_);
    Append<uint64_t>(&pieces_, seq);
    Append<uint32_t>(&pieces_, v);
    ++piece_count_;
  }
  // The parts (at least one).
  std::vector<std::string> Finish() {
    if (writer_count_ > 0 || parts_.empty()) Flush();
    return std::move(parts_);
  }

 private:
  size_t WriterBytes() const { return 24 + 8 * words_; }
  size_t Size() const {
    return writers_.size() + (piece_count_ > 0 ? 16 + pieces_.size() : 0) +
           (layer_count_ > 0 ? 16 + layers_.size() : 0) +
           (only_ != nullptr ? 16 + 4 * only_->size() : 0);
  }
  // Before a layer or piece of `bytes`: a new part, listing the writer again (no done
  // bits), if this one is full and holds more than the writer's entry.
  void MakeRoom(size_t bytes) {
    if ((holds_more_ || writer_count_ > 1) && Size() + bytes > max_bytes_) {
      Flush();
      AppendWriter(nullptr);
    }
    holds_more_ = true;
  }
  void AppendWriter(const std::vector<uint64_t>* done) {
    Append<uint64_t>(&writers_, id_);
    Append<uint64_t>(&writers_, incarnation_);
    Append<uint64_t>(&writers_, base_);
    for (size_t k = 0; k < words_; ++k) Append<uint64_t>(&writers_, done ? (*done)[k] : 0);
    ++writer_count_;
  }
  // The part's header (its writer count written by Flush), then its writers' entries.
  void StartPart() {
    writers_.clear();
    Append<uint32_t>(&writers_, window_);
    Append<uint64_t>(&writers_, 0);
  }
  // The part is its writers' buffer with the count and the sections added (no copy of
  // the writers: the whole state is one part when unbounded, every round's Serialize).
  void Flush() {
    std::string& out = writers_;
    std::memcpy(out.data() + sizeof(uint32_t), &writer_count_, sizeof(writer_count_));
    out.reserve(Size());
    if (piece_count_ > 0) {
      Append<uint64_t>(&out, kPiecesTag);
      Append<uint64_t>(&out, piece_count_);
      out += pieces_;
    }
    if (layer_count_ > 0) {
      Append<uint64_t>(&out, kLayersTag);
      Append<uint64_t>(&out, layer_count_);
      out += layers_;
    }
    if (only_ != nullptr) {
      Append<uint64_t>(&out, kOnlyTag);
      Append<uint64_t>(&out, only_->size());
      for (uint32_t v : *only_) Append<uint32_t>(&out, v);
    }
    parts_.push_back(std::move(out));
    StartPart();
    pieces_.clear();
    layers_.clear();
    writer_count_ = piece_count_ = layer_count_ = 0;
  }

  const uint32_t window_;
  const size_t words_;
  const std::vector<uint32_t>* const only_;
  const size_t max_bytes_;
  std::vector<std::string> parts_;
  std::string writers_, pieces_, layers_;
  uint64_t writer_count_ = 0, piece_count_ = 0, layer_count_ = 0;
  // The writer being added, and whether the part holds a layer or piece of it.
  uint64_t id_ = 0, incarnation_ = 0, base_ = 0;
  bool holds_more_ = false;
};

}  // namespace

std::string PushDedup::Serialize(const std::vector<bool>* only_vshards) const {
  return std::move(SerializeParts(only_vshards, SIZE_MAX).front());
}

std::vector<std::string> PushDedup::SerializeParts(const std::vector<bool>* only_vshards,
                                                   size_t max_part_bytes) const {
  std::vector<uint32_t> only;
  if (only_vshards != nullptr) {
    for (uint32_t v = 0; v < only_vshards->size(); ++v) {
      if ((*only_vshards)[v]) only.push_back(v);
    }
  }
  auto in_copy = [&](uint32_t v) { return only_vshards == nullptr || Has(only, v); };
  PartWriter parts(options_.window, only_vshards != nullptr ? &only : nullptr, max_part_bytes);
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> done;
  // A copy's layers by what they claim of the copied vshards (several may claim the same).
  std::vector<std::pair<std::vector<uint32_t>, std::vector<uint64_t>>> copied;
  for (const auto& [id, w] : writers_) {
    done = w.done;
    copied.clear();
    for (const Layer& l : w.layers) {
      if (only_vshards == nullptr) break;  // every layer goes as it is
      // Of the copied vshards, those the layer claims.
      std::vector<uint32_t> claimed = l.except ? Minus(only, l.vshards) : Both(only, l.vshards);
      if (claimed.empty()) continue;
      if (claimed.size() == only.size()) {
        for (size_t k = 0; k < done.size(); ++k) done[k] |= l.bits[k];
        continue;
      }
      auto same = std::find_if(copied.begin(), copied.end(),
                               [&](const auto& c) { return c.first == claimed; });
      if (same == copied.end()) {
        copied.emplace_back(std::move(claimed), l.bits);
      } else {
        for (size_t k = 0; k < done.size(); ++k) same->second[k] |= l.bits[k];
      }
    }
    parts.AddWriter(id, w.incarnation, w.base, done);
    if (only_vshards == nullptr) {
      for (const Layer& l : w.layers) parts.AddLayer(l.except, l.vshards, l.bits);
    } else {
      for (const auto& [claimed, bits] : copied) parts.AddLayer(/*except=*/false, claimed, bits);
    }
    for (const auto& [seq, p] : w.pieces) {
      for (uint32_t v : p.done) {
        if (in_copy(v)) parts.AddPiece(seq, v);
      }
    }
  }
  return parts.Finish();
}

absl::StatusOr<PushDedup::Parsed> PushDedup::Parse(absl::string_view bytes) const {
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
  Parsed parsed;
  absl::flat_hash_map<uint64_t, Writer>& writers = parsed.writers;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t id = 0;
    Writer w;
    w.done.resize(words);
    bool ok = Take(&bytes, &id) && Take(&bytes, &w.incarnation) && Take(&bytes, &w.base);
    for (size_t k = 0; ok && k < words; ++k) ok = Take(&bytes, &w.done[k]);
    if (!ok) return absl::InvalidArgumentError("push de-duplication state is truncated");
    writers.emplace(id, std::move(w));
  }
  // A vshard list of `n` entries, sorted and distinct.
  auto take_vshards = [&](uint64_t n, std::vector<uint32_t>* out) -> absl::Status {
    if (n > bytes.size() / 4) {
      return absl::InvalidArgumentError("push de-duplication state's vshards are truncated");
    }
    out->resize(n);
    for (uint64_t k = 0; k < n; ++k) Take(&bytes, &(*out)[k]);
    for (uint64_t k = 1; k < n; ++k) {
      if ((*out)[k - 1] >= (*out)[k]) {
        return absl::InvalidArgumentError("push de-duplication state's vshards are not sorted");
      }
    }
    return absl::OkStatus();
  };
  while (!bytes.empty()) {
    uint64_t tag = 0, n = 0;
    if (!Take(&bytes, &tag) || !Take(&bytes, &n)) {
      return absl::InvalidArgumentError("push de-duplication state has trailing bytes");
    }
    if (tag == kPiecesTag) {
      if (n > bytes.size() / 20) {
        return absl::InvalidArgumentError("push de-duplication state's pieces are truncated");
      }
      for (uint64_t i = 0; i < n; ++i) {
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
    } else if (tag == kLayersTag) {
      for (uint64_t i = 0; i < n; ++i) {
        uint64_t id = 0;
        uint32_t except = 0, nv = 0;
        if (!Take(&bytes, &id) || !Take(&bytes, &except) || !Take(&bytes, &nv) || except > 1) {
          return absl::InvalidArgumentError("push de-duplication state's layers are truncated");
        }
        Layer l;
        l.except = except == 1;
        RETURN_IF_ERROR(take_vshards(nv, &l.vshards));
        l.bits.resize(words);
        for (size_t k = 0; k < words; ++k) {
          if (!Take(&bytes, &l.bits[k])) {
            return absl::InvalidArgumentError("push de-duplication state's layers are truncated");
          }
        }
        auto it = writers.find(id);
        if (it == writers.end()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "push de-duplication state has a layer of worker ", id, ", which it does not list"));
        }
        it->second.layers.push_back(std::move(l));
      }
    } else if (tag == kOnlyTag) {
      parsed.only = true;
      RETURN_IF_ERROR(take_vshards(n, &parsed.vshards));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("push de-duplication state has an unknown section ", tag));
    }
  }
  return parsed;
}

absl::Status PushDedup::Restore(absl::string_view bytes) {
  absl::StatusOr<Parsed> parsed = Parse(bytes);
  if (!parsed.ok()) return parsed.status();
  if (parsed->only) {
    return absl::InvalidArgumentError(
        "push de-duplication state of a vshard copy cannot replace a pod's state");
  }
  absl::MutexLock lock(&mu_);
  writers_ = std::move(parsed->writers);
  return absl::OkStatus();
}

namespace {

// The sequences whose bits are set in `bits` (a window ring from `base`), increasing.
void SeqsOf(const std::vector<uint64_t>& bits, uint64_t base, uint64_t window,
            std::vector<uint64_t>* out) {
  for (size_t k = 0; k < bits.size(); ++k) {
    for (uint64_t word = bits[k]; word != 0; word &= word - 1) {
      const uint64_t slot = k * 64 + __builtin_ctzll(word);
      if (slot >= window) continue;
      out->push_back(base + (slot + window - base % window) % window);
    }
  }
}

}  // namespace

absl::Status PushDedup::Merge(absl::string_view bytes) {
  absl::StatusOr<Parsed> parsed = Parse(bytes);
  if (!parsed.ok()) return parsed.status();
  const uint64_t window = options_.window;
  absl::MutexLock lock(&mu_);
  // What each of their sequences claims: whole (-1), a layer of theirs (its index), or
  // pieces only (-2).
  std::vector<std::pair<uint64_t, int>> seqs;
  std::vector<uint64_t> found;
  for (const auto& [id, t] : parsed->writers) {
    Writer* w = WriterFor(id, t.incarnation);
    if (w == nullptr) continue;  // this pod has a newer incarnation of the writer
    seqs.clear();
    found.clear();
    SeqsOf(t.done, t.base, window, &found);
    for (uint64_t seq : found) seqs.emplace_back(seq, -1);
    for (size_t i = 0; i < t.layers.size(); ++i) {
      found.clear();
      SeqsOf(t.layers[i].bits, t.base, window, &found);
      for (uint64_t seq : found) seqs.emplace_back(seq, static_cast<int>(i));
    }
    for (const auto& [seq, p] : t.pieces) seqs.emplace_back(seq, -2);
    std::sort(seqs.begin(), seqs.end());  // the window only moves forward
    for (const auto& [seq, what] : seqs) {
      if (seq < w->base) continue;  // older than this pod remembers: refused here anyway
      if (seq >= w->base + window) Advance(*w, seq);
      if (what == -1) {
        // A copy's whole keys claim its vshards only.
        if (parsed->only) {
          SetInLayer(*w, seq, parsed->vshards, /*except=*/false);
        } else {
          SetDone(*w, seq);
        }
      } else if (what >= 0) {
        const Layer& l = t.layers[what];
        SetInLayer(*w, seq, l.vshards, l.except);
      } else if (!IsDone(*w, seq)) {
        const Pieces& p = t.pieces.at(seq);
        w->pieces[seq].done.insert(p.done.begin(), p.done.end());
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
