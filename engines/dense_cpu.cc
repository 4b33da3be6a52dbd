#include "engines/dense_cpu.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <new>
#include <numbers>
#include <optional>
#include <vector>

#include <dnnl.hpp>
#include <fmt/format.h>

#include "engines/bf16_gemv.h"
#include "engines/gemv.h"
#include "engines/half.h"

namespace warmpool::dense {
namespace {

using safetensors::DType;
using safetensors::TensorInfo;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

std::atomic<int> g_threads{1};

constexpr size_t kMatmulsPerLayer = 32;

constexpr float kInvSqrt2 = 1.0f / std::numbers::sqrt2_v<float>;
constexpr float kInfinity = std::numeric_limits<float>::infinity();

dnnl::engine& CpuEngine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// How a layer is computed, chosen once at start from its dtype and what this CPU has.
enum class Path {
  kF32,    // oneDNN f32 matmul on the stored weights (kF32GemvRows rows or fewer: the AVX-512
           // kernel where the CPU has it)
  kBF16,   // oneDNN bf16 matmul on the stored weights, activations narrowed (kBF16GemvRows rows
           // or fewer: the AVX-512 BF16 kernel where the CPU has it, on the same narrowed inputs)
  kF16,    // the F16C kernel up to kGemvRows rows; widened into scratch and f32 matmul above
  kWiden,  // widened into scratch and f32 matmul (a 16-bit dtype this CPU has no path for)
};

std::string_view PathName(Path path) {
  switch (path) {
    case Path::kF32: return HaveF32Gemv() ? "f32 kernel (small batches) or matmul" : "f32 matmul";
    case Path::kBF16: return HaveBF16Gemv() ? "bf16 kernel (small batches) or matmul" : "bf16 matmul";
    case Path::kF16: return "f16 kernel";
    case Path::kWiden: return "widened to f32";
  }
  return "?";
}

// A matmul for one layer at one batch size, with its descriptors (for wrapping the buffers).
struct Matmul {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul primitive;
  std::optional<dnnl::eltwise_forward> gelu;  // in place on the output, for a GELU layer
};

struct Layer {
  LinearLayer spec;
  Path path = Path::kF32;
  bool activate = false;      // every layer but the last
  std::vector<float> bias;    // widened once; empty without one
  std::map<uint32_t, Matmul> matmuls;  // by batch size, made on first use (kMatmulsPerLayer at most)
};

// The activations oneDNN may fuse into the matmul. Not ReLU: oneDNN's eltwise_relu with alpha 0 is
// vmaxps(x, 0), which returns its second operand, 0, when x is NaN (no alpha, clip or binary_max
// post-op keeps NaN either). Not GELU: oneDNN's gelu_erf of -Inf is NaN (-Inf * 0), where the
// limit is 0. Those two run after the matmul (ActivateAfterMatmul).
bool FusedInMatmul(Activation activation) { return activation == Activation::kTanh; }

// y (rows x out, f32) = x (rows x in) * W^T + b, then tanh if fused. W is [out, in] as stored,
// which is the (in x out) weights matrix in oneDNN's "ba" layout: no repacking.
Matmul MakeMatmul(const Layer& layer, uint32_t rows, dt type, Activation activation) {
  const auto m = static_cast<dnnl::memory::dim>(rows);
  const auto k = static_cast<dnnl::memory::dim>(layer.spec.in_features);
  const auto n = static_cast<dnnl::memory::dim>(layer.spec.out_features);
  dnnl::memory::desc src({m, k}, type, tag::ab);
  dnnl::memory::desc weights({k, n}, type, tag::ba);
  dnnl::memory::desc dst({m, n}, dt::f32, tag::ab);
  dnnl::primitive_attr attr;
  if (layer.activate && FusedInMatmul(activation)) {
    dnnl::post_ops ops;
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_tanh, 0.0f, 0.0f);
    attr.set_post_ops(ops);
  }
  dnnl::matmul::desc desc = layer.bias.empty()
                                ? dnnl::matmul::desc(src, weights, dst)
                                : dnnl::matmul::desc(src, weights, dnnl::memory::desc({1, n}, dt::f32, tag::ab), dst);
  Matmul made{dnnl::matmul::primitive_desc(desc, attr, CpuEngine()), {}, {}};
  made.primitive = dnnl::matmul(made.pd);
  if (layer.activate && activation == Activation::kGelu) {
    dnnl::eltwise_forward::desc gelu(dnnl::prop_kind::forward_inference, dnnl::algorithm::eltwise_gelu_erf, dst);
    made.gelu = dnnl::eltwise_forward(dnnl::eltwise_forward::primitive_desc(gelu, CpuEngine()));
  }
  return made;
}

}  // namespace

bool HaveBF16Matmul() {
  // oneDNN says whether this CPU has one when it is asked for a primitive (AVX-512 and up: on an
  // AVX2 CPU it refuses).
  static const bool have = [] {
    try {
      dnnl::memory::desc src({1, 16}, dt::bf16, tag::ab);
      dnnl::memory::desc weights({16, 16}, dt::bf16, tag::ba);
      dnnl::memory::desc dst({1, 16}, dt::f32, tag::ab);
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, dst), CpuEngine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return have;
}

namespace {

bool Aligned(const void* p, size_t alignment) { return reinterpret_cast<uintptr_t>(p) % alignment == 0; }

class OneDnnLayers final : public CpuLayers {
 public:
  explicit OneDnnLayers(Activation activation) : activation_(activation), stream_(CpuEngine()) {}

  Status Prepare(const DenseModel& model, const StoredBytes& stored) {
    for (size_t i = 0; i < model.layers.size(); ++i) {
      Layer layer;
      layer.spec = model.layers[i];
      layer.activate = i + 1 < model.layers.size();
      if (layer.spec.bias) {
        Result<const uint8_t*> bytes = stored(*layer.spec.bias);
        if (!bytes.ok()) return bytes.status();
        layer.bias.resize(layer.spec.out_features);
        WidenToFloat(*bytes, layer.spec.bias->dtype, layer.bias.size(), layer.bias.data());
      }
      layer.path = ChoosePath(layer);
      layers_.push_back(std::move(layer));
    }
    // Left uninitialised: every element is written before it is read, and pages a small batch
    // never reaches stay untouched, so a replica's attach does not pay for the whole workspace.
    const ScratchSizes sizes = ScratchFor(model);
    activations_[0].reset(new float[sizes.activation_floats]);
    activations_[1].reset(new float[sizes.activation_floats]);
    conversion_.reset(new float[sizes.conversion_floats]);
    narrow_.reset(new uint16_t[sizes.narrow_halves]);
    return OkStatus();
  }

  Status Run(const float* input, uint32_t rows, float* output, const StoredBytes& stored) override {
    // The OpenMP thread count belongs to the calling thread: set it on the one that computes.
    omp_set_num_threads(CpuThreads());
    const float* x = input;
    for (size_t i = 0; i < layers_.size(); ++i) {
      float* y = i + 1 == layers_.size() ? output : activations_[i % 2].get();
      Result<const uint8_t*> weight = stored(layers_[i].spec.weight);
      if (!weight.ok()) return weight.status();
      if (Status s = RunLayer(layers_[i], *weight, x, rows, y); !s.ok()) return s;
      x = y;
    }
    return OkStatus();
  }

  std::string Describe() const override {
    const dnnl_version_t* version = dnnl_version();
    std::map<Path, int> counts;
    for (const Layer& layer : layers_) ++counts[layer.path];
    std::string paths;
    for (const auto& [path, count] : counts) paths += fmt::format("{}{} {}", paths.empty() ? "" : ", ", count, PathName(path));
    return fmt::format("layers on the CPU with oneDNN {}.{}.{} ({} threads): {}", version->major, version->minor,
                       version->patch, CpuThreads(), paths);
  }

 private:
  Path ChoosePath(const Layer& layer) {
    switch (layer.spec.weight.dtype) {
      case DType::F16:
        return HaveF16Gemv() ? Path::kF16 : Path::kWiden;
      case DType::BF16:
        if (!HaveBF16Matmul()) return Path::kWiden;
        try {
          MakeMatmul(layer, 1, dt::bf16, activation_);
          return Path::kBF16;
        } catch (const dnnl::error&) {
          return Path::kWiden;
        }
      default:
        return Path::kF32;
    }
  }

  Status RunLayer(Layer& layer, const uint8_t* weight, const float* x, uint32_t rows, float* y) {
    const LinearLayer& spec = layer.spec;
    if (layer.path == Path::kF16 && rows <= kGemvRows) {
      F16Gemv(weight, spec.in_features, spec.out_features, x, rows, layer.bias.empty() ? nullptr : layer.bias.data(),
              y, CpuThreads());
      if (layer.activate) Activate(activation_, y, uint64_t{rows} * spec.out_features);
      return OkStatus();
    }
    if (layer.path == Path::kF32 && rows <= kF32GemvRows && HaveF32Gemv()) {
      F32Gemv(weight, spec.in_features, spec.out_features, x, rows, layer.bias.empty() ? nullptr : layer.bias.data(),
              y, CpuThreads());
      if (layer.activate) Activate(activation_, y, uint64_t{rows} * spec.out_features);
      return OkStatus();
    }
    if (layer.path == Path::kBF16 && rows <= kBF16GemvRows && HaveBF16Gemv()) {
      NarrowToBF16(x, uint64_t{rows} * spec.in_features);
      BF16Gemv(weight, spec.in_features, spec.out_features, narrow_.get(), rows,
               layer.bias.empty() ? nullptr : layer.bias.data(), y, CpuThreads());
      if (layer.activate) Activate(activation_, y, uint64_t{rows} * spec.out_features);
      return OkStatus();
    }
    dt type = dt::f32;
    const void* weights = weight;
    const void* src = x;
    switch (layer.path) {
      case Path::kBF16:
        type = dt::bf16;
        if (!Aligned(weight, 2)) {
          std::memcpy(conversion_.get(), weight, spec.weight.bytes());
          weights = conversion_.get();
        }
        NarrowToBF16(x, uint64_t{rows} * spec.in_features);
        src = narrow_.get();
        break;
      case Path::kF32:
        if (!Aligned(weight, alignof(float))) {
          std::memcpy(conversion_.get(), weight, spec.weight.bytes());
          weights = conversion_.get();
        }
        break;
      case Path::kF16:
        WidenHalves(weight, spec.weight.numel(), conversion_.get(), CpuThreads());
        weights = conversion_.get();
        break;
      case Path::kWiden:
        WidenToFloat(weight, spec.weight.dtype, spec.weight.numel(), conversion_.get());
        weights = conversion_.get();
        break;
    }
    try {
      auto found = layer.matmuls.find(rows);
      if (found == layer.matmuls.end()) {
        // Batching makes every batch size up to kMaxBatch possible: a bounded set is kept here
        // (oneDNN's own primitive cache makes one made again cheap).
        if (layer.matmuls.size() >= kMatmulsPerLayer) layer.matmuls.clear();
        found = layer.matmuls.emplace(rows, MakeMatmul(layer, rows, type, activation_)).first;
      }
      Matmul& mm = found->second;
      // oneDNN takes non-const handles; it only reads the inputs.
      std::unordered_map<int, dnnl::memory> args = {
          {DNNL_ARG_SRC, dnnl::memory(mm.pd.src_desc(), CpuEngine(), const_cast<void*>(src))},
          {DNNL_ARG_WEIGHTS, dnnl::memory(mm.pd.weights_desc(), CpuEngine(), const_cast<void*>(weights))},
          {DNNL_ARG_DST, dnnl::memory(mm.pd.dst_desc(), CpuEngine(), y)}};
      if (!layer.bias.empty()) {
        args.emplace(DNNL_ARG_BIAS, dnnl::memory(mm.pd.bias_desc(), CpuEngine(), layer.bias.data()));
      }
      mm.primitive.execute(stream_, args);
      stream_.wait();
      if (layer.activate) ActivateAfterMatmul(mm, y, uint64_t{rows} * spec.out_features);
    } catch (const dnnl::error& e) {
      return Error(Code::kInternal, "layer {} ({} x {}, {}): oneDNN: {}", spec.index, spec.out_features,
                   spec.in_features, PathName(layer.path), e.what());
    }
    return OkStatus();
  }

  void ActivateAfterMatmul(Matmul& mm, float* y, uint64_t count) {
    if (FusedInMatmul(activation_)) return;
    if (!mm.gelu) {
      Activate(activation_, y, count);
      return;
    }
    // oneDNN's own GELU (vectorized; ours is scalar erf), with -Inf first made -FLT_MAX, whose
    // GELU it computes as 0, the limit at -Inf.
#pragma omp simd
    for (uint64_t i = 0; i < count; ++i) y[i] = y[i] == -kInfinity ? -std::numeric_limits<float>::max() : y[i];
    dnnl::memory values(mm.pd.dst_desc(), CpuEngine(), y);
    mm.gelu->execute(stream_, {{DNNL_ARG_SRC, values}, {DNNL_ARG_DST, values}});
    stream_.wait();
  }

  void NarrowToBF16(const float* x, uint64_t count) {
    for (uint64_t i = 0; i < count; ++i) narrow_[i] = safetensors::FloatToBF16(x[i]);
  }

  Activation activation_;
  dnnl::stream stream_;
  std::vector<Layer> layers_;
  std::unique_ptr<float[]> activations_[2];
  std::unique_ptr<float[]> conversion_;
  std::unique_ptr<uint16_t[]> narrow_;
};

}  // namespace

void Activate(Activation activation, float* values, uint64_t count) {
  switch (activation) {
    case Activation::kRelu:
      // `x < 0 ? 0 : x`, not std::max(0.0f, x) or fmaxf(x, 0), which give 0 for NaN: a comparison
      // with NaN is false, so NaN passes, and vectorized this is vmaxps(0, x), the operand order
      // that returns x when x is NaN (vmaxps returns its second operand when either is NaN).
#pragma omp simd
      for (uint64_t i = 0; i < count; ++i) values[i] = values[i] < 0.0f ? 0.0f : values[i];
      return;
    case Activation::kGelu:
      // x * Phi(x) tends to 0 at -Inf, where 0.5 x (1 + erf(x / sqrt 2)) is -Inf * 0 = NaN.
      for (uint64_t i = 0; i < count; ++i) {
        const float x = values[i];
        values[i] = x == -kInfinity ? 0.0f : 0.5f * x * (1.0f + std::erf(x * kInvSqrt2));
      }
      return;
    case Activation::kTanh:
      for (uint64_t i = 0; i < count; ++i) values[i] = std::tanh(values[i]);
      return;
    case Activation::kNone:
      return;
  }
}

void SetCpuThreads(int threads) { g_threads.store(std::max(1, threads)); }
int CpuThreads() { return g_threads.load(); }

Result<std::unique_ptr<CpuLayers>> CpuLayers::Start(const DenseModel& model, const StoredBytes& stored) {
  try {
    auto layers = std::make_unique<OneDnnLayers>(model.activation);
    if (Status s = layers->Prepare(model, stored); !s.ok()) return s;
    return std::unique_ptr<CpuLayers>(std::move(layers));
  } catch (const dnnl::error& e) {
    return Error(Code::kInternal, "cannot start the CPU layers: oneDNN: {}", e.what());
  } catch (const std::bad_alloc&) {
    return Error(Code::kResourceExhausted, "cannot allocate the inference workspace");
  }
}

}  // namespace warmpool::dense
