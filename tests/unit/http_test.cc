// The HTTP layer: the parser (pieces, pipelining, limits, garbage), the sniffing of a
// connection's first bytes, the numbers clients write, and the API's translation of requests and
// replies, all without sockets; and one HTTP session on a socketpair, for the bytes it holds.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "http/numbers.h"
#include "http/request_parser.h"
#include "http/response.h"
#include "supervisor/http_api.h"
#include "supervisor/http_session.h"

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
  // The endpoints of other APIs refuse in their clients' shapes: OpenAI's error object (GET
  // /v1/models is OpenAI's list), Ollama's and KServe's {"error": "..."}.
  const std::pair<http::Request, std::string> dialects[] = {
      {Req("POST", "/v1/models"), R"({"error":{"code":"INVALID_ARGUMENT","message":"POST /v1/models is not served)"},
      {Req("POST", "/v1/chat/completions", "{"), R"({"error":{"code":"INVALID_ARGUMENT")"},
      {Req("POST", "/api/chat", "{"), R"({"error":")"},
      {Req("GET", "/api/pull"), R"({"error":"/api/pull is not available)"},
      {Req("POST", "/v2/models/m/infer", "{"), R"({"error":"INVALID_ARGUMENT: )"},
  };
  for (const auto& [request, body] : dialects) {
    auto plan = PlanRequest(request, true);
    ASSERT_TRUE(plan.immediate.has_value()) << request.path;
    EXPECT_NE(plan.immediate->find("\r\n\r\n" + body), std::string::npos) << *plan.immediate;
    EXPECT_NE(plan.immediate->find("Content-Type: application/json"), std::string::npos) << *plan.immediate;
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

TEST(HttpNumbersTest, OnlyDecimalDigitsAllOfThemWithinTheRange) {
  EXPECT_EQ(*http::ParseDecimal("0", "x", 0, 10), 0u);
  EXPECT_EQ(*http::ParseDecimal("10", "x", 0, 10), 10u);
  EXPECT_EQ(*http::ParseDecimal("007", "x", 0, 10), 7u);
  EXPECT_EQ(*http::ParseDecimal("4294967295", "x", 0, UINT32_MAX), 4294967295u);
  EXPECT_EQ(*http::ParseDecimal("18446744073709551615", "x", 0, UINT64_MAX), UINT64_MAX);
  for (const char* bad : {"", "abc", "-5", "+5", " 5", "5 ", "12x", "0x10", "1e3", "1.5", "4294967296",
                          "18446744073709551616", "99999999999999999999999", "\t5", "5\n"}) {
    Result<uint64_t> r = http::ParseDecimal(bad, "query parameter deadline_ms", 0, UINT32_MAX);
    ASSERT_FALSE(r.ok()) << "\"" << bad << "\" was taken as " << *r;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find("query parameter deadline_ms must be an integer from 0 to 4294967295"),
              std::string::npos) << r.status().message();
  }
  EXPECT_FALSE(http::ParseDecimal("0", "rows", 1, 10).ok());
  EXPECT_FALSE(http::ParseDecimal("11", "rows", 1, 10).ok());
  // What the client sent is quoted bounded and printable.
  std::string message = http::ParseDecimal(std::string(100, '\x01'), "x", 0, 1).status().message();
  EXPECT_LT(message.size(), 120u) << message;
  EXPECT_EQ(message.find('\x01'), std::string::npos);
}

TEST(HttpApiTest, NumbersInQueryParametersAndHeadersAreCheckedStrictly) {
  std::string bytes(8, '\0');
  auto binary = [&](std::string query_deadline, std::string rows_header) {
    http::Request r = Req("POST", "/v1/models/m/infer", bytes, {{"content-type", "application/octet-stream"}});
    if (!rows_header.empty()) r.headers["x-warmpool-rows"] = rows_header;
    else r.query["rows"] = "1";
    r.query["deadline_ms"] = query_deadline;
    return PlanRequest(r, true);
  };
  auto good = binary("250", "1");
  ASSERT_FALSE(good.immediate.has_value()) << *good.immediate;
  EXPECT_EQ(good.request.infer().deadline_ms(), 250u);
  EXPECT_EQ(binary("4294967295", "2").request.infer().deadline_ms(), 4294967295u);
  for (const char* bad : {"abc", "-5", "12x", "4294967296", "", "+5", " 5"}) {
    auto plan = binary(bad, "1");
    ASSERT_TRUE(plan.immediate.has_value()) << "deadline_ms=" << bad << " was served";
    EXPECT_EQ(plan.code, Code::kInvalidArgument);
    EXPECT_NE(plan.immediate->find("HTTP/1.1 400 "), std::string::npos) << *plan.immediate;
    EXPECT_NE(plan.immediate->find("query parameter deadline_ms must be an integer from 0 to 4294967295"),
              std::string::npos) << *plan.immediate;
  }
  for (const char* bad : {"abc", "-1", "2x", "0", "4294967296", "+2", " 2"}) {
    auto plan = binary("1", bad);
    ASSERT_TRUE(plan.immediate.has_value()) << "X-Warmpool-Rows: " << bad << " was served";
    EXPECT_NE(plan.immediate->find("header X-Warmpool-Rows must be an integer from 1 to 4294967295"),
              std::string::npos) << *plan.immediate;
  }
  http::Request r = Req("POST", "/v1/models/m/infer", bytes, {{"content-type", "application/octet-stream"}});
  r.query["rows"] = "2x";
  EXPECT_NE(PlanRequest(r, true).immediate->find("query parameter rows must be"), std::string::npos);
  r.query["rows"] = "2";
  r.query["keep_alive"] = "soon";
  EXPECT_NE(PlanRequest(r, true).immediate->find("query parameter keep_alive"), std::string::npos);
}

// One HTTP session on a socketpair and a loop of its own: what it holds for the client.
class HttpSessionBytesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    uv_loop_init(&loop_);
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds_), 0);
  }
  void TearDown() override {
    if (session_ != nullptr && !closed_) session_->Close(OkStatus());
    uv_run(&loop_, UV_RUN_NOWAIT);
    close(fds_[1]);
    uv_loop_close(&loop_);
  }
  void Open(uint64_t max_unread) {
    supervisor::HttpSession::Options options;
    options.max_unread_bytes = max_unread;
    supervisor::HttpSession::Hooks hooks;
    hooks.request = [this](v1::Envelope&& e, bool) { requests_.push_back(std::move(e)); };
    hooks.closed = [this](const Status& why) {
      closed_ = true;
      why_ = why;
    };
    hooks.answered = [this](Code) { answered_++; };
    session_ = supervisor::HttpSession::OpenPipe(&loop_, fds_[0], options, hooks);
    ASSERT_NE(session_, nullptr);
  }
  void Send(const std::string& bytes) {
    ASSERT_EQ(write(fds_[1], bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    for (int i = 0; i < 10; i++) uv_run(&loop_, UV_RUN_NOWAIT);
  }
  v1::Envelope Reply(uint64_t id, size_t bytes) {
    v1::Envelope reply;
    reply.set_request_id(id);
    reply.mutable_infer_reply()->mutable_output()->set_rows(1);
    reply.mutable_infer_reply()->mutable_output()->set_cols(static_cast<uint32_t>(bytes / 4));
    reply.mutable_infer_reply()->mutable_output()->set_data(std::string(bytes, '\0'));
    return reply;
  }

  uv_loop_t loop_{};
  int fds_[2] = {-1, -1};
  supervisor::HttpSession* session_ = nullptr;
  std::vector<v1::Envelope> requests_;
  bool closed_ = false;
  Status why_;
  int answered_ = 0;
};

std::string BinaryInfer() {
  return "POST /v1/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Type: application/octet-stream\r\n"
         "X-Warmpool-Rows: 1\r\nContent-Length: 4\r\n\r\nabcd";
}

TEST_F(HttpSessionBytesTest, RepliesHeldBehindASlowFirstRequestCountAsUnread) {
  Open(/*max_unread=*/1 << 20);
  std::string pipelined;
  for (int i = 0; i < 4; i++) pipelined += BinaryInfer();
  Send(pipelined);
  ASSERT_EQ(requests_.size(), 4u);
  // The first is slow; the later ones are answered, held in order behind it.
  session_->OnReply(Reply(requests_[1].request_id(), 300 << 10));
  EXPECT_GE(session_->held_bytes(), 300u << 10);
  EXPECT_EQ(session_->pending_write_bytes(), session_->held_bytes());
  session_->OnReply(Reply(requests_[2].request_id(), 300 << 10));
  EXPECT_GE(session_->pending_write_bytes(), 600u << 10);
  EXPECT_FALSE(closed_);
  EXPECT_EQ(answered_, 0);  // nothing written: the first is not answered
  // The next one takes what the client makes the daemon hold past its bound: cut off.
  session_->OnReply(Reply(requests_[3].request_id(), 500 << 10));
  EXPECT_TRUE(closed_);
  EXPECT_EQ(why_.code(), Code::kResourceExhausted) << why_.ToString();
  EXPECT_NE(why_.message().find("held behind an earlier request"), std::string::npos) << why_.ToString();
  session_ = nullptr;
}

TEST_F(HttpSessionBytesTest, HeldRepliesMoveToWrittenWhenTheFirstIsAnswered) {
  Open(/*max_unread=*/64 << 20);
  Send(BinaryInfer() + BinaryInfer());
  ASSERT_EQ(requests_.size(), 2u);
  session_->OnReply(Reply(requests_[1].request_id(), 100 << 10));
  const uint64_t held = session_->held_bytes();
  EXPECT_GE(held, 100u << 10);
  session_->OnReply(Reply(requests_[0].request_id(), 10));
  EXPECT_EQ(session_->held_bytes(), 0u);
  EXPECT_EQ(answered_, 2);
  // Written now (or taken by the socket): whatever is left counts, and nothing twice.
  EXPECT_LE(session_->pending_write_bytes(), held + 1024);
}

TEST(HttpResponseTest, Chunks) {
  EXPECT_EQ(http::Chunk("hello"), "5\r\nhello\r\n");
  EXPECT_EQ(http::LastChunk(), "0\r\n\r\n");
  EXPECT_EQ(http::StatusFor(Code::kResourceExhausted), 429);
  EXPECT_EQ(http::StatusFor(Code::kUnavailable), 503);
}

}  // namespace
}  // namespace warmpool
