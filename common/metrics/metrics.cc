#include "common/metrics/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

bool IsNameChar(char c, bool first) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
         (!first && c >= '0' && c <= '9');
}

// Label values escape \ " and newline; HELP text escapes \ and newline.
void AppendEscaped(absl::string_view s, bool quote, std::string* out) {
  for (char c : s) {
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '\n') {
      out->append("\\n");
    } else if (quote && c == '"') {
      out->append("\\\"");
    } else {
      out->push_back(c);
    }
  }
}

const char* TypeName(MetricType t) {
  switch (t) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

}  // namespace

std::vector<double> DefaultLatencyBuckets() {
  return {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,    0.1,    0.25,    0.5,    1,     2.5,    5,     10};
}

bool IsValidMetricName(absl::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (!IsNameChar(name[i], i == 0)) return false;
  }
  return true;
}

std::string FormatMetricValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  if (ec != std::errc()) return absl::StrCat(v);
  return std::string(buf, end);
}

void MetricsWriter::Family(absl::string_view name, absl::string_view help, MetricType type) {
  family_ = std::string(name);
  dropping_ =
      !IsValidMetricName(name) || std::find(seen_.begin(), seen_.end(), family_) != seen_.end();
  if (dropping_) return;
  seen_.push_back(family_);
  absl::StrAppend(&out_, "# HELP ", name, " ");
  AppendEscaped(help, /*quote=*/false, &out_);
  absl::StrAppend(&out_, "\n# TYPE ", name, " ", TypeName(type), "\n");
}

void MetricsWriter::Line(absl::string_view suffix, const MetricLabels& labels,
                         const std::string* extra_le, double value) {
  absl::StrAppend(&out_, family_, suffix);
  if (!labels.empty() || extra_le != nullptr) {
    out_.push_back('{');
    bool first = true;
    for (const auto& [k, v] : labels) {
      if (!IsValidMetricName(k) || k.find(':') != std::string::npos) continue;
      if (!first) out_.push_back(',');
      first = false;
      absl::StrAppend(&out_, k, "=\"");
      AppendEscaped(v, /*quote=*/true, &out_);
      out_.push_back('"');
    }
    if (extra_le != nullptr) absl::StrAppend(&out_, first ? "" : ",", "le=\"", *extra_le, "\"");
    out_.push_back('}');
  }
  absl::StrAppend(&out_, " ", FormatMetricValue(value), "\n");
}

void MetricsWriter::Sample(const MetricLabels& labels, double value) {
  if (!dropping_) Line("", labels, nullptr, value);
}

void MetricsWriter::Histogram(const MetricLabels& labels, const HistogramSnapshot& h) {
  if (dropping_) return;
  for (size_t i = 0; i < h.bounds.size() && i < h.cumulative.size(); ++i) {
    const std::string le = FormatMetricValue(h.bounds[i]);
    Line("_bucket", labels, &le, static_cast<double>(h.cumulative[i]));
  }
  const std::string inf = "+Inf";
  Line("_bucket", labels, &inf, static_cast<double>(h.count));
  Line("_sum", labels, nullptr, h.sum);
  Line("_count", labels, nullptr, static_cast<double>(h.count));
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_([&] {
        std::sort(bounds.begin(), bounds.end());
        if (bounds.size() > kMaxBuckets) bounds.resize(kMaxBuckets);
        return bounds;
      }()) {}

void Histogram::Observe(double v) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  if (v > 0) {
    sum_micros_.fetch_add(static_cast<uint64_t>(v * 1e6 + 0.5), std::memory_order_relaxed);
  }
}

HistogramSnapshot Histogram::Snapshot() const {
  HistogramSnapshot s;
  s.bounds = bounds_;
  uint64_t total = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(total);
  }
  s.count = total + buckets_[bounds_.size()].load(std::memory_order_relaxed);
  s.sum = static_cast<double>(sum_micros_.load(std::memory_order_relaxed)) / 1e6;
  return s;
}

MetricFamily<Counter>* MetricsRegistry::AddCounter(const std::string& name, const std::string& help,
                                                   std::vector<std::string> label_names) {
  auto family = std::make_unique<MetricFamily<Counter>>(std::move(label_names),
                                                        [] { return std::make_unique<Counter>(); });
  MetricFamily<Counter>* f = family.get();
  absl::MutexLock lock(&mu_);
  counters_.push_back(std::move(family));
  collectors_.push_back([f, name, help](MetricsWriter* w) {
    w->Family(name, help, MetricType::kCounter);
    f->ForEach([w](const MetricLabels& labels, const Counter& c) {
      w->Sample(labels, static_cast<double>(c.value()));
    });
  });
  return f;
}

MetricFamily<Histogram>* MetricsRegistry::AddHistogram(const std::string& name,
                                                       const std::string& help,
                                                       std::vector<std::string> label_names,
                                                       std::vector<double> bounds) {
  auto family = std::make_unique<MetricFamily<Histogram>>(
      std::move(label_names), [bounds] { return std::make_unique<Histogram>(bounds); });
  MetricFamily<Histogram>* f = family.get();
  absl::MutexLock lock(&mu_);
  histograms_.push_back(std::move(family));
  collectors_.push_back([f, name, help](MetricsWriter* w) {
    w->Family(name, help, MetricType::kHistogram);
    f->ForEach([w](const MetricLabels& labels, const Histogram& h) {
      w->Histogram(labels, h.Snapshot());
    });
  });
  return f;
}

void MetricsRegistry::AddCollector(Collector collect) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collect));
}

std::string MetricsRegistry::Render() const {
  std::vector<Collector> collectors;
  {
    absl::MutexLock lock(&mu_);
    collectors = collectors_;
  }
  MetricsWriter w;
  for (const Collector& c : collectors) c(&w);
  return w.text();
}

}  // namespace ps
