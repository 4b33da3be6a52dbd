// The transformer engine behind the C ABI (engine.h, version 3): a Hugging Face decoder directory
// served on the CPU, or on a GPU when the worker's memory is a device's. Its weights region holds
// every tensor as stored and the tokenizer's file (engines/transformer/packed_model.h), so that
// replicas, respawned workers and unparks attach it without the directory. One sequence at a time:
// its KV cache is the engine's workspace (host memory, or device memory from the budget).
//
// On device memory the forward pass runs in the GPU module (engines/transformer/gpu_sequence.h).
// Where that cannot start (a build without it, no CUDA runtime: the driver test double) the engine
// copies the weights back into host memory, outside the device budget, and computes on the CPU,
// saying so once: slower, never wrong.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/small_file.h"
#include "engines/builtin.h"
#include "engines/dense_cpu.h"
#include "engines/transformer/cpu_model.h"
#include "engines/transformer/gpu_sequence.h"
#include "engines/transformer/packed_model.h"
#include "engines/transformer/text_generation.h"
#include "engines/transformer/weights.h"
#include "warmpool/engine.h"

namespace warmpool::transformer {
namespace {

// Stop strings a request may give, and their length: each is searched for in the text held back.
constexpr uint32_t kMaxStopStrings = 16;
constexpr uint64_t kMaxStopBytes = 256;

// A load reads the files into device memory through a host buffer this large.
constexpr uint64_t kStagingBytes = uint64_t{16} << 20;

struct TransformerEngine {
  const wp_device_memory* memory = nullptr;
  bool on_device = false;  // the region is device memory (read and write through the service)
  std::string name;
  int directory = -1;  // a load's, until it ends
  uint32_t context = 0;
  PackedModel packed;
  std::string header;  // packed, encoded: describe()
  wp_region region{nullptr, 0, -1};
  bool has_region = false;
  // Bound once the region holds the model (load, attach).
  std::optional<ServingFiles> files;
  std::unique_ptr<uint8_t[]> host_copy;  // on device memory, when the GPU cannot compute
  std::unique_ptr<CpuModel> model;       // on the CPU
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<Sequence> sequence;    // what generates: the CPU's, or the GPU's

  ~TransformerEngine() {
    sequence.reset();  // before the weights it reads go
    if (directory >= 0) close(directory);
    if (has_region) memory->free(memory->ctx, &region);
  }
};

TransformerEngine* As(wp_engine* engine) { return reinterpret_cast<TransformerEngine*>(engine); }

// The ABI's calls may not throw: a library's exception (an allocation) becomes a status.
template <typename F>
wp_status Guarded(char* err, size_t err_len, F&& body) {
  try {
    return WpFromStatus(body(), err, err_len);
  } catch (const std::bad_alloc&) {
    return WpFromStatus(Error(Code::kResourceExhausted, "transformer: out of memory"), err, err_len);
  } catch (const std::exception& e) {
    return WpFromStatus(Error(Code::kInternal, "transformer: {}", e.what()), err, err_len);
  }
}

// Once per worker: where the layers of models run, and why.
void SayWhereItRuns(const std::string& what) {
  static std::once_flag once;
  std::call_once(once, [&] { std::fprintf(stderr, "transformer engine: %s\n", what.c_str()); });
}

Result<ModelWeights> BindAt(const TransformerEngine& e, const uint8_t* base) {
  std::map<std::string, TensorView> views;
  for (const PackedTensor& t : e.packed.tensors) {
    views.emplace(t.name, TensorView{t.name, t.dtype, t.shape, base + t.offset, t.file, t.file_offset, t.bytes});
  }
  return BindWeights(e.packed.config, views, e.name);
}

Status ReadRegion(const TransformerEngine& e, uint64_t offset, void* out, uint64_t bytes) {
  if (e.memory->read(e.memory->ctx, &e.region, offset, out, bytes) != WP_OK) {
    return Error(Code::kInternal, "model \"{}\": cannot read its region back from the device", e.name);
  }
  return OkStatus();
}

// The model on the CPU, its tensors where they lie in `base` (the region, or its host copy).
Status StartOnCpu(TransformerEngine& e, const uint8_t* base) {
  Result<ModelWeights> weights = BindAt(e, base);
  if (!weights.ok()) return weights.status();
  // The worker's compute threads ([daemon] threads_per_worker), as the dense engine uses them.
  e.model = std::make_unique<CpuModel>(e.packed.config, *weights, dense::CpuThreads());
  e.cache = std::make_unique<KvCache>(e.packed.config, e.context);
  e.sequence = std::make_unique<CpuSequence>(*e.model, *e.cache);
  return OkStatus();
}

Status StartOnDevice(TransformerEngine& e) {
  Result<ModelWeights> weights = BindAt(e, static_cast<const uint8_t*>(e.region.ptr));
  if (!weights.ok()) return weights.status();
  std::string why;
  e.sequence = StartGpuSequence(e.packed.config, *weights, e.memory, e.context, &why);
  if (e.sequence) {
    SayWhereItRuns(e.sequence->Describe());
    return OkStatus();
  }
  SayWhereItRuns("weights on the GPU, computed on the CPU from a host copy: " + why);
  try {
    e.host_copy.reset(new uint8_t[e.packed.region_bytes]);
  } catch (const std::bad_alloc&) {
    return Error(Code::kResourceExhausted, "model \"{}\": no host memory for the copy its CPU fallback needs ({})",
                 e.name, why);
  }
  if (Status s = ReadRegion(e, 0, e.host_copy.get(), e.packed.region_bytes); !s.ok()) return s;
  return StartOnCpu(e, e.host_copy.get());
}

// The region holds the model: the tensors bound where they lie, the tokenizer parsed from its copy.
Status Bind(TransformerEngine& e) {
  const auto* base = static_cast<const uint8_t*>(e.region.ptr);
  TextFiles texts = e.packed.texts;
  if (e.on_device) {
    texts.tokenizer.resize(e.packed.tokenizer_bytes);
    if (Status s = ReadRegion(e, e.packed.tokenizer_offset, texts.tokenizer.data(), texts.tokenizer.size()); !s.ok()) {
      return s;
    }
  } else {
    texts.tokenizer.assign(reinterpret_cast<const char*>(base + e.packed.tokenizer_offset), e.packed.tokenizer_bytes);
  }
  Result<ServingFiles> files = ServingFiles::Parse(texts, e.packed.config.vocab_size, e.name);
  if (!files.ok()) return files.status();
  e.files = std::move(*files);
  return e.on_device ? StartOnDevice(e) : StartOnCpu(e, base);
}

Status Open(const wp_engine_spec& spec, TransformerEngine& e, wp_engine_info& info) {
  e.name = spec.name != nullptr ? spec.name : "";
  e.on_device = e.memory->host_addressable == 0;
  if (e.on_device && (e.memory->write == nullptr || e.memory->read == nullptr)) {
    return Error(Code::kFailedPrecondition,
                 "model \"{}\": the transformer engine needs a memory service that copies to and from device "
                 "memory (write and read)",
                 e.name);
  }
  if (spec.header != nullptr && spec.header_bytes > 0) {
    std::string_view header(reinterpret_cast<const char*>(spec.header), spec.header_bytes);
    Result<PackedModel> packed = DecodeHeader(header);
    if (!packed.ok()) return Error(packed.status().code(), "model \"{}\": {}", e.name, packed.status().message());
    e.packed = std::move(*packed);
    e.header.assign(header);
  } else if (spec.has_directory) {
    const std::string shown = spec.path != nullptr ? spec.path : e.name;
    Result<PackedModel> packed = DescribeDirectory(spec.directory_fd, shown);
    if (!packed.ok()) return packed.status();
    e.packed = std::move(*packed);
    e.header = EncodeHeader(e.packed);
    e.directory = fcntl(spec.directory_fd, F_DUPFD_CLOEXEC, 0);
    if (e.directory < 0) return Error(Code::kInternal, "model \"{}\": cannot keep its directory open", e.name);
  } else {
    return Error(Code::kInvalidArgument,
                 "model \"{}\": the transformer engine serves a model directory (config.json, weights, "
                 "tokenizer.json), not a file",
                 e.name);
  }
  e.context = ServedContext(e.packed.config, spec.context);
  info.weight_bytes = e.packed.region_bytes;
  // On a GPU the workspace is device memory: the KV cache and what the kernels need.
  info.workspace_bytes = e.on_device ? PlanGpuSequence(e.packed.config, e.context).total
                                     : WorkspaceBytes(e.packed.config, e.context);
  info.max_batch = 1;
  info.context = e.context;
  info.sequences = 1;
  info.kv_bytes_per_token = e.packed.config.KvBytesPerToken();
  return OkStatus();
}

// Reads `bytes` at `offset` of the file into `out`, whole.
Status ReadAt(int fd, uint64_t offset, uint8_t* out, uint64_t bytes, const std::string& shown) {
  while (bytes > 0) {
    const ssize_t n = pread(fd, out, std::min<uint64_t>(bytes, 64u << 20), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status(CodeForErrno(errno), fmt::format("\"{}\": read failed: {}", shown, std::strerror(errno)));
    if (n == 0) return Error(Code::kFailedPrecondition, "\"{}\" is shorter than when it was described", shown);
    out += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<uint64_t>(n);
  }
  return OkStatus();
}

// `bytes` of the file at `file_offset` into the region at `region_offset`: in place on the host,
// through `staging` (kStagingBytes) and the memory service on a device.
Status CopyIntoRegion(TransformerEngine& e, int fd, uint64_t file_offset, uint64_t region_offset, uint64_t bytes,
                      uint8_t* staging, const std::string& shown) {
  if (!e.on_device) return ReadAt(fd, file_offset, static_cast<uint8_t*>(e.region.ptr) + region_offset, bytes, shown);
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t step = std::min(kStagingBytes, bytes - done);
    if (Status s = ReadAt(fd, file_offset + done, staging, step, shown); !s.ok()) return s;
    if (e.memory->write(e.memory->ctx, &e.region, region_offset + done, staging, step) != WP_OK) {
      return Error(Code::kInternal, "model \"{}\": cannot copy its weights to the device", e.name);
    }
    done += step;
  }
  return OkStatus();
}

Status Load(TransformerEngine& e, wp_progress_fn progress, void* progress_ctx) {
  if (e.directory < 0) return Error(Code::kFailedPrecondition, "model \"{}\": nothing to load from", e.name);
  if (wp_status s = e.memory->alloc(e.memory->ctx, e.packed.region_bytes, &e.region); s != WP_OK) {
    return Error(CodeFromInt(s), "model \"{}\": no room for its {} bytes of weights", e.name, e.packed.region_bytes);
  }
  e.has_region = true;
  std::unique_ptr<uint8_t[]> staging(e.on_device ? new uint8_t[kStagingBytes] : nullptr);
  uint64_t done = 0;
  const uint64_t total = e.packed.region_bytes;
  for (uint32_t f = 0; f < e.packed.files.size(); f++) {
    const std::string shown = e.name + ": " + e.packed.files[f];
    Result<int> fd = OpenFileAt(e.directory, e.packed.files[f], shown);
    if (!fd.ok()) return fd.status();
    Status read;
    for (const PackedTensor& t : e.packed.tensors) {
      if (t.file != f) continue;
      read = CopyIntoRegion(e, *fd, t.file_offset, t.offset, t.bytes, staging.get(), shown);
      if (!read.ok()) break;
      done += t.bytes;
      if (progress != nullptr && progress(progress_ctx, done, total) != 0) {
        read = Error(Code::kUnavailable, "model \"{}\": load cancelled", e.name);
        break;
      }
    }
    close(*fd);
    if (!read.ok()) return read;
  }
  Result<std::string> text = ReadSmallFileAt(e.directory, "tokenizer.json", e.packed.tokenizer_bytes,
                                             e.name + ": tokenizer.json");
  if (!text.ok()) return text.status();
  if (text->size() != e.packed.tokenizer_bytes) {
    return Error(Code::kFailedPrecondition, "model \"{}\": tokenizer.json changed while it was loaded", e.name);
  }
  if (e.on_device) {
    if (e.memory->write(e.memory->ctx, &e.region, e.packed.tokenizer_offset, text->data(), text->size()) != WP_OK) {
      return Error(Code::kInternal, "model \"{}\": cannot copy its tokenizer to the device", e.name);
    }
  } else {
    std::memcpy(static_cast<uint8_t*>(e.region.ptr) + e.packed.tokenizer_offset, text->data(), text->size());
  }
  close(e.directory);
  e.directory = -1;
  if (progress != nullptr) progress(progress_ctx, total, total);
  return Bind(e);
}

// A conversation as the prompt its model was trained on: its chat template, given the messages, the
// special tokens' text, and the assistant's turn to speak (Hugging Face's apply_chat_template).
Result<std::string> RenderChat(const TransformerEngine& e, const wp_generate_request& r) {
  if (!e.files->chat) {
    return Error(Code::kFailedPrecondition,
                 "model \"{}\" has no chat template (tokenizer_config.json's chat_template): send a prompt", e.name);
  }
  if (r.roles == nullptr || r.contents == nullptr) return Error(Code::kInvalidArgument, "messages missing");
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (uint32_t i = 0; i < r.message_count; i++) {
    messages.push_back({{"role", std::string(r.roles[i].data != nullptr ? r.roles[i].data : "", r.roles[i].bytes)},
                        {"content", std::string(r.contents[i].data != nullptr ? r.contents[i].data : "", r.contents[i].bytes)}});
  }
  nlohmann::ordered_json context = {{"messages", std::move(messages)},
                                    {"add_generation_prompt", true},
                                    {"bos_token", e.files->bos_text},
                                    {"eos_token", e.files->eos_text}};
  return e.files->chat->Render(context);
}

Status Generate(TransformerEngine& e, const wp_generate_request& r, wp_emit_fn emit, void* emit_ctx,
                wp_generate_result& result) {
  if (!e.sequence) return Error(Code::kFailedPrecondition, "model \"{}\" is not loaded", e.name);
  TextRequest request;
  if (r.message_count > 0) {
    Result<std::string> prompt = RenderChat(e, r);
    if (!prompt.ok()) return prompt.status();
    request.prompt = std::move(*prompt);
    request.add_special_tokens = false;  // HF's apply_chat_template: the template wrote them
  } else if (r.token_count > 0) {
    if (r.tokens == nullptr) return Error(Code::kInvalidArgument, "token ids missing");
    request.tokens.assign(r.tokens, r.tokens + r.token_count);
  } else {
    request.prompt.assign(r.prompt.data != nullptr ? r.prompt.data : "", r.prompt.bytes);
  }
  request.max_tokens = r.max_tokens;
  SamplingOptions& s = request.sampling;
  s = e.files->sampling;
  if (r.set & WP_SET_TEMPERATURE) s.temperature = r.temperature;
  if (r.set & WP_SET_TOP_K) s.top_k = r.top_k;
  if (r.set & WP_SET_TOP_P) s.top_p = r.top_p;
  if (r.set & WP_SET_MIN_P) s.min_p = r.min_p;
  if (r.set & WP_SET_REPETITION_PENALTY) s.repetition_penalty = r.repetition_penalty;
  if (r.set & WP_SET_SEED) s.seed = r.seed;
  if (Status checked = CheckSamplingOptions(s); !checked.ok()) return checked;
  if (r.stop_count > kMaxStopStrings) {
    return Error(Code::kInvalidArgument, "{} stop strings: at most {}", r.stop_count, kMaxStopStrings);
  }
  for (uint32_t i = 0; i < r.stop_count; i++) {
    if (r.stop[i].bytes > kMaxStopBytes) {
      return Error(Code::kInvalidArgument, "a stop string of {} bytes: at most {}", r.stop[i].bytes, kMaxStopBytes);
    }
    request.stop.emplace_back(r.stop[i].data != nullptr ? r.stop[i].data : "", r.stop[i].bytes);
  }
  Result<TextResult> done = GenerateText(*e.sequence, *e.files, request,
                                         [&](std::string_view text, std::span<const int32_t> tokens) {
                                           wp_generate_chunk chunk{{text.data(), text.size()},
                                                                   tokens.data(),
                                                                   static_cast<uint32_t>(tokens.size())};
                                           return emit == nullptr || emit(emit_ctx, &chunk) == 0;
                                         });
  if (!done.ok()) return done.status();
  static_assert(static_cast<int>(FinishReason::kStop) == WP_FINISH_STOP &&
                static_cast<int>(FinishReason::kLength) == WP_FINISH_LENGTH &&
                static_cast<int>(FinishReason::kCancelled) == WP_FINISH_CANCELLED);
  result.finish_reason = static_cast<uint32_t>(done->finish);
  result.prompt_tokens = done->prompt_tokens;
  result.completion_tokens = done->completion_tokens;
  return OkStatus();
}

wp_status OpenCall(const wp_engine_spec* spec, const wp_device_memory* memory, wp_engine** out, wp_engine_info* info,
                   char* err, size_t err_len) {
  if (spec == nullptr || memory == nullptr || out == nullptr || info == nullptr) {
    return WpFromStatus(Error(Code::kInvalidArgument, "transformer: open needs spec, memory, out and info"), err,
                        err_len);
  }
  *out = nullptr;
  return Guarded(err, err_len, [&] {
    auto engine = std::make_unique<TransformerEngine>();
    engine->memory = memory;
    wp_engine_info described{};
    Status s = Open(*spec, *engine, described);
    if (!s.ok()) return s;
    *info = described;
    *out = reinterpret_cast<wp_engine*>(engine.release());
    return OkStatus();
  });
}

wp_status LoadCall(wp_engine* engine, wp_progress_fn progress, void* progress_ctx, char* err, size_t err_len) {
  return Guarded(err, err_len, [&] { return Load(*As(engine), progress, progress_ctx); });
}

wp_status InferCall(wp_engine* engine, const float*, uint32_t, uint32_t, float*, char* err, size_t err_len) {
  return WpFromStatus(Error(Code::kFailedPrecondition,
                            "model \"{}\" is a language model: send it a generate request, not a tensor",
                            As(engine)->name),
                      err, err_len);
}

void CloseCall(wp_engine* engine) { delete As(engine); }

wp_status ExportCall(wp_engine* engine, wp_region* out) {
  TransformerEngine& e = *As(engine);
  if (!e.has_region || out == nullptr) return WP_NOT_FOUND;
  *out = e.region;
  return WP_OK;
}

wp_status AttachCall(wp_engine* engine, const wp_region* weights, char* err, size_t err_len) {
  return Guarded(err, err_len, [&] {
    TransformerEngine& e = *As(engine);
    if (weights == nullptr || weights->bytes < e.packed.region_bytes) {
      return Error(Code::kInvalidArgument, "model \"{}\": the region holds {} bytes, the model {}", e.name,
                   weights == nullptr ? 0 : weights->bytes, e.packed.region_bytes);
    }
    e.region = *weights;
    Status bound = Bind(e);
    // Taken over only once it serves: on failure the region is still the caller's.
    if (bound.ok()) e.has_region = true;
    else e.region = wp_region{nullptr, 0, -1};
    return bound;
  });
}

wp_status DescribeCall(wp_engine* engine, const uint8_t** header, uint64_t* header_bytes) {
  TransformerEngine& e = *As(engine);
  if (header == nullptr || header_bytes == nullptr) return WP_INVALID_ARGUMENT;
  *header = reinterpret_cast<const uint8_t*>(e.header.data());
  *header_bytes = e.header.size();
  return WP_OK;
}

wp_status GenerateCall(wp_engine* engine, const wp_generate_request* request, wp_emit_fn emit, void* emit_ctx,
                       wp_generate_result* result, char* err, size_t err_len) {
  if (request == nullptr || result == nullptr) {
    return WpFromStatus(Error(Code::kInvalidArgument, "transformer: generate needs a request and a result"), err,
                        err_len);
  }
  return Guarded(err, err_len, [&] { return Generate(*As(engine), *request, emit, emit_ctx, *result); });
}

const wp_engine_vtable kTransformerVtable = {
    WP_ENGINE_ABI_VERSION, "transformer", &OpenCall,   &LoadCall,     &InferCall,
    &CloseCall,            &ExportCall,   &AttachCall, &DescribeCall, &GenerateCall,
};

}  // namespace
}  // namespace warmpool::transformer

extern "C" const wp_engine_vtable* warmpool_engine_transformer(void) { return &warmpool::transformer::kTransformerVtable; }
