// Start-up shared by every binary: gflags (with --help listing only the flags defined in
// the binary's own main file, not glog's and gflags' own), glog to stderr, and abseil's
// mutex deadlock detection off (Debian's abseil runs it on every lock: ~30% of a pull),
// and glibc malloc told to keep large blocks: pulls and pushes allocate and free
// 256 KB+ message buffers thousands of times a second, and served by mmap/munmap each
// one costs page faults and page zeroing (measured: ~10% of a pod's CPU).
#pragma once

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <malloc.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace ps {

// Parses flags (removing them from argv). `main_file` is __FILE__ of the caller: --help
// prints `usage` and the flags this project defines (in the caller's file, and in shared
// flag files such as client/security_flags.cc), not gflags' or glog's, then exits 0.
inline void ParseFlagsWithHelp(int* argc, char*** argv, const char* usage, const char* main_file) {
  gflags::SetUsageMessage(usage);
  // The source tree's root as this build names it: main_file less "<folder>/<file>".
  std::string root = main_file;
  root.resize(root.rfind('/') == std::string::npos ? 0 : root.rfind('/'));
  root.resize(root.rfind('/') == std::string::npos ? 0 : root.rfind('/') + 1);
  for (int i = 1; i < *argc; ++i) {
    if (std::strcmp((*argv)[i], "--help") == 0 || std::strcmp((*argv)[i], "-help") == 0 ||
        std::strcmp((*argv)[i], "-h") == 0) {
      std::printf("%s\n\nFlags:\n", usage);
      std::vector<gflags::CommandLineFlagInfo> flags;
      gflags::GetAllFlags(&flags);
      for (const auto& f : flags) {
        if (f.filename != main_file && (root.empty() || f.filename.rfind(root, 0) != 0)) continue;
        std::printf("  --%s (%s, default \"%s\")\n      %s\n", f.name.c_str(), f.type.c_str(),
                    f.default_value.c_str(), f.description.c_str());
      }
      std::exit(0);
    }
  }
  gflags::ParseCommandLineFlags(argc, argv, true);
}

// ParseFlagsWithHelp, then logging and process-wide settings. Call first thing in main().
inline void InitBinary(int* argc, char*** argv, const char* usage, const char* main_file) {
  ParseFlagsWithHelp(argc, argv, usage, main_file);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging((*argv)[0]);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

// For the servers that keep data (ps-server, ps-master): adds 027 to the process's umask,
// so no file or directory they create (databases, logs, checkpoints, exports) is readable
// by other users; group read stays (Kubernetes' fsGroup). A stricter umask is kept.
inline void RestrictUmask() {
  const mode_t old = umask(0);
  umask(old | 027);
}

// For --port_file: writes the bound port to `path` atomically (a temporary file renamed
// into place), so a launcher polling the file never reads a partial number. No-op for "".
inline void WritePortFile(const std::string& path, int port) {
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << port << "\n";
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    LOG(ERROR) << "cannot write port file " << path << ": " << std::strerror(errno);
  }
}

}  // namespace ps
