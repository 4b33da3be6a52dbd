// The HTTP layer without sockets: the parser (pieces, pipelining, limits, garbage), the sniffing
// of a connection's first bytes, and the API's translation of requests and replies.
#include <gtest/gtest.h>

#include <string>

#include "http/request_parser.h"
#include "http/response.h"
#include "supervisor/http_api.h"

namespace warmpool {
namespace {

using http::RequestParser;

// Feeds everything (in pieces of `step` bytes), collecting the requests.
std::vector<http::Request> ParseAll(RequestParser& parser, const std::string& bytes, size_t step,
                                    Status* error = nullptr) {
  std::vector<http::Request> out;
  std::string pending;
  for (size_t i = 0; i < bytes.size(); i += step) {
    pending += bytes.substr(i, step);
    while (!pending.empty()) {
      Result<size_t> taken = parser.Feed(pending);
      if (!taken.ok()) {
        if (error != nullptr) *error = taken.status();
        return out;
      }
      pending.erase(0, *taken);
      std::optional<http::Request> r = parser.Next();
      if (r) out.push_back(std::move(*r));
      else if (*taken == 0) break;
    }
  }
  return out;
}

TEST(HttpParserTest, PipelinedRequestsInAnyPieces) {
  const std::string two =
      "GET /v1/models?x=a%20b&flag HTTP/1.1\r\nHost: h\r\nX-Multi: 1\r\nx-multi: 2\r\n\r\n"
      "POST /v1/models/m%2Fx/infer HTTP/1.1\r\nContent-Length: 5\r\nConnection: close\r\n\r\n[[1]]";
  for (size_t step : {1, 3, 7, 1000}) {
    RequestParser parser;
    auto requests = ParseAll(parser, two, step);
    ASSERT_EQ(requests.size(), 2u) << "step " << step;
    EXPECT_EQ(requests[0].method, "GET");
    EXPECT_EQ(requests[0].path, "/v1/models");
    EXPECT_EQ(requests[0].query.at("x"), "a b");
    EXPECT_EQ(requests[0].query.at("flag"), "");
    EXPECT_EQ(requests[0].Header("x-multi"), "1, 2");
    EXPECT_TRUE(requests[0].keep_alive);
    EXPECT_EQ(requests[1].method, "POST");
    EXPECT_EQ(requests[1].path, "/v1/models/m/x/infer");
    EXPECT_EQ(requests[1].body, "[[1]]");
    EXPECT_FALSE(requests[1].keep_alive);
  }
}

TEST(HttpParserTest, ChunkedBodies) {
  RequestParser parser;
  auto r = ParseAll(parser, "POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", 2);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].body, "abcde");
}

TEST(HttpParserTest, LimitsAreCheckedBeforeBuffering) {
  http::ParserLimits limits;
  limits.max_header_bytes = 64;
  limits.max_body_bytes = 10;
  {
    RequestParser parser(limits);
    Status error;
    ParseAll(parser, "GET /" + std::string(100, 'a') + " HTTP/1.1\r\n\r\n", 1000, &error);
    EXPECT_EQ(error.code(), Code::kResourceExhausted);
    EXPECT_EQ(parser.status_code(), 431);
  }
  {
    // The declared length alone is refused: no byte of the body was sent.
    RequestParser parser(limits);
    Status error;
    ParseAll(parser, "POST /a HTTP/1.1\r\nContent-Length: 999999999999\r\n\r\n", 1000, &error);
    EXPECT_EQ(error.code(), Code::kResourceExhausted);
    EXPECT_EQ(parser.status_code(), 413);
  }
  {
    RequestParser parser(limits);
    Status error;
    ParseAll(parser, "POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n20\r\n" + std::string(32, 'x') + "\r\n0\r\n\r\n", 5, &error);
    EXPECT_EQ(parser.status_code(), 413);
  }
}

TEST(HttpParserTest, GarbageIsAnErrorThatStays) {
  for (const char* garbage : {"GARBAGE\r\n\r\n", "GET / HTTP/9.9\r\n\r\n", "GET /\x01 HTTP/1.1\r\n\r\n",
                              "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
                              "CONNECT warmpool:80 HTTP/1.1\r\n\r\n"}) {
    RequestParser parser;
    Status error;
    ParseAll(parser, garbage, 1000, &error);
    EXPECT_FALSE(error.ok()) << garbage;
    EXPECT_GE(parser.status_code(), 400);
    EXPECT_FALSE(parser.Feed(std::string_view("GET / HTTP/1.1\r\n\r\n")).ok());
  }
}

TEST(HttpParserTest, AnUpgradeOfferIsDeclinedAndExpectContinueNoticed) {
  RequestParser parser;
  std::string bytes =
      "POST /v1/models/m/infer HTTP/1.1\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
      "Expect: 100-continue\r\nContent-Length: 5\r\n\r\n";
  ASSERT_TRUE(parser.Feed(bytes).ok());
  EXPECT_TRUE(parser.TakeExpectsContinue());
  EXPECT_FALSE(parser.TakeExpectsContinue()) << "once per request";
  auto requests = ParseAll(parser, "[[1]]GET /v1/ps HTTP/1.0\r\n\r\n", 1000);
  ASSERT_EQ(requests.size(), 2u) << "the upgrade offer is an ordinary request, the next follows";
  EXPECT_EQ(requests[0].body, "[[1]]");
  EXPECT_TRUE(requests[0].http11);
  EXPECT_FALSE(requests[1].http11);
  EXPECT_FALSE(requests[1].keep_alive);
}

TEST(HttpParserTest, PercentDecoding) {
  EXPECT_EQ(http::PercentDecode("a%41+b", true), "aA b");
  EXPECT_EQ(http::PercentDecode("a+b", false), "a+b");
  EXPECT_FALSE(http::PercentDecode("%4", false).has_value());
  EXPECT_FALSE(http::PercentDecode("%zz", false).has_value());
  EXPECT_FALSE(http::PercentDecode("a%", false).has_value());
}

TEST(HttpSniffTest, MethodsAgainstFrames) {
  using http::Sniffed;
  EXPECT_EQ(http::SniffFirstBytes("GET "), Sniffed::kHttp);
  EXPECT_EQ(http::SniffFirstBytes("POST"), Sniffed::kHttp);
  EXPECT_EQ(http::SniffFirstBytes("DELE"), Sniffed::kHttp);
  EXPECT_EQ(http::SniffFirstBytes("PO"), Sniffed::kNeedMore);
  EXPECT_EQ(http::SniffFirstBytes("P"), Sniffed::kNeedMore);
  // A frame of 71 bytes begins with 'G': its second byte tells it apart.
  EXPECT_EQ(http::SniffFirstBytes(std::string("G\0\0\0", 4)), Sniffed::kFramed);
  EXPECT_EQ(http::SniffFirstBytes(std::string("\x10\0\0\0", 4)), Sniffed::kFramed);
  EXPECT_EQ(http::SniffFirstBytes("GETX"), Sniffed::kFramed);
}

http::Request Req(std::string method, std::string path, std::string body = "",
                  std::map<std::string, std::string> headers = {}) {
  http::Request r;
  r.method = std::move(method);
  r.path = std::move(path);
  r.body = std::move(body);
  r.headers = std::move(headers);
  return r;
}

using supervisor::httpapi::Kind;
using supervisor::httpapi::PlanRequest;

TEST(HttpApiTest, EveryEndpointBecomesItsRequest) {
  EXPECT_TRUE(PlanRequest(Req("GET", "/v1/models"), true).request.has_models());
  EXPECT_TRUE(PlanRequest(Req("GET", "/v1/ps"), true).request.has_ps());
  EXPECT_TRUE(PlanRequest(Req("GET", "/v1/status"), true).request.has_status());
  EXPECT_EQ(PlanRequest(Req("GET", "/metrics"), true).kind, Kind::kMetrics);
  auto load = PlanRequest(Req("POST", "/v1/models/m/load", R"({"replicas": 2, "keep_alive": "5m"})"), true);
  ASSERT_TRUE(load.request.has_load());
  EXPECT_EQ(load.request.load().model(), "m");
  EXPECT_EQ(load.request.load().replicas(), 2u);
  EXPECT_EQ(load.request.load().keep_alive_ms(), 300000);
  EXPECT_EQ(PlanRequest(Req("POST", "/v1/models/m/load", R"({"keep_alive": -1})"), true).request.load().keep_alive_ms(), -1);
  auto unload = PlanRequest(Req("POST", "/v1/models/m/unload", R"({"park": true})"), true);
  EXPECT_TRUE(unload.request.unload().park());
  EXPECT_TRUE(PlanRequest(Req("POST", "/v1/unload"), true).request.unload().all());
  EXPECT_TRUE(PlanRequest(Req("POST", "/v1/models/m/pin"), true).request.pin().pin());
  EXPECT_FALSE(PlanRequest(Req("POST", "/v1/models/m/unpin"), true).request.pin().pin());
  auto reg = PlanRequest(Req("PUT", "/v1/models/m", R"({"path": "/x/m.safetensors"})"), true);
  EXPECT_EQ(reg.request.register_model().path(), "/x/m.safetensors");
  EXPECT_TRUE(PlanRequest(Req("DELETE", "/v1/models/m"), true).request.register_model().remove());
  auto arm = PlanRequest(Req("POST", "/v1/faults", R"({"point": "infer.mid", "action": "kill", "times": 2})"), true);
  EXPECT_EQ(arm.request.fault_arm().point(), "infer.mid");
  EXPECT_EQ(arm.request.fault_arm().times(), 2u);
  EXPECT_TRUE(PlanRequest(Req("DELETE", "/v1/faults"), true).request.has_fault_clear());
}

TEST(HttpApiTest, InferJsonAndBinary) {
  auto rows = PlanRequest(Req("POST", "/v1/models/m/infer", "[[1, 2], [3, 4]]"), true);
  ASSERT_TRUE(rows.request.has_infer());
  EXPECT_EQ(rows.request.infer().input().rows(), 2u);
  EXPECT_EQ(rows.request.infer().input().cols(), 2u);
  auto object = PlanRequest(Req("POST", "/v1/models/m/infer", R"({"input": [[1]], "deadline_ms": 50})"), true);
  EXPECT_EQ(object.request.infer().deadline_ms(), 50u);
  std::string bytes(24, '\0');
  auto binary = PlanRequest(Req("POST", "/v1/models/m/infer", bytes,
                                {{"content-type", "application/octet-stream"}, {"x-warmpool-rows", "2"}}),
                            true);
  ASSERT_FALSE(binary.immediate.has_value());
  EXPECT_EQ(binary.request.infer().input().cols(), 3u);
  EXPECT_TRUE(binary.binary_output);
}

TEST(HttpApiTest, BadRequestsGetTheirStatusAndCodeText) {
  struct Case {
    http::Request request;
    int status;
    std::string code;
  };
  std::vector<Case> cases = {
      {Req("GET", "/nope"), 404, "NOT_FOUND"},
      {Req("POST", "/v1/models"), 405, "INVALID_ARGUMENT"},
      {Req("GET", "/v1/models/m/load"), 405, "INVALID_ARGUMENT"},
      {Req("POST", "/v1/models/m/infer", "not json"), 400, "INVALID_ARGUMENT"},
      {Req("POST", "/v1/models/m/infer", "[[1], [2, 3]]"), 400, "INVALID_ARGUMENT"},
      {Req("POST", "/v1/models/m/infer", "[]"), 400, "INVALID_ARGUMENT"},
      {Req("POST", "/v1/models/m/infer", "abc", {{"content-type", "application/octet-stream"}, {"x-warmpool-rows", "1"}}), 400, "INVALID_ARGUMENT"},
      {Req("POST", "/v1/models/m/infer", "abcd", {{"content-type", "application/octet-stream"}}), 400, "INVALID_ARGUMENT"},
      {Req("POST", "/v1/models/m/load", R"({"replicas": -1})"), 400, "INVALID_ARGUMENT"},
      {Req("POST", "/v1/models/m/load", R"({"keep_alive": "5 parsecs"})"), 400, "INVALID_ARGUMENT"},
      {Req("POST", "/v1/models/m/load", "[1]"), 400, "INVALID_ARGUMENT"},
      {Req("POST", "/v1/models/m/explode"), 404, "NOT_FOUND"},
      {Req("PUT", "/v1/models/m", "{}"), 400, "INVALID_ARGUMENT"},
  };
  for (const Case& c : cases) {
    auto plan = PlanRequest(c.request, true);
    ASSERT_TRUE(plan.immediate.has_value()) << c.request.path << " " << c.request.body;
    EXPECT_NE(plan.immediate->find(fmt::format("HTTP/1.1 {} ", c.status)), std::string::npos) << *plan.immediate;
    EXPECT_NE(plan.immediate->find("\r\n\r\n" + c.code + ": "), std::string::npos) << *plan.immediate;
  }
}

TEST(HttpApiTest, WrongJsonTypesAndDeepNestingAreRefusedNotThrown) {
  auto park = PlanRequest(Req("POST", "/v1/models/m/unload", R"({"park": 1})"), true);
  ASSERT_TRUE(park.immediate.has_value());
  EXPECT_NE(park.immediate->find("INVALID_ARGUMENT: park must be true or false"), std::string::npos) << *park.immediate;
  std::string deep = std::string(100000, '[') + std::string(100000, ']');
  auto nested = PlanRequest(Req("POST", "/v1/models/m/infer", deep), true);
  ASSERT_TRUE(nested.immediate.has_value());
  EXPECT_NE(nested.immediate->find("nests deeper than"), std::string::npos);
  // Brackets inside strings are not nesting.
  auto strings = PlanRequest(Req("POST", "/v1/models/m/load", R"({"keep_alive": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["})"), true);
  ASSERT_TRUE(strings.immediate.has_value());
  EXPECT_EQ(strings.immediate->find("nests deeper"), std::string::npos);
  for (const char* body : {R"({"replicas": "2"})", R"({"keep_alive": []})", R"({"input": {"a": 1}})",
                           R"({"input": [[1]], "deadline_ms": "x"})", R"([[1, "2"]])", R"([[1e999]])"}) {
    auto plan = PlanRequest(Req("POST", std::string("/v1/models/m/") + (body[2] == 'r' || body[2] == 'k' ? "load" : "infer"), body), true);
    ASSERT_TRUE(plan.immediate.has_value()) << body;
    EXPECT_NE(plan.immediate->find("400 Bad Request"), std::string::npos) << body << *plan.immediate;
  }
  // A model path that is not UTF-8 (file names are bytes) is written, not thrown.
  v1::Envelope models;
  models.mutable_models_reply()->add_models()->set_path(std::string("/models/\xff\xfe.safetensors"));
  std::string text = supervisor::httpapi::RenderReply(PlanRequest(Req("GET", "/v1/models"), true), models, true);
  EXPECT_EQ(text.rfind("HTTP/1.1 200 OK", 0), 0u) << text;
}

TEST(HttpApiTest, RepliesRender) {
  v1::Envelope reply;
  reply.mutable_error()->set_code(v1::NOT_FOUND);
  reply.mutable_error()->set_message("model \"x\" is not registered");
  auto plan = PlanRequest(Req("GET", "/v1/ps"), false);
  std::string text = supervisor::httpapi::RenderReply(plan, reply, false);
  EXPECT_EQ(text.rfind("HTTP/1.1 404 Not Found\r\n", 0), 0u) << text;
  EXPECT_NE(text.find("Connection: close"), std::string::npos);
  EXPECT_NE(text.find("NOT_FOUND: model \"x\" is not registered\n"), std::string::npos);

  v1::Envelope out;
  out.mutable_infer_reply()->mutable_output()->set_rows(1);
  out.mutable_infer_reply()->mutable_output()->set_cols(2);
  float values[2] = {1.5f, -2};
  out.mutable_infer_reply()->mutable_output()->set_data(std::string(reinterpret_cast<char*>(values), 8));
  out.mutable_infer_reply()->set_batch_rows(1);
  auto infer = PlanRequest(Req("POST", "/v1/models/m/infer", "[[1]]"), true);
  text = supervisor::httpapi::RenderReply(infer, out, true);
  EXPECT_NE(text.find(R"({"batch_rows":1,"output":[[1.5,-2.0]]})"), std::string::npos) << text;
}

TEST(HttpResponseTest, Chunks) {
  EXPECT_EQ(http::Chunk("hello"), "5\r\nhello\r\n");
  EXPECT_EQ(http::LastChunk(), "0\r\n\r\n");
  EXPECT_EQ(http::StatusFor(Code::kResourceExhausted), 429);
  EXPECT_EQ(http::StatusFor(Code::kUnavailable), 503);
}

}  // namespace
}  // namespace warmpool
