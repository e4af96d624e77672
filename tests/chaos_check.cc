#include "tests/chaos_check.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace ps::chaos {
namespace {

constexpr size_t kMaxExamples = 10;

void Example(Verdict* v, std::string text) {
  if (v->examples.size() < kMaxExamples) v->examples.push_back(std::move(text));
}

const std::vector<float>& RowOf(const absl::flat_hash_map<int64_t, std::vector<float>>& rows,
                                int64_t id) {
  static const std::vector<float> kZeros(kDim, 0.0f);
  auto it = rows.find(id);
  return it == rows.end() ? kZeros : it->second;
}

}  // namespace

std::vector<int64_t> IdsToRead(const Workload& workload, uint64_t records, uint32_t epochs) {
  std::vector<int64_t> ids;
  ids.reserve(records * epochs * kParts + workload.hot_ids().size());
  for (uint32_t e = 0; e < epochs; ++e) {
    for (uint64_t r = 0; r < records; ++r) {
      for (uint32_t j = 0; j < kParts; ++j) ids.push_back(workload.Witness(r, e, j));
    }
  }
  ids.insert(ids.end(), workload.hot_ids().begin(), workload.hot_ids().end());
  return ids;
}

Verdict Check(const Workload& workload, const JournalSummary& journals, uint64_t records,
              uint32_t epochs, const absl::flat_hash_map<int64_t, std::vector<float>>& rows) {
  Verdict v;
  // Minus the expected value of each hot row, summed in double (exact: small integers).
  absl::flat_hash_map<int64_t, std::vector<double>> hot;
  for (int64_t id : workload.hot_ids()) hot[id].assign(kDim, 0.0);
  for (uint32_t e = 0; e < epochs; ++e) {
    for (uint64_t r = 0; r < records; ++r) {
      RecordPushes pushes;
      auto it = journals.records.find({e, r});
      if (it != journals.records.end()) pushes = it->second;
      const std::vector<Part> parts = workload.Record(r, e);
      for (uint32_t j = 0; j < kParts; ++j) {
        ++v.parts_checked;
        const Part& part = parts[j];
        const std::vector<float>& witness = RowOf(rows, part.ids[0]);
        // Minus the witness value: how often the part was applied.
        const double applied = -static_cast<double>(witness[0]);
        bool whole = applied >= 0 && applied == std::floor(applied);
        for (uint32_t d = 1; d < kDim; ++d) whole = whole && witness[d] == witness[0];
        if (!whole) {
          ++v.wrong_rows;
          Example(&v, absl::StrCat("witness row ", part.ids[0], " of epoch ", e, " record ", r,
                                   " part ", j, " holds ", witness[0], ", ", witness[1],
                                   "...: not minus a count"));
          continue;
        }
        const uint64_t n = static_cast<uint64_t>(applied);
        if (n < pushes.acked) {
          v.lost += pushes.acked - n;
          Example(&v,
                  absl::StrCat("epoch ", e, " record ", r, " part ", j, " (vshard ", part.vshard,
                               "): applied ", n, " times, acknowledged ", pushes.acked, " times"));
        } else if (n > uint64_t{pushes.acked} + pushes.unknown) {
          v.duplicated += n - pushes.acked - pushes.unknown;
          Example(&v, absl::StrCat("epoch ", e, " record ", r, " part ", j, " (vshard ",
                                   part.vshard, "): applied ", n, " times, acknowledged ",
                                   pushes.acked, " and ", pushes.unknown, " of unknown fate"));
        } else if (n > 1) {
          v.reapplied += n - 1;
        }
        for (size_t i = 1; i < part.ids.size(); ++i) {
          std::vector<double>& sum = hot[part.ids[i]];
          for (uint32_t d = 0; d < kDim; ++d) sum[d] += n * part.grads[i * kDim + d];
        }
      }
    }
  }
  for (int64_t id : workload.hot_ids()) {
    const std::vector<float>& row = RowOf(rows, id);
    const std::vector<double>& sum = hot[id];
    for (uint32_t d = 0; d < kDim; ++d) {
      if (static_cast<double>(row[d]) != -sum[d]) {
        ++v.wrong_rows;
        Example(&v, absl::StrCat("hot row ", id, " element ", d, " is ", row[d], ", expected ",
                                 -sum[d], " from the witnessed counts"));
        break;
      }
    }
  }
  return v;
}

}  // namespace ps::chaos
