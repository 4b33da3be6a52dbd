// The echo engine returns its input unchanged. It needs no model file and no device memory, which
// makes it the engine to exercise the supervisor and worker plumbing with.
#include <cstring>
#include <new>

#include "engines/builtin.h"
#include "engines/dense_model.h"
#include "warmpool/engine.h"

namespace warmpool {
namespace {

struct EchoEngine {};

EchoEngine* AsEcho(wp_engine* engine) { return reinterpret_cast<EchoEngine*>(engine); }

wp_status EchoOpen(const wp_engine_spec* spec, const wp_device_memory* memory, wp_engine** out,
                   wp_engine_info* info, char* err, size_t err_len) {
  if (out == nullptr || info == nullptr) {
    return WpFromStatus(Error(Code::kInvalidArgument, "echo: open needs out and info"), err, err_len);
  }
  auto* engine = new (std::nothrow) EchoEngine();
  if (engine == nullptr) return WpFromStatus(Error(Code::kResourceExhausted, "echo: out of memory"), err, err_len);
  *out = reinterpret_cast<wp_engine*>(engine);
  *info = wp_engine_info{0, 0, 0, 0, dense::kMaxBatch, 0, 0, 0, 0};
  return WP_OK;
}

wp_status EchoLoad(wp_engine* engine, wp_progress_fn progress, void* progress_ctx, char* err, size_t err_len) {
  if (progress != nullptr && progress(progress_ctx, 0, 0) != 0) {
    return WpFromStatus(Error(Code::kUnavailable, "echo: load cancelled"), err, err_len);
  }
  return WP_OK;
}

wp_status EchoInfer(wp_engine* engine, const float* input, uint32_t rows, uint32_t cols, float* output,
                    char* err, size_t err_len) {
  if (rows == 0 || cols == 0) {
    return WpFromStatus(Error(Code::kInvalidArgument, "input is empty ({} rows x {} columns)", rows, cols),
                        err, err_len);
  }
  if (input == nullptr || output == nullptr) {
    return WpFromStatus(Error(Code::kInvalidArgument, "echo: input and output must not be null"), err, err_len);
  }
  std::memmove(output, input, static_cast<size_t>(rows) * cols * sizeof(float));
  return WP_OK;
}

// Typed tensors: every input back as an output of its name (no signature: any tensors).
wp_status EchoRun(wp_engine*, const wp_tensor* inputs, uint32_t input_count, uint64_t, wp_tensor_sink_fn sink,
                  void* sink_ctx, wp_progress_fn, void*, char*, size_t) {
  for (uint32_t i = 0; i < input_count; i++) {
    if (wp_status s = sink(sink_ctx, &inputs[i]); s != WP_OK) return s;
  }
  return WP_OK;
}

void EchoClose(wp_engine* engine) { delete AsEcho(engine); }

// Echo holds no weights: nothing to export, and attaching needs none.
wp_status EchoExport(wp_engine*, wp_region*) { return WP_NOT_FOUND; }
wp_status EchoAttach(wp_engine*, const wp_region*, char*, size_t) { return WP_OK; }

const wp_engine_vtable kEchoVtable = {WP_ENGINE_ABI_VERSION,      "echo",     &EchoOpen,   &EchoLoad,
                                      &EchoInfer,                 &EchoClose, &EchoExport, &EchoAttach,
                                      /*describe=*/nullptr,       /*generate=*/nullptr,
                                      /*embed=*/nullptr,          /*tensor_signature=*/nullptr,
                                      &EchoRun,
                                      /*open_sequence=*/nullptr, /*step=*/nullptr, /*close_sequence=*/nullptr,
                                       /*export_cache=*/nullptr, /*kv_usage=*/nullptr,
                                       /*adopt_cache=*/nullptr};

}  // namespace
}  // namespace warmpool

extern "C" const wp_engine_vtable* warmpool_engine_echo(void) { return &warmpool::kEchoVtable; }
