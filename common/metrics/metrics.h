// Prometheus metrics: counters, gauges and latency histograms, rendered in the Prometheus
// text exposition format (version 0.0.4) with HELP and TYPE lines and labels.
//
// Two ways to export a value:
// - Owned metrics (MetricsRegistry::AddCounter / AddHistogram): a family with fixed label
//   names; WithLabels() returns a child the hot path keeps and updates with one relaxed
//   atomic add. Lock-free after the child is created.
// - Collectors (MetricsRegistry::AddCollector): a function called at scrape time that reads
//   counters the program keeps anyway (PsCore's Stats, the master's Status) and writes
//   whole families through a MetricsWriter. Nothing is counted twice.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace ps {

enum class MetricType { kCounter, kGauge, kHistogram };

// Label (name, value) pairs of one sample, in the order written.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// Upper bounds (seconds) of the default latency buckets: 50 us .. 10 s.
std::vector<double> DefaultLatencyBuckets();

// A point-in-time copy of a histogram: cumulative counts per bound (+Inf implied).
struct HistogramSnapshot {
  std::vector<double> bounds;
  std::vector<uint64_t> cumulative;  // cumulative[i]: observations <= bounds[i]
  uint64_t count = 0;
  double sum = 0;
};

// Builds one exposition. Not thread-safe; one writer per scrape.
class MetricsWriter {
 public:
  // Starts a family: writes its # HELP and # TYPE lines. `name` must match
  // [a-zA-Z_:][a-zA-Z0-9_:]* (checked by IsValidMetricName; an invalid family is dropped
  // with its samples). A family name may appear once per exposition.
  void Family(absl::string_view name, absl::string_view help, MetricType type);
  // A sample of the current counter or gauge family.
  void Sample(const MetricLabels& labels, double value);
  // The _bucket, _sum and _count samples of the current histogram family.
  void Histogram(const MetricLabels& labels, const HistogramSnapshot& h);

  const std::string& text() const { return out_; }

 private:
  void Line(absl::string_view suffix, const MetricLabels& labels, const std::string* extra_le,
            double value);

  std::string out_;
  std::string family_;
  bool dropping_ = false;
  std::vector<std::string> seen_;
};

bool IsValidMetricName(absl::string_view name);
// Shortest text that reads back as `v` (integers without a decimal point; +Inf, -Inf, NaN).
std::string FormatMetricValue(double v);

class Counter {
 public:
  void Add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

class Histogram {
 public:
  // `bounds` ascending. At most kMaxBuckets of them.
  explicit Histogram(std::vector<double> bounds);
  // Thread-safe, lock-free.
  void Observe(double v);
  HistogramSnapshot Snapshot() const;

  static constexpr size_t kMaxBuckets = 31;

 private:
  const std::vector<double> bounds_;
  std::array<std::atomic<uint64_t>, kMaxBuckets + 1> buckets_{};  // last: above every bound
  std::atomic<uint64_t> sum_micros_{0};  // the sum, in millionths (no atomic double add)
};

// A family of children distinguished by label values (the label names are the family's).
template <typename Metric>
class MetricFamily {
 public:
  MetricFamily(std::vector<std::string> label_names, std::function<std::unique_ptr<Metric>()> make)
      : label_names_(std::move(label_names)), make_(std::move(make)) {}
  // The child for these label values (one per label name), created on first use. The
  // pointer lives as long as the registry. Thread-safe; keep the pointer on hot paths.
  Metric* WithLabels(const std::vector<std::string>& values) {
    absl::MutexLock lock(&mu_);
    auto& slot = children_[values];
    if (slot == nullptr) slot = make_();
    return slot.get();
  }
  // Calls f(labels, metric) for every child, in label order.
  template <typename F>
  void ForEach(F f) const {
    absl::MutexLock lock(&mu_);
    for (const auto& [values, metric] : children_) {
      MetricLabels labels;
      for (size_t i = 0; i < label_names_.size() && i < values.size(); ++i) {
        labels.emplace_back(label_names_[i], values[i]);
      }
      f(labels, *metric);
    }
  }

 private:
  const std::vector<std::string> label_names_;
  const std::function<std::unique_ptr<Metric>()> make_;
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<Metric>> children_ ABSL_GUARDED_BY(mu_);
};

class MetricsRegistry {
 public:
  using Collector = std::function<void(MetricsWriter*)>;

  // Families owned by the registry, exported in the order added. The pointer lives as long
  // as the registry. Thread-safe.
  MetricFamily<Counter>* AddCounter(const std::string& name, const std::string& help,
                                    std::vector<std::string> label_names);
  MetricFamily<Histogram>* AddHistogram(const std::string& name, const std::string& help,
                                        std::vector<std::string> label_names,
                                        std::vector<double> bounds = DefaultLatencyBuckets());
  // `collect` runs on the scraping thread at every Render, after the owned families; it
  // must be thread-safe and must not block on the data path (read atomics, or take a lock
  // only as long as a request does).
  void AddCollector(Collector collect);

  // The whole exposition. Thread-safe.
  std::string Render() const;

 private:
  mutable absl::Mutex mu_;
  std::vector<Collector> collectors_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<MetricFamily<Counter>>> counters_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<MetricFamily<Histogram>>> histograms_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps
