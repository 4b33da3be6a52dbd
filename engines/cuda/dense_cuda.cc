// The dense engine's layers on a GPU, with cuBLAS: the module behind engines/dense_gpu.h.
//
// Layout: PyTorch stores W as [out, in] row-major and computes y = x W^T + b on row-major x. In
// cuBLAS's column-major terms W is an (in x out) matrix with leading dimension in, x an (in x rows)
// one, and y^T = W^T x^T an (out x rows) one: a GEMM with A = W transposed, B = x, m = out,
// n = rows, k = in. The bias is a vector of m, which is what cuBLASLt's bias epilogue adds.
//
// Types: f32 layers run in f32 (TF32 tensor cores only when configured); f16 and bf16 weights are
// used as stored (half the memory and bandwidth) and the activations are narrowed to the same type
// before the GEMM, accumulating and writing f32 (cuBLAS takes A and B of one type). The bias goes
// into cuBLASLt's epilogue; the activations run in a small kernel after it: GELU is the exact erf
// form the CPU reference uses (not the epilogue's tanh approximation), and ReLU must keep NaN,
// which cuBLASLt does not promise for its ReLU epilogue (a max(x, 0) in the CUTLASS manner is 0 for
// NaN). When cuBLASLt has no algorithm for a shape, cublasGemmEx runs it and the kernel adds bias
// and activation. What cuBLASLt is told about a layer at a batch size, and the algorithm it picks,
// is kept for the next call of that shape.
//
// Alignment: safetensors packs tensors without padding, so a weight may start 2, 4 or 8 bytes
// past a 16-byte boundary. cuBLASLt assumes 256-byte alignment unless told otherwise, and a kernel
// picked under that assumption faults (a sticky error that takes the context, and the worker,
// with it): each operand's real alignment goes into the heuristic's preferences.
//
// cuBLAS and cuBLASLt use one workspace, granted from the device budget with the rest; cuBLAS is
// told so (it would otherwise allocate its own, outside the budget).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "engines/cuda/kernels.h"
#include "engines/dense_gpu.h"

namespace warmpool::dense {
namespace {

using safetensors::DType;

std::string CudaError(cudaError_t e) { return fmt::format("{} ({})", cudaGetErrorName(e), cudaGetErrorString(e)); }

Status Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return OkStatus();
  return Error(Code::kInternal, "{}: {}", what, CudaError(e));
}

Status Check(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return OkStatus();
  return Error(Code::kInternal, "{}: {} ({})", what, cublasGetStatusName(s), cublasGetStatusString(s));
}

cudaDataType_t CudaType(DType dtype) {
  return dtype == DType::F16 ? CUDA_R_16F : dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

// The largest power of two (up to 256) the address is a multiple of.
uint32_t Alignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  return static_cast<uint32_t>(std::min<uintptr_t>(256, address & (~address + 1)));
}

// What cuBLASLt was told about one layer at one batch size, and the algorithm it chose (usable
// false: it has none, cublasGemmEx runs that shape). Owns its descriptors.
struct LtGemm {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;
  bool activates = false;  // nothing is left after the epilogue (no activation: ours run after it)
  LtGemm() = default;
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;
  ~LtGemm() {
    if (preference != nullptr) cublasLtMatmulPreferenceDestroy(preference);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

class CudaRunner final : public GpuRunner {
 public:
  ~CudaRunner() override {
    if (started_) cudaSetDevice(device_);
    // Nothing may still run on the workspace when it is unmapped.
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    plans_.clear();
    if (lt_ != nullptr) cublasLtDestroy(lt_);
    if (blas_ != nullptr) cublasDestroy(blas_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (workspace_.ptr != nullptr) memory_->free(memory_->ctx, &workspace_);
  }

  Status Start(const DenseModel& model, const wp_device_memory* memory, const wp_region& weights,
               const GpuOptions& options) {
    memory_ = memory;
    tf32_ = options.tf32;
    activation_ = model.activation;
    in_ = model.in_features;
    out_ = model.out_features;
    // The device is the one that holds the weights (a worker maps only its own device's memory).
    cudaPointerAttributes where{};
    if (Status s = Check(cudaPointerGetAttributes(&where, weights.ptr), "cudaPointerGetAttributes"); !s.ok()) return s;
    if (where.type != cudaMemoryTypeDevice) {
      return Error(Code::kFailedPrecondition, "the weights are not in device memory (CUDA sees memory type {})",
                   static_cast<int>(where.type));
    }
    device_ = where.device;
    if (Status s = Check(cudaSetDevice(device_), "cudaSetDevice"); !s.ok()) return s;
    started_ = true;
    cudaDeviceProp properties{};
    if (cudaGetDeviceProperties(&properties, device_) == cudaSuccess) device_name_ = properties.name;

    const GpuWorkspace plan = PlanGpuWorkspace(model);
    const auto* base = static_cast<const uint8_t*>(weights.ptr);
    for (size_t i = 0; i < model.layers.size(); i++) {
      const LinearLayer& l = model.layers[i];
      if (l.weight.dtype != DType::F32 && l.weight.dtype != DType::F16 && l.weight.dtype != DType::BF16) {
        return Error(Code::kFailedPrecondition, "layer {} is {}, which cuBLAS does not take", l.index,
                     safetensors::DTypeName(l.weight.dtype));
      }
      const uintptr_t at = reinterpret_cast<uintptr_t>(base + l.weight.begin);
      if (at % safetensors::DTypeSize(l.weight.dtype) != 0) {
        return Error(Code::kFailedPrecondition, "layer {}'s weight is not aligned to its element size", l.index);
      }
      layers_.push_back(Layer{base + l.weight.begin, CudaType(l.weight.dtype), nullptr, l.in_features, l.out_features});
      sixteen_ = sixteen_ || l.weight.dtype != DType::F32;
    }

    // Workspace from the budget, like the weights: the memory service asks the device's owner.
    wp_status allocated = memory->alloc(memory->ctx, plan.total, &workspace_);
    if (allocated != WP_OK) {
      workspace_ = wp_region{nullptr, 0, -1};
      return Error(allocated == WP_RESOURCE_EXHAUSTED ? Code::kResourceExhausted : Code::kInternal,
                   "cannot allocate the {}-byte GPU workspace", plan.total);
    }
    auto* space = static_cast<uint8_t*>(workspace_.ptr);
    activations_[0] = reinterpret_cast<float*>(space + plan.activations[0]);
    activations_[1] = reinterpret_cast<float*>(space + plan.activations[1]);
    half_ = space + plan.half;
    blas_workspace_ = space + plan.blas;
    blas_workspace_bytes_ = plan.blas_bytes;

    if (Status s = Check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"); !s.ok()) return s;
    if (Status s = Check(cublasCreate(&blas_), "cublasCreate"); !s.ok()) return s;
    if (Status s = Check(cublasSetStream(blas_, stream_), "cublasSetStream"); !s.ok()) return s;
    // After cublasSetStream, which resets it: cuBLAS works in the budget's workspace too.
    if (Status s = Check(cublasSetWorkspace(blas_, blas_workspace_, blas_workspace_bytes_), "cublasSetWorkspace");
        !s.ok()) {
      return s;
    }
    if (Status s = Check(cublasLtCreate(&lt_), "cublasLtCreate"); !s.ok()) return s;
    plans_.resize(layers_.size());

    // Biases, widened to f32 once: the epilogue and the kernel add f32.
    for (size_t i = 0; i < model.layers.size(); i++) {
      const LinearLayer& l = model.layers[i];
      if (!l.bias) continue;
      float* bias = reinterpret_cast<float*>(space + plan.biases[i]);
      if (Status s = WidenBias(base + l.bias->begin, *l.bias, bias); !s.ok()) return s;
      layers_[i].bias = bias;
    }
    return Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  Status Run(const float* input, uint32_t rows, float* output) override {
    if (rows == 0 || rows > kMaxBatch) {
      return Error(Code::kInvalidArgument, "{} rows in one step, the workspace holds 1 to {}", rows, kMaxBatch);
    }
    if (Status s = Check(cudaSetDevice(device_), "cudaSetDevice"); !s.ok()) return s;
    (void)cudaGetLastError();  // an error an earlier call left on this thread is not this call's
    if (Status s = Check(cudaMemcpyAsync(activations_[0], input, uint64_t{rows} * in_ * sizeof(float),
                                         cudaMemcpyHostToDevice, stream_), "copy of the input");
        !s.ok()) {
      return s;
    }
    const float* x = activations_[0];
    for (size_t i = 0; i < layers_.size(); i++) {
      const Layer& layer = layers_[i];
      float* y = activations_[(i + 1) % 2];
      const bool last = i + 1 == layers_.size();
      const int activation = last ? cuda::kNone : static_cast<int>(activation_);
      const void* b = x;
      if (layer.type != CUDA_R_32F) {
        if (Status s = Check(cuda::LaunchNarrow(x, half_, uint64_t{rows} * layer.in, layer.type == CUDA_R_16BF,
                                                stream_), "narrowing the activations");
            !s.ok()) {
          return s;
        }
        b = half_;
      }
      if (Status s = Gemm(i, b, rows, y, activation); !s.ok()) return s;
      x = y;
    }
    if (Status s = Check(cudaMemcpyAsync(output, x, uint64_t{rows} * out_ * sizeof(float), cudaMemcpyDeviceToHost,
                                         stream_), "copy of the output");
        !s.ok()) {
      return s;
    }
    return Check(cudaStreamSynchronize(stream_), "inference on the GPU");
  }

  std::string Describe() const override {
    return fmt::format("cuBLAS on CUDA device {} ({}), {} layers{}{}", device_, device_name_, layers_.size(),
                       sixteen_ ? ", 16-bit weights as stored" : "", tf32_ ? ", TF32" : "");
  }

 private:
  struct Layer {
    const void* weight;     // device, as stored
    cudaDataType_t type;    // of the weight (and of the activations it multiplies)
    const float* bias;      // device f32, or null
    uint32_t in, out;
  };

  cublasComputeType_t Compute(const Layer& layer) const {
    return layer.type == CUDA_R_32F && tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  }

  // y (out x rows, column-major) = act(W^T b + bias): cuBLASLt with the epilogue where it applies.
  // b is the activation buffer or its 16-bit copy, y an activation buffer: both 256-byte aligned.
  Status Gemm(size_t index, const void* b, uint32_t rows, float* y, int activation) {
    const Layer& layer = layers_[index];
    Result<LtGemm*> plan = PlanFor(index, rows, activation);
    if (!plan.ok()) return plan.status();
    const float one = 1.0f, zero = 0.0f;
    LtGemm& g = **plan;
    if (g.usable) {
      Status s = Check(cublasLtMatmul(lt_, g.op, &one, layer.weight, g.a, b, g.b, &zero, y, g.d, y, g.d, &g.algo,
                                      blas_workspace_, blas_workspace_bytes_, stream_),
                       "cublasLtMatmul");
      if (!s.ok()) return s;
      if (g.activates) return OkStatus();
      return Check(cuda::LaunchBiasActivate(y, nullptr, rows, layer.out, activation, stream_), "the activation");
    }
    // cuBLASLt has no algorithm for this shape: the classic GEMM, then bias and activation.
    Status s = Check(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(layer.out), static_cast<int>(rows),
                                  static_cast<int>(layer.in), &one, layer.weight, layer.type, static_cast<int>(layer.in),
                                  b, layer.type, static_cast<int>(layer.in), &zero, y, CUDA_R_32F,
                                  static_cast<int>(layer.out), Compute(layer), CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx");
    if (!s.ok()) return s;
    return Check(cuda::LaunchBiasActivate(y, layer.bias, rows, layer.out, activation, stream_),
                 "the bias and activation");
  }

  // The layer's plan at this batch size, made the first time it runs.
  Result<LtGemm*> PlanFor(size_t index, uint32_t rows, int activation) {
    std::unique_ptr<LtGemm>& slot = plans_[index][rows];
    if (slot) return slot.get();
    auto g = std::make_unique<LtGemm>();
    if (Status s = DescribeGemm(layers_[index], rows, activation, *g); !s.ok()) {
      plans_[index].erase(rows);
      return s;
    }
    slot = std::move(g);
    return slot.get();
  }

  Status DescribeGemm(const Layer& layer, uint32_t rows, int activation, LtGemm& g) {
    auto set = [&](cublasLtMatmulDescAttributes_t attribute, const void* value, size_t bytes) {
      return Check(cublasLtMatmulDescSetAttribute(g.op, attribute, value, bytes), "cublasLtMatmulDescSetAttribute");
    };
    auto prefer = [&](cublasLtMatmulPreferenceAttributes_t attribute, const void* value, size_t bytes) {
      return Check(cublasLtMatmulPreferenceSetAttribute(g.preference, attribute, value, bytes),
                   "cublasLtMatmulPreferenceSetAttribute");
    };
    if (Status s = Check(cublasLtMatmulDescCreate(&g.op, Compute(layer), CUDA_R_32F), "cublasLtMatmulDescCreate");
        !s.ok()) {
      return s;
    }
    const cublasOperation_t transpose = CUBLAS_OP_T, plain = CUBLAS_OP_N;
    const cublasLtEpilogue_t epilogue = layer.bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    const cudaDataType_t bias_type = CUDA_R_32F;
    Status s = set(CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose));
    if (s.ok()) s = set(CUBLASLT_MATMUL_DESC_TRANSB, &plain, sizeof(plain));
    if (s.ok()) s = set(CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
    if (s.ok() && layer.bias != nullptr) s = set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &layer.bias, sizeof(layer.bias));
    if (s.ok() && layer.bias != nullptr) s = set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type));
    if (s.ok()) s = Check(cublasLtMatrixLayoutCreate(&g.a, layer.type, layer.in, layer.out, layer.in), "layout of W");
    if (s.ok()) s = Check(cublasLtMatrixLayoutCreate(&g.b, layer.type, layer.in, rows, layer.in), "layout of x");
    if (s.ok()) s = Check(cublasLtMatrixLayoutCreate(&g.d, CUDA_R_32F, layer.out, rows, layer.out), "layout of y");
    if (s.ok()) s = Check(cublasLtMatmulPreferenceCreate(&g.preference), "cublasLtMatmulPreferenceCreate");
    // The operands as they are: the weight wherever safetensors put it, the buffers 256-aligned.
    const uint32_t align_a = Alignment(layer.weight), aligned = 256;
    if (s.ok()) s = prefer(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &blas_workspace_bytes_, sizeof(blas_workspace_bytes_));
    if (s.ok()) s = prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a));
    if (s.ok()) s = prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &aligned, sizeof(aligned));
    if (s.ok()) s = prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &aligned, sizeof(aligned));
    if (s.ok()) s = prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &aligned, sizeof(aligned));
    if (!s.ok()) return s;
    cublasLtMatmulHeuristicResult_t found{};
    int count = 0;
    const cublasStatus_t asked =
        cublasLtMatmulAlgoGetHeuristic(lt_, g.op, g.a, g.b, g.d, g.d, g.preference, 1, &found, &count);
    if (asked == CUBLAS_STATUS_NOT_SUPPORTED || (asked == CUBLAS_STATUS_SUCCESS && count == 0)) {
      g.usable = false;  // no algorithm for this shape: cublasGemmEx
      return OkStatus();
    }
    if (Status h = Check(asked, "cublasLtMatmulAlgoGetHeuristic"); !h.ok()) return h;
    g.algo = found.algo;
    g.usable = true;
    g.activates = activation == cuda::kNone;
    return OkStatus();
  }

  Status WidenBias(const uint8_t* stored, const safetensors::TensorInfo& tensor, float* bias) {
    std::vector<uint8_t> bytes(tensor.bytes());
    std::vector<float> widened(tensor.numel());
    if (Status s = Check(cudaMemcpy(bytes.data(), stored, bytes.size(), cudaMemcpyDeviceToHost), "copy of a bias");
        !s.ok()) {
      return s;
    }
    WidenToFloat(bytes.data(), tensor.dtype, widened.size(), widened.data());
    return Check(cudaMemcpy(bias, widened.data(), widened.size() * sizeof(float), cudaMemcpyHostToDevice),
                 "copy of a bias");
  }

  const wp_device_memory* memory_ = nullptr;
  int device_ = 0;
  bool started_ = false;
  std::string device_name_;
  bool tf32_ = false;
  bool sixteen_ = false;
  Activation activation_ = Activation::kNone;
  uint32_t in_ = 0, out_ = 0;
  std::vector<Layer> layers_;
  wp_region workspace_{nullptr, 0, -1};
  float* activations_[2] = {nullptr, nullptr};
  void* half_ = nullptr;
  void* blas_workspace_ = nullptr;
  uint64_t blas_workspace_bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  std::vector<std::map<uint32_t, std::unique_ptr<LtGemm>>> plans_;  // per layer, by rows
};

static_assert(static_cast<int>(Activation::kRelu) == cuda::kRelu && static_cast<int>(Activation::kGelu) == cuda::kGelu &&
              static_cast<int>(Activation::kTanh) == cuda::kTanh && static_cast<int>(Activation::kNone) == cuda::kNone);

}  // namespace
}  // namespace warmpool::dense

extern "C" __attribute__((visibility("default"))) warmpool::dense::GpuRunner* warmpool_dense_cuda_start(
    const warmpool::dense::DenseModel* model, const wp_device_memory* memory, const wp_region* weights,
    const warmpool::dense::GpuOptions* options, std::string* why) {
  try {
    auto runner = std::make_unique<warmpool::dense::CudaRunner>();
    warmpool::Status started = runner->Start(*model, memory, *weights, *options);
    if (!started.ok()) {
      *why = started.message();
      return nullptr;
    }
    return runner.release();
  } catch (const std::exception& e) {
    *why = e.what();
    return nullptr;
  }
}
