#include "common/metrics/http_request.h"

#include <gtest/gtest.h>

#include <string>

namespace ps {
namespace {

TEST(HttpRequestTest, GetAndHeadOfAPath) {
  HttpRequest r = ParseHttpRequest("GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nAccept: */*");
  EXPECT_EQ(r.error, 0);
  EXPECT_EQ(r.path, "/metrics");
  EXPECT_FALSE(r.head_only);
  EXPECT_FALSE(r.close);
  r = ParseHttpRequest("HEAD /healthz HTTP/1.1");
  EXPECT_EQ(r.error, 0);
  EXPECT_EQ(r.path, "/healthz");
  EXPECT_TRUE(r.head_only);
}

TEST(HttpRequestTest, CloseFromTheHeaderOrHttp10) {
  EXPECT_TRUE(ParseHttpRequest("GET / HTTP/1.1\r\nCONNECTION: Close").close);
  EXPECT_TRUE(ParseHttpRequest("GET / HTTP/1.0").close);
  EXPECT_FALSE(ParseHttpRequest("GET / HTTP/1.1\r\nConnection: keep-alive").close);
}

TEST(HttpRequestTest, BadRequestsAndMethods) {
  const std::string heads[] = {
      "", "GET", "GET /", "GET / HTTP/2", "GET / HTTP/1.1 extra", "\r\n\r\n", "GET  HTTP/1.1"};
  for (const std::string& head : heads) {
    const HttpRequest r = ParseHttpRequest(head);
    EXPECT_EQ(r.error, 400) << head;
    EXPECT_TRUE(r.close) << head;
    EXPECT_TRUE(r.path.empty()) << head;
  }
  const HttpRequest r = ParseHttpRequest("POST /metrics HTTP/1.1");
  EXPECT_EQ(r.error, 405);
  EXPECT_FALSE(r.close);
  EXPECT_TRUE(r.path.empty());
}

TEST(HttpRequestTest, NulAndOddBytesAreJustBytes) {
  const std::string head("GET /a\0b?c HTTP/1.1\r\n\xff\xfe: x", 26);
  const HttpRequest r = ParseHttpRequest(head);
  EXPECT_EQ(r.error, 0);
  EXPECT_EQ(r.path, std::string("/a\0b", 4));
}

}  // namespace
}  // namespace ps
