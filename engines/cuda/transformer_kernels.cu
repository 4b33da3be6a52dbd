#include "engines/cuda/transformer_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace warmpool::transformer::cuda {
namespace {

constexpr unsigned kThreads = 256;
// Positions scored at once by one attention block: one per thread.
constexpr unsigned kTile = 128;

unsigned Blocks(uint64_t count) {
  const uint64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 * 32 ? blocks : 65535 * 32);
}

__device__ float Load(const void* data, int type, uint64_t i) {
  switch (type) {
    case kF16: return __half2float(static_cast<const __half*>(data)[i]);
    case kBf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(data)[i]);
    default: return static_cast<const float*>(data)[i];
  }
}

// The sum (or max) of v over the block; every thread gets it. scratch: 32 values.
template <typename T, typename Op>
__device__ T BlockReduce(T v, T* scratch, Op op) {
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = (blockDim.x + 31) / 32;
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = scratch[0];
  for (unsigned w = 1; w < warps; w++) v = op(v, scratch[w]);
  return v;
}

struct Sum {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

__global__ void Embed(const int32_t* tokens, uint32_t rows, const void* table, int type, uint32_t hidden, float* x) {
  const uint64_t count = uint64_t{rows} * hidden;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < count; i += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t r = i / hidden, c = i % hidden;
    x[i] = Load(table, type, static_cast<uint64_t>(tokens[r]) * hidden + c);
  }
}

// One block per row.
__global__ void RmsNorm(const float* x, uint32_t width, const void* weight, int type, double eps, float* y) {
  __shared__ double scratch[32];
  const float* in = x + blockIdx.x * uint64_t{width};
  float* out = y + blockIdx.x * uint64_t{width};
  double squares = 0;
  for (uint32_t i = threadIdx.x; i < width; i += blockDim.x) squares += double{in[i]} * in[i];
  squares = BlockReduce(squares, scratch, Sum{});
  const auto scale = static_cast<float>(1.0 / sqrt(squares / width + eps));
  for (uint32_t i = threadIdx.x; i < width; i += blockDim.x) out[i] = in[i] * scale * Load(weight, type, i);
}

__global__ void AddBias(float* y, uint32_t rows, uint32_t width, uint64_t stride, const void* bias, int type) {
  const uint64_t count = uint64_t{rows} * width;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < count; i += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t r = i / width, c = i % width;
    y[r * stride + c] += Load(bias, type, c);
  }
}

__global__ void Rope(float* x, uint32_t rows, uint32_t heads, uint32_t head_dim, uint64_t stride,
                     const int32_t* positions, const double* inv_freq) {
  const uint32_t half = head_dim / 2;
  const uint64_t count = uint64_t{rows} * heads * half;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < count; i += uint64_t{gridDim.x} * blockDim.x) {
    const auto f = static_cast<uint32_t>(i % half);
    const uint64_t h = (i / half) % heads, r = i / (uint64_t{half} * heads);
    const double angle = static_cast<double>(positions[r]) * inv_freq[f];
    const auto c = static_cast<float>(cos(angle));
    const auto s = static_cast<float>(sin(angle));
    float* head = x + r * stride + h * head_dim;
    const float a = head[f], b = head[f + half];
    head[f] = a * c - b * s;
    head[f + half] = b * c + a * s;
  }
}

// Where a row's sequence keeps position j of `layer` (half 0: keys, 1: values).
__device__ float* Cached(const PagedRows& p, uint32_t row, uint32_t j, uint32_t layer, uint32_t half) {
  const auto block = static_cast<uint64_t>(p.tables[p.table_at[row] + j / kBlockTokens]);
  return p.pool + block * p.block_floats + ((uint64_t{layer} * 2 + half) * kBlockTokens + j % kBlockTokens) * p.kv_size;
}

__global__ void StoreKv(const float* keys, const float* values, uint32_t rows, PagedRows p, uint32_t layer) {
  const uint64_t count = uint64_t{rows} * p.kv_size;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < count; i += uint64_t{gridDim.x} * blockDim.x) {
    const auto r = static_cast<uint32_t>(i / p.kv_size);
    const uint64_t c = i % p.kv_size;
    const auto position = static_cast<uint32_t>(p.positions[r]);
    Cached(p, r, position, layer, 0)[c] = keys[i];
    Cached(p, r, position, layer, 1)[c] = values[i];
  }
}

// One block of kTile threads per (head, row). Each thread scores one position of a tile; the
// running maximum and sum rescale the accumulated output as each tile comes in (online softmax).
// Thread t accumulates the output dimensions t, t + kTile, ...
__global__ void Attend(const float* q, PagedRows paged, uint32_t layer, AttentionShape shape, float* out) {
  extern __shared__ float shared[];
  float* query = shared;                    // head_dim
  float* weights = shared + shape.head_dim;  // kTile
  __shared__ float scratch[32];
  __shared__ const float* value_rows[kTile];  // each position's values in this tile, found once
  const uint32_t h = blockIdx.x, r = blockIdx.y;
  const auto position = static_cast<uint32_t>(paged.positions[r]);
  const uint32_t first = shape.window != 0 && position + 1 > shape.window
                             ? static_cast<uint32_t>(position + 1 - shape.window)
                             : 0;
  const uint64_t q_size = uint64_t{shape.heads} * shape.head_dim;
  const uint64_t kv_offset = uint64_t{h / (shape.heads / shape.kv_heads)} * shape.head_dim;
  const float* my_query = q + r * q_size + uint64_t{h} * shape.head_dim;
  for (uint32_t d = threadIdx.x; d < shape.head_dim; d += blockDim.x) query[d] = my_query[d];
  __syncthreads();
  const float scale = 1.0f / sqrtf(static_cast<float>(shape.head_dim));

  constexpr uint32_t kSlots = kMaxHeadDim / kTile;
  float accumulated[kSlots] = {};
  float running_max = -INFINITY, running_sum = 0;
  // A tile may span blocks of the cache: each position's key and value are found through the
  // row's table (Cached).
  for (uint32_t tile = first; tile <= position; tile += kTile) {
    const uint32_t j = tile + threadIdx.x;
    float score = -INFINITY;
    if (j <= position) {
      value_rows[threadIdx.x] = Cached(paged, r, j, layer, 1) + kv_offset;
      const float* key = Cached(paged, r, j, layer, 0) + kv_offset;
      float dot = 0;
      for (uint32_t d = 0; d < shape.head_dim; d++) dot += query[d] * key[d];
      score = dot * scale;
    }
    const float tile_max = BlockReduce(score, scratch, Max{});
    const float new_max = fmaxf(running_max, tile_max);
    const float weight = j <= position ? expf(score - new_max) : 0.0f;
    weights[threadIdx.x] = weight;
    const float tile_sum = BlockReduce(weight, scratch, Sum{});  // its barriers publish weights[], value_rows[]
    const float rescale = expf(running_max - new_max);          // 0 on the first tile
    running_sum = running_sum * rescale + tile_sum;
    running_max = new_max;
    const uint32_t count = min(kTile, position + 1 - tile);
    for (uint32_t slot = 0; slot < kSlots; slot++) {
      const uint32_t d = threadIdx.x + slot * kTile;
      if (d >= shape.head_dim) break;
      float sum = accumulated[slot] * rescale;
      for (uint32_t t = 0; t < count; t++) sum += weights[t] * value_rows[t][d];
      accumulated[slot] = sum;
    }
    __syncthreads();  // weights[] and value_rows[] are rewritten by the next tile
  }
  float* my_out = out + r * q_size + uint64_t{h} * shape.head_dim;
  for (uint32_t slot = 0; slot < kSlots; slot++) {
    const uint32_t d = threadIdx.x + slot * kTile;
    if (d < shape.head_dim) my_out[d] = accumulated[slot] / running_sum;
  }
}

// One block: each thread keeps the largest of its stride of x (the first on a tie: it scans up), then
// the block halves its candidates until one is left, the lower index winning a tie. NaN and -inf
// never win: an index of -1 means no value was a number above -inf.
constexpr unsigned kArgMaxThreads = 1024;
__global__ void ArgMax(const float* x, uint32_t count, int32_t* out) {
  __shared__ float values[kArgMaxThreads];
  __shared__ int32_t indices[kArgMaxThreads];
  float best = -INFINITY;
  int32_t index = -1;
  for (uint32_t i = threadIdx.x; i < count; i += blockDim.x) {
    if (x[i] > best) {
      best = x[i];
      index = static_cast<int32_t>(i);
    }
  }
  values[threadIdx.x] = best;
  indices[threadIdx.x] = index;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      const float v = values[threadIdx.x + half];
      const int32_t j = indices[threadIdx.x + half];
      if (j >= 0 && (v > values[threadIdx.x] || indices[threadIdx.x] < 0 ||
                     (v == values[threadIdx.x] && j < indices[threadIdx.x]))) {
        values[threadIdx.x] = v;
        indices[threadIdx.x] = j;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = indices[0];
}

__global__ void SwiGlu(float* gate, const float* up, uint64_t count) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < count; i += uint64_t{gridDim.x} * blockDim.x) {
    const float g = gate[i];
    gate[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

}  // namespace

cudaError_t LaunchEmbed(const int32_t* tokens, uint32_t rows, const void* table, int type, uint32_t hidden, float* x,
                        cudaStream_t stream) {
  Embed<<<Blocks(uint64_t{rows} * hidden), kThreads, 0, stream>>>(tokens, rows, table, type, hidden, x);
  return cudaGetLastError();
}

cudaError_t LaunchRmsNorm(const float* x, uint64_t rows, uint32_t width, const void* weight, int type, double eps,
                          float* y, cudaStream_t stream) {
  for (uint64_t first = 0; first < rows; first += 65535) {  // the grid's y and z are not used: chunks
    const uint64_t count = rows - first < 65535 ? rows - first : 65535;
    RmsNorm<<<static_cast<unsigned>(count), kThreads, 0, stream>>>(x + first * width, width, weight, type, eps,
                                                                   y + first * width);
  }
  return cudaGetLastError();
}

cudaError_t LaunchAddBias(float* y, uint32_t rows, uint32_t width, uint64_t stride, const void* bias, int type,
                          cudaStream_t stream) {
  AddBias<<<Blocks(uint64_t{rows} * width), kThreads, 0, stream>>>(y, rows, width, stride, bias, type);
  return cudaGetLastError();
}

cudaError_t LaunchRope(float* x, uint32_t rows, uint32_t heads, uint32_t head_dim, uint64_t stride,
                       const int32_t* positions, const double* inv_freq, cudaStream_t stream) {
  Rope<<<Blocks(uint64_t{rows} * heads * (head_dim / 2)), kThreads, 0, stream>>>(x, rows, heads, head_dim, stride,
                                                                                positions, inv_freq);
  return cudaGetLastError();
}

cudaError_t LaunchStoreKv(const float* keys, const float* values, uint32_t rows, const PagedRows& paged,
                          uint32_t layer, cudaStream_t stream) {
  StoreKv<<<Blocks(uint64_t{rows} * paged.kv_size), kThreads, 0, stream>>>(keys, values, rows, paged, layer);
  return cudaGetLastError();
}

cudaError_t LaunchAttention(const float* q, uint32_t rows, const PagedRows& paged, uint32_t layer,
                            const AttentionShape& shape, float* out, cudaStream_t stream) {
  if (shape.head_dim > kMaxHeadDim || rows > 65535) return cudaErrorInvalidValue;
  const dim3 grid(shape.heads, rows);
  const size_t shared = (shape.head_dim + kTile) * sizeof(float);
  Attend<<<grid, kTile, shared, stream>>>(q, paged, layer, shape, out);
  return cudaGetLastError();
}

cudaError_t LaunchArgMax(const float* x, uint32_t count, int32_t* out, cudaStream_t stream) {
  ArgMax<<<1, kArgMaxThreads, 0, stream>>>(x, count, out);
  return cudaGetLastError();
}

cudaError_t LaunchSwiGlu(float* gate, const float* up, uint64_t count, cudaStream_t stream) {
  SwiGlu<<<Blocks(count), kThreads, 0, stream>>>(gate, up, count);
  return cudaGetLastError();
}

}  // namespace warmpool::transformer::cuda
