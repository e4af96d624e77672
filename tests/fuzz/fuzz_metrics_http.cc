// libFuzzer harness: the metrics HTTP server's request parser (common/metrics/
// http_request.h), fed as the server feeds it: the received bytes cut at each blank line
// (CRLF CRLF) into request heads. An input is the bytes a client sends.
// Checks (any mismatch aborts):
// - the answer is one of: a request (GET/HEAD) for a path, 400 (closing) or 405;
// - a request's path is a prefix of its request line's target, has no '?', and HEAD
//   (only) is head_only;
// - HTTP/1.0 closes the connection.
//
// Seeds: tests/fuzz/corpus/metrics_http/ (tests/fuzz/make_corpus.py).
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/metrics/http_request.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_metrics_http: %s\n", what);
    std::abort();
  }
}

void CheckHead(absl::string_view head) {
  const ps::HttpRequest r = ps::ParseHttpRequest(head);
  Check(r.error == 0 || r.error == 400 || r.error == 405, "the answer is a request, 400 or 405");
  if (r.error != 0) {
    Check(r.path.empty() && !r.head_only, "an error has no path");
    if (r.error == 400) Check(r.close, "a bad request closes the connection");
    return;
  }
  absl::string_view line = head.substr(0, head.find("\r\n"));
  while (absl::ConsumePrefix(&line, " ")) {
  }
  Check(absl::StartsWith(line, "GET ") || absl::StartsWith(line, "HEAD "), "GET or HEAD only");
  Check(r.head_only == absl::StartsWith(line, "HEAD "), "HEAD, and only HEAD, is head_only");
  Check(r.path.find('?') == std::string::npos, "the query is not part of the path");
  Check(absl::StrContains(line, r.path), "the path is from the request line");
  if (absl::EndsWith(line, " HTTP/1.0")) Check(r.close, "HTTP/1.0 closes the connection");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view in(reinterpret_cast<const char*>(data), size);
  for (;;) {
    const size_t end = in.find("\r\n\r\n");
    if (end == absl::string_view::npos) break;
    CheckHead(in.substr(0, end));
    in.remove_prefix(end + 4);
  }
  return 0;
}
