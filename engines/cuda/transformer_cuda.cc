// The transformer's forward pass on a GPU: the module side of engines/transformer/gpu_sequence.h.
//
// Layout: a weight is stored [out, in] row-major and y = x W^T on row-major x; in cuBLAS's
// column-major terms that is y^T (out x rows) = W^T (W read as an in x out matrix) times x^T (in x
// rows): a GEMM with A = W transposed, m = out, n = rows, k = in (engines/cuda/dense_cuda.cc says
// the same). A step's rows, of whichever sequences, go through every product together; the keys
// and values are projected into scratch rows, rotated there, and stored into each row's block of
// the paged pool (LaunchStoreKv) before attention reads them through the rows' tables. The output
// and down projections add into the residual stream (beta = 1).
//
// One Step at a time (the workspace is the model's). The KV pool is a region of its own, which the
// engine exports; its records' mirror is written on the same stream (WriteToPool). Everything runs on the model's own stream; a
// step is complete when it returns, its results copied to the host.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "engines/cuda/kernels.h"
#include "engines/cuda/transformer_kernels.h"
#include "engines/transformer/gpu_sequence.h"
#include "engines/transformer/gpu_step_check.h"
#include "engines/transformer/kv_cache.h"

namespace warmpool::transformer {
namespace {

using safetensors::DType;

static_assert(cuda::kBlockTokens == kKvBlockTokens, "the kernels page the cache as the host does");

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

class CudaModel final : public GpuModel {
 public:
  ~CudaModel() override {
    if (started_) cudaSetDevice(device_);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);  // nothing may run on an unmapped workspace
    if (blas_ != nullptr) cublasDestroy(blas_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (workspace_.ptr != nullptr) memory_->free(memory_->ctx, &workspace_);
    if (pool_.ptr != nullptr) memory_->free(memory_->ctx, &pool_);  // the supervisor may hold it still
  }

  Status Start(const Config& config, const ModelWeights& weights, const wp_device_memory* memory, uint32_t context,
               uint32_t sequences, uint32_t pool_blocks) {
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

    plan_ = PlanGpu(config, context, sequences, pool_blocks);
    // From the budget, like the weights: the memory service asks the device's owner. The pool in
    // a region of its own, which the supervisor can hold past this process as it holds weights.
    for (auto [region, bytes, what] : {std::tuple{&pool_, plan_.pool_bytes, "KV cache"},
                                       std::tuple{&workspace_, plan_.workspace_bytes, "workspace"}}) {
      if (wp_status s = memory->alloc(memory->ctx, bytes, region); s != WP_OK) {
        *region = wp_region{nullptr, 0, -1};
        return Error(s == WP_RESOURCE_EXHAUSTED ? Code::kResourceExhausted : Code::kInternal,
                     "no room for the {}-byte {} on the GPU ({} bytes with the {})", bytes, what, plan_.total,
                     region == &pool_ ? "workspace" : "KV cache");
      }
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
  const GpuPlan& plan() const override { return plan_; }

  Status CopyBlock(uint32_t from, uint32_t to) override {
    if (from >= plan_.blocks || to >= plan_.blocks) {
      return Error(Code::kInternal, "a copy of KV block {} to {} of {}", from, to, plan_.blocks);
    }
    WP_CUDA_TRY(cudaSetDevice(device_), "cudaSetDevice");
    const uint64_t bytes = plan_.block_floats * sizeof(float);
    return Check(cudaMemcpyAsync(Pool<uint8_t>() + to * bytes, Pool<uint8_t>() + from * bytes, bytes,
                                 cudaMemcpyDeviceToDevice, stream_),
                 "copy of a shared KV block");
  }

  const wp_region& pool() const override { return pool_; }

  Status WriteToPool(std::span<const KvRegion::ImageWrite> writes) override {
    WP_CUDA_TRY(cudaSetDevice(device_), "cudaSetDevice");
    // Copies on the model's stream keep their order, among themselves and with the kernels.
    for (const KvRegion::ImageWrite& w : writes) {
      if (w.offset > pool_.bytes || w.size > pool_.bytes - w.offset) {
        return Error(Code::kInternal, "a write of {} bytes at {} into a KV pool region of {}", w.size, w.offset,
                     pool_.bytes);
      }
      WP_CUDA_TRY(cudaMemcpyAsync(Pool<uint8_t>() + w.offset, w.bytes, w.size, cudaMemcpyHostToDevice, stream_),
                  "copy of the KV cache's records");
    }
    return Check(cudaStreamSynchronize(stream_), "writing the KV cache's records");
  }

  Status CopyFromPool(const wp_region& source, std::span<const KvCache::Rows> rows) override {
    WP_CUDA_TRY(cudaSetDevice(device_), "cudaSetDevice");
    const uint64_t floats = plan_.blocks * plan_.block_floats;
    for (const KvCache::Rows& r : rows) {
      if (r.from > floats || r.elements > floats - r.from || r.to > floats || r.elements > floats - r.to ||
          (r.from + r.elements) * sizeof(float) > source.bytes) {
        return Error(Code::kInternal, "a copy of {} floats from {} to {} in KV pools of {}", r.elements, r.from, r.to,
                     floats);
      }
      WP_CUDA_TRY(cudaMemcpyAsync(Pool<float>() + r.to, static_cast<const float*>(source.ptr) + r.from,
                                  r.elements * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
                  "copy of a dead worker's keys and values");
    }
    return Check(cudaStreamSynchronize(stream_), "copying a dead worker's keys and values");
  }

  Status Step(std::span<const int32_t> tokens, std::span<const GpuRun> runs, std::span<float> out,
              std::span<int32_t> argmax) override {
    if (Status s = CheckGpuStep(config_, plan_, context_, tokens, runs, out, argmax); !s.ok()) return s;
    WP_CUDA_TRY(cudaSetDevice(device_), "cudaSetDevice");
    (void)cudaGetLastError();  // an error an earlier call left on this thread is not this call's
    // Every row's token, position and table, and the tables, in one copy (GpuPlan::ints).
    const auto rows = static_cast<uint32_t>(tokens.size());
    std::vector<int32_t> ints(3 * uint64_t{rows});
    std::copy(tokens.begin(), tokens.end(), ints.begin());
    uint32_t row = 0;
    for (const GpuRun& run : runs) {
      const auto table_at = static_cast<int32_t>(ints.size() - 3 * uint64_t{rows});
      for (uint32_t i = 0; i < run.rows; ++i, ++row) {
        ints[rows + row] = static_cast<int32_t>(run.start + i);
        ints[2 * uint64_t{rows} + row] = table_at;
      }
      ints.insert(ints.end(), run.table.begin(), run.table.end());
    }
    WP_CUDA_TRY(cudaMemcpyAsync(At<int32_t>(plan_.ints), ints.data(), ints.size() * sizeof(int32_t),
                                cudaMemcpyHostToDevice, stream_),
                "copy of the step's tokens and tables");
    if (Status s = Layers(rows); !s.ok()) return s;
    return Results(runs, out, argmax);
  }

  std::string Describe() const override {
    const DType dtype = weights_.embed.dtype;
    return fmt::format(
        "cuBLAS on CUDA device {} ({}), {} weights as stored, a paged KV cache of {} positions on the device for {} "
        "sequence{}",
        device_, device_name_, safetensors::DTypeName(dtype), uint64_t{plan_.blocks} * kKvBlockTokens,
        plan_.sequences, plan_.sequences == 1 ? "" : "s");
  }

 private:

  template <typename T>
  T* Pool() const {
    return static_cast<T*>(pool_.ptr);
  }

  template <typename T>
  T* At(uint64_t offset) const {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(workspace_.ptr) + offset);
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

  // The step's rows through every layer: x holds the residual stream after the last; each row's
  // keys and values are in the pool.
  Status Layers(uint32_t rows) {
    const Config& c = config_;
    float* x = At<float>(plan_.x);
    float* normed = At<float>(plan_.normed);
    float* q = At<float>(plan_.q);
    float* k = At<float>(plan_.k);
    float* v = At<float>(plan_.v);
    float* attended = At<float>(plan_.attended);
    float* gate = At<float>(plan_.gate);
    float* up = At<float>(plan_.up);
    const double* inv_freq = At<double>(plan_.inv_freq);
    const int32_t* ints = At<int32_t>(plan_.ints);
    const cuda::PagedRows paged{Pool<float>(), plan_.block_floats, c.kv_size(), ints + rows,
                                ints + 2 * uint64_t{rows}, ints + 3 * uint64_t{rows}};
    WP_CUDA_TRY(cuda::LaunchEmbed(ints, rows, weights_.embed.data, Stored(weights_.embed.dtype), c.hidden_size, x,
                                  stream_),
                "the embedding");
    const cuda::AttentionShape shape{c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.sliding_window};
    for (uint32_t l = 0; l < c.num_hidden_layers; l++) {
      const LayerWeights& w = weights_.layers[l];
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
      WP_CUDA_TRY(cuda::LaunchRope(q, rows, c.num_attention_heads, c.head_dim, c.q_size(), paged.positions, inv_freq,
                                   stream_),
                  "the rotary embedding");
      WP_CUDA_TRY(cuda::LaunchRope(k, rows, c.num_key_value_heads, c.head_dim, c.kv_size(), paged.positions, inv_freq,
                                   stream_),
                  "the rotary embedding");
      // Before attention: a row attends to its own key and to the earlier rows' of its sequence.
      WP_CUDA_TRY(cuda::LaunchStoreKv(k, v, rows, paged, l, stream_), "storing keys and values");
      WP_CUDA_TRY(cuda::LaunchAttention(q, rows, paged, l, shape, attended, stream_), "attention");
      if (Status s = Project(attended, rows, w.o, x, c.hidden_size, true); !s.ok()) return s;
      if (Status s = Bias(x, rows, c.hidden_size, c.hidden_size, w.o_bias); !s.ok()) return s;

      if (Status s = Norm(x, rows, c.hidden_size, w.post_attention_norm, normed); !s.ok()) return s;
      if (Status s = Project(normed, rows, w.gate, gate, c.intermediate_size, false); !s.ok()) return s;
      if (Status s = Project(normed, rows, w.up, up, c.intermediate_size, false); !s.ok()) return s;
      WP_CUDA_TRY(cuda::LaunchSwiGlu(gate, up, uint64_t{rows} * c.intermediate_size, stream_), "SwiGLU");
      if (Status s = Project(gate, rows, w.down, x, c.hidden_size, true); !s.ok()) return s;
    }
    return OkStatus();
  }

  // Each run's last row normed (finals), then what the runs want of it copied back.
  Status Results(std::span<const GpuRun> runs, std::span<float> out, std::span<int32_t> argmax) {
    const Config& c = config_;
    const float* x = At<float>(plan_.x);
    float* finals = At<float>(plan_.finals);
    float* logits = At<float>(plan_.logits);
    int32_t* chosen = At<int32_t>(plan_.chosen);
    const auto count = static_cast<uint32_t>(runs.size());
    bool head = false, choose = false;
    uint64_t last = 0;
    for (uint32_t i = 0; i < count; ++i) {
      last += runs[i].rows;
      if (runs[i].want == GpuRun::Want::kNothing) continue;
      head = head || runs[i].want != GpuRun::Want::kHidden;
      choose = choose || runs[i].want == GpuRun::Want::kArgMax;
      const float* row = x + (last - 1) * c.hidden_size;
      if (Status s = Norm(row, 1, c.hidden_size, weights_.final_norm, finals + uint64_t{i} * c.hidden_size); !s.ok()) {
        return s;
      }
    }
    if (head) {
      if (Status s = Project(finals, count, weights_.lm_head, logits, c.vocab_size, false); !s.ok()) return s;
    }
    std::vector<int32_t> tokens(count, -1);
    const bool all_logits = std::all_of(runs.begin(), runs.end(), [](const GpuRun& run) {
      return run.want == GpuRun::Want::kLogits;
    });
    if (all_logits) {  // a decode step's usual case: one copy
      WP_CUDA_TRY(cudaMemcpyAsync(out.data(), logits, uint64_t{count} * c.vocab_size * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream_),
                  "copy of the logits");
    }
    for (uint32_t i = 0; i < count && !all_logits; ++i) {
      const uint64_t width = runs[i].want == GpuRun::Want::kHidden ? c.hidden_size : c.vocab_size;
      const float* from = (runs[i].want == GpuRun::Want::kHidden ? finals : logits) + i * width;
      switch (runs[i].want) {
        case GpuRun::Want::kNothing: break;
        case GpuRun::Want::kArgMax:
          WP_CUDA_TRY(cuda::LaunchArgMax(logits + i * width, c.vocab_size, chosen + i, stream_), "the argmax");
          break;
        case GpuRun::Want::kLogits:
        case GpuRun::Want::kHidden:
          WP_CUDA_TRY(cudaMemcpyAsync(out.data() + i * width, from, width * sizeof(float), cudaMemcpyDeviceToHost,
                                      stream_),
                      "copy of the output");
          break;
      }
    }
    if (choose) {
      WP_CUDA_TRY(cudaMemcpyAsync(tokens.data(), chosen, count * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_),
                  "copy of the chosen tokens");
    }
    if (Status s = Check(cudaStreamSynchronize(stream_), "the forward pass on the GPU"); !s.ok()) return s;
    for (uint32_t i = 0; i < count; ++i) {
      if (runs[i].want == GpuRun::Want::kArgMax) argmax[i] = tokens[i];
    }
    return OkStatus();
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
  wp_region pool_{nullptr, 0, -1};
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
};

#undef WP_CUDA_TRY

}  // namespace
}  // namespace warmpool::transformer

extern "C" __attribute__((visibility("default"))) warmpool::transformer::GpuModel* warmpool_transformer_cuda_model(
    const warmpool::transformer::Config* config, const warmpool::transformer::ModelWeights* weights,
    const wp_device_memory* memory, uint32_t context, uint32_t sequences, uint32_t pool_blocks, std::string* why) {
  try {
    auto model = std::make_unique<warmpool::transformer::CudaModel>();
    warmpool::Status started = model->Start(*config, *weights, memory, context, sequences, pool_blocks);
    if (!started.ok()) {
      *why = started.message();
      return nullptr;
    }
    return model.release();
  } catch (const std::exception& e) {
    *why = e.what();
    return nullptr;
  }
}
