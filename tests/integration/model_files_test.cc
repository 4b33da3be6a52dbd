// Model files as a hostile user or a careless operator changes them under a running daemon: a
// directory swapped for a symlink out of the model roots after registration (supervisor/
// model_roots.h: the supervisor opens every file beneath its root and the worker reads only what it
// was handed), and a file replaced by a retrained one of the same architecture, which a reload must
// see (common/file_version.h: one definition of "the same file").
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>

#include "tests/integration/daemon_fixture.h"

namespace warmpool::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class ModelFilesTest : public DaemonTest {
 protected:
  void TearDown() override {
    DaemonTest::TearDown();
    std::error_code ec;
    if (!outside_.empty()) fs::remove_all(outside_, ec);
  }

  std::string Mkmodel(const std::string& path, int seed) {
    EXPECT_EQ(RunProgram({BinDir() + "/warmpool-mkmodel", path, "--layers", "8,16,4", "--seed", std::to_string(seed)}), 0);
    return path;
  }

  // models/sub/<name>.safetensors (seed 1), and the same name outside every root (seed 2).
  void MakeInsideAndOutside(const std::string& name) {
    fs::create_directories(models_dir_ + "/sub");
    Mkmodel(models_dir_ + "/sub/" + name + ".safetensors", 1);
    outside_ = fs::temp_directory_path() / ("warmpool-outside-" + std::to_string(getpid()));
    fs::create_directories(outside_ + "/sub");
    Mkmodel(outside_ + "/sub/" + name + ".safetensors", 2);
  }

  void SwapSubForSymlinkOut() {
    fs::rename(models_dir_ + "/sub", models_dir_ + "/sub.old");
    fs::create_directory_symlink(outside_ + "/sub", models_dir_ + "/sub");
  }

  void Reload() {
    const size_t before = Count(DaemonLog(), "reload: ");
    ASSERT_EQ(kill(DaemonPid(), SIGHUP), 0);
    for (int i = 0; i < 250 && Count(DaemonLog(), "reload: ") == before; i++) std::this_thread::sleep_for(20ms);
    ASSERT_GT(Count(DaemonLog(), "reload: "), before) << DaemonLog();
  }

  static size_t Count(const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) n++;
    return n;
  }

  std::string outside_;
};

// Registered (from the configuration, and by `warmpool register`) while the path led to a file
// inside the roots; the directory on the way then leads out. No load may read the file outside.
TEST_F(ModelFilesTest, ADirectorySwappedForASymlinkOutOfTheRootsIsNeverReadThrough) {
  MakeInsideAndOutside("m");
  std::string good = MakeModel("good", "8,4");
  StartDaemon(fmt::format("[recovery]\nfailed_cooldown_ms = 100\n[[models]]\nname = \"configured\"\npath = \"{}\"\n",
                          models_dir_ + "/sub/m.safetensors"));
  std::string out, err;
  ASSERT_EQ(Cli({"register", "registered", models_dir_ + "/sub/m.safetensors"}, &out, &err), 0) << err;
  SwapSubForSymlinkOut();
  const client::Matrix input = RandomMatrix(2, 8, 7);
  const client::Matrix outside_answer = ReferenceInfer(outside_ + "/sub/m.safetensors", input);
  auto c = Connect();
  for (const char* name : {"configured", "registered"}) {
    SCOPED_TRACE(name);
    for (int attempt = 0; attempt < 2; attempt++) {  // the load, and a retry after the cooldown
      auto got = c->Infer(name, input);
      ASSERT_FALSE(got.ok()) << "served from outside the model roots (matches it: "
                             << (got.ok() && std::abs(got->data[0] - outside_answer.data[0]) < 1e-5f) << ")";
      EXPECT_TRUE(got.status().code() == Code::kPermissionDenied || got.status().code() == Code::kFailedPrecondition)
          << got.status().ToString();
      std::this_thread::sleep_for(150ms);
    }
  }
  EXPECT_EQ(DaemonLog().find("loaded \"configured\""), std::string::npos) << DaemonLog();
  // Everybody else is served; put back, the path serves again after a reload.
  auto fine = c->Infer("good", RandomMatrix(1, 8, 1));
  EXPECT_TRUE(fine.ok()) << fine.status().ToString();
  fs::remove(models_dir_ + "/sub");
  fs::rename(models_dir_ + "/sub.old", models_dir_ + "/sub");
  Result<client::Matrix> back = Status(Code::kUnavailable, "not tried");
  for (int i = 0; i < 100 && !back.ok(); i++) {  // once the failed model's cooldown is over
    std::this_thread::sleep_for(50ms);
    back = c->Infer("configured", input);
  }
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectNear(ReferenceInfer(models_dir_ + "/sub/m.safetensors", input), *back);
}

// A retrained model of the same architecture has the same header and size: only its version
// (inode or change time) tells it apart. Rewritten in place, or replaced by a rename.
TEST_F(ModelFilesTest, AFileReplacedByARetrainedOneIsServedNewAfterAReload) {
  const std::string in_place = MakeModel("in_place", "8,16,4", "relu", "f32", 1);
  const std::string renamed = MakeModel("renamed", "8,16,4", "relu", "f32", 1);
  StartDaemon();
  const client::Matrix input = RandomMatrix(3, 8, 11);
  const client::Matrix first = ReferenceInfer(in_place, input);
  auto c = Connect();
  for (const char* name : {"in_place", "renamed"}) {
    auto got = c->Infer(name, input);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ExpectNear(first, *got);
  }
  const std::string retrained = Mkmodel(dir_ + "/retrained.safetensors", 2);
  fs::copy_file(retrained, in_place, fs::copy_options::overwrite_existing);  // the same inode
  Mkmodel(renamed, 2);                                                        // a new inode
  const client::Matrix second = ReferenceInfer(retrained, input);
  ASSERT_GT(std::abs(second.data[0] - first.data[0]) + std::abs(second.data[1] - first.data[1]), 1e-4f);
  Reload();
  EXPECT_NE(DaemonLog().find("2 changed"), std::string::npos) << DaemonLog();
  for (const char* name : {"in_place", "renamed"}) {
    SCOPED_TRACE(name);
    auto got = c->Infer(name, input);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ExpectNear(second, *got);
  }
  // Nothing changed since: a second reload leaves the loaded models alone.
  Reload();
  EXPECT_NE(DaemonLog().find("0 changed"), std::string::npos) << DaemonLog();
}

}  // namespace
}  // namespace warmpool::testing
