// Test helper: a fresh CA, server and client certificates (scripts/make-certs.sh) in a
// temporary directory, removed on destruction. Needs openssl; ok() is false without it.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <string>

#ifndef PS_SOURCE_DIR
#error "define PS_SOURCE_DIR (the repository root) for test_certs.h"
#endif

namespace ps {

class TestCerts {
 public:
  TestCerts() {
    char tmpl[] = "/tmp/ps-certs.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return;
    dir_ = tmpl;
    const std::string cmd =
        std::string(PS_SOURCE_DIR) + "/scripts/make-certs.sh " + dir_ + " >/dev/null 2>&1";
    ok_ = std::system(cmd.c_str()) == 0;
    // A second, unrelated CA: certificates it signs must be refused.
    const std::string other =
        std::string(PS_SOURCE_DIR) + "/scripts/make-certs.sh " + dir_ + "/other >/dev/null 2>&1";
    ok_ = ok_ && std::system(other.c_str()) == 0;
  }
  ~TestCerts() {
    if (!dir_.empty()) std::system(("rm -rf " + dir_).c_str());
  }
  bool ok() const { return ok_; }
  std::string file(const std::string& name) const { return dir_ + "/" + name; }

 private:
  std::string dir_;
  bool ok_ = false;
};

}  // namespace ps
