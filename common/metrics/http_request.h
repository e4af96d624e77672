// The request parser of the metrics HTTP server (metrics_http.h), as a pure function so
// that it is tested and fuzzed apart from sockets (tests/fuzz/fuzz_metrics_http.cc).
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace ps {

// What one request head asks for. Only GET and HEAD of HTTP/1.x are served.
struct HttpRequest {
  // 0 for a request to answer; else the error status to answer it with: 400 (not a
  // request line of three words ending in HTTP/1.x) or 405 (a method other than GET/HEAD).
  int error = 0;
  bool head_only = false;  // HEAD: the answer carries no body
  // The connection closes after the answer: "Connection: close", HTTP/1.0, or a 400.
  bool close = false;
  std::string path;  // the target without its query ("?..."); empty on error
};

// Parses a request head: the request line and the header lines, separated by CRLF,
// without the blank line that ends them (the caller finds it: requests carry no body).
// Any bytes are accepted; the result says what to answer. Thread-safe.
HttpRequest ParseHttpRequest(absl::string_view head);

}  // namespace ps
