#include "engines/transformer/prefill_matmul.h"

#include <omp.h>

#include <cstring>

#include <dnnl.hpp>

#include "engines/gemv.h"
#include "engines/half.h"

namespace warmpool::transformer {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using safetensors::DType;

// Shapes a prompt may come in are many (its length): a bounded set is kept (oneDNN's own cache
// makes one made again cheap).
constexpr size_t kPrimitives = 64;

dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& Stream() {
  static dnnl::stream stream(Engine());
  return stream;
}

}  // namespace

struct PrefillMatmul::Primitive {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul matmul;
};

PrefillMatmul::PrefillMatmul() = default;
PrefillMatmul::~PrefillMatmul() = default;

PrefillMatmul::Primitive* PrefillMatmul::PrimitiveFor(uint32_t rows, uint32_t in, uint32_t out, bool bias, bool bf16) {
  const auto key = std::make_tuple(rows, in, out, bias, bf16);
  auto found = primitives_.find(key);
  if (found != primitives_.end()) return found->second.get();
  if (primitives_.size() >= kPrimitives) primitives_.clear();
  const auto m = static_cast<dnnl::memory::dim>(rows);
  const auto k = static_cast<dnnl::memory::dim>(in);
  const auto n = static_cast<dnnl::memory::dim>(out);
  const dt operands = bf16 ? dt::bf16 : dt::f32;
  dnnl::memory::desc src({m, k}, operands, tag::ab);
  dnnl::memory::desc wei({k, n}, operands, tag::ba);  // [out, in] as stored: no repacking
  dnnl::memory::desc dst({m, n}, dt::f32, tag::ab);
  dnnl::matmul::desc desc = bias ? dnnl::matmul::desc(src, wei, dnnl::memory::desc({1, n}, dt::f32, tag::ab), dst)
                                 : dnnl::matmul::desc(src, wei, dst);
  auto made = std::make_unique<Primitive>(Primitive{dnnl::matmul::primitive_desc(desc, Engine()), {}});
  made->matmul = dnnl::matmul(made->pd);
  return primitives_.emplace(key, std::move(made)).first->second.get();
}

Status PrefillMatmul::Run(const float* x, uint32_t rows, const Matrix& w, const Vector& bias, float* y, int threads) {
  const uint64_t count = uint64_t{w.rows} * w.cols;
  if (bias) bias_ = WidenAll(bias);
  if (w.dtype == DType::BF16 && bf16_products_ && reinterpret_cast<uintptr_t>(w.data) % 2 == 0) {
    Primitive* p = nullptr;
    try {
      p = PrimitiveFor(rows, w.cols, w.rows, static_cast<bool>(bias), /*bf16=*/true);
    } catch (const dnnl::error&) {
      bf16_products_ = false;  // no bf16 matmul on this CPU: widen, as for f16
    }
    if (p != nullptr) {
      narrowed_.resize(uint64_t{rows} * w.cols);
      const int64_t elements = static_cast<int64_t>(narrowed_.size());
#pragma omp parallel for num_threads(threads) schedule(static)
      for (int64_t i = 0; i < elements; ++i) narrowed_[static_cast<size_t>(i)] = safetensors::FloatToBF16(x[i]);
      try {
        omp_set_num_threads(threads);
        std::unordered_map<int, dnnl::memory> args = {
            {DNNL_ARG_SRC, dnnl::memory(p->pd.src_desc(), Engine(), narrowed_.data())},
            {DNNL_ARG_WEIGHTS, dnnl::memory(p->pd.weights_desc(), Engine(), const_cast<uint8_t*>(w.data))},
            {DNNL_ARG_DST, dnnl::memory(p->pd.dst_desc(), Engine(), y)}};
        if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(p->pd.bias_desc(), Engine(), bias_.data()));
        p->matmul.execute(Stream(), args);
        Stream().wait();
      } catch (const dnnl::error& e) {
        return Error(Code::kInternal, "a {} x {} bf16 product of {} rows: oneDNN: {}", w.rows, w.cols, rows, e.what());
      }
      return OkStatus();
    }
  }
  const float* weights = nullptr;
  if (w.dtype == DType::F32 && reinterpret_cast<uintptr_t>(w.data) % alignof(float) == 0) {
    weights = reinterpret_cast<const float*>(w.data);
  } else {
    widened_.resize(count);
    if (w.dtype == DType::F32) {
      std::memcpy(widened_.data(), w.data, count * 4);
    } else if (w.dtype == DType::F16 && dense::HaveF16Gemv()) {
      dense::WidenHalves(w.data, count, widened_.data(), threads);
    } else {
      // Row by row over the threads: each row widened by one of them.
#pragma omp parallel for num_threads(threads) schedule(static)
      for (int64_t o = 0; o < static_cast<int64_t>(w.rows); ++o) {
        Widen(w.data, w.dtype, static_cast<uint64_t>(o) * w.cols, w.cols, &widened_[static_cast<size_t>(o) * w.cols]);
      }
    }
    weights = widened_.data();
  }
  try {
    Primitive& p = *PrimitiveFor(rows, w.cols, w.rows, static_cast<bool>(bias), /*bf16=*/false);
    omp_set_num_threads(threads);  // oneDNN's OpenMP runtime takes its threads from here
    std::unordered_map<int, dnnl::memory> args = {
        {DNNL_ARG_SRC, dnnl::memory(p.pd.src_desc(), Engine(), const_cast<float*>(x))},
        {DNNL_ARG_WEIGHTS, dnnl::memory(p.pd.weights_desc(), Engine(), const_cast<float*>(weights))},
        {DNNL_ARG_DST, dnnl::memory(p.pd.dst_desc(), Engine(), y)}};
    if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(p.pd.bias_desc(), Engine(), bias_.data()));
    p.matmul.execute(Stream(), args);
    Stream().wait();
  } catch (const dnnl::error& e) {
    return Error(Code::kInternal, "a {} x {} product of {} rows: oneDNN: {}", w.rows, w.cols, rows, e.what());
  }
  return OkStatus();
}

}  // namespace warmpool::transformer
