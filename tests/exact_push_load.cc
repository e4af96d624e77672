#include "tests/exact_push_load.h"

#include <algorithm>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"

namespace ps::integration {
namespace {

constexpr int kShared = 64;
constexpr int kSharedPerPush = 8;
// Ids per read: 16k rows of kLoadDim floats is 256 KB, far below any message limit.
constexpr size_t kReadPage = 16384;

}  // namespace

TableSpec ExactLoadTable(const std::string& name) {
  TableSpec spec;
  spec.set_name(name);
  spec.set_dim(kLoadDim);
  spec.mutable_initializer()->set_kind(InitializerSpec::ZEROS);
  spec.mutable_optimizer()->set_kind(OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_learning_rate(1);
  return spec;
}

absl::StatusOr<std::unique_ptr<ExactPushLoad>> ExactPushLoad::Start(
    const ClientOptions& client_options, const std::string& table, int threads, uint64_t seed) {
  std::unique_ptr<ExactPushLoad> load(new ExactPushLoad());
  load->table_ = table;
  for (int c = 0; c < threads; ++c) {
    auto client = PsClient::Connect(client_options);
    if (!client.ok()) return client.status();
    load->clients_.push_back(*std::move(client));
  }
  for (int c = 0; c < threads; ++c) {
    load->threads_.emplace_back([raw = load.get(), client = load->clients_[c].get(), c, seed] {
      raw->Run(client, c, seed);
    });
  }
  return load;
}

void ExactPushLoad::Run(PsClient* client, int thread, uint64_t seed) {
  std::mt19937_64 rng(seed * 1000 + thread);
  std::vector<int64_t> all(kShared);
  for (int i = 0; i < kShared; ++i) all[i] = i;
  const std::vector<float> minus_one((1 + kSharedPerPush) * kLoadDim, -1.0f);
  for (uint64_t seq = 1; !stop_.load(); ++seq) {
    LoadPush p;
    p.marker = (int64_t{thread + 1} << 32) | static_cast<int64_t>(seq);
    std::shuffle(all.begin(), all.end(), rng);
    p.shared.assign(all.begin(), all.begin() + kSharedPerPush);
    std::vector<int64_t> ids = {p.marker};
    ids.insert(ids.end(), p.shared.begin(), p.shared.end());
    p.sent_at = absl::Now();
    const ClientStats before = client->client_stats();
    const absl::Status s = client->Push({{table_, ids, minus_one.data()}});
    const ClientStats after = client->client_stats();
    p.done_at = absl::Now();
    p.reroutes = after.reroutes - before.reroutes;
    p.retries = after.retries - before.retries;
    p.duplicates = after.duplicate_pushes - before.duplicate_pushes;
    p.acked = s.ok();
    if (!s.ok()) p.error = s.ToString();
    if (s.ok()) acked_.fetch_add(1);
    absl::MutexLock lock(&mu_);
    pushes_.push_back(std::move(p));
  }
}

void ExactPushLoad::Stop() {
  stop_.store(true);
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

std::vector<LoadPush> ExactPushLoad::pushes() const {
  absl::MutexLock lock(&mu_);
  return pushes_;
}

absl::StatusOr<LoadCheck> CheckPushLoad(PsClient& client, const std::string& table,
                                        const std::vector<LoadPush>& pushes) {
  std::vector<int64_t> ids;
  for (const LoadPush& p : pushes) ids.push_back(p.marker);
  for (int i = 0; i < kShared; ++i) ids.push_back(i);
  std::vector<float> values(ids.size() * kLoadDim);
  for (size_t begin = 0; begin < ids.size(); begin += kReadPage) {
    const size_t n = std::min(kReadPage, ids.size() - begin);
    absl::Status s = client.Pull(
        {{table, absl::MakeConstSpan(ids.data() + begin, n), values.data() + begin * kLoadDim}});
    if (!s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("reading ids ", begin, "..", begin + n, ": ", s.message()));
    }
  }
  LoadCheck check;
  std::map<int64_t, int64_t> expected;
  for (size_t i = 0; i < pushes.size(); ++i) {
    const float* row = values.data() + i * kLoadDim;
    for (int d = 1; d < kLoadDim; ++d) check.torn += row[d] != row[0];
    if (pushes[i].acked) {
      ++check.acked;
      if (row[0] == 0) ++check.lost;
    } else {
      ++check.failed;
    }
    if (row[0] >= 2) ++check.duplicated;
    if (((pushes[i].acked && row[0] == 0) || row[0] >= 2) && check.problems.size() < 2000) {
      absl::StrAppend(&check.problems, "push ", pushes[i].marker >> 32, "/",
                      pushes[i].marker & 0xffffffff, " (", absl::FormatTime(pushes[i].sent_at),
                      " .. ", absl::FormatTime(pushes[i].done_at), "): marker ", row[0], "\n");
    }
    for (int64_t id : pushes[i].shared) expected[id] += static_cast<int64_t>(row[0]);
  }
  for (int i = 0; i < kShared; ++i) {
    const float* row = values.data() + (pushes.size() + i) * kLoadDim;
    for (int d = 0; d < kLoadDim; ++d) {
      check.shared_mismatches += row[d] != static_cast<float>(expected[i]);
    }
    if (row[0] != static_cast<float>(expected[i]) && check.problems.size() < 20000) {
      absl::StrAppend(&check.problems, "shared row ", i, ": ", row[0], " ", row[1], " ", row[2],
                      " ", row[3], ", expected ", expected[i], "; its pushes that met a fault:\n");
      const float* markers = values.data();
      for (size_t k = 0; k < pushes.size(); ++k) {
        const LoadPush& p = pushes[k];
        if (p.reroutes + p.retries + p.duplicates == 0 || !p.acked) continue;
        if (std::find(p.shared.begin(), p.shared.end(), i) == p.shared.end()) continue;
        absl::StrAppend(&check.problems, "  push ", p.marker >> 32, ":", p.marker & 0xffffffff,
                        " marker ", markers[k * kLoadDim], " reroutes ", p.reroutes, " retries ",
                        p.retries, " duplicates ", p.duplicates, " (", absl::FormatTime(p.sent_at),
                        " .. ", absl::FormatTime(p.done_at), ")\n");
      }
    }
  }
  return check;
}

}  // namespace ps::integration
