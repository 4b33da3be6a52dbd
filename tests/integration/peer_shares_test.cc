// Fair shares of the client socket against a real daemon (supervisor/peer_limits.h): one user
// past its share of connections, or holding every descriptor it may, leaves room for another
// user; a /metrics scrape is served while one peer has spent its share; a request trickled a byte
// at a time is cut off a bounded time after its first byte; HTTP replies held in order behind a
// slow request count against the byte limits; a request id in use is refused, not merged; and
// every refusal made before the core shows in the metrics. Raw bytes where what is tested is
// what any client would see; a forked child as a second user (needs root).
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <grp.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "ipc/framing.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/http_exchange.h"

namespace warmpool::testing {
namespace {

using namespace std::chrono_literals;

constexpr uid_t kNobody = 65534;

size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) n++;
  return n;
}

// The value of one sample in Prometheus text, or -1 when it is not there.
double Sample(const std::string& text, const std::string& series) {
  size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::strtod(text.c_str() + at + series.size() + 2, nullptr);
}

const char kScrape[] = "GET /metrics HTTP/1.1\r\nHost: warmpool\r\nConnection: close\r\n\r\n";

class PeerSharesTest : public DaemonTest {
 protected:
  // A test ends with its connections closed by this process, but the daemon learns of each close
  // on a later turn of its loop: until then they still count against this uid's share, and the
  // fixture's teardown (which checks the daemon as this uid) would be refused. Wait for that.
  void TearDown() override {
    if (daemon_ != nullptr) {
      for (int i = 0; i < 200; i++) {
        auto c = client::Client::Connect(socket_);
        if (c.ok() && (*c)->GetStatus().ok()) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    DaemonTest::TearDown();
  }
  // `warmpool status` as another user (nobody); its exit status, and what it said on stderr.
  int StatusAsNobody(std::string* err) {
    std::string cli = dir_ + "/warmpool-cli";
    std::filesystem::copy_file(BinDir() + "/warmpool", cli,
                               std::filesystem::copy_options::overwrite_existing);
    chmod(cli.c_str(), 0755);
    chmod(dir_.c_str(), 0711);
    chmod(socket_.c_str(), 0666);
    std::string err_path = dir_ + "/nobody.err";
    pid_t pid = fork();
    if (pid == 0) {
      int fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
      dup2(fd, 2);
      int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      if (setgroups(0, nullptr) != 0 || setgid(kNobody) != 0 || setuid(kNobody) != 0) _exit(99);
      std::vector<std::string> argv = {cli, "--socket", socket_, "status"};
      std::vector<char*> c;
      for (std::string& a : argv) c.push_back(a.data());
      c.push_back(nullptr);
      execv(c[0], c.data());
      _exit(98);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    std::ifstream in(err_path);
    err->assign(std::istreambuf_iterator<char>(in), {});
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  // Connections of this process (root) until `count`, each asking for status; the ones served
  // are kept in held, the first refusal is returned.
  Status Hold(int count, std::vector<std::unique_ptr<client::Client>>& held) {
    Status refused;
    for (int i = 0; i < count; i++) {
      auto c = client::Client::Connect(socket_);
      if (!c.ok()) {
        if (refused.ok()) refused = c.status();
        continue;
      }
      timeval two{2, 0};
      setsockopt((*c)->fd(), SOL_SOCKET, SO_RCVTIMEO, &two, sizeof(two));
      auto s = (*c)->GetStatus();
      if (s.ok()) held.push_back(std::move(*c));
      else if (refused.ok()) refused = s.status();
    }
    return refused;
  }
};

TEST_F(PeerSharesTest, OneUserHoldingItsShareOfConnectionsLeavesRoomForAnother) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a client as a second user";
  MakeModel("m", "8,4");
  StartDaemon("[limits]\nmax_connections = 16\n");  // a share of 4 connections per user
  std::vector<std::unique_ptr<client::Client>> held;
  Status refused = Hold(16, held);
  EXPECT_LT(held.size(), 16u) << "one user took every connection";
  // Past its share the client is told why, as a typed error: not a bare close or broken pipe.
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.code(), Code::kResourceExhausted) << refused.ToString();
  EXPECT_TRUE(Contains(refused.message(), "uid 0 already has")) << refused.ToString();
  EXPECT_TRUE(Contains(refused.message(), "max_connections_per_peer")) << refused.ToString();
  std::string err;
  EXPECT_EQ(StatusAsNobody(&err), 0) << err;
  EXPECT_TRUE(held[0]->Infer("m", RandomMatrix(1, 8, 1)).ok());
}

TEST_F(PeerSharesTest, OneUserHoldingEveryDescriptorItMayLeavesRoomForAnother) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a client as a second user";
  MakeModel("m", "8,4");
  launch_nofile_ = 64;
  StartDaemon();
  std::vector<std::unique_ptr<client::Client>> held;
  Status refused = Hold(100, held);
  ASSERT_FALSE(refused.ok()) << "100 connections of one user on 64 descriptors";
  EXPECT_EQ(refused.code(), Code::kResourceExhausted) << refused.ToString();
  std::string err;
  EXPECT_EQ(StatusAsNobody(&err), 0) << err;
  EXPECT_FALSE(Contains(DaemonLog(), "out of file descriptors")) << DaemonLog();
}

TEST_F(PeerSharesTest, AMetricsScrapeSucceedsWhileOnePeerHasSpentItsShare) {
  MakeModel("m", "8,4");
  const int port = FreePort();
  StartDaemon("[limits]\nmax_connections = 16\n[http]\nlisten = \"127.0.0.1:" + std::to_string(port) + "\"\n");
  std::vector<std::unique_ptr<client::Client>> held;
  ASSERT_FALSE(Hold(16, held).ok());
  // The abuser itself may still scrape, from the reserve.
  std::string mine = Exchange(ConnectUnix(socket_), kScrape);
  EXPECT_TRUE(Contains(mine, "HTTP/1.1 200 ")) << mine.substr(0, 300);
  EXPECT_GE(Sample(mine, "warmpool_session_refusals_total{reason=\"peer_connections\"}"), 1) << mine;
  // It holds half the reserve too, silently: Prometheus (TCP, another peer) scrapes all the same.
  std::vector<int> silent;
  for (int i = 0; i < 12; i++) silent.push_back(ConnectUnix(socket_));
  std::this_thread::sleep_for(100ms);
  std::string theirs = Exchange(ConnectTcp(port), kScrape);
  EXPECT_TRUE(Contains(theirs, "HTTP/1.1 200 ")) << theirs.substr(0, 300);
  EXPECT_TRUE(Contains(theirs, "warmpool_build_info")) << theirs.substr(0, 300);
  // Past its share and its half of the reserve, the abuser is still told why (at once, in the
  // words of its protocol when its request came before the refusal).
  std::string refused = Exchange(ConnectUnix(socket_), "GET /v1/ps HTTP/1.1\r\nHost: w\r\n\r\n");
  EXPECT_TRUE(Contains(refused, "uid 0 already has 4 connections")) << refused;
  for (int fd : silent) close(fd);
}

// The bound is on a request's arrival, from its first byte: a client that connects and sends its
// first request later (a connection pool, a client made long before it is used) is idle, not slow.
TEST_F(PeerSharesTest, AConnectionThatSendsItsFirstRequestAfterTheBoundIsServed) {
  StartDaemon("[limits]\nrequest_read_timeout = \"500ms\"\n");
  auto c = Connect();
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  auto status = c->GetStatus();
  EXPECT_TRUE(status.ok()) << status.status().ToString();
}

TEST_F(PeerSharesTest, ARequestTrickledAByteAtATimeIsCutOffAfterTheBound) {
  StartDaemon("[limits]\nrequest_read_timeout = \"1s\"\n");
  // HTTP: a header line that never ends, a byte every 200 ms.
  int fd = ConnectUnix(socket_);
  ASSERT_GE(fd, 0);
  ASSERT_GT(send(fd, "GET /metrics HTTP/1.1\r\nX: ", 26, MSG_NOSIGNAL), 0);
  bool closed = false;
  std::string got;
  for (int i = 0; i < 40 && !closed; i++) {  // 8 s at most; the bound is 1 s
    std::this_thread::sleep_for(200ms);
    if (send(fd, "y", 1, MSG_NOSIGNAL | MSG_DONTWAIT) <= 0) closed = true;
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0) got.append(buf, static_cast<size_t>(n));
    if (n == 0) closed = true;
  }
  close(fd);
  EXPECT_TRUE(closed) << "a trickling HTTP client was never cut off";
  EXPECT_TRUE(Contains(got, "408 ")) << got;
  EXPECT_TRUE(Contains(got, "request_read_timeout")) << got;

  // Framed: a frame whose body comes a byte at a time.
  fd = ConnectUnix(socket_);
  ASSERT_GE(fd, 0);
  const uint32_t length = 1000;
  ASSERT_EQ(send(fd, &length, 4, MSG_NOSIGNAL), 4);
  closed = false;
  got.clear();
  for (int i = 0; i < 40 && !closed; i++) {
    std::this_thread::sleep_for(200ms);
    if (send(fd, "\x08", 1, MSG_NOSIGNAL | MSG_DONTWAIT) <= 0) closed = true;
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0) got.append(buf, static_cast<size_t>(n));
    if (n == 0) closed = true;
  }
  close(fd);
  EXPECT_TRUE(closed) << "a trickling framed client was never cut off";
  ipc::FrameDecoder decoder;
  ASSERT_TRUE(decoder.Append(got).ok());
  std::string body;
  ASSERT_TRUE(decoder.Next(body)) << "no reply before the close";
  v1::Envelope reply;
  ASSERT_TRUE(reply.ParseFromString(body));
  EXPECT_EQ(reply.error().code(), v1::DEADLINE_EXCEEDED) << reply.DebugString();
}

TEST_F(PeerSharesTest, HttpRepliesHeldBehindASlowFirstRequestCountAgainstTheByteLimit) {
  MakeModel("m", "8,4");
  StartDaemon("[limits]\nmax_frame_bytes = \"256KiB\"\nmax_unread_reply_bytes = \"512KiB\"\n"
              "[[models]]\nname = \"echo\"\nengine = \"echo\"\n",
              {"--enable-fault-injection"});
  ASSERT_EQ(Cli({"load", "m"}), 0);
  ASSERT_EQ(Cli({"load", "echo"}), 0);
  ASSERT_EQ(Cli({"fault", "arm", "infer.mid", "delay:1500", "--model", "m"}), 0);
  // The first request is slow; eight answers of 200 KiB each are ready long before it.
  std::string slow = "[[1, 2, 3, 4, 5, 6, 7, 8]]";
  std::string requests = "POST /v1/models/m/infer HTTP/1.1\r\nHost: w\r\nContent-Length: " +
                         std::to_string(slow.size()) + "\r\n\r\n" + slow;
  std::string input(200 << 10, '\0');
  for (int i = 0; i < 8; i++) {
    requests += "POST /v1/models/echo/infer HTTP/1.1\r\nHost: w\r\nContent-Type: application/octet-stream\r\n"
                "X-Warmpool-Rows: 1\r\nContent-Length: " + std::to_string(input.size()) + "\r\n\r\n" + input;
  }
  std::string got = Exchange(ConnectUnix(socket_), requests);
  // Cut off once what it made the daemon hold passed 512 KiB, while the first request was still
  // running: no answer came (without counting the held ones, all were held until the first was
  // answered, and the first ones written reached the client before the cut-off).
  EXPECT_EQ(Count(got, "HTTP/1.1 200 "), 0u) << "the daemon held the replies until the first was answered";
  // Everybody else is served.
  auto other = Connect();
  EXPECT_TRUE(other->GetStatus().ok());
  std::string metrics = Exchange(ConnectUnix(socket_), kScrape);
  EXPECT_GE(Sample(metrics, "warmpool_session_refusals_total{reason=\"unread_cut_off\"}"), 1) << metrics;
  ASSERT_EQ(Cli({"fault", "clear"}), 0);
}

// Raw frames, so that the client chooses the request ids.
std::string InferFrame(uint64_t id, const std::string& model) {
  v1::Envelope e;
  e.set_request_id(id);
  e.set_protocol_version(ipc::kProtocolVersion);
  *e.mutable_infer()->mutable_input() = client::ToTensor(RandomMatrix(1, 8, id));
  e.mutable_infer()->set_model(model);
  return ipc::Frame(e);
}

std::vector<v1::Envelope> ReadReplies(int fd, size_t count) {
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ipc::FrameDecoder decoder;
  std::vector<v1::Envelope> out;
  char buf[65536];
  while (out.size() < count) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    if (!decoder.Append({buf, static_cast<size_t>(n)}).ok()) break;
    std::string body;
    while (decoder.Next(body)) {
      v1::Envelope e;
      e.ParseFromString(body);
      out.push_back(std::move(e));
    }
  }
  return out;
}

TEST_F(PeerSharesTest, ARequestIdInUseIsRefusedNotMerged) {
  MakeModel("m", "8,4");
  StartDaemon("", {"--enable-fault-injection"});
  ASSERT_EQ(Cli({"load", "m"}), 0);
  ASSERT_EQ(Cli({"fault", "arm", "infer.mid", "delay:500", "--model", "m"}), 0);
  int fd = ConnectUnix(socket_);
  ASSERT_GE(fd, 0);
  std::string frames = InferFrame(7, "m") + InferFrame(7, "m");
  ASSERT_EQ(send(fd, frames.data(), frames.size(), MSG_NOSIGNAL), static_cast<ssize_t>(frames.size()));
  std::vector<v1::Envelope> replies = ReadReplies(fd, 2);
  close(fd);
  ASSERT_EQ(replies.size(), 2u);
  int refused = 0, served = 0;
  for (const v1::Envelope& r : replies) {
    EXPECT_EQ(r.request_id(), 7u);
    if (r.has_infer_reply()) served++;
    if (r.has_error()) {
      refused++;
      EXPECT_EQ(r.error().code(), v1::INVALID_ARGUMENT) << r.DebugString();
      EXPECT_TRUE(Contains(r.error().message(), "request id 7 is already in use")) << r.DebugString();
    }
  }
  EXPECT_EQ(served, 1);
  EXPECT_EQ(refused, 1);
  // Once answered, the id is free again.
  fd = ConnectUnix(socket_);
  frames = InferFrame(7, "m");
  ASSERT_GT(send(fd, frames.data(), frames.size(), MSG_NOSIGNAL), 0);
  replies = ReadReplies(fd, 1);
  close(fd);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_TRUE(replies[0].has_infer_reply()) << replies[0].DebugString();
  ASSERT_EQ(Cli({"fault", "clear"}), 0);
}

TEST_F(PeerSharesTest, RefusalsBeforeTheCoreAreCountedInTheMetrics) {
  MakeModel("m", "8,4");
  StartDaemon("[limits]\nmax_requests_per_connection = 2\n", {"--enable-fault-injection"});
  ASSERT_EQ(Cli({"load", "m"}), 0);
  ASSERT_EQ(Cli({"fault", "arm", "infer.mid", "delay:300", "--model", "m", "--times", "2"}), 0);
  // Three past the per-connection limit, and a request id in use.
  int fd = ConnectUnix(socket_);
  std::string frames;
  for (uint64_t id = 1; id <= 5; id++) frames += InferFrame(id, "m");
  frames += InferFrame(1, "m");
  ASSERT_GT(send(fd, frames.data(), frames.size(), MSG_NOSIGNAL), 0);
  std::vector<v1::Envelope> replies = ReadReplies(fd, 6);
  close(fd);
  ASSERT_EQ(replies.size(), 6u);
  // HTTP: a body that does not parse, a parameter that is not a number, bytes that are not HTTP.
  std::string bad_json = Exchange(ConnectUnix(socket_),
                                  "POST /v1/models/m/infer HTTP/1.1\r\nHost: w\r\nContent-Length: 3\r\n"
                                  "Connection: close\r\n\r\n{x]");
  EXPECT_TRUE(Contains(bad_json, "400 ")) << bad_json;
  std::string bad_number = Exchange(
      ConnectUnix(socket_),
      "POST /v1/models/m/infer?deadline_ms=12x HTTP/1.1\r\nHost: w\r\nContent-Type: application/octet-stream\r\n"
      "X-Warmpool-Rows: 1\r\nContent-Length: 32\r\nConnection: close\r\n\r\n" + std::string(32, '\0'));
  EXPECT_TRUE(Contains(bad_number, "400 ")) << bad_number;
  EXPECT_TRUE(Contains(bad_number, "query parameter deadline_ms must be an integer from 0 to 4294967295"))
      << bad_number;
  std::string garbage = Exchange(ConnectUnix(socket_), "GET / HTTP/1.1\r\nBad Header\r\n\r\n");
  EXPECT_TRUE(Contains(garbage, "400 ")) << garbage;

  std::string metrics = Exchange(ConnectUnix(socket_), kScrape);
  EXPECT_EQ(Sample(metrics, "warmpool_session_refusals_total{reason=\"requests_per_connection\"}"), 3) << metrics;
  EXPECT_EQ(Sample(metrics, "warmpool_session_refusals_total{reason=\"duplicate_request_id\"}"), 1) << metrics;
  EXPECT_EQ(Sample(metrics, "warmpool_session_refusals_total{reason=\"http_invalid\"}"), 2) << metrics;
  EXPECT_EQ(Sample(metrics, "warmpool_session_refusals_total{reason=\"http_unreadable\"}"), 1) << metrics;
  EXPECT_GE(Sample(metrics, "warmpool_replies_total{protocol=\"framed\",code=\"RESOURCE_EXHAUSTED\"}"), 3) << metrics;
  EXPECT_GE(Sample(metrics, "warmpool_replies_total{protocol=\"framed\",code=\"INVALID_ARGUMENT\"}"), 1) << metrics;
  EXPECT_GE(Sample(metrics, "warmpool_replies_total{protocol=\"http\",code=\"INVALID_ARGUMENT\"}"), 3) << metrics;
  EXPECT_GE(Sample(metrics, "warmpool_replies_total{protocol=\"framed\",code=\"OK\"}"), 2) << metrics;
  ASSERT_EQ(Cli({"fault", "clear"}), 0);
}

}  // namespace
}  // namespace warmpool::testing
