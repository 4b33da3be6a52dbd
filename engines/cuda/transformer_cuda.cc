// The transformer's forward pass on a GPU: the module side of engines/transformer/gpu_sequence.h.
//
// Layout: a weight is stored [out, in] row-major and y = x W^T on row-major x; in cuBLAS's
// column-major terms that is y^T (out x rows) = W^T (W read as an in x out matrix) times x^T (in x
// rows): a GEMM with A = W transposed, m = out, n = rows, k = in (engines/cuda/dense_cuda.cc says
// the same). The key and value projections write straight into the cache at their positions (one
// layer's positions are contiguous), where the rotation then happens in place; the output and down
// projections add into the residual stream (beta = 1).
//
// One Forward at a time (the workspace is the sequence's). Everything runs on the sequence's own
// stream; a call is complete when it returns, the logits copied to the host.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "engines/cuda/kernels.h"
#include "engines/cuda/transformer_kernels.h"
#include "engines/transformer/gpu_sequence.h"

namespace warmpool::transformer {
namespace {

using safetensors::DType;

Status Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return OkStatus();
  return Error(Code::kInternal, "{}: {} ({})", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

Status Check(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return OkStatus();
  return Error(Code::kInternal, "{}: {} ({})", what, cublasGetStatusName(s), cublasGetStatusString(s));
}

int Stored(DType dtype) {
  return dtype == DType::F16 ? cuda::kF16 : dtype == DType::BF16 ? cuda::kBf16 : cuda::kF32;
}

cudaDataType_t BlasType(DType dtype) {
  return dtype == DType::F16 ? CUDA_R_16F : dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

#define WP_CUDA_TRY(expression, what)                                  \
  do {                                                                 \
    if (::warmpool::Status s_ = Check((expression), what); !s_.ok()) { \
      return s_;                                                       \
    }                                                                  \
  } while (0)

class CudaSequence final : public Sequence {
 public:
  ~CudaSequence() override {
    if (started_) cudaSetDevice(device_);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);  // nothing may run on an unmapped workspace
    if (blas_ != nullptr) cublasDestroy(blas_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (workspace_.ptr != nullptr) memory_->free(memory_->ctx, &workspace_);
  }

  Status Start(const Config& config, const ModelWeights& weights, const wp_device_memory* memory, uint32_t context) {
    config_ = config;
    weights_ = weights;
    memory_ = memory;
    context_ = context;
    if (config.head_dim > cuda::kMaxHeadDim || config.head_dim % 2 != 0) {
      return Error(Code::kFailedPrecondition, "a head of {} dimensions (the GPU kernels take even ones up to {})",
                   config.head_dim, cuda::kMaxHeadDim);
    }
    cudaPointerAttributes where{};
    WP_CUDA_TRY(cudaPointerGetAttributes(&where, weights.embed.data), "cudaPointerGetAttributes");
    if (where.type != cudaMemoryTypeDevice) {
      return Error(Code::kFailedPrecondition, "the weights are not in device memory (CUDA sees memory type {})",
                   static_cast<int>(where.type));
    }
    device_ = where.device;
    WP_CUDA_TRY(cudaSetDevice(device_), "cudaSetDevice");
    started_ = true;
    cudaDeviceProp properties{};
    if (cudaGetDeviceProperties(&properties, device_) == cudaSuccess) device_name_ = properties.name;

    plan_ = PlanGpuSequence(config, context);
    // From the budget, like the weights: the memory service asks the device's owner.
    if (wp_status s = memory->alloc(memory->ctx, plan_.total, &workspace_); s != WP_OK) {
      workspace_ = wp_region{nullptr, 0, -1};
      return Error(s == WP_RESOURCE_EXHAUSTED ? Code::kResourceExhausted : Code::kInternal,
                   "no room for the {}-byte KV cache and workspace on the GPU", plan_.total);
    }
    WP_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    WP_CUDA_TRY(cublasCreate(&blas_), "cublasCreate");
    WP_CUDA_TRY(cublasSetStream(blas_, stream_), "cublasSetStream");
    // After cublasSetStream, which resets it: cuBLAS works in the budget's workspace.
    WP_CUDA_TRY(cublasSetWorkspace(blas_, At<void>(plan_.blas), kGpuBlasWorkspaceBytes), "cublasSetWorkspace");
    const std::vector<double> frequencies = config.RotaryFrequencies();
    WP_CUDA_TRY(cudaMemcpyAsync(At<double>(plan_.inv_freq), frequencies.data(), frequencies.size() * sizeof(double),
                                cudaMemcpyHostToDevice, stream_),
                "copy of the rotary frequencies");
    return Check(cudaStreamSynchronize(stream_), "starting the model on the GPU");
  }

  const Config& config() const override { return config_; }
  uint32_t context() const override { return context_; }

  Status Forward(std::span<const int32_t> tokens, uint32_t start, std::span<float> logits) override {
    return Run(tokens, start, logits, false);
  }
  Status Hidden(std::span<const int32_t> tokens, uint32_t start, std::span<float> hidden) override {
    return Run(tokens, start, hidden, true);
  }
  // Greedy decoding: the argmax on the device, one id copied back instead of the logits.
  Result<int32_t> ForwardArgMax(std::span<const int32_t> tokens, uint32_t start) override {
    if (Status s = RunOnDevice(tokens, start, false); !s.ok()) return s;
    int32_t* chosen = At<int32_t>(plan_.chosen);
    WP_CUDA_TRY(cuda::LaunchArgMax(At<float>(plan_.logits), config_.vocab_size, chosen, stream_), "the argmax");
    int32_t token = -1;
    WP_CUDA_TRY(cudaMemcpyAsync(&token, chosen, sizeof(token), cudaMemcpyDeviceToHost, stream_), "copy of the token");
    if (Status s = Check(cudaStreamSynchronize(stream_), "the forward pass on the GPU"); !s.ok()) return s;
    if (token < 0) return Error(Code::kInternal, "the model gave no logit that is a number: nothing can be sampled");
    return token;
  }

  std::string Describe() const override {
    const DType dtype = weights_.embed.dtype;
    return fmt::format("cuBLAS on CUDA device {} ({}), {} weights as stored, a {}-token KV cache on the device",
                       device_, device_name_, safetensors::DTypeName(dtype), context_);
  }

 private:
  // The tokens through the model; out gets the last one's logits, or (hidden) its hidden state
  // after the final norm.
  Status Run(std::span<const int32_t> tokens, uint32_t start, std::span<float> out, bool hidden) {
    const uint64_t needed = hidden ? config_.hidden_size : config_.vocab_size;
    if (out.size() < needed) {
      return Error(Code::kInvalidArgument, "{} floats for the output where {} are needed", out.size(), needed);
    }
    if (Status s = RunOnDevice(tokens, start, hidden); !s.ok()) return s;
    // The final norm's output (normed, hidden_size floats) or the head's (logits).
    const float* result = hidden ? At<float>(plan_.normed) : At<float>(plan_.logits);
    WP_CUDA_TRY(cudaMemcpyAsync(out.data(), result, needed * sizeof(float), cudaMemcpyDeviceToHost, stream_),
                "copy of the output");
    return Check(cudaStreamSynchronize(stream_), "the forward pass on the GPU");
  }

  // The chunks of a run queued on the stream, the last one's result left in the workspace.
  Status RunOnDevice(std::span<const int32_t> tokens, uint32_t start, bool hidden) {
    const auto rows = static_cast<uint32_t>(tokens.size());
    if (rows == 0) return Error(Code::kInvalidArgument, "no tokens to run");
    if (uint64_t{start} + rows > context_) {
      return Error(Code::kInvalidArgument, "positions {} to {} are past the context of {} tokens", start,
                   uint64_t{start} + rows - 1, context_);
    }
    for (int32_t token : tokens) {
      if (token < 0 || static_cast<uint32_t>(token) >= config_.vocab_size) {
        return Error(Code::kInvalidArgument, "token {} is outside the vocabulary of {}", token, config_.vocab_size);
      }
    }
    WP_CUDA_TRY(cudaSetDevice(device_), "cudaSetDevice");
    (void)cudaGetLastError();  // an error an earlier call left on this thread is not this call's
    for (uint32_t done = 0; done < rows; done += plan_.chunk_rows) {
      const uint32_t chunk = std::min(plan_.chunk_rows, rows - done);
      const bool last = done + chunk == rows;
      if (Status s = Chunk(tokens.data() + done, chunk, start + done, last, hidden); !s.ok()) return s;
    }
    return OkStatus();
  }

  template <typename T>
  T* At(uint64_t offset) const {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(workspace_.ptr) + offset);
  }
  float* Keys(uint32_t layer, uint32_t position) const {
    return At<float>(plan_.keys) + (uint64_t{layer} * context_ + position) * config_.kv_size();
  }
  float* Values(uint32_t layer, uint32_t position) const {
    return At<float>(plan_.values) + (uint64_t{layer} * context_ + position) * config_.kv_size();
  }

  // y (rows x w.rows, rows ldy floats apart) = x (rows x w.cols) W^T, or y += that (accumulate).
  Status Project(const float* x, uint32_t rows, const Matrix& w, float* y, uint64_t ldy, bool accumulate) {
    const cudaDataType_t type = BlasType(w.dtype);
    const void* b = x;
    if (type != CUDA_R_32F) {
      void* narrow = At<void>(plan_.narrow);
      WP_CUDA_TRY(dense::cuda::LaunchNarrow(x, narrow, uint64_t{rows} * w.cols, type == CUDA_R_16BF, stream_),
                  "narrowing the activations");
      b = narrow;
    }
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    return Check(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.rows), static_cast<int>(rows),
                              static_cast<int>(w.cols), &one, w.data, type, static_cast<int>(w.cols), b, type,
                              static_cast<int>(w.cols), &beta, y, CUDA_R_32F, static_cast<int>(ldy), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  }

  Status Bias(float* y, uint32_t rows, uint32_t width, uint64_t stride, const Vector& bias) {
    if (!bias) return OkStatus();
    return Check(cuda::LaunchAddBias(y, rows, width, stride, bias.data, Stored(bias.dtype), stream_), "a bias");
  }

  Status Norm(const float* x, uint64_t rows, uint32_t width, const Vector& weight, float* y) {
    return Check(cuda::LaunchRmsNorm(x, rows, width, weight.data, Stored(weight.dtype), config_.rms_norm_eps, y,
                                     stream_),
                 "RMSNorm");
  }

  // rows tokens at positions start...; when `last`, the final norm of the last one (in normed) and,
  // unless `hidden`, its logits.
  Status Chunk(const int32_t* tokens, uint32_t rows, uint32_t start, bool last, bool hidden) {
    const Config& c = config_;
    float* x = At<float>(plan_.x);
    float* normed = At<float>(plan_.normed);
    float* q = At<float>(plan_.q);
    float* attended = At<float>(plan_.attended);
    float* gate = At<float>(plan_.gate);
    float* up = At<float>(plan_.up);
    const double* inv_freq = At<double>(plan_.inv_freq);
    int32_t* device_tokens = At<int32_t>(plan_.tokens);
    WP_CUDA_TRY(cudaMemcpyAsync(device_tokens, tokens, uint64_t{rows} * sizeof(int32_t), cudaMemcpyHostToDevice,
                                stream_),
                "copy of the tokens");
    WP_CUDA_TRY(cuda::LaunchEmbed(device_tokens, rows, weights_.embed.data, Stored(weights_.embed.dtype),
                                  c.hidden_size, x, stream_),
                "the embedding");
    const cuda::AttentionShape shape{c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.sliding_window};
    for (uint32_t l = 0; l < c.num_hidden_layers; l++) {
      const LayerWeights& w = weights_.layers[l];
      float* k = Keys(l, start);
      float* v = Values(l, start);
      if (Status s = Norm(x, rows, c.hidden_size, w.input_norm, normed); !s.ok()) return s;
      if (Status s = Project(normed, rows, w.q, q, c.q_size(), false); !s.ok()) return s;
      if (Status s = Project(normed, rows, w.k, k, c.kv_size(), false); !s.ok()) return s;
      if (Status s = Project(normed, rows, w.v, v, c.kv_size(), false); !s.ok()) return s;
      if (Status s = Bias(q, rows, c.q_size(), c.q_size(), w.q_bias); !s.ok()) return s;
      if (Status s = Bias(k, rows, c.kv_size(), c.kv_size(), w.k_bias); !s.ok()) return s;
      if (Status s = Bias(v, rows, c.kv_size(), c.kv_size(), w.v_bias); !s.ok()) return s;
      if (c.qk_norm) {
        if (Status s = Norm(q, uint64_t{rows} * c.num_attention_heads, c.head_dim, w.q_norm, q); !s.ok()) return s;
        if (Status s = Norm(k, uint64_t{rows} * c.num_key_value_heads, c.head_dim, w.k_norm, k); !s.ok()) return s;
      }
      WP_CUDA_TRY(cuda::LaunchRope(q, rows, c.num_attention_heads, c.head_dim, c.q_size(), start, inv_freq, stream_),
                  "the rotary embedding");
      WP_CUDA_TRY(cuda::LaunchRope(k, rows, c.num_key_value_heads, c.head_dim, c.kv_size(), start, inv_freq, stream_),
                  "the rotary embedding");
      WP_CUDA_TRY(cuda::LaunchAttention(q, rows, start, Keys(l, 0), Values(l, 0), shape, attended, stream_),
                  "attention");
      if (Status s = Project(attended, rows, w.o, x, c.hidden_size, true); !s.ok()) return s;
      if (Status s = Bias(x, rows, c.hidden_size, c.hidden_size, w.o_bias); !s.ok()) return s;

      if (Status s = Norm(x, rows, c.hidden_size, w.post_attention_norm, normed); !s.ok()) return s;
      if (Status s = Project(normed, rows, w.gate, gate, c.intermediate_size, false); !s.ok()) return s;
      if (Status s = Project(normed, rows, w.up, up, c.intermediate_size, false); !s.ok()) return s;
      WP_CUDA_TRY(cuda::LaunchSwiGlu(gate, up, uint64_t{rows} * c.intermediate_size, stream_), "SwiGLU");
      if (Status s = Project(gate, rows, w.down, x, c.hidden_size, true); !s.ok()) return s;
    }
    if (!last) return OkStatus();
    const float* final_row = x + uint64_t{rows - 1} * c.hidden_size;
    if (Status s = Norm(final_row, 1, c.hidden_size, weights_.final_norm, normed); !s.ok()) return s;
    if (hidden) return OkStatus();
    return Project(normed, 1, weights_.lm_head, At<float>(plan_.logits), c.vocab_size, false);
  }

  Config config_;
  ModelWeights weights_;  // device pointers into the weights region
  const wp_device_memory* memory_ = nullptr;
  uint32_t context_ = 0;
  GpuPlan plan_;
  int device_ = 0;
  bool started_ = false;
  std::string device_name_;
  wp_region workspace_{nullptr, 0, -1};
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
};

#undef WP_CUDA_TRY

}  // namespace
}  // namespace warmpool::transformer

extern "C" __attribute__((visibility("default"))) warmpool::transformer::Sequence* warmpool_transformer_cuda_start(
    const warmpool::transformer::Config* config, const warmpool::transformer::ModelWeights* weights,
    const wp_device_memory* memory, uint32_t context, std::string* why) {
  try {
    auto sequence = std::make_unique<warmpool::transformer::CudaSequence>();
    warmpool::Status started = sequence->Start(*config, *weights, memory, context);
    if (!started.ok()) {
      *why = started.message();
      return nullptr;
    }
    return sequence.release();
  } catch (const std::exception& e) {
    *why = e.what();
    return nullptr;
  }
}
