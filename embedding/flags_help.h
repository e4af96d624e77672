// Command-line parsing shared by every binary: gflags, with --help listing only the
// flags defined in the binary's own main file (not glog's and gflags' own).
#pragma once

#include <gflags/gflags.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace ps {

// Parses flags (removing them from argv). `main_file` is __FILE__ of the caller: --help
// prints `usage` and the flags defined there, then exits 0.
inline void ParseFlagsWithHelp(int* argc, char*** argv, const char* usage,
                               const char* main_file) {
  gflags::SetUsageMessage(usage);
  for (int i = 1; i < *argc; ++i) {
    if (std::strcmp((*argv)[i], "--help") == 0 || std::strcmp((*argv)[i], "-help") == 0 ||
        std::strcmp((*argv)[i], "-h") == 0) {
      std::printf("%s\n\nFlags:\n", usage);
      std::vector<gflags::CommandLineFlagInfo> flags;
      gflags::GetAllFlags(&flags);
      for (const auto& f : flags) {
        if (f.filename != main_file) continue;
        std::printf("  --%s (%s, default \"%s\")\n      %s\n", f.name.c_str(), f.type.c_str(),
                    f.default_value.c_str(), f.description.c_str());
      }
      std::exit(0);
    }
  }
  gflags::ParseCommandLineFlags(argc, argv, true);
}

}  // namespace ps
