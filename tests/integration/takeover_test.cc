// `warmpoold --takeover` (supervisor/takeover.h): a second daemon takes the socket and the warm
// weights from the one running, without a service manager, while every client request is answered
// once and no file is read again.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <thread>

#include "tests/integration/daemon_fixture.h"

namespace warmpool::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// `warmpoold --takeover` (supervisor/takeover.h), without a service manager.
class TakeoverTest : public DaemonTest {
 protected:
  // A second warmpoold on the same socket and instance, taking over from the one running.
  std::unique_ptr<launch::DaemonProcess> StartTakeover() {
    launch::DaemonSpec spec = daemon_->spec();
    spec.args.push_back("--takeover");
    spec.log = dir_ + "/takeover.log";
    auto next = std::make_unique<launch::DaemonProcess>(spec);
    Status started = next->Start();
    EXPECT_TRUE(started.ok()) << started.ToString();
    return next;
  }
};

// One client of the load: keeps `depth` requests in flight and sends each logical request until
// it succeeds once; a reconnect (the old daemon closing its connection) or an UNAVAILABLE refusal
// (it handed over) sends it again on a new connection. Counts what a client must never see.
struct LoadClient {
  std::string socket;
  std::vector<client::Matrix> inputs;
  std::vector<client::Matrix> expected;
  uint32_t requests = 0;                 // at least this many, and more while `running`
  const std::atomic<bool>* running = nullptr;
  uint32_t issued = 0;
  int succeeded = 0, duplicates = 0, wrong = 0, unexpected = 0, reconnects = 0, refused = 0;
  std::string last_problem;

  void Run() {
    std::vector<bool> done;
    std::vector<uint32_t> todo;
    auto more = [&] {
      if (!todo.empty()) return true;
      if (issued >= requests && running->load()) {
      } else if (issued >= requests) {
        return false;
      }
      todo.push_back(issued++);
      done.push_back(false);
      return true;
    };
    auto deadline = std::chrono::steady_clock::now() + 60s;
    while (more() && std::chrono::steady_clock::now() < deadline) {
      auto c = client::Client::Connect(socket);
      if (!c.ok()) {
        std::this_thread::sleep_for(5ms);
        continue;
      }
      std::map<uint64_t, uint32_t> in_flight;  // request id -> logical request
      std::vector<uint32_t> again;
      bool broken = false;
      while ((more() || !in_flight.empty()) && !broken) {
        while (in_flight.size() < 4 && more()) {
          const uint32_t logical = todo.back();
          Result<uint64_t> id = SendInfer(**c, "a", inputs[logical % inputs.size()]);
          if (!id.ok()) {
            broken = true;
            break;
          }
          todo.pop_back();
          in_flight[*id] = logical;
        }
        if (broken || in_flight.empty()) break;
        Result<v1::Envelope> reply = (*c)->Receive();
        if (!reply.ok()) {
          broken = true;
          break;
        }
        auto it = in_flight.find(reply->request_id());
        if (it == in_flight.end()) {
          duplicates++;  // an id answered twice, or never sent
          continue;
        }
        const uint32_t logical = it->second;
        in_flight.erase(it);
        if (reply->has_error()) {
          if (reply->error().message().find("reconnect") != std::string::npos) {
            refused++;
            again.push_back(logical);
            broken = true;  // go to the new daemon
          } else {
            unexpected++;
            last_problem = reply->error().message();
            again.push_back(logical);
          }
          continue;
        }
        if (done[logical]) duplicates++;
        done[logical] = true;
        Result<client::Matrix> got = client::FromTensor(reply->infer_reply().output());
        const client::Matrix& want = expected[logical % expected.size()];
        bool same = got.ok() && got->rows == want.rows && got->cols == want.cols;
        for (size_t k = 0; same && k < got->data.size(); k++) same = std::abs(got->data[k] - want.data[k]) < 1e-4f;
        if (!same) wrong++;
        succeeded++;
      }
      // What was in flight on a connection the daemon closed was never accepted: send it again.
      for (auto& [id, logical] : in_flight) todo.push_back(logical);
      for (uint32_t logical : again) todo.push_back(logical);
      if (broken) reconnects++;
    }
  }
};

TEST_F(TakeoverTest, UnderLoadEveryRequestIsAnsweredOnceAndTheNewDaemonReadsNoFile) {
  std::string a = MakeModel("a", "32,256,8");
  StartDaemon("[[models]]\nname = \"a\"\npath = \"" + a + "\"\n");
  std::string out, err;
  ASSERT_EQ(Cli({"load", "a"}, &out, &err), 0) << err;
  std::vector<client::Matrix> inputs, expected;
  for (uint32_t i = 0; i < 8; i++) {
    inputs.push_back(RandomMatrix(2, 32, 100 + i));
    expected.push_back(ReferenceInfer(a, inputs.back()));
  }
  fs::remove(a);  // the new daemon must not need it
  std::vector<LoadClient> clients(3);
  std::vector<std::thread> threads;
  std::atomic<bool> running{true};
  for (LoadClient& c : clients) {
    c.socket = socket_;
    c.inputs = inputs;
    c.expected = expected;
    c.requests = 200;
    c.running = &running;
  }
  for (LoadClient& c : clients) threads.emplace_back([&c] { c.Run(); });
  std::this_thread::sleep_for(150ms);
  std::unique_ptr<launch::DaemonProcess> next = StartTakeover();
  // The old daemon hands over, drains and exits cleanly; its workers go with it.
  EXPECT_EQ(daemon_->Wait(20000), 0) << DaemonLog();
  std::this_thread::sleep_for(200ms);  // the load goes on against the new daemon
  running = false;
  for (std::thread& t : threads) t.join();
  int succeeded = 0;
  for (const LoadClient& c : clients) {
    EXPECT_EQ(c.succeeded, static_cast<int>(c.issued)) << "every request answered";
    EXPECT_GE(c.issued, 200u);
    EXPECT_EQ(c.duplicates, 0) << "none twice";
    EXPECT_EQ(c.wrong, 0);
    EXPECT_EQ(c.unexpected, 0) << c.last_problem;
    succeeded += c.succeeded;
  }
  int moved = 0;
  for (const LoadClient& c : clients) moved += c.reconnects;
  EXPECT_GT(moved, 0) << "the clients moved to the new daemon";
  const std::string old_log = DaemonLog();
  EXPECT_NE(old_log.find("handed the socket and 1 kept weights to a new warmpoold"), std::string::npos) << old_log;
  // From here the fixture watches the new daemon (its TearDown stops it and checks what it leaves).
  daemon_ = std::move(next);
  WorkerPids();
  const std::string log = daemon_->Log();
  EXPECT_NE(log.find("adopted \"a\" ready"), std::string::npos) << log;
  EXPECT_NE(log.find("(taken over)"), std::string::npos) << log;
  EXPECT_EQ(log.find("loading \"a\""), std::string::npos) << log;
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  auto got = c->Infer("a", inputs[0]);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectNear(expected[0], *got);
}

// The manifest a daemon hands over records the version the weights were read from, not what the
// registry says of a file deleted since (nothing): so a second takeover adopts them as the first did.
TEST_F(TakeoverTest, AModelWhoseFileWasDeletedIsKeptAcrossTwoTakeovers) {
  std::string a = MakeModel("a", "16,32,8");
  StartDaemon("[[models]]\nname = \"a\"\npath = \"" + a + "\"\n");
  std::string out, err;
  ASSERT_EQ(Cli({"load", "a"}, &out, &err), 0) << err;
  const client::Matrix input = RandomMatrix(2, 16, 3);
  const client::Matrix expected = ReferenceInfer(a, input);
  fs::remove(a);
  for (int round = 1; round <= 2; round++) {
    SCOPED_TRACE(round);
    launch::DaemonSpec spec = daemon_->spec();
    if (round == 1) spec.args.push_back("--takeover");
    spec.log = dir_ + "/takeover" + std::to_string(round) + ".log";
    auto next = std::make_unique<launch::DaemonProcess>(spec);
    ASSERT_TRUE(next->Start().ok());
    EXPECT_EQ(daemon_->Wait(20000), 0) << DaemonLog();
    daemon_ = std::move(next);
    WorkerPids();
    const std::string log = daemon_->Log();
    EXPECT_NE(log.find("adopted \"a\" ready"), std::string::npos) << log;
    auto got = Connect()->Infer("a", input);
    ASSERT_TRUE(got.ok()) << got.status().ToString() << "\n" << log;
    ExpectNear(expected, *got);
  }
}

TEST_F(TakeoverTest, WithNoDaemonToTakeOverFromItSaysSo) {
  std::string out, err;
  int rc = RunProgram({BinDir() + "/warmpoold", "--socket", socket_, "--instance", instance_, "--takeover"}, &out, &err);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find("--takeover: no daemon answers on"), std::string::npos) << err;
}

}  // namespace
}  // namespace warmpool::testing
