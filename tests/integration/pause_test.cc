// The daemon stopped for a while (SIGSTOP here; a VM stall or swap in life) while a worker computes
// a request and answers it in time: on resuming, its overdue timers must not judge the worker on
// what they have not read (supervisor/core/events.h, event::Tick). The core's side is in
// core_pause_test and the simulator's pause fault; this is the shell's, with a real loop and
// real sockets.
#include <signal.h>

#include <chrono>
#include <thread>

#include "tests/integration/daemon_fixture.h"

namespace warmpool::testing {
namespace {

using namespace std::chrono_literals;

TEST_F(DaemonTest, APausedDaemonDoesNotKillAWorkerThatAnsweredInTime) {
  const std::string model = MakeModel("m", "8,4");
  StartDaemon("[recovery]\ninference_grace_ms = 200\n", {"--enable-fault-injection"});
  ASSERT_EQ(Cli({"load", "m"}), 0);
  // The worker takes the request, computes for a second, and answers within the deadline.
  ASSERT_EQ(Cli({"fault", "arm", "infer.mid", "delay:1000", "--model", "m", "--times", "1"}), 0);
  auto c = Connect();
  auto watcher = Connect();
  const client::Matrix input = RandomMatrix(2, 8, 9);
  Result<uint64_t> id = SendInfer(*c, "m", input, /*deadline_ms=*/1500);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  bool taken = false;
  for (int i = 0; i < 400 && !taken; i++) {
    auto status = watcher->GetStatus();
    ASSERT_TRUE(status.ok()) << status.status().ToString();
    taken = status->inflight() == 1;
    if (!taken) std::this_thread::sleep_for(2ms);
  }
  ASSERT_TRUE(taken) << "the request never reached the worker";
  // Stopped while the worker computes; resumed well past the deadline and its grace. The reply the
  // worker sent meanwhile waits in the channel.
  ASSERT_EQ(kill(DaemonPid(), SIGSTOP), 0);
  std::this_thread::sleep_for(3s);
  ASSERT_EQ(kill(DaemonPid(), SIGCONT), 0);
  ExpectInferReply(c->Receive(), ReferenceInfer(model, input));
  auto status = watcher->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  for (const v1::WorkerStatus& w : status->workers()) {
    EXPECT_EQ(w.restarts(), 0u) << "worker " << w.slot() << " was judged hung:\n" << DaemonLog();
  }
  EXPECT_EQ(DaemonLog().find("overran its deadline"), std::string::npos) << DaemonLog();
}

}  // namespace
}  // namespace warmpool::testing
