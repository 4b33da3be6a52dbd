// Who may use the HTTP API over TCP and from which web pages (supervisor/http_access.h): API keys
// guard every TCP request and let the daemon listen beyond loopback; the admin token still alone
// administers; the Unix socket goes by peer credentials; CORS is off unless origins are listed.
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <thread>

#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/integration/daemon_fixture.h"
#include "tests/integration/http_exchange.h"
#include "tests/unit/tiny_model.h"

namespace warmpool::testing {
namespace {

using nlohmann::json;

constexpr char kKeyOne[] = "first-key-0123456789abcdef";
constexpr char kKeyTwo[] = "second-key-0123456789abcdef";
constexpr char kAdmin[] = "admin-token-0123456789abcdef";

class HttpAccessTest : public DaemonTest {
 protected:
  std::string Secret(const std::string& name, const std::string& text, mode_t mode = 0600) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    chmod(path.c_str(), mode);
    return path;
  }
  Response Tcp(const std::string& request) {
    std::vector<Response> r = Split(Exchange(ConnectTcp(port_), request));
    EXPECT_EQ(r.size(), 1u) << request;
    return r.empty() ? Response{} : r[0];
  }
  static std::string Get(const std::string& path, const std::string& extra) {
    return "GET " + path + " HTTP/1.1\r\nHost: warmpool\r\n" + extra + "Connection: close\r\n\r\n";
  }
  static std::string Bearer(const std::string& token) { return "Authorization: Bearer " + token + "\r\n"; }
  static bool Has(const Response& r, const std::string& header_line) {
    return r.headers.find(header_line) != std::string::npos;
  }
  // How often the daemon's log says `what`.
  size_t Occurrences(const std::string& what) const {
    const std::string log = DaemonLog();
    size_t n = 0;
    for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) n++;
    return n;
  }
  // Whether the daemon logged `says` once more after a SIGHUP.
  bool Reload(const std::string& says) {
    const size_t before = Occurrences(says);
    if (kill(DaemonPid(), SIGHUP) != 0) return false;
    for (int i = 0; i < 250 && Occurrences(says) == before; i++) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return Occurrences(says) > before;
  }
  // One response from a connection that stays open: its head, then Content-Length bytes of body.
  static Response ReadOne(int fd) {
    timeval tv{20, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::string bytes;
    char buf[4096];
    size_t head_end = std::string::npos;
    uint64_t length = 0;
    for (;;) {
      if (head_end == std::string::npos && (head_end = bytes.find("\r\n\r\n")) != std::string::npos) {
        const size_t at = bytes.find("Content-Length: ");
        length = at < head_end ? std::stoull(bytes.substr(at + 16)) : 0;
      }
      if (head_end != std::string::npos && bytes.size() >= head_end + 4 + length) break;
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      bytes.append(buf, static_cast<size_t>(n));
    }
    std::vector<Response> r = Split(bytes);
    return r.empty() ? Response{} : r[0];
  }
  int port_ = FreePort();
};

TEST_F(HttpAccessTest, ApiKeysGuardEveryTcpRequestAndLetTheDaemonListenBeyondLoopback) {
  MakeModel("m", "8,4");
  const std::string keys = Secret("keys", std::string("# one key per line\n") + kKeyOne + "\n\n  " + kKeyTwo + "  \n");
  const std::string admin = Secret("admin", std::string(kAdmin) + "\n");
  StartDaemon("[http]\nlisten = \"0.0.0.0:" + std::to_string(port_) + "\"\napi_keys_file = \"" + keys +
              "\"\nadmin_token_file = \"" + admin + "\"\n");
  // No key, a wrong one: 401 with the challenge, in each endpoint's dialect.
  for (const std::string& extra : {std::string(), Bearer("wrong-key-0123456789abcdefg"), Bearer("")}) {
    Response openai = Tcp(Get("/v1/models", extra));
    EXPECT_EQ(openai.status, 401) << openai.body;
    EXPECT_TRUE(Has(openai, "WWW-Authenticate: Bearer")) << openai.headers;
    EXPECT_TRUE(json::parse(openai.body)["error"]["message"].get<std::string>().find("api_keys_file") !=
                std::string::npos) << openai.body;
    Response ollama = Tcp(Get("/api/tags", extra));
    EXPECT_EQ(ollama.status, 401);
    EXPECT_TRUE(json::parse(ollama.body)["error"].is_string()) << ollama.body;
    EXPECT_EQ(Tcp(Get("/metrics", extra)).status, 401);
    EXPECT_EQ(Tcp(HttpPost("/v1/models/m/infer", "[[1,2,3,4,5,6,7,8]]", true, extra)).status, 401);
  }
  // Either key serves reads and inference; only the admin token administers.
  EXPECT_EQ(Tcp(Get("/v1/models", Bearer(kKeyOne))).status, 200);
  EXPECT_EQ(Tcp(Get("/metrics", Bearer(kKeyTwo))).status, 200);
  EXPECT_EQ(Tcp(HttpPost("/v1/models/m/infer", "[[1,2,3,4,5,6,7,8]]", true, Bearer(kKeyTwo))).status, 200);
  EXPECT_EQ(Tcp(HttpPost("/v1/models/m/load", "", true, Bearer(kKeyOne))).status, 403);
  EXPECT_EQ(Tcp(HttpPost("/v1/models/m/load", "", true, Bearer(kAdmin))).status, 200);
  // The Unix socket goes by the peer's credentials, as ever.
  std::vector<Response> local = Split(Exchange(ConnectUnix(socket_), HttpGet("/v1/models", true)));
  ASSERT_EQ(local.size(), 1u);
  EXPECT_EQ(local[0].status, 200);
  // No CORS unless configured; the refusals are counted.
  EXPECT_FALSE(Has(Tcp(Get("/v1/models", Bearer(kKeyOne) + "Origin: http://app.example\r\n")), "Access-Control"));
  const std::string metrics = Tcp(Get("/metrics", Bearer(kKeyOne))).body;
  EXPECT_TRUE(metrics.find("warmpool_session_refusals_total{reason=\"http_unauthenticated\"} 12") != std::string::npos)
      << metrics.substr(0, 4000);
  EXPECT_TRUE(metrics.find("warmpool_session_refusals_total{reason=\"http_invalid\"} 0") != std::string::npos)
      << "a missing key is not also an invalid request";
  // The scheme's case does not matter.
  EXPECT_EQ(Tcp(Get("/v1/models", std::string("Authorization: bearer ") + kKeyOne + "\r\n")).status, 200);
}

TEST_F(HttpAccessTest, KeyFilesAreCheckedAtStart) {
  MakeModel("m", "8,4");
  struct Case {
    std::string keys;
    mode_t mode;
    std::string says;
  };
  for (const Case& c : {Case{std::string(kKeyOne) + "\n", 0644, "readable by others"},
                        Case{"short\n", 0600, "use at least 16"},
                        Case{"# nothing but a comment\n\n", 0600, "holds no key"}}) {
    const std::string keys = Secret("keys", c.keys, c.mode);
    std::ofstream(dir_ + "/config.toml") << "[http]\nlisten = \"0.0.0.0:" << port_ << "\"\napi_keys_file = \"" << keys
                                         << "\"\n";
    std::string err;
    int rc = RunProgram({BinDir() + "/warmpoold", "--config", dir_ + "/config.toml", "--socket", socket_, "--instance",
                         instance_, "--models-dir", models_dir_},
                        nullptr, &err);
    EXPECT_NE(rc, 0) << c.keys;
    EXPECT_NE(err.find(c.says), std::string::npos) << err;
  }
}

TEST_F(HttpAccessTest, CorsAllowsTheListedOriginsAndAnswersTheirPreflight) {
  std::filesystem::copy(DemoModelDirectory(), models_dir_ + "/lm", std::filesystem::copy_options::recursive);
  StartDaemon("[http]\nlisten = \"127.0.0.1:" + std::to_string(port_) + "\"\ncors_origins = [\"http://app.example\"]\n");
  const std::string from_app = "Origin: http://app.example\r\n";
  Response listed = Tcp(Get("/v1/models", from_app));
  EXPECT_EQ(listed.status, 200);
  EXPECT_TRUE(Has(listed, "Access-Control-Allow-Origin: http://app.example")) << listed.headers;
  EXPECT_TRUE(Has(listed, "Vary: Origin"));
  EXPECT_FALSE(Has(Tcp(Get("/v1/models", "Origin: http://elsewhere.example\r\n")), "Access-Control"));
  EXPECT_FALSE(Has(Tcp(Get("/v1/models", "")), "Access-Control"));
  // A streamed answer's head carries it too.
  const std::string chat = R"({"model": "lm", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": true})";
  Response streamed = Tcp(HttpPost("/v1/chat/completions", chat, true, from_app));
  EXPECT_EQ(streamed.status, 200);
  EXPECT_TRUE(Has(streamed, "Access-Control-Allow-Origin: http://app.example")) << streamed.headers;
  // The preflight, before any credentials; none for an origin not listed.
  const std::string preflight = "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: warmpool\r\n"
                                "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization\r\n";
  Response allowed = Tcp(preflight + from_app + "Connection: close\r\n\r\n");
  EXPECT_EQ(allowed.status, 204);
  EXPECT_TRUE(allowed.headers.starts_with("HTTP/1.1 204 No Content\r\n")) << allowed.headers;
  EXPECT_FALSE(Has(allowed, "Content-Length"));
  EXPECT_TRUE(Has(allowed, "Access-Control-Allow-Methods: GET, POST, PUT, DELETE, OPTIONS")) << allowed.headers;
  EXPECT_TRUE(Has(allowed, "Access-Control-Allow-Headers: authorization"));  // what it asked for
  // Once: a browser joins repeated ones into "o, o", which matches no origin.
  const size_t first = allowed.headers.find("Access-Control-Allow-Origin:");
  EXPECT_NE(first, std::string::npos);
  EXPECT_EQ(allowed.headers.find("Access-Control-Allow-Origin:", first + 1), std::string::npos) << allowed.headers;
  Response refused = Tcp(preflight + "Origin: http://elsewhere.example\r\nConnection: close\r\n\r\n");
  EXPECT_NE(refused.status, 204);
  EXPECT_FALSE(Has(refused, "Access-Control"));
  EXPECT_TRUE(Has(refused, "Vary: Origin"));
}

// SIGHUP reads the key file again: a key taken out stops serving, on a connection already open
// too; a key put in serves. A file that cannot be used (a short key, readable by others) or a
// configuration that no longer names one changes nothing: the keys in force stay.
TEST_F(HttpAccessTest, AReloadTakesTheKeyFileAgainAndKeepsTheKeysWhenItCannot) {
  MakeModel("m", "8,4");
  const std::string keys = Secret("keys", std::string(kKeyOne) + "\n");
  const std::string config = "[http]\nlisten = \"127.0.0.1:" + std::to_string(port_) + "\"\napi_keys_file = \"" + keys + "\"\n";
  StartDaemon(config);
  // A connection that stays open across the reload: its first request with the key in force.
  const int open = ConnectTcp(port_);
  ASSERT_GE(open, 0);
  const std::string keep = "GET /v1/models HTTP/1.1\r\nHost: warmpool\r\n" + Bearer(kKeyOne) + "\r\n";
  ASSERT_EQ(send(open, keep.data(), keep.size(), MSG_NOSIGNAL), static_cast<ssize_t>(keep.size()));
  EXPECT_EQ(ReadOne(open).status, 200);

  Secret("keys", std::string(kKeyTwo) + "\n");
  ASSERT_TRUE(Reload("1 API key(s) from " + keys)) << DaemonLog();
  std::vector<Response> after = Split(Exchange(open, Get("/v1/models", Bearer(kKeyOne))));
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].status, 401) << "the open connection's next request, with the key taken out";
  EXPECT_EQ(Tcp(Get("/v1/models", Bearer(kKeyOne))).status, 401);
  EXPECT_EQ(Tcp(Get("/v1/models", Bearer(kKeyTwo))).status, 200);

  // Files it cannot use: the keys in force stay, and the log says why.
  Secret("keys", "short\n");
  ASSERT_TRUE(Reload("use at least 16")) << DaemonLog();
  Secret("keys", std::string(kKeyOne) + "\n", 0644);
  ASSERT_TRUE(Reload("readable by others")) << DaemonLog();
  EXPECT_EQ(Tcp(Get("/v1/models", Bearer(kKeyTwo))).status, 200);
  EXPECT_EQ(Tcp(Get("/v1/models", Bearer(kKeyOne))).status, 401);
  EXPECT_EQ(Tcp(Get("/v1/models", "")).status, 401);

  // A configuration without the file: the keys stay until a restart.
  std::ofstream(dir_ + "/config.toml") << "[daemon]\nworkers_per_device = 2\n[http]\nlisten = \"127.0.0.1:" << port_ << "\"\n";
  ASSERT_TRUE(Reload("api_keys_file is no longer set")) << DaemonLog();
  EXPECT_EQ(Tcp(Get("/v1/models", "")).status, 401);
  EXPECT_EQ(Tcp(Get("/v1/models", Bearer(kKeyTwo))).status, 200);
}

TEST_F(HttpAccessTest, AReloadRotatesTheAdminTokenKeepsItWhenItCannotAndTakesItAwayWhenUnset) {
  MakeModel("m", "8,4");
  const std::string admin = Secret("admin", std::string(kAdmin) + "\n");
  StartDaemon("[http]\nlisten = \"127.0.0.1:" + std::to_string(port_) + "\"\nadmin_token_file = \"" + admin + "\"\n");
  auto load = [&](const std::string& token) {
    return Tcp(HttpPost("/v1/models/m/load", "", true, Bearer(token))).status;
  };
  EXPECT_EQ(load(kAdmin), 200);
  constexpr char kRotated[] = "rotated-admin-token-0123456789";
  Secret("admin", std::string(kRotated) + "\n");
  ASSERT_TRUE(Reload("the admin token from " + admin)) << DaemonLog();
  EXPECT_EQ(load(kAdmin), 403) << "the old token administers no more";
  EXPECT_EQ(load(kRotated), 200);

  // A file it cannot use: the token in force stays, and the log says why.
  Secret("admin", "short\n");
  ASSERT_TRUE(Reload("use at least 16")) << DaemonLog();
  Secret("admin", std::string(kAdmin) + "\n", 0644);
  ASSERT_TRUE(Reload("readable by others")) << DaemonLog();
  EXPECT_EQ(load(kRotated), 200);
  EXPECT_EQ(load(kAdmin), 403);

  // A configuration without the file takes the token away.
  std::ofstream(dir_ + "/config.toml") << "[daemon]\nworkers_per_device = 2\n[http]\nlisten = \"127.0.0.1:" << port_ << "\"\n";
  ASSERT_TRUE(Reload("admin_token_file is no longer set")) << DaemonLog();
  EXPECT_EQ(load(kRotated), 403);
  EXPECT_EQ(Tcp(Get("/v1/models", "")).status, 200) << "reads go on";
}

}  // namespace
}  // namespace warmpool::testing
