// Loading a dense model: a file that changes under the load, a budget too small, progress, and a
// cancelled load.
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "devmem/host_memory.h"
#include "engines/safetensors.h"
#include "tests/unit/dense_open.h"
#include "tests/unit/dense_reference.h"

namespace warmpool {
namespace {

using safetensors::DType;
using safetensors::TensorToWrite;
using namespace warmpool::testing;

TEST(DenseLoad, FileTruncatedAfterOpen) {
  TempDir dir;
  const std::string path = dir.File("m");
  WriteModel(path, {{0, 32, 32}, {2, 32, 4}}, "relu");
  HostMemory memory;
  Result<Engine> engine = OpenDense(path, memory);
  ASSERT_TRUE(engine.ok());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 100);
  Status status = engine->Load();
  EXPECT_EQ(status.code(), Code::kFailedPrecondition) << status.ToString();
  EXPECT_NE(status.message().find("changed after it was opened"), std::string::npos) << status.message();
  EXPECT_EQ(memory.used_bytes(), 0u) << "a failed load frees its region";
}

TEST(DenseLoad, FileRemovedAfterOpen) {
  TempDir dir;
  const std::string path = dir.File("m");
  WriteModel(path, {{0, 4, 4}}, "relu");
  HostMemory memory;
  Result<Engine> engine = OpenDense(path, memory);
  ASSERT_TRUE(engine.ok());
  std::filesystem::remove(path);
  EXPECT_EQ(engine->Load().code(), Code::kNotFound);
  EXPECT_EQ(memory.used_bytes(), 0u);
}

TEST(DenseLoad, BudgetExhaustedIsResourceExhausted) {
  TempDir dir;
  const std::string path = dir.File("m");
  WriteModel(path, {{0, 64, 64}}, "relu");
  HostMemory memory(/*budget_bytes=*/1024);
  Result<Engine> engine = OpenDense(path, memory);
  ASSERT_TRUE(engine.ok());
  Status status = engine->Load();
  EXPECT_EQ(status.code(), Code::kResourceExhausted) << status.ToString();
  EXPECT_NE(status.message().find("weights of model \"m\""), std::string::npos) << status.message();
  EXPECT_EQ(memory.used_bytes(), 0u);
}

// Big enough (over 8 MiB) that the weights are read in more than one chunk.
std::string WriteMultiChunkModel(const TempDir& dir) {
  const std::string path = dir.File("big.safetensors");
  WriteModel(path, {{0, 1024, 2100}}, "none");
  return path;
}

TEST(DenseLoad, ProgressReachesTotal) {
  TempDir dir;
  const std::string path = WriteMultiChunkModel(dir);
  HostMemory memory;
  Result<Engine> engine = OpenDense(path, memory);
  ASSERT_TRUE(engine.ok());
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  ASSERT_TRUE(engine->Load([&](uint64_t done, uint64_t total) {
    calls.emplace_back(done, total);
    return true;
  }).ok());
  ASSERT_GE(calls.size(), 2u);
  for (size_t i = 1; i < calls.size(); ++i) EXPECT_GT(calls[i].first, calls[i - 1].first);
  EXPECT_EQ(calls.back().first, engine->info().weight_bytes);
  EXPECT_EQ(calls.back().second, engine->info().weight_bytes);
}

TEST(DenseLoad, CancelStopsTheLoadAndALaterLoadSucceeds) {
  TempDir dir;
  const std::string path = WriteMultiChunkModel(dir);
  HostMemory memory;
  Result<Engine> engine = OpenDense(path, memory);
  ASSERT_TRUE(engine.ok());
  int calls = 0;
  Status cancelled = engine->Load([&](uint64_t, uint64_t) {
    ++calls;
    return false;
  });
  EXPECT_EQ(cancelled.code(), Code::kUnavailable) << cancelled.ToString();
  EXPECT_NE(cancelled.message().find("cancelled"), std::string::npos);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(memory.used_bytes(), 0u);

  ASSERT_TRUE(engine->Load().ok());
  std::vector<float> input(1024, 0.5f);
  std::vector<float> output;
  EXPECT_TRUE(engine->Infer(input, 1, 1024, output).ok());
  EXPECT_EQ(output.size(), 2100u);
}

}  // namespace
}  // namespace warmpool
