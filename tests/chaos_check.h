// The verdict of a chaos run (ps-chaos): the rows read back, set against what the
// workers' journals say was pushed (tests/chaos_journal.h) and what the workload says
// each record pushes (tests/chaos_workload.h).
//
// For each part of each (epoch, record) the job trained, the witness row gives n, the
// times the part was applied. With `acked` acknowledged pushes of that record and
// `unknown` pushes of unknown fate (failed, or in flight when their worker was killed):
//  - n < acked: an acknowledged push is missing: `lost` += acked - n;
//  - n > acked + unknown: applied more often than pushed: `duplicated` += the excess;
//  - n > 1 otherwise: a task retrained after its worker was killed pushed it again
//    (`reapplied`: the pods cannot de-duplicate those, see docs and tests/chaos_main.cc).
// Every hot row must then equal exactly minus the sum, over the parts that touched it, of
// n times the part's gradient (else `wrong_rows`). Pure computation; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "tests/chaos_journal.h"
#include "tests/chaos_workload.h"

namespace ps::chaos {

struct Verdict {
  uint64_t parts_checked = 0;
  uint64_t lost = 0;
  uint64_t duplicated = 0;
  uint64_t reapplied = 0;
  uint64_t wrong_rows = 0;            // hot or witness rows that are not what the counts imply
  std::vector<std::string> examples;  // the first few problems, for the log
};

// `rows`: every row read back (id -> kDim floats), holding at least the witness rows of
// every part of records [0, records) of epochs [0, epochs) and every hot row; a row
// missing from it counts as zeros.
Verdict Check(const Workload& workload, const JournalSummary& journals, uint64_t records,
              uint32_t epochs, const absl::flat_hash_map<int64_t, std::vector<float>>& rows);

// The ids Check reads: every witness row of those records and epochs, then the hot rows.
std::vector<int64_t> IdsToRead(const Workload& workload, uint64_t records, uint32_t epochs);

}  // namespace ps::chaos
