// Dense model files that are wrong: each refused when it is opened, with the code and a message
// that names the problem.
#include <fstream>
#include <string>
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

TEST(DenseModelErrors, LayersDoNotChain) {
  TempDir dir;
  WriteModel(dir.File("m"), {{0, 4, 6}, {2, 5, 3}}, "relu");
  ExpectOpenFails(dir.File("m"), "layers do not chain: \"0.weight\" produces 6 features but \"2.weight\" (shape [3, 5]) takes 5");
}

TEST(DenseModelErrors, TensorNameNotALayer) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.File("m"), {{"encoder.weight", DType::F32, {1, 1}, std::vector<uint8_t>(4)}}, {}).ok());
  ExpectOpenFails(dir.File("m"), "tensor \"encoder.weight\" is not named <index>.weight or <index>.bias");
}

TEST(DenseModelErrors, TensorKindNotWeightOrBias) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.File("m"), {{"0.weight", DType::F32, {1, 1}, std::vector<uint8_t>(4)},
                                                     {"1.running_mean", DType::F32, {1}, std::vector<uint8_t>(4)}}, {}).ok());
  ExpectOpenFails(dir.File("m"), "tensor \"1.running_mean\" is not named");
}

TEST(DenseModelErrors, LeadingZeroIndexIsRejected) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.File("m"), {{"00.weight", DType::F32, {1, 1}, std::vector<uint8_t>(4)}}, {}).ok());
  ExpectOpenFails(dir.File("m"), "tensor \"00.weight\" is not named");
}

TEST(DenseModelErrors, BiasWithoutWeight) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.File("m"), {{"0.weight", DType::F32, {1, 1}, std::vector<uint8_t>(4)},
                                                     {"2.bias", DType::F32, {1}, std::vector<uint8_t>(4)}}, {}).ok());
  ExpectOpenFails(dir.File("m"), "tensor \"2.bias\" has no matching \"2.weight\"");
}

TEST(DenseModelErrors, BiasOfWrongLength) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.File("m"), {{"0.weight", DType::F32, {2, 1}, std::vector<uint8_t>(8)},
                                                     {"0.bias", DType::F32, {3}, std::vector<uint8_t>(12)}}, {}).ok());
  ExpectOpenFails(dir.File("m"), "tensor \"0.bias\" has shape [3] but \"0.weight\" has 2 output features");
}

TEST(DenseModelErrors, WeightNotTwoDimensional) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.File("m"), {{"0.weight", DType::F32, {2, 1, 1}, std::vector<uint8_t>(8)}}, {}).ok());
  ExpectOpenFails(dir.File("m"), "tensor \"0.weight\" has shape [2, 1, 1]; a Linear weight is [out_features, in_features]");
}

TEST(DenseModelErrors, ZeroSizedWeight) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.File("m"), {{"0.weight", DType::F32, {0, 3}, {}}}, {}).ok());
  ExpectOpenFails(dir.File("m"), "each dimension must be between 1");
}

TEST(DenseModelErrors, UnknownActivation) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.File("m"), {{"0.weight", DType::F32, {1, 1}, std::vector<uint8_t>(4)}},
                                     {{"activation", "swish"}}).ok());
  ExpectOpenFails(dir.File("m"), "unknown activation \"swish\"");
}

TEST(DenseModelErrors, UnsupportedDType) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.File("m"), {{"0.weight", DType::I32, {1, 1}, std::vector<uint8_t>(4)}}, {}).ok());
  ExpectOpenFails(dir.File("m"), "tensor \"0.weight\" has dtype I32; the dense engine supports F32, F16 and BF16");
}

TEST(DenseModelErrors, MetadataNamesAnotherEngine) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.File("m"), {{"0.weight", DType::F32, {1, 1}, std::vector<uint8_t>(4)}},
                                     {{"engine", "llama"}}).ok());
  ExpectOpenFails(dir.File("m"), "names engine \"llama\", not \"dense\"");
}

TEST(DenseModelErrors, NoLayers) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.File("m"), {}, {{"activation", "relu"}}).ok());
  ExpectOpenFails(dir.File("m"), "no layers");
}

TEST(DenseModelErrors, MalformedFileIsReportedByTheParser) {
  TempDir dir;
  std::ofstream(dir.File("m")) << "not a model";
  ExpectOpenFails(dir.File("m"), "model file \"" + dir.File("m") + "\"");
}

TEST(DenseModelErrors, MissingFileIsNotFound) {
  ExpectOpenFails("/nonexistent/model.safetensors", "cannot open", Code::kNotFound);
}

TEST(DenseModelErrors, EmptyPathIsInvalid) { ExpectOpenFails("", "needs a model file"); }

TEST(DenseModelErrors, DeviceMemoryWithoutCopiesIsRefused) {
  TempDir dir;
  WriteModel(dir.File("m"), {{0, 2, 2}}, "relu");
  HostMemory memory;
  wp_device_memory device = *memory.service();
  device.host_addressable = 0;
  device.write = nullptr;
  device.read = nullptr;
  Result<Engine> engine = Engine::Open(FindBuiltinEngine("dense"), Spec(dir.File("m")), &device);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), Code::kFailedPrecondition);
}

}  // namespace
}  // namespace warmpool
