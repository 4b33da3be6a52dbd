// The core's answers to the races the simulator found, each written down as the exact sequence of
// events that used to break it (tests/unit/core_rig.h checks the segment and the core's own
// invariants after every event).
#include <algorithm>

#include "tests/unit/core_rig.h"
#include "tests/text.h"

namespace warmpool::supervisor::testing {
namespace {

using ::warmpool::testing::Contains;

Config WithReplicas(Config c, const std::string& name, uint32_t replicas) {
  ModelConfig m;
  m.name = name;
  m.path = "/models/" + name + ".safetensors";
  m.replicas = replicas;
  c.models.push_back(m);
  return c;
}

// The file changed on disk between registration and load: every attach, replica and unpark must
// describe the weights as the loading worker read them.
TEST(CoreTest, LoadedWeightsAreDescribedByWhatTheWorkerRead) {
  CoreRig rig(WithReplicas(CoreRig::SmallConfig(), "m", 2));
  ModelEntry registered = Entry("m", 100, 10, 1), on_disk = Entry("m", 100, 10, 2);
  rig.Start({registered});
  rig.Up(0);
  rig.Up(1);
  rig.Load(1, "m");
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(0);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(sent[0].has_load());
  EXPECT_EQ(sent[0].load().admitted_bytes(), 110u);
  rig.Reply(0, CoreRig::LoadDone(sent[0].load().job(), on_disk), {100});
  sent = rig.Sent(1);
  ASSERT_EQ(sent.size(), 1u) << "the second replica attaches";
  ASSERT_TRUE(sent[0].has_attach());
  EXPECT_EQ(sent[0].attach().weights().header(), on_disk.header) << "not the registration's header";
  rig.Reply(1, CoreRig::LoadDone(sent[0].attach().job(), on_disk, /*shared=*/false));
  // The worker that loaded it dies; its replacement attaches the same weights, same description.
  rig.Down(0);
  rig.Advance(200);
  rig.Up(0);
  sent = rig.Sent(0);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(sent[0].has_attach());
  EXPECT_EQ(sent[0].attach().weights().header(), on_disk.header);
  EXPECT_TRUE(rig.Closed().empty()) << "the weights are held through the death";
}

// A file that needs more than admission made room for is not loaded over the budget: it is
// registered as it is now and admitted again, room made first.
TEST(CoreTest, AFileThatGrewIsAdmittedAgainForWhatItNeedsNow) {
  CoreRig rig(CoreRig::SmallConfig());  // budget 1000
  ModelEntry a = Entry("a", 400, 0), m = Entry("m", 300, 0, 1), grown = Entry("m", 700, 0, 2);
  rig.Start({a, m});
  rig.Up(0);
  rig.Up(1);
  rig.Loaded(0, a, 100);
  rig.Load(1, "m");
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(1);
  ASSERT_EQ(sent[0].load().admitted_bytes(), 300u);
  v1::WorkerEnvelope changed = CoreRig::LoadDone(sent[0].load().job(), grown, /*shared=*/false);
  changed.mutable_load_done()->set_file_changed(true);
  rig.Reply(1, changed);
  // 400 + 700 > 1000: the idle "a" makes room first; nothing is loaded over the budget meanwhile.
  sent = rig.Sent(0);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(sent[0].has_unload());
  EXPECT_TRUE(rig.Sent(1).empty());
  rig.Reply(0, CoreRig::UnloadDone(sent[0].unload().job()));
  sent = rig.Sent(0);
  if (sent.empty()) sent = rig.Sent(1);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(sent[0].has_load());
  EXPECT_EQ(sent[0].load().admitted_bytes(), 700u);
  EXPECT_EQ(rig.index().Get(rig.index().Find("m")).weight_bytes, 700u) << "registered as it is now";
}

// Held weights attached to the only worker up, behind a long request there; a worker that comes
// up idle attaches them too and serves, instead of the request waiting for the long one.
TEST(CoreTest, AnAttachStuckBehindLongWorkIsOvertakenByAnIdleWorker) {
  CoreRig rig(CoreRig::SmallConfig());
  ModelEntry m = Entry("m", 100, 10), n = Entry("n", 100, 10);
  rig.Start({m, n});
  rig.Up(0);
  rig.Up(1);
  rig.Loaded(0, m, 100);
  rig.Loaded(1, n, 101);
  rig.Infer(2, "n");  // runs long on worker 1: never answered here
  ASSERT_EQ(rig.Sent(1).size(), 1u);
  rig.Down(0);
  rig.Infer(3, "m");
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(1);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(sent[0].has_attach()) << "the only worker up attaches the held weights";
  uint64_t slow_attach = sent[0].attach().job();
  rig.Advance(200);
  rig.Up(0);
  sent = rig.Sent(0);
  ASSERT_EQ(sent.size(), 1u) << "the idle worker attaches them too";
  ASSERT_TRUE(sent[0].has_attach());
  rig.Reply(0, CoreRig::LoadDone(sent[0].attach().job(), m, /*shared=*/false));
  sent = rig.Sent(0);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(sent[0].has_infer());
  rig.Reply(0, CoreRig::InferDone(sent[0].infer().job()));
  std::vector<v1::Envelope> replies = rig.Replies(3);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_TRUE(replies[0].has_infer_reply()) << replies[0].DebugString();
  // The slow attach lands at last: one replica too many, and the busier one lets go.
  rig.Reply(1, CoreRig::LoadDone(slow_attach, m, /*shared=*/false));
  sent = rig.Sent(1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_TRUE(sent[0].has_unload());
  EXPECT_TRUE(rig.Sent(0).empty());
}

// A client that left: its requests still waiting are never sent to a worker, and one that was
// running is not run again when its worker dies.
TEST(CoreTest, RequestsOfADepartedClientNeverRun) {
  CoreRig rig(CoreRig::SmallConfig());
  ModelEntry m = Entry("m", 100, 10);
  rig.Start({m});
  rig.Up(0);
  rig.Up(1);
  rig.Infer(7, "m");  // waits for the load
  rig.Infer(8, "m");
  uint64_t load = rig.Sent(0)[0].load().job();
  rig.Handle(event::ClientGone{7});
  rig.Reply(0, CoreRig::LoadDone(load, m), {100});
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(0);
  ASSERT_EQ(sent.size(), 1u) << "only session 8's request runs";
  uint64_t job8 = sent[0].infer().job();
  // Now session 8 leaves while its request runs, and the worker dies running it.
  rig.Handle(event::ClientGone{8});
  rig.Down(0, {job8});
  rig.Advance(200);
  rig.Up(0);
  for (uint32_t slot : {0u, 1u}) {
    for (const v1::WorkerEnvelope& w : rig.Sent(slot)) EXPECT_FALSE(w.has_infer()) << w.DebugString();
  }
  EXPECT_TRUE(rig.Replies(7).empty());
  EXPECT_TRUE(rig.Replies(8).empty());
  EXPECT_EQ(rig.core().unanswered(), 0u);
  EXPECT_EQ(rig.core().held_bytes(), 0u);
}

// Requests of one batch all hold in-flight markers when their worker dies, and so does an
// inference beside a load: any of them may have been the cause. Each is retried alone (never
// batched again), so that a crash it causes is then its own; it fails only once charged twice
// alone, or at four crashes in all.
TEST(CoreTest, ACrashBesideOtherJobsIsRetriedAloneAndChargedOnlyWhenAlone) {
  Config config = CoreRig::SmallConfig();
  config.crash_loop_crashes = 10;  // the model's own crash loop is not what this is about
  config.workers_per_device = 1;   // so that a load of another model runs beside the retry
  config.respawn_max_ms = 100;     // respawned within serve_again's 200 ms, crash after crash
  CoreRig rig(config);
  ModelEntry m = Entry("m", 100, 10);
  ModelEntry n = Entry("n", 100, 10);
  rig.Start({m, n});
  rig.Up(0);
  rig.Infer(7, "m");  // both wait for the load
  rig.Infer(8, "m");
  rig.Reply(0, CoreRig::LoadDone(rig.Sent(0)[0].load().job(), m), {100});
  // Worker 0 again after it died: m's held weights attach (and n loads, when asked), then the
  // retried request goes, alone.
  auto serve_again = [&]() -> std::vector<v1::WorkerInfer> {
    rig.Advance(200);
    rig.Up(0);
    std::vector<v1::WorkerInfer> infers;
    for (size_t round = 0; round < 3; ++round) {
      for (const v1::WorkerEnvelope& w : rig.Sent(0)) {
        if (w.has_attach()) rig.Reply(0, CoreRig::LoadDone(w.attach().job(), m));
        if (w.has_load()) rig.Reply(0, CoreRig::LoadDone(w.load().job(), n), {200 + static_cast<int>(round)});
        if (w.has_infer()) infers.push_back(w.infer());
      }
    }
    return infers;
  };
  std::vector<v1::WorkerInfer> first;
  for (const v1::WorkerEnvelope& w : rig.Sent(0)) first.push_back(w.infer());
  ASSERT_EQ(first.size(), 2u);
  EXPECT_TRUE(first[0].batch() && first[1].batch());
  EXPECT_GT(first[0].batch_delay_us(), 0u) << "another queued behind it: worth waiting for company";
  EXPECT_GT(first[1].batch_delay_us(), 0u) << "another in flight beside it";

  // The batch crashes its worker: both ran, neither alone. Both are retried, one at a time.
  rig.Down(0, {first[0].job(), first[1].job()});
  std::vector<v1::WorkerInfer> again = serve_again();
  ASSERT_EQ(again.size(), 1u) << "retried, one at a time";
  EXPECT_FALSE(again[0].batch()) << "a suspect runs alone from now on";
  // Two more crashes beside a load of n: still retried, three in all. After the first, session
  // 8's retry, older, goes first (retries of an earlier death keep their place): it is served.
  for (int i = 0; i < 2; ++i) {
    rig.Load(1, "n");
    std::vector<v1::WorkerEnvelope> load = rig.Sent(0);
    ASSERT_EQ(load.size(), 1u);
    ASSERT_TRUE(load[0].has_load());
    rig.Down(0, {again[0].job(), load[0].load().job()});
    again = serve_again();
    ASSERT_EQ(again.size(), 1u) << "crash " << i + 2 << " beside another: retried";
    EXPECT_FALSE(again[0].batch()) << "a suspect runs alone";
    if (i == 0) {
      rig.Reply(0, CoreRig::InferDone(again[0].job()));
      std::vector<v1::Envelope> served = rig.Replies(8);
      ASSERT_EQ(served.size(), 1u) << "session 8's retry went before session 7's newer one";
      EXPECT_TRUE(served[0].has_infer_reply()) << served[0].DebugString();
      std::vector<v1::WorkerEnvelope> next = rig.Sent(0);
      ASSERT_EQ(next.size(), 1u);
      ASSERT_TRUE(next[0].has_infer()) << "then session 7's";
      again = {next[0].infer()};
    }
    rig.Unload(1, "n");
    for (const v1::WorkerEnvelope& w : rig.Sent(0)) {
      if (w.has_unload()) rig.Reply(0, CoreRig::UnloadDone(w.unload().job()));
    }
  }
  EXPECT_TRUE(rig.Replies(7).empty());
  // Session 7's request now crashes its worker alone after three shared crashes: it is the cause.
  rig.Down(0, {again[0].job()});
  std::vector<v1::Envelope> replies = rig.Replies(7);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].error().code(), static_cast<int>(Code::kInternal)) << replies[0].DebugString();
  EXPECT_NE(replies[0].error().message().find("died 4 times"), std::string::npos) << replies[0].DebugString();
  EXPECT_EQ(rig.core().unanswered(), 0u);
}

// The bytes of requests the daemon holds are bounded per connection and in all.
TEST(CoreTest, RequestBytesAreBoundedPerConnectionAndInAll) {
  Config c = CoreRig::SmallConfig();
  c.max_queued_bytes_per_connection = 1000;
  c.max_queued_bytes = 1500;
  CoreRig rig(c);
  rig.Start({Entry("m", 100, 10)});
  // Nothing is up: every request waits (25 rows x 4 columns x 4 bytes = 400 bytes each).
  rig.Infer(1, "m", 25);
  rig.Infer(1, "m", 25);
  rig.Infer(1, "m", 25);
  std::vector<v1::Envelope> r = rig.Replies(1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].error().code(), v1::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(Contains(r[0].error().message(), "max_queued_bytes_per_connection")) << r[0].DebugString();
  rig.Infer(2, "m", 25);
  rig.Infer(2, "m", 25);  // 800 + 400 + 400 > 1500
  r = rig.Replies(2);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(Contains(r[0].error().message(), "raise [limits] max_queued_bytes")) << r[0].DebugString();
  EXPECT_EQ(rig.core().held_bytes(), 1200u);
  rig.Handle(event::ClientGone{1});
  EXPECT_EQ(rig.core().held_bytes(), 400u) << "a departed client's requests are let go";
}

// Two models preloaded while only one worker is up both land on it; the second worker, once up,
// takes one of them (attached from the held weights, then let go by the first).
TEST(CoreTest, ModelsStackedOnOneWorkerSpreadWhenAnotherComesUp) {
  Config c = CoreRig::SmallConfig();
  c.preload = {"a", "b"};
  CoreRig rig(c);
  ModelEntry a = Entry("a", 100, 10), b = Entry("b", 100, 10);
  rig.Start({a, b});
  rig.Up(0);
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(0);
  ASSERT_EQ(sent.size(), 2u);
  rig.Reply(0, CoreRig::LoadDone(sent[0].load().job(), a), {100});
  rig.Reply(0, CoreRig::LoadDone(sent[1].load().job(), b), {101});
  EXPECT_EQ(rig.view().worker(0).models, 2u);
  rig.Up(1);
  sent = rig.Sent(1);
  ASSERT_EQ(sent.size(), 1u) << "the idle worker takes one model";
  ASSERT_TRUE(sent[0].has_attach());
  uint32_t moved = sent[0].attach().model();
  rig.Reply(1, CoreRig::LoadDone(sent[0].attach().job(), moved == 0 ? a : b, false));
  sent = rig.Sent(0);
  ASSERT_EQ(sent.size(), 1u) << "and the crowded one lets it go";
  ASSERT_TRUE(sent[0].has_unload());
  EXPECT_EQ(sent[0].unload().model(), moved);
  rig.Reply(0, CoreRig::UnloadDone(sent[0].unload().job()));
  EXPECT_EQ(rig.view().worker(0).models, 1u);
  EXPECT_EQ(rig.view().worker(1).models, 1u);
  EXPECT_EQ(rig.view().worker(1).held[0], moved);
  EXPECT_TRUE(rig.Closed().empty()) << "moving copies nothing and frees nothing";
}

// A request waiting only for room in a busy worker is not told its model was not ready.
TEST(CoreTest, WaitingForABusyWorkerIsNotCalledNotReady) {
  CoreRig rig(CoreRig::SmallConfig());
  ModelEntry m = Entry("m", 100, 10);
  rig.Start({m});
  rig.Up(0);
  rig.Up(1);
  rig.Loaded(0, m, 100);
  rig.Forget();
  for (uint32_t i = 0; i <= kWorkerWindowJobs; i++) rig.Infer(2, "m");
  EXPECT_EQ(rig.Sent(0).size(), kWorkerWindowJobs) << "one window's worth goes to the worker";
  rig.Advance(1100);  // past the default deadline of 1 s
  bool found = false;
  for (const v1::Envelope& r : rig.Replies(2)) {
    if (!r.has_error()) continue;
    EXPECT_EQ(r.error().code(), v1::DEADLINE_EXCEEDED);
    if (Contains(r.error().message(), "had room")) found = true;
    EXPECT_FALSE(Contains(r.error().message(), "was not ready")) << r.error().message();
  }
  EXPECT_TRUE(found);
}

// A fault's shot goes to one job at a time; a job that ends without firing it gives it back, and
// once fired it is spent (a retried request does not get it again).
TEST(CoreTest, AOneShotFaultIsGrantedToOneJobAndSpentWhenFired) {
  Config c = CoreRig::SmallConfig();
  c.enable_fault_injection = true;
  CoreRig rig(c);
  ModelEntry m = Entry("m", 100, 10);
  rig.Start({m});
  rig.Up(0);
  rig.Up(1);
  rig.Loaded(0, m, 100);
  v1::Envelope arm;
  arm.mutable_fault_arm()->set_point("infer.mid");
  arm.mutable_fault_arm()->set_action("kill");
  rig.Request(1, arm);
  rig.Infer(2, "m");
  rig.Infer(2, "m");
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(0);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].infer().faults_size(), 1);
  EXPECT_EQ(sent[1].infer().faults_size(), 0) << "one shot, one job";
  rig.Reply(0, CoreRig::InferDone(sent[0].infer().job()));  // ended without firing
  rig.Reply(0, CoreRig::InferDone(sent[1].infer().job()));
  rig.Infer(2, "m");
  sent = rig.Sent(0);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_EQ(sent[0].infer().faults_size(), 1) << "the shot came back";
  v1::WorkerEnvelope fired;
  fired.mutable_fault_fired()->set_id(sent[0].infer().faults(0).id());
  fired.mutable_fault_fired()->set_job(sent[0].infer().job());
  rig.Reply(0, fired);
  rig.Down(0, {sent[0].infer().job()});
  rig.Advance(200);
  rig.Up(0);
  for (uint32_t slot : {0u, 1u}) {
    for (const v1::WorkerEnvelope& w : rig.Sent(slot)) {
      if (w.has_infer()) {
        EXPECT_EQ(w.infer().faults_size(), 0) << "the retry gets no second shot";
      }
    }
  }
}

// cuda: the process that owned the device's memory died. Every worker maps dead memory and is
// killed; a request in flight is retried without charging its model; the dead weights are closed
// and never attached again (the model loads from its file once a worker is back); a parked copy,
// in host memory, survives; a load that finishes after the loss is not believed.
TEST(CoreTest, ALostDeviceReloadsItsModelsFromTheirFiles) {
  Config config = CoreRig::SmallConfig();
  config.park_budget_bytes = 1000;
  CoreRig rig(config);
  ModelEntry m = Entry("m", 100, 10), p = Entry("p", 100, 10);
  rig.Start({m, p});
  rig.Up(0);
  rig.Up(1);
  rig.Loaded(0, p, 200);
  rig.Unload(1, "p", /*park=*/true);
  std::vector<v1::WorkerEnvelope> to0 = rig.Sent(0);
  ASSERT_EQ(to0.size(), 2u);
  ASSERT_TRUE(to0[0].has_park());
  rig.Reply(0, CoreRig::ParkDone(to0[0].park().job(), 100), {201});
  rig.Reply(0, CoreRig::UnloadDone(to0[1].unload().job()));
  ASSERT_EQ(rig.State("p"), shm::ModelState::kParked);
  rig.Loaded(0, m, 100);
  uint64_t infer = rig.Infer(2, "m");
  to0 = rig.Sent(0);
  ASSERT_EQ(to0.size(), 1u);
  ASSERT_TRUE(to0[0].has_infer());
  rig.Forget();

  rig.Handle(event::DeviceLost{0, "killed by signal 9"});
  EXPECT_EQ(rig.Count<action::KillWorker>(), 2u) << "both workers map the dead memory";
  // A load that lands now describes memory that no longer exists: not believed.
  rig.Reply(0, CoreRig::InferDone(to0[0].infer().job()));
  EXPECT_TRUE(rig.Replies(2).empty()) << "nothing from a worker of a lost device is believed";
  rig.Down(0, {to0[0].infer().job()});
  rig.Down(1);
  EXPECT_EQ(rig.Closed(), (std::vector<int>{100})) << "the dead weights are let go, the parked copy is not";
  EXPECT_EQ(rig.State("m"), shm::ModelState::kRegistered);
  EXPECT_EQ(rig.State("p"), shm::ModelState::kParked);
  EXPECT_EQ(rig.Used(), 0u);
  // The workers come back before the device's memory owner does: nothing is placed on the
  // device until it is back.
  rig.Advance(500);
  rig.Up(0);
  rig.Up(1);
  EXPECT_TRUE(rig.Sent(0).empty());
  EXPECT_TRUE(rig.Sent(1).empty());
  // Back: the retried request loads "m" from its file (no attach of the old weights).
  rig.Handle(event::DeviceRestored{0});
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(0);
  std::vector<v1::WorkerEnvelope> to1 = rig.Sent(1);
  sent.insert(sent.end(), to1.begin(), to1.end());
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_TRUE(sent[0].has_load()) << "loaded from the file, not attached";
  EXPECT_NE(rig.State("m"), shm::ModelState::kFailed)
      << "no model is charged for a lost device";
  (void)infer;
}

}  // namespace
}  // namespace warmpool::supervisor::testing
