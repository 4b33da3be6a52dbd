#include "bench/model_file.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "engines/safetensors.h"

namespace warmpool::bench {

namespace {

// splitmix64: fast enough for hundreds of MiB of weights, identical everywhere for a seed.
uint64_t Next(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

safetensors::TensorToWrite RandomTensor(std::string name, std::vector<uint64_t> shape,
                                        uint64_t fan_in, uint64_t& state) {
  safetensors::TensorToWrite t{std::move(name), safetensors::DType::F32, std::move(shape), {}};
  uint64_t count = 1;
  for (uint64_t d : t.shape) count *= d;
  t.data.resize(count * sizeof(float));
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  float* out = reinterpret_cast<float*>(t.data.data());  // vector<uint8_t> storage is malloc'd
  for (uint64_t i = 0; i < count; ++i) {
    double unit = static_cast<double>(Next(state) >> 11) * 0x1p-53;
    float v = static_cast<float>((2.0 * unit - 1.0) * bound);
    std::memcpy(out + i, &v, sizeof(float));
  }
  return t;
}

}  // namespace

uint32_t HiddenWidthFor(uint64_t target_bytes, uint32_t in_features, uint32_t out_features) {
  // floats = hidden * (in + 1) + out * hidden + out
  double floats = static_cast<double>(target_bytes) / sizeof(float) - out_features;
  double per_hidden = static_cast<double>(in_features) + 1.0 + out_features;
  double hidden = std::round(floats / per_hidden);
  if (hidden < 1) return 1;
  if (hidden > 1e9) return 1000000000u;
  return static_cast<uint32_t>(hidden);
}

Result<DenseModelFile> WriteDenseModel(const std::string& path, uint64_t target_bytes,
                                       uint32_t in_features, uint32_t out_features,
                                       uint64_t seed) {
  DenseModelFile file;
  file.path = path;
  file.in_features = in_features;
  file.out_features = out_features;
  file.hidden = HiddenWidthFor(target_bytes, in_features, out_features);
  uint64_t state = seed;
  std::vector<safetensors::TensorToWrite> tensors;
  tensors.push_back(RandomTensor("0.weight", {file.hidden, in_features}, in_features, state));
  tensors.push_back(RandomTensor("0.bias", {file.hidden}, in_features, state));
  tensors.push_back(RandomTensor("2.weight", {out_features, file.hidden}, file.hidden, state));
  tensors.push_back(RandomTensor("2.bias", {out_features}, file.hidden, state));
  for (const auto& t : tensors) file.weight_bytes += t.data.size();
  Status written =
      safetensors::WriteFile(path, tensors, {{"activation", "relu"}, {"engine", "dense"}});
  if (!written.ok()) return written;
  return file;
}

}  // namespace warmpool::bench
