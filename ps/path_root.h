// Where a pod may write the directories a request names: a checkpoint's (Checkpoint) and
// an export's (PodTransfer.Export) must lie under a root the operator configured
// (--checkpoint_root, --export_root), so a caller cannot make the pod write anywhere its
// user can (its own data dir, another volume, /etc).
//
//   PathRoot root("/var/lib/ps/data/exports", "--export_root");
//   ASSIGN_OR_RETURN(std::string dir, root.Resolve(req.dir()));  // then write into dir
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace ps {

class PathRoot {
 public:
  // `dir` empty: every path is refused (the pod takes no such paths). `flag` names the
  // setting in error messages, e.g. "--export_root".
  PathRoot(std::string dir, std::string flag) : dir_(std::move(dir)), flag_(std::move(flag)) {}

  // The directory `requested` names: a relative path is taken under the root, an absolute
  // one must lie under it. Symbolic links in the part that exists are resolved first, so
  // a link that leads out of the root is refused like the path it leads to; the result is
  // that resolved path. The root is created (with the process's umask) if missing.
  // Errors: FAILED_PRECONDITION without a root, or when the root cannot be created;
  // INVALID_ARGUMENT for an empty path, a NUL byte, a `..` component, the root itself, a
  // dangling link, or a path outside the root. Thread-safe (it reads the file system; a
  // link swapped in after the check is the concern of whoever can write under the root).
  absl::StatusOr<std::string> Resolve(const std::string& requested) const;

  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::string flag_;
};

}  // namespace ps
