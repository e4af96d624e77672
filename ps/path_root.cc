#include "ps/path_root.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

namespace fs = std::filesystem;

// `path` without a trailing empty component ("a/b/" -> "a/b").
fs::path Trimmed(const fs::path& path) {
  fs::path out;
  for (const fs::path& part : path) {
    if (!part.empty()) out /= part;
  }
  return out;
}

// Whether `path` is `root` or lies below it, component by component (so /a/bc is not
// under /a/b).
bool Within(const fs::path& path, const fs::path& root) {
  const fs::path p = Trimmed(path), r = Trimmed(root);
  auto [ri, pi] = std::mismatch(r.begin(), r.end(), p.begin(), p.end());
  return ri == r.end();
}

}  // namespace

absl::StatusOr<std::string> PathRoot::Resolve(const std::string& requested) const {
  if (dir_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("this pod writes no directory a request names (asked for '", requested,
                     "'): start it with ", flag_, "=DIR and name a directory under DIR"));
  }
  if (requested.empty()) return absl::InvalidArgumentError("the directory is empty");
  if (requested.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("the directory holds a NUL byte");
  }
  const fs::path req(requested);
  for (const fs::path& part : req) {
    if (part == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat("directory '", requested, "' must not contain '..'"));
    }
  }
  std::error_code ec;
  fs::create_directories(dir_, ec);
  const fs::path root = fs::canonical(dir_, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag_, " ", dir_, " cannot be created or resolved: ", ec.message()));
  }
  const fs::path target = (req.is_absolute() ? req : fs::path(dir_) / req).lexically_normal();
  // As configured (the lexical form the operator wrote) and as resolved.
  if (!Within(target, fs::path(dir_).lexically_normal()) && !Within(target, root)) {
    return absl::InvalidArgumentError(
        absl::StrCat("directory '", requested, "' is outside ", flag_, " ", dir_));
  }
  const fs::path resolved = fs::weakly_canonical(target, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("directory '", requested, "' cannot be resolved: ", ec.message()));
  }
  if (!Within(resolved, root)) {
    return absl::InvalidArgumentError(absl::StrCat("directory '", requested, "' leads to ",
                                                   resolved.string(), ", outside ", flag_, " ",
                                                   dir_, " (through a symbolic link)"));
  }
  if (Trimmed(resolved) == Trimmed(root)) {
    return absl::InvalidArgumentError(absl::StrCat("directory '", requested, "' is ", flag_,
                                                   " itself: name a directory under it"));
  }
  if (fs::is_symlink(fs::symlink_status(resolved, ec))) {
    return absl::InvalidArgumentError(
        absl::StrCat("directory '", requested, "' is a symbolic link that leads nowhere"));
  }
  return Trimmed(resolved).string();
}

}  // namespace ps
