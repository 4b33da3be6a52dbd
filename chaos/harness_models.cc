// The models and configuration of the daemon the harness starts itself: dense victims, a bystander,
// fillers that force evictions under the budget, and malformed files.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "chaos/harness.h"
#include "engines/dense_model.h"
#include "engines/safetensors.h"

namespace warmpool::chaos {

namespace fs = std::filesystem;

namespace {

// A dense model with random weights, as warmpool-mkmodel writes them.
Status WriteDense(const std::string& path, const std::vector<uint64_t>& layers, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<safetensors::TensorToWrite> tensors;
  for (size_t i = 0; i + 1 < layers.size(); i++) {
    uint64_t in = layers[i], out = layers[i + 1];
    float bound = 1.0f / std::sqrt(static_cast<float>(in));
    std::uniform_real_distribution<float> dist(-bound, bound);
    auto make = [&](const std::string& name, std::vector<uint64_t> shape, uint64_t n) {
      std::vector<uint8_t> data(n * 4);
      for (uint64_t k = 0; k < n; k++) {
        float v = dist(rng);
        std::memcpy(data.data() + k * 4, &v, 4);
      }
      tensors.push_back({name, safetensors::DType::F32, std::move(shape), std::move(data)});
    };
    make(std::to_string(2 * i) + ".weight", {out, in}, out * in);
    make(std::to_string(2 * i) + ".bias", {out}, out);
  }
  return safetensors::WriteFile(path, tensors, {{"activation", "relu"}, {"engine", "dense"}});
}

uint64_t AccountedBytes(const std::string& path) {
  auto header = safetensors::ReadHeader(path);
  if (!header.ok()) return 0;
  auto model = dense::DescribeModel(*header, path);
  if (!model.ok()) return 0;
  return header->data_bytes + dense::WorkspaceBytes(dense::ScratchFor(*model));
}

}  // namespace

Status Harness::MakeModels() {
  fs::create_directories(dir_ + "/models");
  auto dense = [&](const std::string& name, std::vector<uint64_t> layers, uint64_t seed,
                   ModelUnderTest* out) -> Status {
    std::string path = dir_ + "/models/" + name + ".safetensors";
    if (Status s = WriteDense(path, layers, seed); !s.ok()) return s;
    if (out != nullptr) {
      *out = ModelUnderTest{name, path, static_cast<uint32_t>(layers.front()),
                            static_cast<uint32_t>(layers.back())};
    }
    return OkStatus();
  };
  if (Status s = dense("victim", {32, 64, 8}, 1, &victim_); !s.ok()) return s;
  for (int i = 0; i < 48; i++) {
    ModelUnderTest m;
    if (Status s = dense(fmt::format("v{:02}", i), {32, 64, 8}, 100 + i, &m); !s.ok()) return s;
    victims_.push_back(m);
  }
  if (Status s = dense("bystander", {32, 48, 8}, 2, &bystander_); !s.ok()) return s;
  for (int i = 0; i < 4; i++) {
    ModelUnderTest m;
    if (Status s = dense("filler" + std::to_string(i), {64, 512, 64}, 10 + i, &m); !s.ok()) return s;
    fillers_.push_back(m);
  }
  // Malformed files of three kinds: noise, a header promising more data than the file has, and
  // layers that do not chain.
  {
    std::ofstream f(dir_ + "/models/noise.safetensors", std::ios::binary);
    std::mt19937 rng(7);
    for (int i = 0; i < 4096; i++) f.put(static_cast<char>(rng()));
  }
  if (Status s = dense("truncated", {32, 64, 8}, 3, nullptr); !s.ok()) return s;
  fs::resize_file(dir_ + "/models/truncated.safetensors",
                  fs::file_size(dir_ + "/models/truncated.safetensors") - 100);
  {
    std::vector<safetensors::TensorToWrite> t = {
        {"0.weight", safetensors::DType::F32, {4, 8}, std::vector<uint8_t>(128)},
        {"2.weight", safetensors::DType::F32, {2, 5}, std::vector<uint8_t>(40)}};
    if (Status s = safetensors::WriteFile(dir_ + "/models/unchained.safetensors", t, {}); !s.ok()) {
      return s;
    }
  }
  broken_ = {"noise", "truncated", "unchained"};

  // The budget holds the victim, the bystander and two and a half fillers: the budget scenario
  // forces evictions, the others never need one.
  uint64_t budget = AccountedBytes(victim_.path) + AccountedBytes(bystander_.path) +
                    AccountedBytes(fillers_[0].path) * 5 / 2;
  std::ofstream config(dir_ + "/config.toml");
  config << "[daemon]\nworkers_per_device = 2\ndefault_deadline_ms = 4000\n"
         << "[pool]\nbudget = " << budget << "\npark_budget = \"64MiB\"\n"
         << "[recovery]\ninference_grace_ms = 300\nload_stall_ms = 1000\n"
         << "crash_loop_crashes = 3\ncrash_loop_window_ms = 20000\n"
         << "failed_cooldown_ms = 1000\nfailed_cooldown_max_ms = 4000\n"
         << "respawn_min_ms = 20\nrespawn_max_ms = 400\nrespawn_stable_ms = 5000\n"
         // cuda: device weights kept across a restart too (on a GPU the warm-restart scenario then
         // shows whether an allocation outlives its owner; the driver double's always does).
         << "[cuda]\nkeep_across_restarts = true\n"
         << "[[models]]\nname = \"echo\"\nengine = \"echo\"\n";
  return OkStatus();
}

}  // namespace warmpool::chaos
