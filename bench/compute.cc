#include "bench/compute.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>

#include <dlfcn.h>

#include <cblas.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "bench/skeleton.h"
#include "bench/stats.h"
#include "bench/torch_baseline.h"
#include "devmem/host_memory.h"
#include "engines/builtin.h"
#include "engines/catalog/builtin_engines.h"
#include "engines/dense_cpu.h"
#include "engines/half.h"
#include "engines/safetensors.h"

namespace warmpool::bench {
namespace {

using safetensors::DType;
using Clock = std::chrono::steady_clock;

// The f32 weights [out, in] and biases of every layer, as generated.
struct Weights {
  std::vector<std::vector<float>> weight, bias;
};

Weights Generate(const std::vector<uint32_t>& widths) {
  std::mt19937 generator(7);
  Weights w;
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(widths[l]));
    std::uniform_real_distribution<float> values(-bound, bound);
    w.weight.emplace_back(size_t{widths[l]} * widths[l + 1]);
    w.bias.emplace_back(widths[l + 1]);
    for (float& v : w.weight.back()) v = values(generator);
    for (float& v : w.bias.back()) v = values(generator);
  }
  return w;
}

std::vector<uint8_t> Encode(const std::vector<float>& values, DType dtype) {
  const size_t size = dtype == DType::F32 ? 4 : 2;
  std::vector<uint8_t> bytes(values.size() * size);
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::F32) {
      std::memcpy(&bytes[4 * i], &values[i], 4);
      continue;
    }
    const uint16_t bits = dtype == DType::F16 ? safetensors::FloatToHalf(values[i]) : safetensors::FloatToBF16(values[i]);
    std::memcpy(&bytes[2 * i], &bits, 2);
  }
  return bytes;
}

Status WriteModel(const std::string& path, const std::vector<uint32_t>& widths, const Weights& w, DType dtype) {
  std::vector<safetensors::TensorToWrite> tensors;
  for (size_t l = 0; l < w.weight.size(); ++l) {
    const std::string index = std::to_string(2 * l);
    tensors.push_back({index + ".weight", dtype, {widths[l + 1], widths[l]}, Encode(w.weight[l], dtype)});
    tensors.push_back({index + ".bias", dtype, {widths[l + 1]}, Encode(w.bias[l], dtype)});
  }
  return safetensors::WriteFile(path, tensors, {{"activation", "relu"}, {"engine", "dense"}});
}

// OpenBLAS, loaded at run time: warmpool-bench does not link it, so that the binary goes where
// OpenBLAS is not (the GPU bundle), and only this mode needs it there.
struct OpenBlas {
  decltype(&cblas_sgemv) sgemv = nullptr;
  decltype(&cblas_sgemm) sgemm = nullptr;
  void (*set_num_threads)(int) = nullptr;
};

Result<OpenBlas> LoadOpenBlas() {
  void* library = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    return Error(Code::kFailedPrecondition, "--compute measures against OpenBLAS, which is not here ({}): "
                 "install libopenblas0", dlerror());
  }
  OpenBlas blas;
  blas.sgemv = reinterpret_cast<decltype(blas.sgemv)>(dlsym(library, "cblas_sgemv"));
  blas.sgemm = reinterpret_cast<decltype(blas.sgemm)>(dlsym(library, "cblas_sgemm"));
  blas.set_num_threads = reinterpret_cast<void (*)(int)>(dlsym(library, "openblas_set_num_threads"));
  if (blas.sgemv == nullptr || blas.sgemm == nullptr || blas.set_num_threads == nullptr) {
    return Error(Code::kFailedPrecondition, "libopenblas.so.0 lacks cblas_sgemv, cblas_sgemm or "
                 "openblas_set_num_threads");
  }
  return blas;  // never closed: the mode runs once per process
}

// numpy's way: one BLAS call per layer, then the bias and the activation.
void BlasForward(const OpenBlas& blas, const std::vector<uint32_t>& widths, const Weights& w, const float* x,
                 uint32_t rows, std::vector<float>& a, std::vector<float>& b) {
  const float* in = x;
  for (size_t l = 0; l < w.weight.size(); ++l) {
    const int k = static_cast<int>(widths[l]), n = static_cast<int>(widths[l + 1]);
    std::vector<float>& out = l % 2 == 0 ? a : b;
    if (rows == 1) {
      blas.sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, w.weight[l].data(), k, in, 1, 0.0f, out.data(), 1);
    } else {
      blas.sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), n, k, 1.0f, in, k,
                  w.weight[l].data(), k, 0.0f, out.data(), n);
    }
    const bool last = l + 1 == w.weight.size();
    for (uint32_t r = 0; r < rows; ++r) {
      float* row = out.data() + size_t{r} * n;
      for (int i = 0; i < n; ++i) row[i] = last ? row[i] + w.bias[l][i] : std::max(0.0f, row[i] + w.bias[l][i]);
    }
    in = out.data();
  }
}

template <typename F>
double TimeMs(F&& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct BatchResult {
  uint32_t rows = 0;
  Spread blas, f32, f16, bf16;
  std::optional<Spread> torch_bf16;
};

// PyTorch on the bf16 file, or why not.
struct Torch {
  std::unique_ptr<TorchBaseline> baseline;
  std::string missing;
};

Status Run(const ComputeOptions& o, BenchRun& run, std::vector<BatchResult>& results, Torch& torch) {
  if (o.layers.size() < 2) return Error(Code::kInvalidArgument, "--layers needs at least two widths");
  Result<OpenBlas> blas = LoadOpenBlas();
  if (!blas.ok()) return blas.status();
  blas->set_num_threads(static_cast<int>(o.threads));
  dense::SetCpuThreads(static_cast<int>(o.threads));
  const Weights weights = Generate(o.layers);
  HostMemory memory;
  std::vector<Engine> engines;
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    const std::string path = run.File(fmt::format("{}.safetensors", safetensors::DTypeName(dtype)));
    if (Status s = WriteModel(path, o.layers, weights, dtype); !s.ok()) return s;
    const std::string name(safetensors::DTypeName(dtype));
    Result<Engine> engine = Engine::Open(FindBuiltinEngine("dense"), SpecForFile(name.c_str(), path.c_str(), nullptr, 0, 0),
                                         memory.service());
    if (dtype == DType::BF16 && torch.missing.empty()) {  // forked before the engines start threads
      Result<std::unique_ptr<TorchBaseline>> started = TorchBaseline::Start(run, o.torch_python, path, o.threads);
      if (started.ok()) {
        torch.baseline = std::move(*started);
      } else {
        torch.missing = started.status().message();
      }
    }
    if (!engine.ok()) return engine.status();
    if (Status s = engine->Load(); !s.ok()) return s;
    engines.push_back(std::move(*engine));
  }
  const uint32_t widest = *std::max_element(o.layers.begin(), o.layers.end());
  for (uint32_t rows : o.batches) {
    std::mt19937 generator(rows);
    std::uniform_real_distribution<float> values(-1.0f, 1.0f);
    std::vector<float> x(size_t{rows} * o.layers.front());
    for (float& v : x) v = values(generator);
    std::vector<float> a(size_t{rows} * widest), b(size_t{rows} * widest), out;
    std::vector<double> blas_ms, engine_ms[3], torch_ms;
    // One call of each first (not timed): primitives made, pages touched.
    BlasForward(*blas, o.layers, weights, x.data(), rows, a, b);
    for (Engine& e : engines) {
      if (Status s = e.Infer(x, rows, o.layers.front(), out); !s.ok()) return s;
    }
    if (torch.baseline) {
      if (Result<double> ms = torch.baseline->CallMs(rows); !ms.ok()) return ms.status();
    }
    for (uint32_t round = 0; round < o.rounds; ++round) {
      blas_ms.push_back(TimeMs([&] { BlasForward(*blas, o.layers, weights, x.data(), rows, a, b); }));
      for (size_t e = 0; e < engines.size(); ++e) {
        Status status;
        engine_ms[e].push_back(TimeMs([&] { status = engines[e].Infer(x, rows, o.layers.front(), out); }));
        if (!status.ok()) return status;
      }
      if (torch.baseline) {
        Result<double> ms = torch.baseline->CallMs(rows);
        if (!ms.ok()) return ms.status();
        torch_ms.push_back(*ms);
      }
    }
    results.push_back({rows, SpreadOf(blas_ms), SpreadOf(engine_ms[0]), SpreadOf(engine_ms[1]), SpreadOf(engine_ms[2]),
                       torch_ms.empty() ? std::nullopt : std::optional<Spread>(SpreadOf(torch_ms))});
  }
  return OkStatus();
}

void Print(const ComputeOptions& o, const std::vector<BatchResult>& results, const Torch& torch) {
  auto ratio = [](const Spread& a, const std::optional<Spread>& b) { return b ? a.median_ms / b->median_ms : 0.0; };
  if (o.json) {
    std::string batches;
    for (const BatchResult& r : results) {
      batches += fmt::format(
          "{}{{\"rows\": {}, \"openblas_f32\": {}, \"engine_f32\": {}, \"engine_f16\": {}, \"engine_bf16\": {}, "
          "\"torch_bf16\": {}, \"f32_vs_openblas\": {:.3f}, \"f16_vs_f32\": {:.3f}, \"bf16_vs_openblas\": {:.3f}, "
          "\"bf16_vs_torch\": {}}}",
          batches.empty() ? "" : ", ", r.rows, SpreadJson(r.blas), SpreadJson(r.f32), SpreadJson(r.f16),
          SpreadJson(r.bf16), r.torch_bf16 ? SpreadJson(*r.torch_bf16) : "null", r.f32.median_ms / r.blas.median_ms,
          r.f16.median_ms / r.f32.median_ms, r.bf16.median_ms / r.blas.median_ms,
          r.torch_bf16 ? fmt::format("{:.3f}", ratio(r.bf16, r.torch_bf16)) : "null");
    }
    std::printf("{\"mode\": \"compute\", \"layers\": [%s], \"threads\": %u, \"rounds\": %u, \"torch\": %s, "
                "\"batches\": [%s]}\n",
                fmt::format("{}", fmt::join(o.layers, ", ")).c_str(), o.threads, o.rounds,
                torch.baseline ? "true" : "false", batches.c_str());
    return;
  }
  std::string out = fmt::format("dense MLP {} (relu, biases), {} thread(s), {} rounds; ms per call: median [min, max]\n",
                                fmt::join(o.layers, " -> "), o.threads, o.rounds);
  auto cell = [](const Spread& s) { return fmt::format("{:.2f} [{:.2f}, {:.2f}]", s.median_ms, s.min_ms, s.max_ms); };
  out += fmt::format("{:>6}  {:>26}  {:>26}  {:>26}  {:>26}  {:>26}  {:>9}  {:>8}  {:>9}  {:>10}\n", "rows",
                     "OpenBLAS f32", "engine f32", "engine f16", "engine bf16", "PyTorch bf16", "f32/BLAS", "f16/f32",
                     "bf16/BLAS", "bf16/torch");
  for (const BatchResult& r : results) {
    out += fmt::format("{:>6}  {:>26}  {:>26}  {:>26}  {:>26}  {:>26}  {:>8.2f}x  {:>7.2f}x  {:>8.2f}x  {:>10}\n", r.rows,
                       cell(r.blas), cell(r.f32), cell(r.f16), cell(r.bf16), r.torch_bf16 ? cell(*r.torch_bf16) : "-",
                       r.f32.median_ms / r.blas.median_ms, r.f16.median_ms / r.f32.median_ms,
                       r.bf16.median_ms / r.blas.median_ms,
                       r.torch_bf16 ? fmt::format("{:.2f}x", ratio(r.bf16, r.torch_bf16)) : "-");
  }
  if (!torch.baseline) out += fmt::format("no PyTorch baseline: {}\n", torch.missing);
  out += "targets: f32/BLAS <= 1.2x at batch 1 and <= 1.1x at large batches; f16/f32 <= 0.7x at batch 1; "
         "bf16/torch <= 1.2x at batch 1 and large batches\n";
  std::fputs(out.c_str(), stdout);
}

}  // namespace

int RunCompute(const ComputeOptions& options) {
  return BenchRun::Main("--compute", [&](BenchRun& run) {
    std::vector<BatchResult> results;
    Torch torch;
    if (options.torch_python.empty()) torch.missing = "--torch-python is empty";
    if (Status s = Run(options, run, results, torch); !s.ok()) return s;
    Print(options, results, torch);
    return OkStatus();
  });
}

}  // namespace warmpool::bench
