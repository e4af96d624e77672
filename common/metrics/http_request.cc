#include "common/metrics/http_request.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"

namespace ps {

HttpRequest ParseHttpRequest(absl::string_view head) {
  HttpRequest req;
  std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
  std::vector<absl::string_view> words = absl::StrSplit(lines[0], ' ', absl::SkipEmpty());
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::string l = absl::AsciiStrToLower(lines[i]);
    if (absl::StartsWith(l, "connection:") && absl::StrContains(l, "close")) req.close = true;
  }
  if (words.size() != 3 || !absl::StartsWith(words[2], "HTTP/1.")) {
    req.error = 400;
    req.close = true;
    return req;
  }
  if (words[2] == "HTTP/1.0") req.close = true;
  if (words[0] != "GET" && words[0] != "HEAD") {
    req.error = 405;
    return req;
  }
  req.head_only = words[0] == "HEAD";
  req.path = std::string(words[1].substr(0, words[1].find('?')));
  return req;
}

}  // namespace ps
