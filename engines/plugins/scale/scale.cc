// scale: a sample engine plugin. Its model is a safetensors file holding one F32 tensor "scale",
// either of shape [cols] (inputs must have cols columns) or a scalar (shape [] or [1]: any width).
// Inference multiplies every input row elementwise by it: y[r][c] = x[r][c] * scale[c].
//
// It is written as an engine built outside warmpool would be: it includes only warmpool/engine.h
// (plus nlohmann/json for the header), exports only warmpool_engine(), keeps its weights in device
// memory from the worker's memory service, and implements every entry point of ABI version 2:
// open (header only, from the file or from the header bytes the worker passes on attach), load
// (pread into the region with progress and cancellation), infer, export_weights, attach, close;
// and of version 5, typed tensors: the signature it takes and gives, and run.
// No exception leaves an entry point.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>
#include <new>
#include <string>

#include <nlohmann/json.hpp>

#include "warmpool/engine.h"

namespace {

constexpr uint64_t kMaxHeaderBytes = 16ull << 20;  // as warmpool's own reader
constexpr uint64_t kReadChunkBytes = 1ull << 20;
constexpr uint32_t kMaxBatch = 1u << 16;  // no workspace: any batch fits; reported for preflight

struct ScaleEngine {
  std::string name;
  std::string path;
  const wp_device_memory* memory = nullptr;
  uint64_t file_size = 0;
  uint64_t tensor_offset = 0;  // file offset of the "scale" tensor's data
  uint64_t tensor_bytes = 0;
  uint32_t cols = 0;  // 0: a scalar that scales inputs of any width
  wp_region weights{nullptr, 0, -1};
  bool loaded = false;
  wp_tensor signature[2]{};  // typed tensors: "input" and "output", f32 [rows, cols]
};

ScaleEngine* AsScale(wp_engine* engine) { return reinterpret_cast<ScaleEngine*>(engine); }

wp_status Fail(wp_status code, const std::string& message, char* err, size_t err_len) {
  if (err != nullptr && err_len > 0) std::snprintf(err, err_len, "%s", message.c_str());
  return code;
}

std::string Quoted(const std::string& s) { return "\"" + s + "\""; }

uint64_t ReadLittleEndian64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Reads exactly n bytes at offset; false with errno (0 for a short file) otherwise.
bool PreadAll(int fd, void* buffer, uint64_t n, uint64_t offset) {
  auto* out = static_cast<uint8_t*>(buffer);
  uint64_t done = 0;
  while (done < n) {
    ssize_t got = pread(fd, out + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      if (got == 0) errno = 0;
      return false;
    }
    done += static_cast<uint64_t>(got);
  }
  return true;
}

// Fills the tensor's place and shape from the header: [u64 length][JSON] at the start of the file.
// prefix holds at least the first 8 bytes; every number is checked before it is trusted.
wp_status DescribeModel(ScaleEngine& engine, const uint8_t* prefix, uint64_t prefix_bytes, char* err,
                        size_t err_len) {
  const std::string where = "scale: model file " + Quoted(engine.path);
  if (prefix_bytes < 8 || engine.file_size < 8) {
    return Fail(WP_INVALID_ARGUMENT, where + " is too short for a safetensors header", err, err_len);
  }
  const uint64_t header_len = ReadLittleEndian64(prefix);
  if (header_len == 0 || header_len > kMaxHeaderBytes || header_len > engine.file_size - 8 ||
      header_len > prefix_bytes - 8) {
    return Fail(WP_INVALID_ARGUMENT,
                where + " has a header length of " + std::to_string(header_len) +
                    " bytes that does not fit the file: is it a safetensors file?",
                err, err_len);
  }
  const uint64_t data_offset = 8 + header_len;
  const uint64_t data_bytes = engine.file_size - data_offset;
  nlohmann::json header = nlohmann::json::parse(prefix + 8, prefix + data_offset, nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return Fail(WP_INVALID_ARGUMENT, where + ": the header is not a JSON object", err, err_len);
  }
  auto tensor = header.find("scale");
  if (tensor == header.end() || !tensor->is_object()) {
    return Fail(WP_INVALID_ARGUMENT, where + " has no tensor \"scale\"; the scale engine needs one F32 tensor "
                "\"scale\" of shape [cols] or []", err, err_len);
  }
  auto dtype = tensor->find("dtype");
  if (dtype == tensor->end() || !dtype->is_string() || dtype->get<std::string>() != "F32") {
    return Fail(WP_INVALID_ARGUMENT, where + ": tensor \"scale\" must be F32", err, err_len);
  }
  auto shape = tensor->find("shape");
  if (shape == tensor->end() || !shape->is_array() || shape->size() > 1 ||
      (shape->size() == 1 && !(*shape)[0].is_number_unsigned())) {
    return Fail(WP_INVALID_ARGUMENT, where + ": tensor \"scale\" must have shape [cols] or []", err, err_len);
  }
  uint64_t numel = shape->empty() ? 1 : (*shape)[0].get<uint64_t>();
  if (numel == 0 || numel > std::numeric_limits<uint32_t>::max()) {
    return Fail(WP_INVALID_ARGUMENT, where + ": tensor \"scale\" has " + std::to_string(numel) +
                " elements; it needs 1 to 2^32-1", err, err_len);
  }
  auto offsets = tensor->find("data_offsets");
  if (offsets == tensor->end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    return Fail(WP_INVALID_ARGUMENT, where + ": tensor \"scale\" has no valid data_offsets", err, err_len);
  }
  const uint64_t begin = (*offsets)[0].get<uint64_t>();
  const uint64_t end = (*offsets)[1].get<uint64_t>();
  if (end < begin || end > data_bytes || end - begin != numel * sizeof(float)) {
    return Fail(WP_INVALID_ARGUMENT,
                where + ": tensor \"scale\" has data_offsets [" + std::to_string(begin) + ", " +
                    std::to_string(end) + ") that do not hold " + std::to_string(numel) +
                    " floats inside the file's " + std::to_string(data_bytes) + "-byte data area",
                err, err_len);
  }
  engine.tensor_offset = data_offset + begin;
  engine.tensor_bytes = end - begin;
  // A [1] tensor scales like a scalar: inputs of any width.
  engine.cols = numel == 1 ? 0 : static_cast<uint32_t>(numel);
  return WP_OK;
}

// Reads just the header from the file (the tensor data is read by load).
wp_status DescribeFromFile(ScaleEngine& engine, char* err, size_t err_len) {
  const std::string where = "scale: model file " + Quoted(engine.path);
  int fd = open(engine.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    return Fail(e == ENOENT ? WP_NOT_FOUND : WP_INTERNAL, where + ": cannot open: " + std::strerror(e), err,
                err_len);
  }
  std::unique_ptr<int, void (*)(int*)> closer(&fd, [](int* f) { close(*f); });
  struct stat st {};
  if (fstat(fd, &st) != 0) return Fail(WP_INTERNAL, where + ": cannot stat: " + std::strerror(errno), err, err_len);
  engine.file_size = static_cast<uint64_t>(st.st_size);
  uint8_t length[8];
  if (engine.file_size < 8 || !PreadAll(fd, length, 8, 0)) {
    return Fail(WP_INVALID_ARGUMENT, where + " is too short for a safetensors header", err, err_len);
  }
  const uint64_t header_len = ReadLittleEndian64(length);
  if (header_len == 0 || header_len > kMaxHeaderBytes || header_len > engine.file_size - 8) {
    return DescribeModel(engine, length, sizeof(length), err, err_len);  // reports the bad length
  }
  std::string prefix(8 + header_len, '\0');
  if (!PreadAll(fd, prefix.data(), prefix.size(), 0)) {
    return Fail(WP_INTERNAL, where + ": cannot read the header", err, err_len);
  }
  return DescribeModel(engine, reinterpret_cast<const uint8_t*>(prefix.data()), prefix.size(), err, err_len);
}

void FreeWeights(ScaleEngine& engine) {
  if (engine.weights.ptr != nullptr) engine.memory->free(engine.memory->ctx, &engine.weights);
  engine.weights = wp_region{nullptr, 0, -1};
  engine.loaded = false;
}

wp_status ScaleOpen(const wp_engine_spec* spec, const wp_device_memory* memory, wp_engine** out,
                    wp_engine_info* info, char* err, size_t err_len) {
  if (out == nullptr || info == nullptr) return Fail(WP_INVALID_ARGUMENT, "scale: open needs out and info", err, err_len);
  *out = nullptr;
  if (spec == nullptr || spec->path == nullptr || spec->path[0] == '\0') {
    return Fail(WP_INVALID_ARGUMENT, "the scale engine needs a model file (a .safetensors path)", err, err_len);
  }
  if (memory == nullptr || memory->alloc == nullptr || memory->free == nullptr || memory->import == nullptr) {
    return Fail(WP_INVALID_ARGUMENT, "the scale engine needs a device-memory service", err, err_len);
  }
  if (memory->host_addressable == 0) {
    return Fail(WP_FAILED_PRECONDITION, "the scale engine computes on the CPU and needs host-addressable "
                "memory; use the host memory backend", err, err_len);
  }
  try {
    auto engine = std::make_unique<ScaleEngine>();
    engine->name = spec->name != nullptr ? spec->name : "";
    engine->path = spec->path;
    engine->memory = memory;
    wp_status status;
    if (spec->header != nullptr) {
      // Attaching: describe the model from the header kept since registration, not the file.
      engine->file_size = spec->file_size;
      status = DescribeModel(*engine, spec->header, spec->header_bytes, err, err_len);
    } else {
      status = DescribeFromFile(*engine, err, err_len);
    }
    if (status != WP_OK) return status;
    *info = wp_engine_info{engine->tensor_bytes, 0, engine->cols, engine->cols, kMaxBatch, 0, 0, 0, 0};
    // Any width where the scale is a scalar: -1, the request's to choose.
    const int64_t width = engine->cols != 0 ? int64_t{engine->cols} : -1;
    engine->signature[0] = wp_tensor{"input", WP_DTYPE_F32, 2, {-1, width}, nullptr, 0};
    engine->signature[1] = wp_tensor{"output", WP_DTYPE_F32, 2, {-1, width}, nullptr, 0};
    *out = reinterpret_cast<wp_engine*>(engine.release());
    return WP_OK;
  } catch (const std::bad_alloc&) {
    return Fail(WP_RESOURCE_EXHAUSTED, "scale: out of memory opening the model", err, err_len);
  } catch (const std::exception& e) {
    return Fail(WP_INTERNAL, std::string("scale: open failed: ") + e.what(), err, err_len);
  }
}

wp_status ReadWeights(ScaleEngine& engine, wp_progress_fn progress, void* progress_ctx, char* err,
                      size_t err_len) {
  const std::string where = "scale: model file " + Quoted(engine.path);
  int fd = open(engine.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    return Fail(e == ENOENT ? WP_NOT_FOUND : WP_INTERNAL, where + ": cannot open: " + std::strerror(e), err,
                err_len);
  }
  std::unique_ptr<int, void (*)(int*)> closer(&fd, [](int* f) { close(*f); });
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != engine.file_size) {
    return Fail(WP_FAILED_PRECONDITION, where + " changed after it was opened; open it again", err, err_len);
  }
  auto* destination = static_cast<uint8_t*>(engine.weights.ptr);
  for (uint64_t done = 0; done < engine.tensor_bytes;) {
    const uint64_t n = std::min(kReadChunkBytes, engine.tensor_bytes - done);
    if (!PreadAll(fd, destination + done, n, engine.tensor_offset + done)) {
      return Fail(errno == 0 ? WP_FAILED_PRECONDITION : WP_INTERNAL,
                  where + ": read failed: " + (errno == 0 ? "the file is shorter than its header says"
                                                          : std::strerror(errno)),
                  err, err_len);
    }
    done += n;
    if (progress != nullptr && progress(progress_ctx, done, engine.tensor_bytes) != 0) {
      return Fail(WP_UNAVAILABLE, "scale: loading model " + Quoted(engine.name) + " was cancelled", err, err_len);
    }
  }
  return WP_OK;
}

wp_status ScaleLoad(wp_engine* instance, wp_progress_fn progress, void* progress_ctx, char* err, size_t err_len) {
  if (instance == nullptr) return Fail(WP_INVALID_ARGUMENT, "scale: no engine", err, err_len);
  ScaleEngine& engine = *AsScale(instance);
  if (engine.loaded) return Fail(WP_FAILED_PRECONDITION, "scale: model " + Quoted(engine.name) + " is already loaded", err, err_len);
  try {
    wp_status allocated = engine.memory->alloc(engine.memory->ctx, engine.tensor_bytes, &engine.weights);
    if (allocated != WP_OK) {
      engine.weights = wp_region{nullptr, 0, -1};
      return Fail(allocated == WP_RESOURCE_EXHAUSTED ? WP_RESOURCE_EXHAUSTED : WP_INTERNAL,
                  "scale: cannot allocate " + std::to_string(engine.tensor_bytes) +
                      " bytes of device memory for model " + Quoted(engine.name) +
                      (allocated == WP_RESOURCE_EXHAUSTED ? ": over the memory budget" : ""),
                  err, err_len);
    }
    wp_status read = ReadWeights(engine, progress, progress_ctx, err, err_len);
    if (read != WP_OK) {
      FreeWeights(engine);
      return read;
    }
    engine.loaded = true;
    return WP_OK;
  } catch (const std::exception& e) {
    FreeWeights(engine);
    return Fail(WP_INTERNAL, std::string("scale: load failed: ") + e.what(), err, err_len);
  }
}

wp_status ScaleInfer(wp_engine* instance, const float* input, uint32_t rows, uint32_t cols, float* output,
                     char* err, size_t err_len) {
  if (instance == nullptr) return Fail(WP_INVALID_ARGUMENT, "scale: no engine", err, err_len);
  const ScaleEngine& engine = *AsScale(instance);
  try {
    if (!engine.loaded) return Fail(WP_FAILED_PRECONDITION, "scale: model " + Quoted(engine.name) + " is not loaded", err, err_len);
    if (rows == 0 || cols == 0) return Fail(WP_INVALID_ARGUMENT, "input is empty", err, err_len);
    if (engine.cols != 0 && cols != engine.cols) {
      return Fail(WP_INVALID_ARGUMENT,
                  "input has " + std::to_string(cols) + " columns but model " + Quoted(engine.name) + " expects " +
                      std::to_string(engine.cols),
                  err, err_len);
    }
    if (input == nullptr || output == nullptr) return Fail(WP_INVALID_ARGUMENT, "scale: input and output must not be null", err, err_len);
    const auto* scale = static_cast<const float*>(engine.weights.ptr);  // region mappings are page-aligned
    for (uint64_t r = 0; r < rows; ++r) {
      const float* x = input + r * cols;
      float* y = output + r * cols;  // may be input itself: elementwise, so that is fine
      if (engine.cols == 0) {
        for (uint32_t c = 0; c < cols; ++c) y[c] = x[c] * scale[0];
      } else {
        for (uint32_t c = 0; c < cols; ++c) y[c] = x[c] * scale[c];
      }
    }
    return WP_OK;
  } catch (const std::exception& e) {
    return Fail(WP_INTERNAL, std::string("scale: infer failed: ") + e.what(), err, err_len);
  }
}

void ScaleClose(wp_engine* instance) {
  if (instance == nullptr) return;
  ScaleEngine* engine = AsScale(instance);
  FreeWeights(*engine);
  delete engine;
}

wp_status ScaleExport(wp_engine* instance, wp_region* out) {
  if (instance == nullptr || out == nullptr || !AsScale(instance)->loaded) return WP_FAILED_PRECONDITION;
  *out = AsScale(instance)->weights;
  return WP_OK;
}

wp_status ScaleAttach(wp_engine* instance, const wp_region* weights, char* err, size_t err_len) {
  if (instance == nullptr || weights == nullptr) {
    return Fail(WP_INVALID_ARGUMENT, "scale: attach needs an engine and weights", err, err_len);
  }
  ScaleEngine& engine = *AsScale(instance);
  try {
    if (engine.loaded) return Fail(WP_FAILED_PRECONDITION, "scale: model " + Quoted(engine.name) + " is already loaded", err, err_len);
    if (weights->ptr == nullptr || weights->bytes < engine.tensor_bytes) {
      return Fail(WP_INVALID_ARGUMENT,
                  "scale: the shared weights of model " + Quoted(engine.name) + " hold " +
                      std::to_string(weights->bytes) + " bytes but its header needs " +
                      std::to_string(engine.tensor_bytes),
                  err, err_len);
    }
    engine.weights = *weights;  // taken over: close frees this mapping
    engine.loaded = true;
    return WP_OK;
  } catch (const std::exception& e) {
    return Fail(WP_INTERNAL, std::string("scale: attach failed: ") + e.what(), err, err_len);
  }
}

// Typed tensors (engine.h, version 5): the same product, named. What it takes is stated, so the
// worker has checked the input's dtype and rank (and its width, unless the scale is a scalar).
wp_status ScaleSignature(wp_engine* instance, const wp_tensor** inputs, uint32_t* input_count,
                         const wp_tensor** outputs, uint32_t* output_count) {
  ScaleEngine& engine = *AsScale(instance);
  *inputs = &engine.signature[0];
  *outputs = &engine.signature[1];
  *input_count = *output_count = 1;
  return WP_OK;
}

wp_status ScaleRun(wp_engine* instance, const wp_tensor* inputs, uint32_t, uint64_t max_output_bytes,
                   wp_tensor_sink_fn sink, void* sink_ctx, wp_progress_fn, void*, char* err, size_t err_len) {
  const int64_t rows = inputs[0].shape[0], cols = inputs[0].shape[1];
  if (rows > INT64_C(0xFFFFFFFF) || cols > INT64_C(0xFFFFFFFF)) {
    return Fail(WP_INVALID_ARGUMENT, "scale: an input of more than 2^32 rows or columns", err, err_len);
  }
  const uint64_t bytes = static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols) * sizeof(float);
  if (max_output_bytes != 0 && bytes > max_output_bytes) {
    return Fail(WP_RESOURCE_EXHAUSTED, "scale: the output takes more than a reply holds: send fewer rows", err,
                err_len);
  }
  try {
    std::vector<float> output(static_cast<size_t>(rows) * static_cast<size_t>(cols));
    wp_status status = ScaleInfer(instance, static_cast<const float*>(inputs[0].data), static_cast<uint32_t>(rows),
                                  static_cast<uint32_t>(cols), output.data(), err, err_len);
    if (status != WP_OK) return status;
    wp_tensor out = AsScale(instance)->signature[1];
    out.shape[0] = rows;
    out.shape[1] = cols;
    out.data = output.data();
    out.bytes = bytes;
    return sink(sink_ctx, &out);
  } catch (const std::exception& e) {
    return Fail(WP_RESOURCE_EXHAUSTED, std::string("scale: run failed: ") + e.what(), err, err_len);
  }
}

// Tensors only: no model directory to describe, no text to generate, no embeddings.
const wp_engine_vtable kScaleVtable = {WP_ENGINE_ABI_VERSION, "scale",     &ScaleOpen,      &ScaleLoad,
                                       &ScaleInfer,           &ScaleClose, &ScaleExport,    &ScaleAttach,
                                       /*describe=*/nullptr,  /*generate=*/nullptr,
                                       /*embed=*/nullptr,     &ScaleSignature, &ScaleRun,
                                       /*open_sequence=*/nullptr, /*step=*/nullptr, /*close_sequence=*/nullptr,
                                       /*export_cache=*/nullptr, /*kv_usage=*/nullptr,
                                       /*adopt_cache=*/nullptr};

}  // namespace

extern "C" __attribute__((visibility("default"))) const wp_engine_vtable* warmpool_engine(void) {
  return &kScaleVtable;
}
