// The dense engine: an MLP stored as a safetensors file of nn.Sequential Linear layers. Weights
// stay in their stored dtype in one device-memory region and are computed from there: on the CPU
// by engines/dense_cpu.h (oneDNN, and a kernel of its own for f16), without a private copy.
//
// On memory the CPU cannot address (the cuda backend) the weights live on the GPU and are shared
// there, and the layers run there with cuBLAS (engines/dense_gpu.h, a module loaded at run time).
// Where that module cannot start (a build without it, a CUDA runtime that does not start) each
// call copies a layer's weights to host scratch through the memory service and runs it on the CPU:
// correct but slow, and the log says so, and why, once per worker.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>

#include "common/chunks.h"
#include "common/units.h"
#include "engines/builtin.h"
#include "engines/dense_cpu.h"
#include "engines/dense_gpu.h"
#include "engines/dense_model.h"
#include "engines/half.h"
#include "engines/safetensors.h"
#include "warmpool/engine.h"

namespace warmpool {
namespace {

using dense::Activation;
using dense::DenseModel;
using dense::LinearLayer;
using safetensors::DType;
using safetensors::TensorInfo;

constexpr uint64_t kReadChunkBytes = 8ull << 20;
constexpr uint64_t kReadThreads = 4;

struct DenseEngine {
  std::string name;
  std::string path;
  const wp_device_memory* memory = nullptr;
  safetensors::Header header;
  DenseModel model;
  wp_region weights{nullptr, 0, -1};
  bool loaded = false;
  bool on_device = false;  // weights in memory the CPU cannot address: read through the service
  std::unique_ptr<uint8_t[]> staged;  // on_device: one tensor's stored bytes, copied from the device
  dense::StoredBytes stored;          // where the layers find each tensor's stored bytes
  std::unique_ptr<dense::CpuLayers> cpu;  // the layers on the CPU, when not on the GPU
  std::unique_ptr<dense::GpuRunner> gpu;  // on_device, when the GPU kernels started
  // run (ABI version 5): "input" f32 [rows, in_features] to "output" f32 [rows, out_features].
  wp_tensor signature[2]{};
};

DenseEngine* AsDense(wp_engine* engine) { return reinterpret_cast<DenseEngine*>(engine); }

void FreeWeights(DenseEngine& engine) {
  engine.gpu.reset();  // its workspace before the weights it computes from
  engine.cpu.reset();
  if (engine.weights.ptr != nullptr) engine.memory->free(engine.memory->ctx, &engine.weights);
  engine.weights = wp_region{nullptr, 0, -1};
  engine.loaded = false;
}

Status FileChanged(const DenseEngine& engine, uint64_t now_bytes) {
  return Error(Code::kFailedPrecondition,
               "model file \"{}\" changed after it was opened (was {} bytes, now {}); open it again",
               engine.path, engine.header.file_size, now_bytes);
}

Result<uint64_t> CurrentFileSize(int fd, const DenseEngine& engine) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return Error(Code::kInternal, "model file \"{}\": cannot stat: {}", engine.path, std::strerror(errno));
  return static_cast<uint64_t>(st.st_size);
}

// Reads bytes [begin, end) of the file's data area to `destination` (which holds offset begin).
Status ReadRange(int fd, const DenseEngine& engine, uint8_t* destination, uint64_t begin, uint64_t end) {
  for (uint64_t done = begin; done < end;) {
    ssize_t n = pread(fd, destination + (done - begin), end - done,
                      static_cast<off_t>(engine.header.data_offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error(Code::kInternal, "model file \"{}\": read failed: {}", engine.path, std::strerror(errno));
    if (n == 0) {
      Result<uint64_t> now = CurrentFileSize(fd, engine);
      return FileChanged(engine, now.ok() ? *now : engine.header.data_offset + done);
    }
    done += static_cast<uint64_t>(n);
  }
  return OkStatus();
}

Status Cancelled(const DenseEngine& engine, uint64_t done, uint64_t total) {
  return Error(Code::kUnavailable, "loading model \"{}\" was cancelled after {} of {} bytes", engine.name, done,
               total);
}

// Device memory the CPU cannot address: each chunk through host staging, one after another.
Status ReadThroughStaging(int fd, DenseEngine& engine, wp_progress_fn progress, void* progress_ctx) {
  std::unique_ptr<uint8_t[]> staging(new uint8_t[kReadChunkBytes]);
  const uint64_t total = engine.header.data_bytes;
  for (uint64_t done = 0; done < total;) {
    const uint64_t end = std::min(total, done + kReadChunkBytes);
    if (Status s = ReadRange(fd, engine, staging.get(), done, end); !s.ok()) return s;
    if (engine.memory->write(engine.memory->ctx, &engine.weights, done, staging.get(), end - done) != WP_OK) {
      return Error(Code::kInternal, "model \"{}\": cannot copy its weights into device memory", engine.name);
    }
    done = end;
    if (progress != nullptr && progress(progress_ctx, done, total) != 0) return Cancelled(engine, done, total);
  }
  return OkStatus();
}

// Host memory: chunks read straight into the region by up to kReadThreads threads at once (one
// core's copy out of the page cache is far below what the memory moves). Progress is reported
// after every chunk, by whichever thread read it, one call at a time (the ABI allows that) and
// never going back.
Status ReadInPlace(int fd, DenseEngine& engine, wp_progress_fn progress, void* progress_ctx) {
  auto* destination = static_cast<uint8_t*>(engine.weights.ptr);
  const uint64_t total = engine.header.data_bytes;
  std::mutex mutex;  // guards what follows, and serialises the progress calls
  uint64_t done = 0;
  Status error;
  ForEachChunk(total, kReadChunkBytes, kReadThreads, [&](uint64_t begin, uint64_t length) {
    Status s = ReadRange(fd, engine, destination + begin, begin, begin + length);
    std::lock_guard lock(mutex);
    if (!error.ok()) return false;  // cancelled or failed meanwhile: no word after that
    if (s.ok()) {
      done += length;
      if (progress != nullptr && progress(progress_ctx, done, total) != 0) s = Cancelled(engine, done, total);
    }
    error = s;
    return s.ok();
  });
  return error;
}

// Copies the data area of the file into the weights region. pread, not mmap: a file truncated
// under us must give an error, not SIGBUS.
Status ReadWeights(DenseEngine& engine, wp_progress_fn progress, void* progress_ctx) {
  // A worker names the file the supervisor opened for it as /proc/self/fd/N (worker/load.cc), a
  // link to that open file that nothing can redirect: it must be followed, so no O_NOFOLLOW here.
  // O_NONBLOCK: a FIFO must not block the open (the size check below refuses it).
  int fd = open(engine.path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    const Code code = err == ENOENT ? Code::kNotFound : err == EACCES ? Code::kPermissionDenied : Code::kInternal;
    return Status(code, fmt::format("model file \"{}\": cannot open: {}", engine.path, std::strerror(err)));
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { close(fd); }
  } closer{fd};

  Result<uint64_t> size = CurrentFileSize(fd, engine);
  if (!size.ok()) return size.status();
  if (*size != engine.header.file_size) return FileChanged(engine, *size);
  Status read = engine.on_device ? ReadThroughStaging(fd, engine, progress, progress_ctx)
                                 : ReadInPlace(fd, engine, progress, progress_ctx);
  if (!read.ok()) return read;
  size = CurrentFileSize(fd, engine);
  if (!size.ok()) return size.status();
  if (*size != engine.header.file_size) return FileChanged(engine, *size);
  return OkStatus();
}

// The stored bytes of a tensor: in place in host memory, or copied out of the device into `staged`.
Result<const uint8_t*> StoredTensor(DenseEngine& engine, const TensorInfo& tensor) {
  const uint8_t* region = static_cast<const uint8_t*>(engine.weights.ptr);
  if (!engine.on_device) return region + tensor.begin;
  if (engine.memory->read(engine.memory->ctx, &engine.weights, tensor.begin, engine.staged.get(), tensor.bytes()) !=
      WP_OK) {
    return Error(Code::kInternal, "model \"{}\": cannot read its weights from the device", engine.name);
  }
  return engine.staged.get();
}

Status RunModel(DenseEngine& engine, const float* input, uint32_t rows, float* output) {
  for (uint32_t first = 0; first < rows; first += dense::kMaxBatch) {
    const uint32_t step = std::min(dense::kMaxBatch, rows - first);
    const float* x = input + static_cast<size_t>(first) * engine.model.in_features;
    float* y = output + static_cast<size_t>(first) * engine.model.out_features;
    Status s = engine.gpu ? engine.gpu->Run(x, step, y) : engine.cpu->Run(x, step, y, engine.stored);
    if (!s.ok()) {
      return Status(s.code(), fmt::format("model \"{}\"{}: {}", engine.name, engine.gpu ? " on the GPU" : "", s.message()));
    }
  }
  return OkStatus();
}

Status Open(const wp_engine_spec* spec, const wp_device_memory* memory, DenseEngine& engine, wp_engine_info& info) {
  if (spec == nullptr || spec->path == nullptr || spec->path[0] == '\0') {
    return Error(Code::kInvalidArgument, "the dense engine needs a model file (a .safetensors path)");
  }
  if (memory == nullptr || memory->alloc == nullptr || memory->free == nullptr) {
    return Error(Code::kInvalidArgument, "the dense engine needs a device-memory service");
  }
  if (memory->host_addressable == 0 && (memory->write == nullptr || memory->read == nullptr)) {
    return Error(Code::kFailedPrecondition, "the dense engine needs a memory service that copies to and from "
                 "device memory (write and read)");
  }
  engine.on_device = memory->host_addressable == 0;
  engine.name = spec->name != nullptr ? spec->name : "";
  engine.path = spec->path;
  engine.memory = memory;
  // Re-attaching: the description comes from the header bytes kept since registration.
  Result<safetensors::Header> header =
      spec->header != nullptr
          ? safetensors::ParseHeader({spec->header, spec->header_bytes}, spec->file_size, engine.path)
          : safetensors::ReadHeader(engine.path);
  if (!header.ok()) return header.status();
  Result<DenseModel> model = dense::DescribeModel(*header, engine.path);
  if (!model.ok()) return model.status();
  engine.header = std::move(*header);
  engine.model = std::move(*model);

  const dense::ScratchSizes scratch = dense::ScratchFor(engine.model);
  info.weight_bytes = engine.header.data_bytes;
  // On a GPU the workspace is device memory (what the kernels need); on the host, the scratch.
  info.workspace_bytes = engine.on_device ? dense::PlanGpuWorkspace(engine.model).total : dense::WorkspaceBytes(scratch);
  info.in_features = engine.model.in_features;
  info.out_features = engine.model.out_features;
  info.max_batch = dense::kMaxBatch;
  engine.signature[0] = {"input", WP_DTYPE_F32, 2, {-1, engine.model.in_features}, nullptr, 0};
  engine.signature[1] = {"output", WP_DTYPE_F32, 2, {-1, engine.model.out_features}, nullptr, 0};
  return OkStatus();
}

Status PrepareScratch(DenseEngine& engine);

Status Load(DenseEngine& engine, wp_progress_fn progress, void* progress_ctx) {
  if (engine.loaded) return Error(Code::kFailedPrecondition, "model \"{}\" is already loaded", engine.name);
  const uint64_t bytes = engine.header.data_bytes;
  wp_status allocated = engine.memory->alloc(engine.memory->ctx, bytes, &engine.weights);
  if (allocated != WP_OK) {
    engine.weights = wp_region{nullptr, 0, -1};
    return Status(allocated == WP_RESOURCE_EXHAUSTED ? Code::kResourceExhausted : Code::kInternal,
                  fmt::format("cannot allocate {} of device memory for the weights of model \"{}\"{}",
                              FormatBytes(bytes), engine.name,
                              allocated == WP_RESOURCE_EXHAUSTED ? ": over the memory budget" : ""));
  }
  Status read = ReadWeights(engine, progress, progress_ctx);
  if (!read.ok()) {
    FreeWeights(engine);
    return read;
  }
  return PrepareScratch(engine);
}

Status Attach(DenseEngine& engine, const wp_region& weights) {
  if (engine.loaded) return Error(Code::kFailedPrecondition, "model \"{}\" is already loaded", engine.name);
  if (weights.ptr == nullptr || weights.bytes < engine.header.data_bytes) {
    return Error(Code::kInvalidArgument,
                 "the shared weights of model \"{}\" hold {} bytes but its header needs {}",
                 engine.name, weights.bytes, engine.header.data_bytes);
  }
  engine.weights = weights;  // taken over: close releases this mapping
  return PrepareScratch(engine);
}

// Once per worker: what computes the layers of models on device memory, and why.
void SayWhereLayersRun(const std::string& what) {
  static std::once_flag once;
  std::call_once(once, [&] { std::fprintf(stderr, "dense engine: %s\n", what.c_str()); });
}

Status PrepareScratch(DenseEngine& engine) {
  if (engine.on_device) {
    std::string why;
    engine.gpu = dense::StartGpuRunner(engine.model, engine.memory, engine.weights, &why);
    if (engine.gpu) {
      SayWhereLayersRun(engine.gpu->Describe());
      engine.loaded = true;
      return OkStatus();
    }
    SayWhereLayersRun("weights on the GPU, layers computed on the CPU: " + why);
  }
  // Host memory, so not in the workspace the engine reports when on device (that is device memory).
  uint64_t staged_bytes = 0;
  if (engine.on_device) {
    for (const TensorInfo& tensor : engine.header.tensors) staged_bytes = std::max(staged_bytes, tensor.bytes());
  }
  try {
    if (staged_bytes != 0) engine.staged.reset(new uint8_t[staged_bytes]);
  } catch (const std::bad_alloc&) {
    FreeWeights(engine);
    return Error(Code::kResourceExhausted, "cannot allocate the inference workspace of model \"{}\"", engine.name);
  }
  engine.stored = [&engine](const TensorInfo& tensor) { return StoredTensor(engine, tensor); };
  Result<std::unique_ptr<dense::CpuLayers>> cpu = dense::CpuLayers::Start(engine.model, engine.stored);
  if (!cpu.ok()) {
    FreeWeights(engine);
    return Status(cpu.status().code(), fmt::format("model \"{}\": {}", engine.name, cpu.status().message()));
  }
  engine.cpu = std::move(*cpu);
  if (!engine.on_device) SayWhereLayersRun(engine.cpu->Describe());
  engine.loaded = true;
  return OkStatus();
}

Status Infer(DenseEngine& engine, const float* input, uint32_t rows, uint32_t cols, float* output) {
  if (!engine.loaded) return Error(Code::kFailedPrecondition, "model \"{}\" is not loaded", engine.name);
  if (cols != engine.model.in_features) {
    return Error(Code::kInvalidArgument, "input has {} columns but model \"{}\" expects {}", cols, engine.name,
                 engine.model.in_features);
  }
  if (rows == 0) return Error(Code::kInvalidArgument, "input has no rows");
  if (input == nullptr || output == nullptr) return Error(Code::kInvalidArgument, "input and output must not be null");
  return RunModel(engine, input, rows, output);
}

// The C entry points: no exception may leave them.

wp_status DenseOpen(const wp_engine_spec* spec, const wp_device_memory* memory, wp_engine** out,
                    wp_engine_info* info, char* err, size_t err_len) {
  if (out == nullptr || info == nullptr) {
    return WpFromStatus(Error(Code::kInvalidArgument, "dense: open needs out and info"), err, err_len);
  }
  *out = nullptr;
  try {
    auto engine = std::make_unique<DenseEngine>();
    wp_engine_info opened{};
    Status status = Open(spec, memory, *engine, opened);
    if (!status.ok()) return WpFromStatus(status, err, err_len);
    *info = opened;
    *out = reinterpret_cast<wp_engine*>(engine.release());
    return WP_OK;
  } catch (const std::bad_alloc&) {
    return WpFromStatus(Error(Code::kResourceExhausted, "dense: out of memory opening the model"), err, err_len);
  } catch (const std::exception& e) {
    return WpFromStatus(Error(Code::kInternal, "dense: open failed: {}", e.what()), err, err_len);
  }
}

wp_status DenseLoad(wp_engine* engine, wp_progress_fn progress, void* progress_ctx, char* err, size_t err_len) {
  if (engine == nullptr) return WpFromStatus(Error(Code::kInvalidArgument, "dense: no engine"), err, err_len);
  try {
    return WpFromStatus(Load(*AsDense(engine), progress, progress_ctx), err, err_len);
  } catch (const std::exception& e) {
    FreeWeights(*AsDense(engine));
    return WpFromStatus(Error(Code::kInternal, "dense: load failed: {}", e.what()), err, err_len);
  }
}

wp_status DenseInfer(wp_engine* engine, const float* input, uint32_t rows, uint32_t cols, float* output,
                     char* err, size_t err_len) {
  if (engine == nullptr) return WpFromStatus(Error(Code::kInvalidArgument, "dense: no engine"), err, err_len);
  try {
    return WpFromStatus(Infer(*AsDense(engine), input, rows, cols, output), err, err_len);
  } catch (const std::exception& e) {
    return WpFromStatus(Error(Code::kInternal, "dense: infer failed: {}", e.what()), err, err_len);
  }
}

wp_status DenseSignature(wp_engine* engine, const wp_tensor** inputs, uint32_t* input_count,
                         const wp_tensor** outputs, uint32_t* output_count) {
  DenseEngine* dense = AsDense(engine);
  *inputs = &dense->signature[0];
  *outputs = &dense->signature[1];
  *input_count = *output_count = 1;
  return WP_OK;
}

// The worker has checked the input against the signature (and aligned its data).
wp_status DenseRun(wp_engine* engine, const wp_tensor* inputs, uint32_t, uint64_t max_output_bytes,
                   wp_tensor_sink_fn sink, void* sink_ctx, wp_progress_fn, void*, char* err, size_t err_len) {
  DenseEngine& dense = *AsDense(engine);
  const int64_t rows = inputs[0].shape[0];
  if (rows > int64_t{UINT32_MAX}) {
    return WpFromStatus(Error(Code::kInvalidArgument, "{} rows: at most {} in one call", rows, UINT32_MAX), err,
                        err_len);
  }
  // Refused before anything is allocated: a narrow input may ask for a wide output.
  const uint64_t output_bytes = static_cast<uint64_t>(rows) * dense.model.out_features * sizeof(float);
  if (max_output_bytes != 0 && output_bytes > max_output_bytes) {
    return WpFromStatus(Error(Code::kResourceExhausted,
                              "the output of {} rows takes {} bytes, more than a reply holds ({}): send fewer rows",
                              rows, output_bytes, max_output_bytes),
                        err, err_len);
  }
  try {
    std::vector<float> output(static_cast<size_t>(rows) * dense.model.out_features);
    Status status = Infer(dense, static_cast<const float*>(inputs[0].data), static_cast<uint32_t>(rows),
                          dense.model.in_features, output.data());
    if (!status.ok()) return WpFromStatus(status, err, err_len);
    wp_tensor out = dense.signature[1];
    out.shape[0] = rows;
    out.data = output.data();
    out.bytes = output.size() * sizeof(float);
    return sink(sink_ctx, &out);
  } catch (const std::bad_alloc&) {
    return WpFromStatus(Error(Code::kResourceExhausted, "dense: no memory for an output of {} rows", rows), err,
                        err_len);
  } catch (const std::exception& e) {
    return WpFromStatus(Error(Code::kInternal, "dense: run failed: {}", e.what()), err, err_len);
  }
}

wp_status DenseExport(wp_engine* engine, wp_region* out) {
  if (engine == nullptr || out == nullptr || !AsDense(engine)->loaded) return WP_FAILED_PRECONDITION;
  *out = AsDense(engine)->weights;
  return WP_OK;
}

wp_status DenseAttach(wp_engine* engine, const wp_region* weights, char* err, size_t err_len) {
  if (engine == nullptr || weights == nullptr) {
    return WpFromStatus(Error(Code::kInvalidArgument, "dense: attach needs an engine and weights"), err, err_len);
  }
  try {
    return WpFromStatus(Attach(*AsDense(engine), *weights), err, err_len);
  } catch (const std::exception& e) {
    return WpFromStatus(Error(Code::kInternal, "dense: attach failed: {}", e.what()), err, err_len);
  }
}

void DenseClose(wp_engine* engine) {
  if (engine == nullptr) return;
  DenseEngine* dense = AsDense(engine);
  FreeWeights(*dense);
  delete dense;
}

const wp_engine_vtable kDenseVtable = {WP_ENGINE_ABI_VERSION, "dense",      &DenseOpen,
                                       &DenseLoad,            &DenseInfer,  &DenseClose,
                                       &DenseExport,          &DenseAttach,
                                       /*describe=*/nullptr,  /*generate=*/nullptr,
                                       /*embed=*/nullptr,     &DenseSignature,
                                       &DenseRun,
                                       /*open_sequence=*/nullptr, /*step=*/nullptr, /*close_sequence=*/nullptr,
                                       /*export_cache=*/nullptr, /*kv_usage=*/nullptr,
                                       /*adopt_cache=*/nullptr};

}  // namespace
}  // namespace warmpool

extern "C" const wp_engine_vtable* warmpool_engine_dense(void) { return &warmpool::kDenseVtable; }
