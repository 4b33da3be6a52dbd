// Model files as the core sees them (common/file_version.h): a load asks the shell to open the
// registered file beneath its root; what the worker read is the version the weights carry; a reload
// tells a retrained file of the same header and size from the one loaded.
#include "ipc/file_version_proto.h"
#include "tests/unit/core_rig.h"

namespace warmpool::supervisor::testing {
namespace {

// A retrained model of the same architecture: the same header and size, another inode and times.
ModelEntry Retrained(const ModelEntry& e) {
  ModelEntry r = e;
  r.version.inode += 1;
  r.version.mtime_ns += 1;
  r.version.ctime_ns += 1;
  return r;
}

TEST(CoreFilesTest, ALoadAsksForItsFileToBeOpenedBeneathTheRoots) {
  CoreRig rig(CoreRig::SmallConfig());
  ModelEntry m = Entry("m", 100, 10);
  rig.Start({m});
  rig.Up(0);
  rig.Forget();
  rig.Load(1, "m");
  std::vector<action::SendToWorker> sends = rig.SendsTo(0);
  ASSERT_EQ(sends.size(), 1u);
  EXPECT_EQ(sends[0].model_file, m.path);
}

TEST(CoreFilesTest, AReloadTellsARetrainedFileOfTheSameHeaderAndSizeFromTheOneLoaded) {
  CoreRig rig(CoreRig::SmallConfig());
  ModelEntry m = Entry("m", 100, 10);
  rig.Start({m});
  rig.Up(0);
  rig.Loaded(0, m, 100);
  rig.Forget();
  event::Reload same;
  same.config = CoreRig::SmallConfig();
  same.entries = {m};
  rig.Handle(std::move(same));
  EXPECT_TRUE(rig.Closed().empty()) << "the same file: left serving";
  EXPECT_EQ(rig.State("m"), shm::ModelState::kReady);

  const ModelEntry retrained = Retrained(m);
  event::Reload changed;
  changed.config = CoreRig::SmallConfig();
  changed.entries = {retrained};
  rig.Handle(std::move(changed));
  for (const v1::WorkerEnvelope& w : rig.Sent(0)) {
    if (w.has_unload()) rig.Reply(0, CoreRig::UnloadDone(w.unload().job()));
  }
  EXPECT_EQ(rig.Closed(), (std::vector<int>{100})) << "the old weights are let go:\n" << rig.Logs();
  rig.Forget();
  rig.Infer(2, "m");
  std::vector<action::SendToWorker> sends = rig.SendsTo(0);
  ASSERT_EQ(sends.size(), 1u) << "the next request loads the new version";
  EXPECT_EQ(sends[0].model_file, m.path);
}

// The worker says which version it read; the weights carry it, and the registration follows it
// (a file replaced between registration and load is the version served), so that a reload compares
// the file with what is served and a warm restart keeps what was read.
TEST(CoreFilesTest, TheWeightsCarryTheVersionTheWorkerRead) {
  CoreRig rig(CoreRig::SmallConfig());
  ModelEntry m = Entry("m", 100, 10);
  rig.Start({m});
  rig.Up(0);
  rig.Forget();
  rig.Load(1, "m");
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(0);
  ASSERT_EQ(sent.size(), 1u);
  const ModelEntry read = Retrained(m);
  v1::WorkerEnvelope done = CoreRig::LoadDone(sent[0].load().job(), read);
  ipc::SetFileVersion(done.mutable_load_done()->mutable_weights()->mutable_file_version(), read.version);
  rig.Reply(0, std::move(done), {100});
  ASSERT_EQ(rig.State("m"), shm::ModelState::kReady);
  std::vector<KeptWeights> kept = rig.core().Kept();
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0].weights.version, read.version);
  rig.Forget();
  // The file as it is now is the version loaded: a reload leaves it serving.
  event::Reload same;
  same.config = CoreRig::SmallConfig();
  same.entries = {read};
  rig.Handle(std::move(same));
  EXPECT_TRUE(rig.Closed().empty()) << rig.Logs();
  EXPECT_EQ(rig.State("m"), shm::ModelState::kReady);
}

}  // namespace
}  // namespace warmpool::supervisor::testing
