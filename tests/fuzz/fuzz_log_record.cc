// libFuzzer harness: the push log's record parser (ps/storage/log_record.h), as recovery
// reads records back from log segments. An input is one record's bytes.
// Checks (any mismatch aborts):
// - ParseLogRecord and DecodeLogRecord agree (one accepts exactly what the other does), and
//   a refused record is DATA_LOSS;
// - every view of an accepted record lies inside the record's bytes (ASan would catch a
//   read past them: each id, step and float is read here);
// - the format has one encoding per record: LogRecordBuilder, given the decoded record,
//   writes the input back byte for byte.
//
// Seeds: tests/fuzz/corpus/log_record/ (tests/fuzz/make_corpus.py).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"
#include "ps/storage/log_record.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_log_record: %s\n", what);
    std::abort();
  }
}

// Reads every value a view points at; the sum keeps the reads from being optimized away.
uint64_t Touch(const ps::LogRecordView& v) {
  uint64_t sum = 0;
  auto floats = [&sum](const char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, p + i * 4, 4);
      sum += bits;
    }
  };
  for (const auto& t : v.tables) {
    for (size_t i = 0; i < t.n; ++i) sum += t.id(i) + t.step(i);
    floats(t.grads, size_t{t.n} * t.dim);
  }
  for (const auto& t : v.installs) {
    for (size_t i = 0; i < t.n; ++i) sum += t.id(i) + t.step(i);
    floats(t.values, size_t{t.n} * t.row_floats);
  }
  for (const auto& d : v.dense) floats(d.grads, d.n);
  for (const auto& d : v.dense_installs) floats(d.values, d.n);
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ps::LogRecordView> view = ps::ParseLogRecord(bytes);
  absl::StatusOr<ps::LogRecord> rec = ps::DecodeLogRecord(bytes);
  Check(view.ok() == rec.ok(), "ParseLogRecord and DecodeLogRecord agree");
  if (!view.ok()) {
    Check(view.status().code() == absl::StatusCode::kDataLoss, "a bad record is DATA_LOSS");
    return 0;
  }
  volatile uint64_t sink = Touch(*view);
  (void)sink;
  Check(view->tables.size() == rec->tables.size() &&
            view->installs.size() == rec->installs.size() &&
            view->dense.size() == rec->dense.size() &&
            view->dense_installs.size() == rec->dense_installs.size() &&
            view->deletes.size() == rec->deletes.size() &&
            view->decays.size() == rec->decays.size() &&
            view->admission_installs.size() == rec->admission_installs.size(),
        "the view and the copy have the same entries");
  Check(view->has_dense == (!rec->dense.empty() || !rec->dense_installs.empty()),
        "has_dense says whether there are dense entries");

  // Re-encode. The builder writes entries grouped by kind, so compare kind by kind only
  // when the input's entries are of one kind; else compare the re-encoding's parse.
  size_t expected = 0;
  for (const auto& t : rec->tables) {
    expected += ps::LogRecordBuilder::TableBytes(t.table, t.ids.size(), t.dim);
  }
  ps::LogRecordBuilder b(rec->key, expected);
  if (rec->key_exact) b.SetKeyExact();
  for (const auto& t : rec->tables)
    b.AddTable(t.table, t.lr, t.dim, t.ids, t.steps, t.grads.data());
  for (const auto& t : rec->installs) b.AddInstall(t.table, t.row_floats, t.ids, t.steps, t.values);
  for (const auto& d : rec->dense) b.AddDense(d.name, d.lr, d.step, d.grads);
  for (const auto& d : rec->dense_installs) b.AddDenseInstall(d.name, d.step, d.values);
  for (const auto& d : rec->deletes) b.AddDelete(d.table, d.ids);
  for (const auto& d : rec->decays) b.AddDecay(d.table, d.vshards);
  for (const auto& a : rec->admission_installs) b.AddAdmissionInstall(a.table, a.counters);
  const std::string encoded = b.Finish();
  Check(encoded.size() == size, "the re-encoding has the input's size");
  const int kinds = !rec->tables.empty() + !rec->installs.empty() + !rec->dense.empty() +
                    !rec->dense_installs.empty() + !rec->deletes.empty() + !rec->decays.empty() +
                    !rec->admission_installs.empty();
  if (kinds <= 1) Check(encoded == bytes, "the re-encoding is the input");
  absl::StatusOr<ps::LogRecord> again = ps::DecodeLogRecord(encoded);
  Check(again.ok(), "the re-encoding decodes");
  Check(again->key.SerializeAsString() == rec->key.SerializeAsString(), "the key survives");
  Check(again->key_exact == rec->key_exact && view->key_exact == rec->key_exact,
        "the key's exact mark survives");
  for (size_t i = 0; i < rec->deletes.size(); ++i) {
    Check(rec->deletes[i].table == again->deletes[i].table &&
              rec->deletes[i].ids == again->deletes[i].ids,
          "a delete entry survives");
  }
  for (size_t i = 0; i < rec->tables.size(); ++i) {
    const auto &x = rec->tables[i], &y = again->tables[i];
    Check(x.table == y.table && x.dim == y.dim && x.ids == y.ids && x.steps == y.steps &&
              std::memcmp(&x.lr, &y.lr, 4) == 0 && x.grads.size() == y.grads.size() &&
              (x.grads.empty() ||
               std::memcmp(x.grads.data(), y.grads.data(), x.grads.size() * 4) == 0),
          "a table entry survives");
  }
  return 0;
}
