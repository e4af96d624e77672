// MemoryStore: a MasterStore in memory, for unit tests of the master's parts. Writes can be
// made to fail or to wait (a test's hook runs before each batch is applied).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "master/master_store.h"

namespace ps {

class MemoryStore final : public MasterStore {
 public:
  // Runs before each batch is applied, without the store's lock; a non-OK status fails the
  // write (nothing applied). Set it before the store is shared between threads.
  std::function<absl::Status(const StoreBatch&)> before_write;

  absl::Status Write(const StoreBatch& batch) override {
    if (before_write) {
      if (absl::Status s = before_write(batch); !s.ok()) return s;
    }
    absl::MutexLock lock(&mu_);
    for (const auto& [key, value] : batch.ops()) {
      if (value.has_value()) {
        data_[key] = *value;
      } else {
        data_.erase(key);
      }
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<std::string>> Get(absl::string_view key) override {
    absl::MutexLock lock(&mu_);
    auto it = data_.find(std::string(key));
    if (it == data_.end()) return std::nullopt;
    return it->second;
  }
  absl::Status Checkpoint(const std::string& dir) override {
    return absl::UnimplementedError("MemoryStore has no checkpoints");
  }
  absl::Status Scan(
      absl::string_view prefix,
      const std::function<absl::Status(absl::string_view, absl::string_view)>& fn) override {
    std::map<std::string, std::string> copy;
    {
      absl::MutexLock lock(&mu_);
      copy = data_;
    }
    for (auto it = copy.lower_bound(std::string(prefix));
         it != copy.end() && absl::string_view(it->first).substr(0, prefix.size()) == prefix;
         ++it) {
      if (absl::Status s = fn(it->first, it->second); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> data_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps
