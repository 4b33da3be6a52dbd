// The transformer's element-wise and attention kernels on a GPU (transformer_kernels.cu, built with
// nvcc), around cuBLAS's products (transformer_cuda.cc). Each computes what engines/transformer/
// cpu_model.cc computes on the CPU, in f32, reading weights as stored; each returns the launch's
// error (cudaSuccess when it was queued on the stream).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace warmpool::transformer::cuda {

// How a weight is stored (safetensors::DType F32, F16, BF16).
enum StoredType : int { kF32 = 0, kF16 = 1, kBf16 = 2 };

// Largest head the attention kernel takes (its accumulators live in registers).
inline constexpr uint32_t kMaxHeadDim = 512;

// x[r] = table[tokens[r]] (rows x hidden, f32). Tokens were checked against the vocabulary.
cudaError_t LaunchEmbed(const int32_t* tokens, uint32_t rows, const void* table, int type, uint32_t hidden, float* x,
                        cudaStream_t stream);

// y = x / sqrt(mean(x^2) + eps) * weight over each of `rows` rows of `width` (y may be x). Squares
// are summed in double, as the CPU does.
cudaError_t LaunchRmsNorm(const float* x, uint64_t rows, uint32_t width, const void* weight, int type, double eps,
                          float* y, cudaStream_t stream);

// y[r][i] += bias[i] for rows of `width` that lie `stride` floats apart.
cudaError_t LaunchAddBias(float* y, uint32_t rows, uint32_t width, uint64_t stride, const void* bias, int type,
                          cudaStream_t stream);

// Rotary embedding (Hugging Face's rotate_half) of `heads` heads of head_dim per row, the rows
// `stride` floats apart, row r at position positions[r]. The angle position * inv_freq[i] and its
// cosine and sine are computed in double and rounded to f32, as the CPU does.
cudaError_t LaunchRope(float* x, uint32_t rows, uint32_t heads, uint32_t head_dim, uint64_t stride,
                       const int32_t* positions, const double* inv_freq, cudaStream_t stream);

struct AttentionShape {
  uint32_t heads = 0;      // query heads
  uint32_t kv_heads = 0;   // heads / kv_heads queries share a key/value head
  uint32_t head_dim = 0;   // at most kMaxHeadDim
  uint64_t window = 0;     // sliding window (the token itself included); 0: the whole context
};

// The paged KV cache of a step's rows (engines/transformer/gpu_sequence.h): blocks of
// kBlockTokens positions, block b's layer l keys (half 0) or values (half 1) at `offset` beginning
// at pool + b x block_floats + ((l x 2 + half) x kBlockTokens + offset) x kv_size. Row r is at
// position positions[r] of the sequence whose table begins at tables[table_at[r]] (entry i: the
// block of positions i x kBlockTokens on).
inline constexpr uint32_t kBlockTokens = 64;
struct PagedRows {
  float* pool = nullptr;
  uint64_t block_floats = 0;
  uint32_t kv_size = 0;
  const int32_t* positions = nullptr;
  const int32_t* table_at = nullptr;
  const int32_t* tables = nullptr;
};

// Each row's keys and values (rows x kv_size each, after their rotation) into `layer` of its
// position's block.
cudaError_t LaunchStoreKv(const float* keys, const float* values, uint32_t rows, const PagedRows& paged,
                          uint32_t layer, cudaStream_t stream);

// Causal grouped-query attention of rows, each over its own sequence's cache in `layer`: q is
// rows x (heads x head_dim); the cache holds every position of a row's sequence up to the row's
// own (rows of one sequence come in position order and were stored first). out is rows x (heads x
// head_dim). Softmax online, one tile of positions at a time, so any context fits.
cudaError_t LaunchAttention(const float* q, uint32_t rows, const PagedRows& paged, uint32_t layer,
                            const AttentionShape& shape, float* out, cudaStream_t stream);

// *out = the index of x's largest value (the lowest on a tie; NaN and -inf never chosen), or -1
// when none is above -inf: greedy decoding's choice (engines/transformer/sampler.h, ArgMaxToken).
cudaError_t LaunchArgMax(const float* x, uint32_t count, int32_t* out, cudaStream_t stream);

// gate[i] = silu(gate[i]) * up[i].
cudaError_t LaunchSwiGlu(float* gate, const float* up, uint64_t count, cudaStream_t stream);

}  // namespace warmpool::transformer::cuda
