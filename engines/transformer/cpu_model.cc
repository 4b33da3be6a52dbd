#include "engines/transformer/cpu_model.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include <dnnl.h>
#include <omp.h>
#include <fmt/format.h>

#include "engines/bf16_gemv.h"
#include "engines/dense_cpu.h"
#include "engines/gemv.h"
#include "engines/half.h"
#include "engines/transformer/decode_attention.h"
#include "engines/transformer/prompt_attention.h"
#include "engines/transformer/vector_exp.h"

namespace warmpool::transformer {
namespace {

using safetensors::DType;

float Dot(const float* a, const float* b, uint32_t n) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (uint32_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// The dot product of a stored f32 or bf16 row with x, converting in the loop (one pass over the
// weights, which the compiler vectorises; a bf16 value is the upper half of an f32).
float DotStored(const uint8_t* row, DType dtype, const float* x, uint32_t n) {
  float sum = 0;
  if (dtype == DType::F32) {
#pragma omp simd reduction(+ : sum)
    for (uint32_t i = 0; i < n; ++i) {
      float w;
      std::memcpy(&w, row + uint64_t{i} * 4, 4);
      sum += w * x[i];
    }
    return sum;
  }
#pragma omp simd reduction(+ : sum)
  for (uint32_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, row + uint64_t{i} * 2, 2);
    sum += std::bit_cast<float>(static_cast<uint32_t>(h) << 16) * x[i];
  }
  return sum;
}

// Up to this many input rows, f32 and bf16 weight rows are read in the dot product itself (a row
// read again for the next input row comes from the cache); beyond, each weight row is widened once
// into f32 and used for every input row. f16 goes to the dense engine's F16C kernels (gemv.h)
// where the CPU has F16C.
constexpr uint32_t kDirectRows = 4;

// From this many rows of one run on (a prompt's piece), attention runs in query tiles of one head
// (prompt_attention.h); fewer (a decode step) row by row (decode_attention.h).
constexpr uint32_t kPromptAttentionRows = 8;

// Up to this many rows on bf16 weights (decode tokens of a step of several sequences, and a prompt
// piece beside them) run in the AVX-512 BF16 small-batch kernel (engines/bf16_gemv.h) where the CPU
// has it: eight rows in one pass over the weights, sixteen in two (the second from the L2 cache).
// More go to oneDNN. On a 2-core EPYC VM (warmpool-bench --generate --batch 8 and 16, three runs
// each way, alternated) a step of 8 sequences ran 1.17 to 1.38 times faster on the kernel than on
// oneDNN's products, one of 16 1.04 to 1.18 times. (A step that carries a decode row runs here
// with more rows too: CarriesDecodeRow.)
constexpr uint32_t kBatchedRows = 16;

// Whether a step carries a decode row (a sequence's next token). Such a step's products all go to
// a small-batch kernel (bf16 or f16, where the CPU has it), whatever their number (at most
// `parallel` decode rows and kStepPromptTokens of prompts, sequence_slots.h), so that a decode
// row's sums are the same bits whether a prompt's piece rides along or not: a stream's decode
// steps do not depend on what else the replica serves, and a stream resumed on another worker
// continues as it would have. Per row the kernel costs about
// what oneDNN does at these sizes (docs/benchmarks.md, "A decode row's bits").
// Logits asked of a model without an output head (weights.h): nothing is computed or written.
Status NoOutputHead() {
  return Error(Code::kFailedPrecondition, "the model has no output head (lm_head.weight): it embeds only");
}

bool CarriesDecodeRow(std::span<const StepRun> runs) {
  return std::any_of(runs.begin(), runs.end(), [](const StepRun& run) { return run.decode; });
}

// y[rows x w.rows] = x[rows x w.cols] · wᵀ + bias. Either way a call reads the weights from memory
// once: a prefill costs the weights once, as a decode step does.
void Project(const float* x, uint32_t rows, const Matrix& w, const Vector& bias, float* y, int threads) {
  const bool f16c = w.dtype == DType::F16 && dense::HaveF16Gemv();
  if (f16c && rows <= dense::kGemvRows) {
    // The dense engine's F16C kernel: halves converted in registers, the weights read once.
    const std::vector<float> widened_bias = WidenAll(bias);
    dense::F16Gemv(w.data, w.cols, w.rows, x, rows, bias ? widened_bias.data() : nullptr, y, threads);
    return;
  }
  const int64_t outputs = w.rows;
  const bool direct = rows <= kDirectRows && w.dtype != DType::F16;
  const uint64_t row_bytes = uint64_t{w.cols} * safetensors::DTypeSize(w.dtype);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t o = 0; o < outputs; ++o) {
    float b = 0;
    if (bias) Widen(bias.data, bias.dtype, static_cast<uint64_t>(o), 1, &b);
    if (direct) {
      const uint8_t* stored = w.data + static_cast<uint64_t>(o) * row_bytes;
      for (uint32_t r = 0; r < rows; ++r) {
        y[uint64_t{r} * w.rows + o] = DotStored(stored, w.dtype, x + uint64_t{r} * w.cols, w.cols) + b;
      }
      continue;
    }
    thread_local std::vector<float> row;
    row.resize(w.cols);
    if (f16c) {
      dense::WidenHalves(w.data + static_cast<uint64_t>(o) * row_bytes, w.cols, row.data(), 1);
    } else {
      Widen(w.data, w.dtype, static_cast<uint64_t>(o) * w.cols, w.cols, row.data());
    }
    for (uint32_t r = 0; r < rows; ++r) y[uint64_t{r} * w.rows + o] = Dot(x + uint64_t{r} * w.cols, row.data(), w.cols) + b;
  }
}

// x / sqrt(mean(x²) + eps) * weight over each of `rows` rows of `width`.
void RmsNorm(const float* x, uint64_t rows, uint32_t width, const std::vector<float>& weight, double eps, float* y) {
  for (uint64_t r = 0; r < rows; ++r) {
    const float* in = x + uint64_t{r} * width;
    float* out = y + uint64_t{r} * width;
    double squares = 0;
    for (uint32_t i = 0; i < width; ++i) squares += double{in[i]} * in[i];
    const float scale = static_cast<float>(1.0 / std::sqrt(squares / width + eps));
    for (uint32_t i = 0; i < width; ++i) out[i] = in[i] * scale * weight[i];
  }
}

}  // namespace

void WarmCpuKernels() {
  // The attention's two products (PromptAttention; DecodeAttention without AVX-512): scores = q·kᵀ over a
  // block's positions, then out += scores·v, for a full block and a part of one, at the common
  // head sizes. Their sizes only pick among kernels generated once each.
  omp_set_num_threads(dense::CpuThreads());  // the calling thread's team, as the engines' own
  constexpr int kGroup = 4, kMostDim = 128;
  std::vector<float> q(kGroup * kMostDim, 0.5f), kv(kKvBlockTokens * kMostDim, 0.25f), scores(kGroup * kKvBlockTokens);
  for (const int span : {static_cast<int>(kKvBlockTokens), 7, 1}) {
    for (const int d : {64, kMostDim}) {
      (void)dnnl_sgemm('N', 'T', kGroup, span, d, 1.0f, q.data(), d, kv.data(), d, 0.0f, scores.data(), span);
      (void)dnnl_sgemm('N', 'N', kGroup, d, span, 1.0f, scores.data(), span, kv.data(), d, 1.0f, q.data(), d);
    }
  }
}

CpuModel::CpuModel(const Config& config, const ModelWeights& weights, int threads)
    : config_(config), weights_(weights), threads_(std::max(1, threads)), inv_freq_(config.RotaryFrequencies()) {}

Status CpuModel::Linear(const float* x, uint32_t rows, const Matrix& w, const Vector& bias, float* y,
                        bool decoding) {
  // Decode tokens on bf16 weights, one sequence's or a continuous-batching step's: the AVX-512
  // BF16 kernel streams the weights once for all rows, with the activations narrowed to bf16 as a
  // prompt's are on oneDNN. A lone row too: a row's sums here are the same bits alone or beside
  // others (BF16Gemv), every row of a step that carries a decode row comes here (CarriesDecodeRow),
  // and the kernel reads the weights faster than the f32 loop below (a 256 MiB model's decode step
  // at 1.02 to 1.09 times the bandwidth the bench measures, against 0.8 to 0.9). As with a
  // prompt's, a subnormal activation or weight counts as zero (VDPBF16PS) and an activation past
  // bf16's largest finite value as infinite.
  if (w.dtype == DType::BF16 && (rows <= kBatchedRows || decoding) && dense::HaveBF16Gemv()) {
    thread_local std::vector<uint16_t> narrow;
    narrow.resize(uint64_t{rows} * w.cols);
    dense::NarrowToBF16(x, narrow.size(), narrow.data());
    const std::vector<float> widened_bias = WidenAll(bias);
    dense::BF16Gemv(w.data, w.cols, w.rows, narrow.data(), rows, bias ? widened_bias.data() : nullptr, y, threads_);
    return OkStatus();
  }
  // The same for f16 weights with F16C: a step that carries a decode row runs in the dense engine's
  // kernel (a lone row already did), whose rows' sums are the same bits in any batch. Not f32: its
  // kernel reads a lone row's weights at 0.8 of the bandwidth where the loop below does 1.05 to
  // 1.09 (warmpool-bench --generate --dtype f32 --batch 8), so an f32 step of more than
  // kDirectRows rows still sums in oneDNN's order.
  if (decoding && w.dtype == DType::F16 && dense::HaveF16Gemv()) {
    const std::vector<float> widened_bias = WidenAll(bias);
    dense::F16Gemv(w.data, w.cols, w.rows, x, rows, bias ? widened_bias.data() : nullptr, y, threads_);
    return OkStatus();
  }
  // Few rows (a decode step): bound by reading the weights, which the loops here do at the memory's
  // pace. Many (a prompt): bound by arithmetic, which oneDNN does best.
  const uint32_t few = w.dtype == DType::F16 && dense::HaveF16Gemv() ? dense::kGemvRows : kDirectRows;
  if (rows > few) return prefill_.Run(x, rows, w, bias, y, threads_);
  Project(x, rows, w, bias, y, threads_);
  return OkStatus();
}

void CpuModel::Rotations(uint32_t position, float* out) const {
  const uint32_t half = config_.head_dim / 2;
  for (uint32_t i = 0; i < half; ++i) {
    const double angle = position * inv_freq_[i];
    out[i] = static_cast<float>(std::cos(angle));
    out[half + i] = static_cast<float>(std::sin(angle));
  }
}

void CpuModel::Rope(float* heads, uint32_t count, const float* rotations) const {
  // HF's rotate_half: the first and second halves of a head are the pairs' two coordinates.
  const uint32_t half = config_.head_dim / 2;
  for (uint32_t i = 0; i < half; ++i) {
    const float c = rotations[i], s = rotations[half + i];
    for (uint32_t h = 0; h < count; ++h) {
      float* x = heads + uint64_t{h} * config_.head_dim;
      const float a = x[i], b = x[i + half];
      x[i] = a * c - b * s;
      x[i + half] = b * c + a * s;
    }
  }
}

Status CpuModel::Check(std::span<const int32_t> tokens, std::span<const StepRun> runs, uint64_t out_size,
                       uint64_t needed) const {
  const Config& c = config_;
  if (tokens.empty() || runs.empty()) return Error(Code::kInvalidArgument, "no tokens to run");
  if (c.kv_element == KvElement::kBF16 && !HaveBF16KvCache(c.head_dim)) {
    return Error(Code::kFailedPrecondition, "this CPU cannot keep a bf16 KV cache (AVX-512 BF16, head size {})",
                 c.head_dim);
  }
  uint64_t rows = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const StepRun& run = runs[i];
    if (run.cache == nullptr || run.rows == 0) return Error(Code::kInvalidArgument, "a run without a cache or tokens");
    if (!run.cache->Fits(c)) return Error(Code::kInvalidArgument, "the KV cache was made for another model's shape");
    if (uint64_t{run.start} + run.rows > run.cache->context()) {
      return Error(Code::kInvalidArgument, "positions {} to {} are past the context of {} tokens", run.start,
                   uint64_t{run.start} + run.rows - 1, run.cache->context());
    }
    if (run.start > run.cache->length()) {
      return Error(Code::kInvalidArgument, "position {} follows a KV cache of {} positions: no gap can be left",
                   run.start, run.cache->length());
    }
    for (size_t j = 0; j < i; ++j) {
      if (runs[j].cache == run.cache) return Error(Code::kInvalidArgument, "two runs of one step share a cache");
    }
    rows += run.rows;
  }
  if (rows != tokens.size()) {
    return Error(Code::kInvalidArgument, "{} tokens for runs of {} in all", tokens.size(), rows);
  }
  if (out_size < needed) {
    return Error(Code::kInvalidArgument, "{} floats for the output where {} are needed", out_size, needed);
  }
  for (int32_t token : tokens) {
    if (token < 0 || static_cast<uint32_t>(token) >= c.vocab_size) {
      return Error(Code::kInvalidArgument, "token {} is outside the vocabulary of {}", token, c.vocab_size);
    }
  }
  return OkStatus();
}

Status CpuModel::Forward(std::span<const int32_t> tokens, uint32_t start, KvCache& cache, std::span<float> logits,
                         bool all_positions) {
  const Config& c = config_;
  if (weights_.lm_head.data == nullptr) return NoOutputHead();
  const auto rows = static_cast<uint32_t>(tokens.size());
  const StepRun run{&cache, start, rows};
  if (Status s = Check(tokens, {&run, 1}, logits.size(), uint64_t{all_positions ? rows : 1} * c.vocab_size);
      !s.ok()) {
    return s;
  }
  std::vector<float> x;
  if (Status s = Layers(tokens, {&run, 1}, x); !s.ok()) return s;
  const uint32_t first = all_positions ? 0 : rows - 1;
  const uint32_t count = rows - first;
  std::vector<float> normed(uint64_t{count} * c.hidden_size);
  RmsNorm(&x[uint64_t{first} * c.hidden_size], count, c.hidden_size, WidenAll(weights_.final_norm), c.rms_norm_eps,
          normed.data());
  return Linear(normed.data(), count, weights_.lm_head, {}, logits.data(), rows == 1);
}

Status CpuModel::Hidden(std::span<const int32_t> tokens, uint32_t start, KvCache& cache, std::span<float> hidden) {
  const Config& c = config_;
  const StepRun run{&cache, start, static_cast<uint32_t>(tokens.size())};
  if (Status s = Check(tokens, {&run, 1}, hidden.size(), c.hidden_size); !s.ok()) return s;
  std::vector<float> x;
  if (Status s = Layers(tokens, {&run, 1}, x); !s.ok()) return s;
  RmsNorm(&x[(tokens.size() - 1) * c.hidden_size], 1, c.hidden_size, WidenAll(weights_.final_norm), c.rms_norm_eps,
          hidden.data());
  return OkStatus();
}

Status CpuModel::Step(std::span<const int32_t> tokens, std::span<const StepRun> runs, std::span<float> logits) {
  const Config& c = config_;
  if (weights_.lm_head.data == nullptr) return NoOutputHead();
  if (Status s = Check(tokens, runs, logits.size(), uint64_t{runs.size()} * c.vocab_size); !s.ok()) return s;
  // Each run's last token: through the final norm, then the output head for all of them together.
  std::vector<float> normed(runs.size() * uint64_t{c.hidden_size});
  if (Status s = LastStates(tokens, runs, normed.data()); !s.ok()) return s;
  return Linear(normed.data(), static_cast<uint32_t>(runs.size()), weights_.lm_head, {}, logits.data(),
                CarriesDecodeRow(runs));
}

Status CpuModel::StepHidden(std::span<const int32_t> tokens, std::span<const StepRun> runs, std::span<float> hidden) {
  if (Status s = Check(tokens, runs, hidden.size(), uint64_t{runs.size()} * config_.hidden_size); !s.ok()) return s;
  return LastStates(tokens, runs, hidden.data());
}

Status CpuModel::LastStates(std::span<const int32_t> tokens, std::span<const StepRun> runs, float* out) {
  const Config& c = config_;
  std::vector<float> x;
  if (Status s = Layers(tokens, runs, x); !s.ok()) return s;
  const std::vector<float> norm = WidenAll(weights_.final_norm);
  uint64_t row = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    row += runs[i].rows;
    RmsNorm(&x[(row - 1) * c.hidden_size], 1, c.hidden_size, norm, c.rms_norm_eps, &out[i * c.hidden_size]);
  }
  return OkStatus();
}

Status CpuModel::Layers(std::span<const int32_t> tokens, std::span<const StepRun> runs, std::vector<float>& x) {
  const Config& c = config_;
  const auto rows = static_cast<uint32_t>(tokens.size());
  const uint32_t hidden = c.hidden_size;
  x.assign(uint64_t{rows} * hidden, 0.0f);
  std::vector<float> normed(x.size()), q(uint64_t{rows} * c.q_size()),
      k(uint64_t{rows} * c.kv_size()), v(k.size()), attended(q.size()),
      gate(uint64_t{rows} * c.intermediate_size), up(gate.size()), sigmoid(gate.size());
  // Every run's blocks first (the one error that can remain, a full pool, then leaves no layer
  // half written); the positions are committed once every layer holds them.
  for (const StepRun& run : runs) {
    if (Status s = run.cache->Prepare(run.start, run.start + run.rows); !s.ok()) return s;
  }
  for (uint32_t r = 0; r < rows; ++r) {
    Widen(weights_.embed.data, weights_.embed.dtype, uint64_t(tokens[r]) * hidden, hidden, &x[uint64_t{r} * hidden]);
  }
  std::vector<DecodeRows> decode_rows;
  decode_rows.reserve(runs.size());
  // Each row's rotations (a cosine and a sine per pair of a head), the same in every layer.
  std::vector<float> rotations(uint64_t{rows} * c.head_dim);
  for (uint32_t first = 0; const StepRun& run : runs) {
    for (uint32_t i = 0; i < run.rows; ++i) Rotations(run.start + i, &rotations[uint64_t{first + i} * c.head_dim]);
    first += run.rows;
  }
  const bool decoding = CarriesDecodeRow(runs);
  for (uint32_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& w = weights_.layers[l];
    RmsNorm(x.data(), rows, hidden, WidenAll(w.input_norm), c.rms_norm_eps, normed.data());
    if (Status s = Linear(normed.data(), rows, w.q, w.q_bias, q.data(), decoding); !s.ok()) return s;
    if (Status s = Linear(normed.data(), rows, w.k, w.k_bias, k.data(), decoding); !s.ok()) return s;
    if (Status s = Linear(normed.data(), rows, w.v, w.v_bias, v.data(), decoding); !s.ok()) return s;
    if (c.qk_norm) {
      RmsNorm(q.data(), uint64_t{rows} * c.num_attention_heads, c.head_dim, WidenAll(w.q_norm), c.rms_norm_eps,
              q.data());
      RmsNorm(k.data(), uint64_t{rows} * c.num_key_value_heads, c.head_dim, WidenAll(w.k_norm), c.rms_norm_eps,
              k.data());
    }
    // Positions, the cache and attention are each run's own; the decode rows' attention goes in
    // one call for all the runs.
    uint32_t first = 0;
    decode_rows.clear();
    for (const StepRun& run : runs) {
      KvCache& cache = *run.cache;
      for (uint32_t i = 0; i < run.rows; ++i) {
        const uint64_t r = first + i;
        Rope(&q[r * c.q_size()], c.num_attention_heads, &rotations[r * c.head_dim]);
        Rope(&k[r * c.kv_size()], c.num_key_value_heads, &rotations[r * c.head_dim]);
        if (cache.element() == KvElement::kBF16) {  // rounded to nearest even, as the products' inputs are
          dense::NarrowToBF16(&k[r * c.kv_size()], c.kv_size(), cache.key_bf16(l, run.start + i));
          dense::NarrowToBF16(&v[r * c.kv_size()], c.kv_size(), cache.value_bf16(l, run.start + i));
        } else {
          std::memcpy(cache.key(l, run.start + i), &k[r * c.kv_size()], c.kv_size() * sizeof(float));
          std::memcpy(cache.value(l, run.start + i), &v[r * c.kv_size()], c.kv_size() * sizeof(float));
        }
      }
      float* run_q = &q[uint64_t{first} * c.q_size()];
      float* run_out = &attended[uint64_t{first} * c.q_size()];
      if (run.rows >= kPromptAttentionRows) {
        if (Status s = PromptAttention(c, l, run.rows, run.start, cache, run_q, run_out, threads_); !s.ok()) {
          return s;
        }
      } else {
        decode_rows.push_back({run.rows, run.start, &cache, run_q, run_out});
      }
      first += run.rows;
    }
    if (Status s = DecodeAttention(c, l, decode_rows, threads_); !s.ok()) return s;
    if (Status s = Linear(attended.data(), rows, w.o, w.o_bias, normed.data(), decoding); !s.ok()) return s;
    for (uint64_t i = 0; i < x.size(); ++i) x[i] += normed[i];

    RmsNorm(x.data(), rows, hidden, WidenAll(w.post_attention_norm), c.rms_norm_eps, normed.data());
    if (Status s = Linear(normed.data(), rows, w.gate, {}, gate.data(), decoding); !s.ok()) return s;
    if (Status s = Linear(normed.data(), rows, w.up, {}, up.data(), decoding); !s.ok()) return s;
    // SwiGLU: silu(gate) x up, silu(g) = g / (1 + exp(-g)), the exps in vectors (the same bits
    // at any index: vector_exp.h).
    for (uint64_t i = 0; i < gate.size(); ++i) sigmoid[i] = -gate[i];
    ExpInPlace(sigmoid.data(), sigmoid.size());
    for (uint64_t i = 0; i < gate.size(); ++i) gate[i] = gate[i] / (1.0f + sigmoid[i]) * up[i];
    if (Status s = Linear(gate.data(), rows, w.down, {}, normed.data(), decoding); !s.ok()) return s;
    for (uint64_t i = 0; i < x.size(); ++i) x[i] += normed[i];
  }
  uint64_t first = 0;
  for (const StepRun& run : runs) {
    run.cache->Commit(run.start, tokens.subspan(first, run.rows));
    first += run.rows;
  }
  return OkStatus();
}

std::string CpuSequence::Describe() const {
  return fmt::format("the CPU, {} thread{}", model_.threads(), model_.threads() == 1 ? "" : "s");
}

}  // namespace warmpool::transformer
