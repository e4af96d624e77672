#include "tests/chaos_cluster.h"

#include <filesystem>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ps::chaos {

using integration::ChildProcess;
using integration::StartServerProcess;

Cluster::Cluster(ClusterOptions options) : options_(std::move(options)) {
  pods_.resize(options_.pods);
  pod_ports_.resize(options_.pods, 0);
}

Cluster::~Cluster() {
  // Workers first (they would only retry against stopped servers), the master last.
  for (auto& w : workers_) {
    if (w != nullptr) w->Stop(absl::Seconds(2));
  }
  for (auto& p : pods_) {
    if (p != nullptr) p->Stop(absl::Seconds(3));
  }
  if (master_ != nullptr) master_->Stop(absl::Seconds(3));
}

absl::Status Cluster::StartMaster() {
  std::vector<std::string> argv = {options_.master_binary,
                                   "--data_dir=" + MasterDataDir(),
                                   absl::StrCat("--num_vshards=", options_.num_vshards),
                                   absl::StrCat("--num_ps=", options_.pods),
                                   absl::StrCat("--lease_ms=", options_.lease_ms),
                                   absl::StrCat("--max_task_failures=", options_.max_task_failures),
                                   "--shutdown_grace_ms=200"};
  if (options_.replication > 1) {
    argv.push_back(absl::StrCat("--replication=", options_.replication));
  }
  argv.insert(argv.end(), options_.master_flags.begin(), options_.master_flags.end());
  absl::Status last;
  // The first start takes any port; a restart needs the same one, which the killed
  // process's socket may hold for a moment.
  for (int attempt = 0; attempt < 20; ++attempt) {
    auto port = StartServerProcess(argv, master_port_, Path("master.port"),
                                   Path(absl::StrCat("master-", processes_started_++, ".log")),
                                   options_.start_timeout, &master_);
    if (port.ok()) {
      master_port_ = *port;
      master_address_ = absl::StrCat("127.0.0.1:", master_port_);
      return absl::OkStatus();
    }
    last = port.status();
    master_->Kill();
    if (master_port_ == 0) break;
    absl::SleepFor(absl::Milliseconds(250));
  }
  return last;
}

void Cluster::KillMaster() {
  if (master_ != nullptr) master_->Kill();
}

std::string Cluster::PodId(uint32_t i) const { return absl::StrCat("ps-", i); }

absl::Status Cluster::StartPod(uint32_t i, bool same_port) {
  std::vector<std::string> argv = {
      options_.server_binary,        "--master=" + master_address_,
      "--pod_id=" + PodId(i),        absl::StrCat("--num_vshards=", options_.num_vshards),
      "--data_dir=" + PodDataDir(i), "--durability=" + options_.durability,
      "--materialize_ms=300",        "--shutdown_grace_ms=200"};
  argv.insert(argv.end(), options_.server_flags.begin(), options_.server_flags.end());
  const int port = same_port ? pod_ports_[i] : 0;
  absl::Status last;
  for (int attempt = 0; attempt < 20; ++attempt) {
    auto started =
        StartServerProcess(argv, port, Path(PodId(i) + ".port"),
                           Path(absl::StrCat(PodId(i), "-", processes_started_++, ".log")),
                           options_.start_timeout, &pods_[i]);
    if (started.ok()) {
      pod_ports_[i] = *started;
      return absl::OkStatus();
    }
    last = started.status();
    pods_[i]->Kill();
    if (port == 0) break;
    absl::SleepFor(absl::Milliseconds(250));
  }
  return last;
}

void Cluster::KillPod(uint32_t i) {
  if (pods_[i] != nullptr) pods_[i]->Kill();
}

void Cluster::SignalPod(uint32_t i, int sig) {
  if (pods_[i] != nullptr) pods_[i]->Signal(sig);
}

void Cluster::LosePodData(uint32_t i) {
  std::error_code ignored;
  std::filesystem::remove_all(PodDataDir(i), ignored);
}

absl::Status Cluster::StartWorker(uint32_t slot, uint64_t worker_id, const std::string& job,
                                  int record_pause_ms) {
  if (slot >= workers_.size()) workers_.resize(slot + 1);
  const std::string name = absl::StrCat("worker-", slot, "-", processes_started_++);
  std::vector<std::string> argv = {options_.worker_binary,
                                   "train",
                                   "--master=" + master_address_,
                                   "--job=" + job,
                                   "--journal=" + Path(name + ".journal"),
                                   absl::StrCat("--num_vshards=", options_.num_vshards),
                                   absl::StrCat("--record_pause_ms=", record_pause_ms)};
  if (worker_id != 0) argv.push_back(absl::StrCat("--worker_id=", worker_id));
  auto child = ChildProcess::Start(argv, Path(name + ".log"));
  if (!child.ok()) return child.status();
  workers_[slot] = *std::move(child);
  return absl::OkStatus();
}

void Cluster::KillWorker(uint32_t slot) {
  if (slot < workers_.size() && workers_[slot] != nullptr) workers_[slot]->Kill();
}

uint64_t Cluster::WorkerId(uint32_t slot) {
  if (slot >= workers_.size() || workers_[slot] == nullptr) return 0;
  const std::string log = integration::FileTail(workers_[slot]->log_path(), 1 << 20);
  uint64_t id = 0;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    if (f.size() == 4 && f[0] == "worker" && f[2] == "incarnation") {
      absl::SimpleAtoi(f[1], &id);
    }
  }
  return id;
}

bool Cluster::WaitWorker(uint32_t slot, absl::Duration timeout) {
  return workers_[slot] == nullptr || workers_[slot]->WaitExit(timeout);
}

std::string Cluster::DescribeWorker(uint32_t slot) {
  return workers_[slot] == nullptr ? "not started" : workers_[slot]->Describe();
}

std::string Cluster::Logs() {
  std::string out;
  auto add = [&out](const std::string& name, ChildProcess* c) {
    if (c == nullptr) return;
    absl::StrAppend(&out, "---- ", name, " (", c->Describe(), "), ", c->log_path(), ":\n",
                    integration::FileTail(c->log_path(), 3000), "\n");
  };
  add("ps-master", master_.get());
  for (uint32_t i = 0; i < pods_.size(); ++i) add(PodId(i), pods_[i].get());
  for (uint32_t i = 0; i < workers_.size(); ++i) {
    add(absl::StrCat("worker ", i), workers_[i].get());
  }
  return out;
}

}  // namespace ps::chaos
