// The model roots (supervisor/model_roots.h): a file is opened beneath the root that holds it, and
// a path that changed since it was resolved (a directory swapped for a symlink) fails to open
// instead of leading out, with openat2 and with the walk older kernels get.
#include "supervisor/model_roots.h"
#include "supervisor/registry.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "engines/transformer/decode_attention.h"
#include "engines/transformer/gpu_sequence.h"
#include "engines/transformer/packed_model.h"
#include "tests/unit/tiny_model.h"

namespace warmpool::supervisor {
namespace {

namespace fs = std::filesystem;

class ModelRootsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() / ("warmpool-roots-" + std::to_string(getpid()));
    fs::remove_all(base_);
    root_ = base_ + "/root";
    outside_ = base_ + "/outside";
    fs::create_directories(root_ + "/sub");
    fs::create_directories(outside_ + "/sub");
    Write(root_ + "/sub/m.bin", "inside");
    Write(outside_ + "/sub/m.bin", "OUTSIDE");
    Write(outside_ + "/secret", "OUTSIDE");
  }
  void TearDown() override { fs::remove_all(base_); }

  static void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }
  static std::string Read(int fd) {
    char buffer[64] = {};
    ssize_t n = pread(fd, buffer, sizeof(buffer), 0);
    return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : "";
  }
  // The swap a hostile user makes after registration: the directory on the way becomes a symlink
  // to one outside every root that holds a file of the same name.
  void SwapSubForSymlinkOut() {
    fs::rename(root_ + "/sub", root_ + "/sub.old");
    fs::create_directory_symlink(outside_ + "/sub", root_ + "/sub");
  }

  std::string base_, root_, outside_;
};

TEST_F(ModelRootsTest, AFileUnderARootOpensWithItsVersion) {
  ModelRoots roots({root_});
  Result<ModelFile> file = roots.Open(root_ + "/sub/../sub/m.bin");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->path(), fs::canonical(root_ + "/sub/m.bin").string());
  EXPECT_EQ(Read(file->fd()), "inside");
  struct stat st{};
  ASSERT_EQ(stat((root_ + "/sub/m.bin").c_str(), &st), 0);
  EXPECT_EQ(file->version(), FileVersionOf(st));
  EXPECT_TRUE(file->version().known());
  EXPECT_EQ(fcntl(file->fd(), F_GETFL) & O_NONBLOCK, 0) << "a worker reads it blocking";
}

TEST_F(ModelRootsTest, SymlinksInsideTheRootsAreFollowedAndOutsideRefused) {
  fs::create_symlink(root_ + "/sub/m.bin", root_ + "/inner-link");
  fs::create_symlink(outside_ + "/secret", root_ + "/escape");
  ModelRoots roots({root_});
  Result<ModelFile> inner = roots.Open(root_ + "/inner-link");
  ASSERT_TRUE(inner.ok()) << inner.status().ToString();
  EXPECT_EQ(Read(inner->fd()), "inside");
  for (const std::string& path : {root_ + "/escape", outside_ + "/secret", root_ + "/../outside/secret"}) {
    Result<ModelFile> out = roots.Open(path);
    ASSERT_FALSE(out.ok()) << path;
    EXPECT_EQ(out.status().code(), Code::kPermissionDenied) << out.status().ToString();
  }
  EXPECT_EQ(roots.Open(root_ + "/missing").status().code(), Code::kNotFound);
}

TEST_F(ModelRootsTest, APathSwappedForASymlinkAfterItWasResolvedDoesNotLeadOut) {
  ModelRoots roots({root_});
  Result<std::string> real = roots.Resolve(root_ + "/sub/m.bin");
  ASSERT_TRUE(real.ok()) << real.status().ToString();
  SwapSubForSymlinkOut();
  Result<ModelFile> file = roots.OpenResolved(*real);
  ASSERT_FALSE(file.ok()) << "opened " << Read(file->fd());
  EXPECT_EQ(file.status().code(), Code::kPermissionDenied);
  EXPECT_NE(file.status().message().find("symlink"), std::string::npos) << file.status().ToString();
  // Resolved anew, the path leads outside: refused for that.
  EXPECT_EQ(roots.Open(root_ + "/sub/m.bin").status().code(), Code::kPermissionDenied);
}

TEST_F(ModelRootsTest, TheWalkForKernelsWithoutOpenat2RefusesWhatOpenat2Refuses) {
  int dir = open(root_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir, 0);
  for (bool use_openat2 : {true, false}) {
    SCOPED_TRACE(use_openat2 ? "openat2" : "walk");
    int fd = OpenBeneath(dir, "sub/m.bin", use_openat2);
    ASSERT_GE(fd, 0) << std::strerror(-fd);
    EXPECT_EQ(Read(fd), "inside");
    close(fd);
    EXPECT_LT(OpenBeneath(dir, "../outside/secret", use_openat2), 0);
  }
  SwapSubForSymlinkOut();
  for (bool use_openat2 : {true, false}) {
    SCOPED_TRACE(use_openat2 ? "openat2" : "walk");
    int fd = OpenBeneath(dir, "sub/m.bin", use_openat2);
    EXPECT_LT(fd, 0) << "opened " << Read(fd);
    if (fd >= 0) close(fd);
  }
  fs::create_symlink(outside_ + "/secret", root_ + "/last");
  for (bool use_openat2 : {true, false}) EXPECT_LT(OpenBeneath(dir, "last", use_openat2), 0);
  close(dir);
}

// A directory opens (a Hugging Face model is one), as a directory: its version is its files'.
TEST_F(ModelRootsTest, AFifoIsRefusedWithoutBlockingAndADirectoryOpensAsOne) {
  ASSERT_EQ(mkfifo((root_ + "/fifo").c_str(), 0600), 0);
  ModelRoots roots({root_});
  EXPECT_EQ(roots.Open(root_ + "/fifo").status().code(), Code::kInvalidArgument);
  Result<ModelFile> sub = roots.Open(root_ + "/sub");
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  EXPECT_TRUE(sub->is_directory());
  EXPECT_EQ(sub->version(), DirectoryVersion(sub->fd()));
}

TEST_F(ModelRootsTest, ARootThatDoesNotExistHoldsNothingAndRootsMove) {
  ModelRoots roots({base_ + "/nowhere", root_});
  EXPECT_TRUE(roots.Open(root_ + "/sub/m.bin").ok());
  ModelRoots moved = std::move(roots);
  EXPECT_TRUE(moved.Open(root_ + "/sub/m.bin").ok());
  ModelRoots none({base_ + "/nowhere"});
  Result<ModelFile> refused = none.Open(root_ + "/sub/m.bin");
  EXPECT_EQ(refused.status().code(), Code::kPermissionDenied);
  EXPECT_NE(refused.status().message().find("none exists"), std::string::npos) << refused.status().ToString();
}

// What the registry says of a problem: the file's (fix the file) or the configuration's (install
// the engine, name the right one), so that a broken-file message never blames a good file.
TEST_F(ModelRootsTest, AProblemIsTheFilesOnlyWhenTheFileIsWhatIsWrong) {
  ModelRoots roots({root_});
  Write(root_ + "/bad.safetensors", "not a safetensors header");
  ModelEntry malformed = InspectModel("bad", "dense", root_ + "/bad.safetensors", roots, base_);
  EXPECT_FALSE(malformed.problem.ok());
  EXPECT_TRUE(malformed.problem_in_file) << malformed.problem.ToString();

  ModelEntry missing = InspectModel("gone", "dense", root_ + "/gone.safetensors", roots, base_);
  EXPECT_FALSE(missing.problem.ok());
  EXPECT_TRUE(missing.problem_in_file) << missing.problem.ToString();

  ModelEntry no_engine = InspectModel("bad", "nosuchengine", root_ + "/bad.safetensors", roots, base_);
  EXPECT_FALSE(no_engine.problem.ok());
  EXPECT_FALSE(no_engine.problem_in_file) << "an engine that is not installed is no fault of the file: "
                                          << no_engine.problem.ToString();
}

// A bf16 language model's KV cache is bf16 where the workers run it on this CPU and it has the
// kernels, f32 on a device: registration counts a position's bytes as the engine will (the
// transformer engine's own tests check its report), and an unresolved backend as the larger.
TEST_F(ModelRootsTest, ALanguageModelsBytesAPositionAreTheCachesWhereTheBackendRunsIt) {
  transformer::RandomCheckpoint bf16;  // 2 layers, 2 KV heads of 16
  bf16.dtype = safetensors::DType::BF16;
  warmpool::testing::WriteTinyModel(root_ + "/tiny", bf16);
  ModelRoots roots({root_});
  const uint64_t f32 = uint64_t{2} * 2 * 2 * 16 * 4;
  const uint64_t on_host = transformer::HaveBF16KvCache(16) ? f32 / 2 : f32;
  ModelEntry host = InspectModel("tiny", "", root_ + "/tiny", roots, base_, Backend::kHost);
  ASSERT_TRUE(host.problem.ok()) << host.problem.ToString();
  EXPECT_EQ(host.kv_bytes_per_token, on_host);
  ModelEntry cuda = InspectModel("tiny", "", root_ + "/tiny", roots, base_, Backend::kCuda);
  EXPECT_EQ(cuda.kv_bytes_per_token, f32);
  ModelEntry unresolved = InspectModel("tiny", "", root_ + "/tiny", roots, base_);
  EXPECT_EQ(unresolved.kv_bytes_per_token, f32);
  // Admission counts the workspace the engine reports there: the CPU's at those bytes a position,
  // the GPU's plan on a device.
  const int dir = open((root_ + "/tiny").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  Result<transformer::PackedModel> packed = transformer::DescribeDirectory(dir, "tiny");
  close(dir);
  ASSERT_TRUE(packed.ok()) << packed.status().ToString();
  transformer::Config c = packed->config;
  c.kv_element = on_host == f32 ? transformer::KvElement::kF32 : transformer::KvElement::kBF16;
  EXPECT_EQ(host.workspace_bytes, transformer::WorkspaceBytes(c, host.context, host.sequences));
  c.kv_element = transformer::KvElement::kF32;
  const uint32_t blocks = transformer::KvPoolBlocks(cuda.context, cuda.sequences);
  EXPECT_EQ(cuda.workspace_bytes, transformer::PlanGpu(c, cuda.context, cuda.sequences, blocks).total);
  EXPECT_EQ(unresolved.workspace_bytes, cuda.workspace_bytes);
}

// A [[models]] entry names no engine unless it must: what the path is decides, as it does for a
// model found in the models directory (the configuration once said "dense" for every entry, and a
// model directory in [[models]] was refused as a dense model).
TEST_F(ModelRootsTest, AnEntryWithNoEngineIsServedByWhatItsPathIs) {
  ModelRoots roots({root_});
  fs::copy(WARMPOOL_SOURCE_DIR "/demo/license-llama", root_ + "/lm");
  Config config;
  config.models.push_back(ModelConfig{.name = "lm", .engine = "", .path = root_ + "/lm"});
  std::vector<std::string> warnings;
  std::vector<ModelEntry> found = DiscoverModels(config, roots, warnings);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].engine, "transformer");
  EXPECT_TRUE(found[0].problem.ok()) << found[0].problem.ToString();
  EXPECT_GT(found[0].context, 0u);
}

}  // namespace
}  // namespace warmpool::supervisor
