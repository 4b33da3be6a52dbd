// Hostile readers of streamed generations over HTTP are bounded as framed clients are: a client
// that asks for a long stream and never reads it is cut off once the daemon holds
// [limits] max_unread_reply_bytes of it, its generation is cancelled (the worker is free again),
// and everybody else is served meanwhile.
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "tests/integration/daemon_fixture.h"
#include "tests/integration/http_exchange.h"
#include "tests/unit/tiny_model.h"

namespace warmpool::testing {
namespace {

class HttpStreamsTest : public DaemonTest {
 protected:
  // A series' value in a scrape of /metrics; -1 when it is not there.
  double Scraped(const std::string& series) {
    std::vector<Response> r = Split(Exchange(ConnectUnix(socket_), HttpGet("/metrics", true)));
    if (r.empty()) return -1;
    const size_t at = r[0].body.find("\n" + series + " ");
    return at == std::string::npos ? -1 : std::stod(r[0].body.substr(at + series.size() + 2));
  }
};

TEST_F(HttpStreamsTest, AnSseReaderThatNeverReadsIsCutOffAndItsGenerationCancelled) {
  // A context long enough (the served 4096 tokens) that the whole stream, about 150 bytes an
  // event, is far more than the limit and the socket's buffer together.
  WriteTinyModel(models_dir_ + "/long", transformer::RandomCheckpoint{.max_position_embeddings = 16384});
  // (The bound is at least max_frame_bytes + 64 KiB: a whole reply must fit.)
  StartDaemon("[limits]\nmax_frame_bytes = \"128KiB\"\nmax_unread_reply_bytes = \"192KiB\"\n"
              "[[models]]\nname = \"echo\"\nengine = \"echo\"\n");
  const int fd = ConnectUnix(socket_);
  ASSERT_GE(fd, 0);
  const std::string request =
      HttpPost("/v1/completions", R"({"model": "long", "prompt": "Everyone", "max_tokens": 100000, "stream": true})");
  ASSERT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  // It reads nothing. Others are served meanwhile.
  auto other = Connect();
  for (int i = 0; i < 20; i++) {
    auto r = other->Infer("echo", RandomMatrix(1, 8, i));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  // Cut off (a liveness wait: the stream outruns any buffer in well under a minute here).
  const auto start = std::chrono::steady_clock::now();
  while (Scraped("warmpool_session_refusals_total{reason=\"unread_cut_off\"}") < 1 &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Scraped("warmpool_session_refusals_total{reason=\"unread_cut_off\"}"), 1);
  // Its generation was cancelled, not run to the end of its context, and the worker is free.
  while (Scraped("warmpool_model_requests_running{model=\"long\"}") != 0 &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Scraped("warmpool_model_generations_cancelled_total{model=\"long\"}"), 1);
  EXPECT_LT(Scraped("warmpool_model_generation_tokens_total{model=\"long\"}"), 4000);
  v1::GenerateRequest next;
  next.set_model("long");
  next.set_prompt("Everyone");
  next.set_max_tokens(4);
  auto reply = other->Generate(std::move(next));
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->completion_tokens(), 4u);
  close(fd);
  ExpectQuiescentAndValid();
}

}  // namespace
}  // namespace warmpool::testing
