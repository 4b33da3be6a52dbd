// Bad input and failures: every one gets a typed error and the daemon keeps serving everyone else.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <thread>

#include "ipc/framing.h"
#include "tests/integration/daemon_fixture.h"

namespace warmpool::testing {
namespace {

// A raw connection for sending what no well-behaved client would.
int RawConnect(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

// Reads one reply frame (or nothing when the daemon hung up first).
std::optional<v1::Envelope> ReadReply(int fd) {
  std::string bytes;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) bytes.append(buffer, n);
  ipc::FrameDecoder decoder;
  EXPECT_TRUE(decoder.Append(bytes).ok());
  std::string body;
  if (!decoder.Next(body)) return std::nullopt;
  v1::Envelope reply;
  EXPECT_TRUE(reply.ParseFromString(body));
  return reply;
}

void ExpectServing(DaemonTest* test, client::Client& client, const std::string& model) {
  auto out = client.Infer(model, RandomMatrix(1, 8, 1));
  EXPECT_TRUE(out.ok()) << out.status().ToString();
}

class FaultsTest : public DaemonTest {};

TEST_F(FaultsTest, UnknownModelIsNotFoundWithAHint) {
  StartDaemon();
  std::string out, err;
  EXPECT_EQ(Cli({"infer", "nope", "--random", "1"}, &out, &err), 1);
  EXPECT_EQ(err, "error: NOT_FOUND: model \"nope\" is not registered (see 'warmpool models')\n");
  EXPECT_EQ(Cli({"load", "nope"}, &out, &err), 1);
  EXPECT_NE(err.find("NOT_FOUND"), std::string::npos);
}

TEST_F(FaultsTest, MalformedInputShapeIsInvalidArgument) {
  MakeModel("m", "8,4");
  StartDaemon();
  auto client = Connect();
  auto out = client->Infer("m", RandomMatrix(2, 5, 1));
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), Code::kInvalidArgument);
  EXPECT_NE(out.status().message().find("input has 5 columns but model \"m\" expects 8"),
            std::string::npos) << out.status().message();

  v1::Envelope bad;  // rows x cols disagrees with the bytes
  bad.mutable_infer()->set_model("m");
  bad.mutable_infer()->mutable_input()->set_rows(3);
  bad.mutable_infer()->mutable_input()->set_cols(8);
  bad.mutable_infer()->mutable_input()->set_data(std::string(12, '\0'));
  auto reply = client->Call(bad);
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), Code::kInvalidArgument);

  std::string cli_out, err;
  EXPECT_EQ(Cli({"infer", "m", "--input", "-"}, &cli_out, &err, "[[1, 2], [3]]"), 2);
  EXPECT_NE(err.find("error: INVALID_ARGUMENT: input row 1 has 1 values but row 0 has 2"), std::string::npos) << err;
  ExpectServing(this, *client, "m");
}

TEST_F(FaultsTest, MalformedModelFileFailsWithReasonAndOthersServe) {
  MakeModel("good", "8,4");
  { std::ofstream(models_dir_ + "/broken.safetensors") << "this is not a model"; }
  StartDaemon();
  auto client = Connect();
  auto out = client->Infer("broken", RandomMatrix(1, 8, 1));
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(out.status().message().find("broken"), std::string::npos);
  auto models = client->Models();
  bool found = false;
  for (const auto& m : models->models()) {
    if (m.name() == "broken") {
      found = true;
      EXPECT_EQ(m.state(), "failed");
      EXPECT_FALSE(m.last_error().empty());
    }
  }
  EXPECT_TRUE(found);
  ExpectServing(this, *client, "good");
}

TEST_F(FaultsTest, ClientDisconnectingMidRequestLeavesNothingBehind) {
  MakeModel("m", "8,512,512,4");
  StartDaemon();
  for (int i = 0; i < 5; i++) {
    auto c = Connect();
    client::Matrix input = RandomMatrix(64, 8, i);
    for (int k = 0; k < 4; k++) ASSERT_TRUE(c->SendInfer("m", input).ok());
    // Gone before any reply.
  }
  auto client = Connect();
  ExpectServing(this, *client, "m");
  // TearDown waits for quiescence and validates the segment: nothing in flight, nothing queued.
}

TEST_F(FaultsTest, FrameOverTheLimitIsRefusedBeforeItsBody) {
  MakeModel("m", "8,4");
  StartDaemon("[limits]\nmax_frame_bytes = \"64KiB\"\n");
  int fd = RawConnect(socket_);
  uint32_t huge = 1u << 30;  // 1 GiB declared; never sent
  char prefix[4] = {static_cast<char>(huge & 0xFF), static_cast<char>(huge >> 8 & 0xFF),
                    static_cast<char>(huge >> 16 & 0xFF), static_cast<char>(huge >> 24)};
  ASSERT_EQ(write(fd, prefix, 4), 4);
  auto reply = ReadReply(fd);  // the daemon answers and hangs up without waiting for the body
  close(fd);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->error().code(), v1::RESOURCE_EXHAUSTED);
  EXPECT_NE(reply->error().message().find("exceeds the limit of 65536 bytes"), std::string::npos);

  // A real request over the limit through the client library: the same typed error.
  auto client = Connect();
  auto out = client->Infer("m", RandomMatrix(4096, 8, 1));  // 128 KiB
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), Code::kResourceExhausted) << out.status().ToString();
  auto other = Connect();
  ExpectServing(this, *other, "m");
}

TEST_F(FaultsTest, GarbageFromAClientDoesNotDisturbOthers) {
  MakeModel("m", "8,4");
  StartDaemon();
  auto steady = Connect();
  ExpectServing(this, *steady, "m");
  // A valid length with bytes that are not an Envelope.
  int fd = RawConnect(socket_);
  std::string garbage = std::string("\x10\x00\x00\x00", 4) + std::string(16, '\xff');
  ASSERT_EQ(write(fd, garbage.data(), garbage.size()), static_cast<ssize_t>(garbage.size()));
  auto reply = ReadReply(fd);
  close(fd);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->error().code(), v1::INVALID_ARGUMENT);
  // Random bytes of every kind.
  std::mt19937 rng(42);
  for (int i = 0; i < 20; i++) {
    int g = RawConnect(socket_);
    std::string noise(1 + rng() % 300, '\0');
    for (char& ch : noise) ch = static_cast<char>(rng());
    (void)!write(g, noise.data(), noise.size());
    close(g);
  }
  ExpectServing(this, *steady, "m");
}

TEST_F(FaultsTest, QueueIsBoundedWithResourceExhausted) {
  MakeModel("m", "8,1024,1024,4");
  StartDaemon("[pool]\nmax_queue = 4\n");
  auto client = Connect();
  std::vector<uint64_t> ids;
  v1::Envelope request = client::InferRequest("m", RandomMatrix(1, 8, 1));
  // All sent before the load can finish: they arrive while "m" is loading.
  std::string burst;
  for (int i = 1; i <= 10; i++) {
    request.set_request_id(i);
    ASSERT_TRUE(ipc::AppendFrame(burst, request).ok());
  }
  ASSERT_TRUE(client->channel().WriteRaw(burst).ok());
  int ok = 0, exhausted = 0;
  for (int i = 1; i <= 10; i++) {
    auto reply = client->Wait(i);
    ASSERT_TRUE(reply.ok());
    if (reply->has_infer_reply()) ok++;
    if (reply->has_error() && reply->error().code() == v1::RESOURCE_EXHAUSTED) exhausted++;
  }
  EXPECT_EQ(ok, 4);
  EXPECT_EQ(exhausted, 6);
}

TEST_F(FaultsTest, DeadlineExceededWhileQueuedBehindSlowWork) {
  MakeModel("slow", "512,2048,2048,512");
  StartDaemon();
  auto client = Connect();
  ASSERT_TRUE(client->Load("slow").ok());
  std::vector<uint64_t> ids;
  for (int i = 0; i < 6; i++) {
    ids.push_back(*client->SendInfer("slow", RandomMatrix(256, 512, i)));
  }
  uint64_t hurried_id =
      *client->SendInfer("slow", RandomMatrix(1, 512, 9), client::InferOptions{1, std::nullopt});
  auto reply = client->Wait(hurried_id);
  ASSERT_TRUE(reply.ok());
  ASSERT_TRUE(reply->has_error());
  EXPECT_EQ(reply->error().code(), v1::DEADLINE_EXCEEDED) << reply->error().message();
  for (uint64_t id : ids) {
    auto r = client->Wait(id);
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->has_infer_reply()) << r->DebugString();
  }
}

TEST_F(FaultsTest, WorkersKilledMidRequestAreRetriedAndRecover) {
  std::string path = MakeModel("slow", "256,1024,1024,256");
  MakeModel("other", "8,4");
  StartDaemon();
  auto client = Connect();
  ASSERT_TRUE(client->Load("slow").ok());
  client::Matrix input = RandomMatrix(128, 256, 5);
  client::Matrix expected = ReferenceInfer(path, input);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 40; i++) {
    ids.push_back(*client->SendInfer("slow", input));
  }
  auto first = client->Wait(ids[0]);
  ASSERT_TRUE(first.ok() && first->has_infer_reply());
  std::vector<pid_t> before = WorkerPids();
  for (pid_t pid : before) kill(pid, SIGKILL);

  // Inference is pure: the request running when its worker died, and those queued behind it, are
  // retried on a respawned worker. Every one is answered exactly once, with the right result.
  for (size_t i = 1; i < ids.size(); i++) {
    auto reply = client->Wait(ids[i]);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    ASSERT_TRUE(reply->has_infer_reply()) << reply->DebugString();
    ExpectNear(expected, *client::FromTensor(reply->infer_reply().output()));
  }
  auto status = client->GetStatus();
  for (const auto& w : status->workers()) {
    EXPECT_EQ(w.restarts(), 1u);
    EXPECT_NE(w.last_exit().find("killed by signal 9"), std::string::npos) << w.last_exit();
  }
  std::vector<pid_t> after = WorkerPids();
  for (pid_t pid : after) EXPECT_EQ(std::count(before.begin(), before.end(), pid), 0);
  ExpectServing(this, *client, "other");
}

TEST_F(FaultsTest, SupervisorKilledLeavesNoOrphansAndTheNextStartServes) {
  MakeModel("m", "8,4");
  StartDaemon();
  auto client = Connect();
  ExpectServing(this, *client, "m");
  std::vector<pid_t> workers = WorkerPids();
  KillDaemon();
  // Workers die with their parent (PR_SET_PDEATHSIG); their exit may wait seconds for a CPU on a
  // loaded machine, so the bound is generous and the loop ends as soon as they are gone.
  for (int i = 0; i < 2000; i++) {
    bool any = false;
    for (pid_t pid : workers) any = any || kill(pid, 0) == 0;
    if (!any) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (pid_t pid : workers) EXPECT_NE(kill(pid, 0), 0) << "orphan worker " << pid;
  EXPECT_TRUE(std::filesystem::exists("/dev/shm/warmpool." + instance_));  // stale, until restart
  StartDaemon();
  auto again = Connect();
  ExpectServing(this, *again, "m");
}

TEST_F(FaultsTest, SecondDaemonOnTheSameInstanceIsRefused) {
  StartDaemon();
  std::string out, err;
  int rc = RunProgram({BinDir() + "/warmpoold", "--socket", dir_ + "/other.sock", "--instance",
                       instance_},
                      &out, &err);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find("is in use by warmpoold pid"), std::string::npos) << err;
  rc = RunProgram({BinDir() + "/warmpoold", "--socket", socket_, "--instance", instance_ + "x"},
                  &out, &err);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find("another daemon is serving on"), std::string::npos) << err;
}

}  // namespace
}  // namespace warmpool::testing
