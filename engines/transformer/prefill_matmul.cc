#include "engines/transformer/prefill_matmul.h"

#include <omp.h>

#include <cstring>

#include <dnnl.hpp>

#include "engines/gemv.h"

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

Status PrefillMatmul::Run(const float* x, uint32_t rows, const Matrix& w, const Vector& bias, float* y, int threads) {
  const uint64_t count = uint64_t{w.rows} * w.cols;
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
  if (bias) bias_ = WidenAll(bias);
  try {
    const auto key = std::make_tuple(rows, w.cols, w.rows, static_cast<bool>(bias));
    auto found = primitives_.find(key);
    if (found == primitives_.end()) {
      if (primitives_.size() >= kPrimitives) primitives_.clear();
      const auto m = static_cast<dnnl::memory::dim>(rows);
      const auto k = static_cast<dnnl::memory::dim>(w.cols);
      const auto n = static_cast<dnnl::memory::dim>(w.rows);
      dnnl::memory::desc src({m, k}, dt::f32, tag::ab);
      dnnl::memory::desc wei({k, n}, dt::f32, tag::ba);  // [out, in] as stored: no repacking
      dnnl::memory::desc dst({m, n}, dt::f32, tag::ab);
      dnnl::matmul::desc desc = bias ? dnnl::matmul::desc(src, wei, dnnl::memory::desc({1, n}, dt::f32, tag::ab), dst)
                                     : dnnl::matmul::desc(src, wei, dst);
      auto made = std::make_unique<Primitive>(Primitive{dnnl::matmul::primitive_desc(desc, Engine()), {}});
      made->matmul = dnnl::matmul(made->pd);
      found = primitives_.emplace(key, std::move(made)).first;
    }
    Primitive& p = *found->second;
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
