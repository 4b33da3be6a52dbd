// The HTTP/JSON API against a real daemon: on the client socket beside framed clients, and on a
// loopback TCP address with and without the admin token. Raw bytes on a socket, so that what is
// tested is what curl or any other HTTP client would see.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/integration/daemon_fixture.h"
#include "tests/integration/http_exchange.h"
#include "tests/unit/tiny_model.h"

namespace warmpool::testing {
namespace {

using nlohmann::json;

class HttpApiTest : public DaemonTest {
 protected:
  Response One(const std::string& request) {
    std::vector<Response> r = Split(Exchange(ConnectUnix(socket_), request));
    EXPECT_EQ(r.size(), 1u);
    return r.empty() ? Response{} : r[0];
  }
};

json RowsOf(const client::Matrix& m) {
  json rows = json::array();
  for (uint32_t r = 0; r < m.rows; r++) {
    json row = json::array();
    for (uint32_t c = 0; c < m.cols; c++) row.push_back(m.data[r * m.cols + c]);
    rows.push_back(row);
  }
  return rows;
}

TEST_F(HttpApiTest, EveryOperationOnTheClientSocket) {
  std::string path = MakeModel("m", "16,32,8");
  StartDaemon();
  Response models = One(HttpGet("/v1/models", true));
  ASSERT_EQ(models.status, 200) << models.body;
  EXPECT_EQ(json::parse(models.body)["object"], "list");
  EXPECT_EQ(json::parse(models.body)["data"][0]["id"], "m");
  EXPECT_EQ(json::parse(models.body)["data"][0]["name"], "m") << "warmpool's own fields beside OpenAI's";

  Response load = One(HttpPost("/v1/models/m/load", R"({"keep_alive": "10m"})", true));
  ASSERT_EQ(load.status, 200) << load.body;
  EXPECT_EQ(json::parse(load.body)["model"], "m");

  client::Matrix input = RandomMatrix(3, 16, 7);
  Response infer = One(HttpPost("/v1/models/m/infer", RowsOf(input).dump(), true));
  ASSERT_EQ(infer.status, 200) << infer.body;
  json out = json::parse(infer.body)["output"];
  client::Matrix expected = ReferenceInfer(path, input);
  client::Matrix got{3, 8, {}};
  for (const json& row : out) for (const json& v : row) got.data.push_back(v.get<float>());
  ExpectNear(expected, got);

  std::string raw(reinterpret_cast<const char*>(input.data.data()), input.data.size() * 4);
  Response binary = One(HttpPost("/v1/models/m/infer", raw, true,
                             "Content-Type: application/octet-stream\r\nX-Warmpool-Rows: 3\r\n"));
  ASSERT_EQ(binary.status, 200) << binary.body;
  EXPECT_NE(binary.headers.find("X-Warmpool-Cols: 8"), std::string::npos);
  ASSERT_EQ(binary.body.size(), 3u * 8 * 4);
  client::Matrix bin{3, 8, std::vector<float>(24)};
  std::memcpy(bin.data.data(), binary.body.data(), binary.body.size());
  ExpectNear(expected, bin);

  EXPECT_EQ(One(HttpPost("/v1/models/m/pin", "", true)).status, 200);
  Response ps = One(HttpGet("/v1/ps", true));
  ASSERT_EQ(ps.status, 200);
  EXPECT_EQ(json::parse(ps.body)[0]["pinned"], true);
  EXPECT_EQ(One(HttpPost("/v1/models/m/unpin", "", true)).status, 200);
  Response status = One(HttpGet("/v1/status", true));
  EXPECT_EQ(json::parse(status.body)["instance"], instance_);
  Response unload = One(HttpPost("/v1/models/m/unload", "", true));
  EXPECT_EQ(unload.status, 200) << unload.body;

  // Register a second file under the model root, then forget it.
  std::string other = MakeModel("other", "4,4");
  Response reg = One("PUT /v1/models/extra HTTP/1.1\r\nContent-Length: " +
                     std::to_string(json({{"path", other}}).dump().size()) + "\r\nConnection: close\r\n\r\n" +
                     json({{"path", other}}).dump());
  EXPECT_EQ(reg.status, 200) << reg.body;
  Response forget = One("DELETE /v1/models/extra HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(forget.status, 200) << forget.body;

  Response metrics = One(HttpGet("/metrics", true));
  ASSERT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find(R"(warmpool_model_requests_total{model="m",request="infer",code="OK"} 2)"),
            std::string::npos) << metrics.body;
  EXPECT_NE(metrics.body.find(R"(warmpool_model_releases_total{model="m",reason="explicit"} 1)"),
            std::string::npos);
  ExpectQuiescentAndValid();
}

TEST_F(HttpApiTest, PipelinedRequestsAreAnsweredInOrderBesideFramedClients) {
  std::string path = MakeModel("m", "8,4");
  StartDaemon();
  auto framed = Connect();  // a framed client on the same socket, throughout
  ASSERT_TRUE(framed->Load("m").ok());
  std::string requests;
  std::vector<client::Matrix> inputs;
  for (int i = 0; i < 40; i++) {
    inputs.push_back(RandomMatrix(1, 8, 100 + i));
    requests += HttpPost("/v1/models/m/infer", RowsOf(inputs.back()).dump());
    if (i == 20) requests += HttpGet("/v1/ps");
  }
  requests += HttpGet("/v1/status", true);
  int fd = ConnectUnix(socket_);
  std::vector<Response> responses = Split(Exchange(fd, requests));
  ASSERT_EQ(responses.size(), 42u);
  size_t next = 0;
  for (size_t i = 0; i < responses.size() - 1; i++) {
    ASSERT_EQ(responses[i].status, 200) << responses[i].body;
    if (i == 21) {  // the ps, in its place
      EXPECT_TRUE(json::parse(responses[i].body).is_array());
      continue;
    }
    json out = json::parse(responses[i].body)["output"];
    client::Matrix expected = ReferenceInfer(path, inputs[next++]);
    EXPECT_NEAR(out[0][0].get<float>(), expected.data[0], 1e-5) << "response " << i;
  }
  EXPECT_TRUE(json::parse(responses.back().body).contains("workers"));
  auto reply = framed->Infer("m", inputs[0]);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
}

TEST_F(HttpApiTest, BadRequestsGetAnErrorAndHarmNobody) {
  MakeModel("m", "8,4");
  StartDaemon();
  auto framed = Connect();
  ASSERT_TRUE(framed->Load("m").ok());
  // Garbage after a good request: the good one is answered, then a 400, then the close.
  std::vector<Response> r = Split(Exchange(ConnectUnix(socket_), HttpGet("/v1/ps") + "GET / HTTP/1.1\r\nBad Header\r\n\r\n"));
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].status, 200);
  EXPECT_EQ(r[1].status, 400);
  EXPECT_NE(r[1].body.find("INVALID_ARGUMENT: "), std::string::npos);
  // A body over the frame limit is refused from its declared length.
  Response big = One("POST /v1/models/m/infer HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n");
  EXPECT_EQ(big.status, 413);
  EXPECT_NE(big.body.find("RESOURCE_EXHAUSTED: "), std::string::npos);
  // Unknown models and shapes get the codes the framed protocol gives.
  EXPECT_EQ(One(HttpPost("/v1/models/nope/infer", "[[1]]", true)).status, 404);
  Response width = One(HttpPost("/v1/models/m/infer", "[[1, 2]]", true));
  EXPECT_EQ(width.status, 400);
  EXPECT_NE(width.body.find("INVALID_ARGUMENT: "), std::string::npos) << width.body;
  // What used to throw inside the loop (a JSON value of the wrong type) or recurse per level.
  Response park = One(HttpPost("/v1/models/m/unload", R"({"park": 1})", true));
  EXPECT_EQ(park.status, 400) << park.body;
  Response deep = One(HttpPost("/v1/models/m/infer", std::string(200000, '[') + std::string(200000, ']'), true));
  EXPECT_EQ(deep.status, 400) << deep.body;
  // A client that sends half a request and vanishes.
  int fd = ConnectUnix(socket_);
  std::string half = "POST /v1/models/m/infer HTTP/1.1\r\nContent-Length: 100\r\n\r\n[[1,";
  ASSERT_GT(send(fd, half.data(), half.size(), MSG_NOSIGNAL), 0);
  close(fd);
  // A client that sends a few bytes of a method and nothing more.
  int slow = ConnectUnix(socket_);
  ASSERT_EQ(send(slow, "PO", 2, MSG_NOSIGNAL), 2);
  EXPECT_TRUE(framed->Infer("m", RandomMatrix(1, 8, 1)).ok());
  EXPECT_EQ(One(HttpGet("/v1/ps", true)).status, 200);
  close(slow);
  ExpectQuiescentAndValid();
}

// A misspelt key is refused like an unknown key of the configuration, naming it: silently
// ignored, {"keep_alive_": "10m"} would keep nothing alive and say nothing.
TEST_F(HttpApiTest, UnknownKeysInBodiesAreRefusedByName) {
  MakeModel("m", "8,4");
  StartDaemon("", {"--enable-fault-injection"});
  struct Case {
    std::string path, body;
  };
  for (const Case& c : {Case{"/v1/models/m/load", R"({"keep_alive_": "10m"})"},
                        Case{"/v1/models/m/unload", R"({"park": true, "keep_alive_": 1})"},
                        Case{"/v1/models/m/pin", R"({"keep_alive_": 1})"},
                        Case{"/v1/models/m/infer", R"({"input": [[1,2,3,4,5,6,7,8]], "keep_alive_": 1})"},
                        Case{"/v1/unload", R"({"keep_alive_": 1})"},
                        Case{"/v1/faults", R"({"point": "infer.mid", "action": "kill", "keep_alive_": 1})"}}) {
    Response r = One(HttpPost(c.path, c.body, true));
    EXPECT_EQ(r.status, 400) << c.path << ": " << r.body;
    EXPECT_NE(r.body.find("unknown key \"keep_alive_\" in the body of POST " + c.path), std::string::npos)
        << r.body;
  }
  const std::string body = json({{"path", "/x.safetensors"}, {"engin", "dense"}}).dump();
  Response reg = One("PUT /v1/models/extra HTTP/1.1\r\nContent-Length: " + std::to_string(body.size()) +
                     "\r\nConnection: close\r\n\r\n" + body);
  EXPECT_EQ(reg.status, 400) << reg.body;
  EXPECT_NE(reg.body.find("unknown key \"engin\""), std::string::npos) << reg.body;
  // Nothing was loaded by the refused load; the keys it takes still work, and the reply names
  // the sizes and replicas.
  EXPECT_EQ(json::parse(One(HttpGet("/v1/ps", true)).body).size(), 0u);
  Response load = One(HttpPost("/v1/models/m/load", R"({"keep_alive": "10m", "replicas": 1})", true));
  ASSERT_EQ(load.status, 200) << load.body;
  json done = json::parse(load.body);
  EXPECT_EQ(done["total_bytes"], done["weight_bytes"].get<uint64_t>() + done["workspace_bytes"].get<uint64_t>());
  EXPECT_EQ(done["replicas"], 1);
  EXPECT_TRUE(done["replicas_capped"].is_null()) << done.dump();
  EXPECT_EQ(done["evicted"], json::array());
  json ps = json::parse(One(HttpGet("/v1/ps", true)).body);
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0]["total_bytes"], done["total_bytes"]);
  EXPECT_EQ(ps[0]["workspace_bytes"], done["workspace_bytes"]);
  ExpectQuiescentAndValid();
}

TEST_F(HttpApiTest, ExpectContinueAndHttp10KeepAlive) {
  MakeModel("m", "8,4");
  StartDaemon();
  // curl sends large bodies only after "100 Continue" (or a second's wait).
  int fd = ConnectUnix(socket_);
  std::string head = "POST /v1/models/m/load HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n";
  ASSERT_EQ(send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
  char buf[64] = {};
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)), "HTTP/1.1 100 Continue\r\n\r\n");
  std::vector<Response> r = Split(Exchange(fd, "{}" + HttpGet("/v1/ps", true)));
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].status, 200) << r[0].body;
  // HTTP/1.0 with keep-alive is told so, and the connection stays for a second request.
  r = Split(Exchange(ConnectUnix(socket_), "GET /v1/ps HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /v1/ps HTTP/1.0\r\n\r\n"));
  ASSERT_EQ(r.size(), 2u);
  EXPECT_NE(r[0].headers.find("Connection: keep-alive"), std::string::npos) << r[0].headers;
  EXPECT_NE(r[1].headers.find("Connection: close"), std::string::npos) << r[1].headers;
}

TEST_F(HttpApiTest, LoadStreamsProgressLines) {
  MakeModel("m", "64,64");
  StartDaemon("", {"--enable-fault-injection"});
  ASSERT_EQ(Cli({"fault", "arm", "load.mid_copy", "delay:1200"}), 0);
  Response load = One(HttpPost("/v1/models/m/load", "", true));
  ASSERT_EQ(load.status, 200) << load.body;
  EXPECT_NE(load.headers.find("Transfer-Encoding: chunked"), std::string::npos) << load.headers;
  std::vector<json> lines;
  size_t pos = 0;
  while (pos < load.body.size()) {
    size_t nl = load.body.find('\n', pos);
    lines.push_back(json::parse(load.body.substr(pos, nl - pos)));
    pos = nl + 1;
  }
  ASSERT_GE(lines.size(), 3u) << load.body;
  EXPECT_TRUE(lines.front().contains("loaded_bytes"));
  EXPECT_TRUE(lines.front().contains("weight_bytes"));
  EXPECT_EQ(lines.back()["done"], true);
  EXPECT_EQ(lines.back()["model"], "m");
}

// NDJSON lines of a body, parsed.
std::vector<json> Lines(const std::string& body) {
  std::vector<json> lines;
  for (size_t pos = 0; pos < body.size();) {
    size_t nl = body.find('\n', pos);
    lines.push_back(json::parse(body.substr(pos, nl - pos)));
    pos = nl + 1;
  }
  return lines;
}

// Generations pipelined on one connection: each answered in order, the second stream's lines held
// until the first's end, then written; the same text streamed and whole.
TEST_F(HttpApiTest, GenerateStreamsNdjsonLinesInRequestOrder) {
  WriteTinyModel(models_dir_ + "/lm");
  StartDaemon();
  const std::string body = R"({"prompt": "This License", "max_tokens": 12, "temperature": 0})";
  const std::string whole = R"({"prompt": "This License", "max_tokens": 12, "temperature": 0, "stream": false})";
  std::vector<Response> r = Split(Exchange(ConnectUnix(socket_), HttpPost("/v1/models/lm/generate", body) +
                                                                    HttpPost("/v1/models/lm/generate", body) +
                                                                    HttpPost("/v1/models/lm/generate", whole, true)));
  ASSERT_EQ(r.size(), 3u);
  std::string texts[2];
  for (int i = 0; i < 2; i++) {
    ASSERT_EQ(r[i].status, 200) << r[i].body;
    EXPECT_NE(r[i].headers.find("application/x-ndjson"), std::string::npos) << r[i].headers;
    std::vector<json> lines = Lines(r[i].body);
    ASSERT_GE(lines.size(), 2u) << r[i].body;
    for (size_t k = 0; k + 1 < lines.size(); k++) {
      EXPECT_EQ(lines[k]["index"], k);
      texts[i] += lines[k]["text"].get<std::string>();
    }
    EXPECT_EQ(lines.back()["done"], true);
    EXPECT_EQ(lines.back()["chunks"], lines.size() - 1);
  }
  EXPECT_EQ(texts[0], texts[1]);
  ASSERT_EQ(r[2].status, 200) << r[2].body;
  json reply = json::parse(r[2].body);
  EXPECT_EQ(reply["text"], texts[0]);
  EXPECT_EQ(reply["done"], true);
  // Bad bodies: typed errors, before the model runs.
  EXPECT_EQ(One(HttpPost("/v1/models/lm/generate", R"({"prompt": "x", "temperature": "hot"})", true)).status, 400);
  Response unknown = One(HttpPost("/v1/models/lm/generate", R"({"prompt": "x", "max_token": 3})", true));
  EXPECT_EQ(unknown.status, 400);
  EXPECT_NE(unknown.body.find("max_token"), std::string::npos) << unknown.body;
  EXPECT_EQ(One(HttpPost("/v1/models/nope/generate", body, true)).status, 404);
  Response with = One(HttpPost("/v1/models/lm/generate",
                           R"({"prompt": "This License", "max_tokens": 3, "temperature": 0, "stream": false,
                               "logprobs": true, "top_logprobs": 2})",
                           true));
  ASSERT_EQ(with.status, 200) << with.body;
  json scored = json::parse(with.body);
  ASSERT_EQ(scored["logprobs"].size(), scored["tokens"].size());
  EXPECT_EQ(scored["logprobs"][0]["top"].size(), 2u);
  EXPECT_EQ(One(HttpPost("/v1/models/lm/generate", R"({"prompt": "x", "logprobs": 1})", true)).status, 400);
}

TEST_F(HttpApiTest, EmbedTakesAStringOrAListAndAnswersOneVectorPerInput) {
  WriteTinyModel(models_dir_ + "/lm");
  StartDaemon();
  Response one = One(HttpPost("/v1/models/lm/embed", R"({"input": "free software"})", true));
  ASSERT_EQ(one.status, 200) << one.body;
  json single = json::parse(one.body);
  ASSERT_EQ(single["embeddings"].size(), 1u);
  EXPECT_EQ(single["embeddings"][0].size(), single["dimensions"].get<size_t>());
  Response two = One(HttpPost("/v1/models/lm/embed", R"({"input": ["x y", "free software"], "keep_alive": "1m"})", true));
  ASSERT_EQ(two.status, 200) << two.body;
  json pair = json::parse(two.body);
  ASSERT_EQ(pair["embeddings"].size(), 2u);
  // An input embeds the same beside another, up to the order of a group's sums
  // (engines/transformer/embedding.h).
  ASSERT_EQ(pair["embeddings"][1].size(), single["embeddings"][0].size());
  for (size_t i = 0; i < single["embeddings"][0].size(); ++i) {
    EXPECT_NEAR(pair["embeddings"][1][i].get<double>(), single["embeddings"][0][i].get<double>(), 1e-5) << i;
  }
  EXPECT_EQ(pair["tokens"].size(), 2u);
  for (const char* bad : {R"({"input": 3})", R"({"input": []})", R"({"input": ["a", 1]})", R"({"inputs": "a"})",
                          R"({"input": ""})"}) {
    Response r = One(HttpPost("/v1/models/lm/embed", bad, true));
    EXPECT_EQ(r.status, 400) << bad << ": " << r.body;
  }
  EXPECT_EQ(One(HttpPost("/v1/models/nope/embed", R"({"input": "a"})", true)).status, 404);
}

TEST_F(HttpApiTest, TcpServesReadsAndInferAndAdministersOnlyWithTheToken) {
  MakeModel("m", "8,4");
  const int port = FreePort();
  const std::string token_file = dir_ + "/token";
  {
    std::ofstream(token_file) << "s3cret-token-of-sufficient-length\n";
  }
  chmod(token_file.c_str(), 0600);
  StartDaemon("[http]\nlisten = \"127.0.0.1:" + std::to_string(port) + "\"\nadmin_token_file = \"" +
              token_file + "\"\n");
  auto tcp = [&](const std::string& request) {
    std::vector<Response> r = Split(Exchange(ConnectTcp(port), request));
    return r.empty() ? Response{} : r[0];
  };
  EXPECT_EQ(tcp(HttpGet("/v1/models", true)).status, 200);
  Response denied = tcp(HttpPost("/v1/models/m/load", "", true));
  EXPECT_EQ(denied.status, 403);
  EXPECT_NE(denied.body.find("PERMISSION_DENIED: over TCP only reads and infer are allowed"),
            std::string::npos) << denied.body;
  EXPECT_EQ(tcp(HttpPost("/v1/models/m/load", "", true, "Authorization: Bearer wrong-token-of-the-same-len\r\n")).status, 403);
  Response allowed = tcp(HttpPost("/v1/models/m/load", "", true, "Authorization: Bearer s3cret-token-of-sufficient-length\r\n"));
  EXPECT_EQ(allowed.status, 200) << allowed.body;
  EXPECT_EQ(tcp(HttpPost("/v1/models/m/infer", "[[1,2,3,4,5,6,7,8]]", true)).status, 200);
  Response metrics = tcp(HttpGet("/metrics", true));
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.headers.find("text/plain; version=0.0.4"), std::string::npos);
}

TEST_F(HttpApiTest, NonLoopbackAddressesAreRefusedAtStart) {
  MakeModel("m", "8,4");
  {
    std::ofstream config(dir_ + "/config.toml");
    config << "[http]\nlisten = \"0.0.0.0:9464\"\n";
  }
  std::string err;
  int rc = RunProgram({BinDir() + "/warmpoold", "--config", dir_ + "/config.toml", "--socket", socket_,
                       "--instance", instance_, "--models-dir", models_dir_}, nullptr, &err);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find("is not a loopback address"), std::string::npos) << err;
}

}  // namespace
}  // namespace warmpool::testing
