// How a transformer engine comes to serve: engine_state.h.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <new>

#include "common/small_file.h"
#include "engines/builtin.h"
#include "engines/dense_cpu.h"
#include "engines/transformer/decode_attention.h"
#include "engines/transformer/engine_state.h"
#include "engines/transformer/gpu_sequence.h"
#include "engines/transformer/gpu_slots.h"
#include "engines/transformer/weights.h"

namespace warmpool::transformer {
namespace {

// A load reads the files into device memory through a host buffer this large.
constexpr uint64_t kStagingBytes = uint64_t{16} << 20;

// Where a model's forward pass runs, and why (on the worker's stderr, which the daemon logs): once
// per model bound, a rare event.
void SayWhereItRuns(const TransformerEngine& e, const std::string& what) {
  std::fprintf(stderr, "transformer engine: model \"%s\": %s\n", e.name.c_str(), what.c_str());
}

Result<ModelWeights> BindAt(TransformerEngine& e, const uint8_t* base) {
  std::map<std::string, TensorView> views;
  for (const PackedTensor& t : e.packed.tensors) {
    views.emplace(t.name, TensorView{t.name, t.dtype, t.shape, base + t.offset, t.file, t.file_offset, t.bytes});
  }
  Result<ModelWeights> weights = BindWeights(e.packed.config, views, e.name);
  // What open told the supervisor (info.embeds_only) is what the bound weights are.
  if (weights.ok() && (weights->lm_head.data != nullptr) != e.has_head) {
    return Error(Code::kInternal, "model \"{}\": its output head is not as its description said", e.name);
  }
  return weights;
}

Status ReadRegion(const TransformerEngine& e, uint64_t offset, void* out, uint64_t bytes) {
  if (e.memory->read(e.memory->ctx, &e.region, offset, out, bytes) != WP_OK) {
    return Error(Code::kInternal, "model \"{}\": cannot read its region back from the device", e.name);
  }
  return OkStatus();
}

// Every sequence's cache from `pool` now. Whatever caches an earlier pool's sequences had hold
// blocks of it: they go first.
void UsePool(TransformerEngine& e, std::unique_ptr<KvPool> pool) {
  e.slots.reset();
  e.sequence.reset();
  e.cache.reset();
  e.kv_pool = std::move(pool);
  e.cache = std::make_unique<KvCache>(*e.kv_pool, e.context);
  if (e.gpu_model) {
    e.sequence = std::make_unique<GpuSequence>(*e.gpu_model, *e.cache);
    e.slots = std::make_unique<GpuSlots>(*e.gpu_model, *e.kv_pool, *e.cache, e.sequences);
    return;
  }
  e.sequence = std::make_unique<CpuSequence>(*e.model, *e.cache);
  e.slots = std::make_unique<CpuSlots>(*e.model, *e.kv_pool, *e.cache, e.sequences);
}

// The model on the CPU, its tensors where they lie in `base` (the region, or its host copy).
Status StartOnCpu(TransformerEngine& e, const uint8_t* base) {
  Result<ModelWeights> weights = BindAt(e, base);
  if (!weights.ok()) return weights.status();
  // The worker's compute threads ([daemon] threads_per_worker), as the dense engine uses them.
  e.model = std::make_unique<CpuModel>(e.packed.config, *weights, dense::CpuThreads());
  Result<std::unique_ptr<KvPool>> pool =
      KvPool::Make(e.packed.config, KvPoolBlocks(e.context, e.sequences, e.kv_tokens));
  if (!pool.ok()) return pool.status();
  UsePool(e, std::move(*pool));
  return OkStatus();
}

Status StartOnDevice(TransformerEngine& e) {
  Result<ModelWeights> weights = BindAt(e, static_cast<const uint8_t*>(e.region.ptr));
  if (!weights.ok()) return weights.status();
  std::string why;
  e.gpu_model = StartGpuModel(e.packed.config, *weights, e.memory, e.context, e.sequences,
                              KvPoolBlocks(e.context, e.sequences, e.kv_tokens), &why);
  if (e.gpu_model) {
    Result<std::unique_ptr<KvPool>> pool = MakeGpuPool(*e.gpu_model);
    if (!pool.ok()) return pool.status();
    UsePool(e, std::move(*pool));
    SayWhereItRuns(e, e.sequence->Describe());
    return OkStatus();
  }
  // Outside the device budget, as the copy is: the CPU's KV pool, as many positions as the GPU's.
  SayWhereItRuns(e, fmt::format("weights on the GPU, computed on the CPU from a host copy and a KV cache of {} "
                                "positions in host memory: {}",
                                uint64_t{KvPoolBlocks(e.context, e.sequences, e.kv_tokens)} * kKvBlockTokens, why));
  try {
    e.host_copy.reset(new uint8_t[e.packed.region_bytes]);
  } catch (const std::bad_alloc&) {
    return Error(Code::kResourceExhausted, "model \"{}\": no host memory for the copy its CPU fallback needs ({})",
                 e.name, why);
  }
  if (Status s = ReadRegion(e, 0, e.host_copy.get(), e.packed.region_bytes); !s.ok()) return s;
  return StartOnCpu(e, e.host_copy.get());
}

}  // namespace

Status BindEngine(TransformerEngine& e) {
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

Status AdoptCache(TransformerEngine& e, int handle, uint64_t bytes) {
  if (e.gpu_model && e.open_sequences != 0) {
    return Error(Code::kFailedPrecondition, "model \"{}\" has {} sequences open: its KV cache is theirs", e.name,
                 e.open_sequences);
  }
  if (e.gpu_model && e.kv_pool) {
    // A GPU's pool parked as a host copy of its region (the worker copied it out at park): written
    // back into this instance's pool region, its prefixes kept.
    Result<KvRegion> host = KvRegion::Open(handle, bytes, e.kv_pool->layers(), e.kv_pool->kv_size(),
                                           e.kv_pool->region().blocks(), e.kv_pool->element());
    if (!host.ok()) return Error(host.status().code(), "model \"{}\": {}", e.name, host.status().message());
    Result<std::unique_ptr<KvPool>> pool = AdoptGpuPool(*e.gpu_model, *host);
    if (!pool.ok()) {
      // The write may have reached the device region this instance's pool keeps its blocks in: a
      // fresh pool, claiming nothing there, replaces it (an empty cache, as before the adopt).
      if (Result<std::unique_ptr<KvPool>> fresh = EmptyGpuPool(*e.gpu_model); fresh.ok()) UsePool(e, std::move(*fresh));
      return Error(pool.status().code(), "model \"{}\": {}", e.name, pool.status().message());
    }
    UsePool(e, std::move(*pool));
    return OkStatus();
  }
  if (!e.kv_pool || !e.model || !e.kv_pool->floats_here()) {
    return Error(Code::kFailedPrecondition, "model \"{}\" keeps no KV cache another instance's could replace",
                 e.name);
  }
  if (e.open_sequences != 0) {
    return Error(Code::kFailedPrecondition, "model \"{}\" has {} sequences open: its KV cache is theirs", e.name,
                 e.open_sequences);
  }
  Result<std::unique_ptr<KvPool>> pool = KvPool::Adopt(e.packed.config, e.kv_pool->blocks().count(), handle, bytes);
  if (!pool.ok()) return Error(pool.status().code(), "model \"{}\": {}", e.name, pool.status().message());
  UsePool(e, std::move(*pool));
  return OkStatus();
}

std::unique_ptr<OpenedKvSource> OpenKvSource(TransformerEngine& e, int handle, uint64_t bytes) {
  if (!e.kv_pool) return nullptr;
  const uint32_t layers = e.kv_pool->layers();
  const uint32_t kv_size = e.kv_pool->kv_size();
  const uint32_t blocks = e.kv_pool->region().blocks();
  const KvElement element = e.kv_pool->element();
  if (e.kv_pool->floats_here()) {
    Result<KvRegion> opened = KvRegion::Open(handle, bytes, layers, kv_size, blocks, element);
    if (!opened.ok()) return nullptr;
    auto mapped = std::make_unique<OpenedKvSource>(e.memory, wp_region{nullptr, 0, -1});
    mapped->SetRecords(std::move(*opened));
    return mapped;
  }
  // A GPU's pool region: the whole region's size, then its records read back through the service.
  if (!e.gpu_model || e.memory->import == nullptr || bytes != KvRegion::WholeBytes(layers, kv_size, blocks, element)) {
    return nullptr;
  }
  wp_region device{nullptr, 0, -1};
  if (e.memory->import(e.memory->ctx, handle, bytes, &device) != WP_OK) return nullptr;
  auto imported = std::make_unique<OpenedKvSource>(e.memory, device);  // freed with it, on every path
  const KvRegion::Span span = KvRegion::ImageSpan(layers, kv_size, blocks, element);
  std::vector<uint8_t> image(span.bytes);
  if (e.memory->read(e.memory->ctx, &device, span.offset, image.data(), image.size()) != WP_OK) return nullptr;
  Result<KvRegion> records = KvRegion::FromImage(image, layers, kv_size, blocks, element);
  if (!records.ok()) return nullptr;
  imported->SetRecords(std::move(*records));
  return imported;
}

Status OpenEngine(const wp_engine_spec& spec, TransformerEngine& e, wp_engine_info& info) {
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
  e.packed.config.kv_element = ServedKvElement(e.packed, e.on_device);
  e.context = ServedContext(e.packed.config, spec.context);
  // The CPU and a GPU alike step several sequences together, their caches blocks of one pool.
  e.sequences = ServedSequences(spec.sequences);
  e.kv_tokens = spec.kv_tokens;
  const uint32_t pool_blocks = KvPoolBlocks(e.context, e.sequences, e.kv_tokens);
  e.preempts = pool_blocks < KvPoolBlocks(e.context, e.sequences);
  e.pacer = StepPacer(kStepPromptTokens, kPrefillPiece, spec.prefill_stretch > 0 ? spec.prefill_stretch : kStepLatencyRatio);
  e.slot_used.assign(e.sequences, false);
  info.weight_bytes = e.packed.region_bytes;
  // On a GPU the workspace is device memory: the KV cache and what the kernels need.
  info.workspace_bytes = ServedWorkspaceBytes(e.packed.config, e.context, e.sequences, e.kv_tokens, e.on_device);
  info.max_batch = 1;
  info.context = e.context;
  info.sequences = e.sequences;
  info.kv_tokens = uint64_t{pool_blocks} * kKvBlockTokens;
  info.embedding_size = e.packed.config.hidden_size;
  info.kv_bytes_per_token = e.packed.config.KvBytesPerToken();
  e.has_head = HasOutputHead(e.packed);
  info.embeds_only = e.has_head ? 0 : 1;
  // A run gives what Hugging Face's model(input_ids) does at the last position: a causal LM's
  // logits, a base model's last hidden state (after the final norm, not scaled to unit length).
  e.signature[0] = {"input_ids", WP_DTYPE_I64, 1, {-1}, nullptr, 0};
  e.signature[1] = e.has_head ? wp_tensor{"logits", WP_DTYPE_F32, 1, {e.packed.config.vocab_size}, nullptr, 0}
                              : wp_tensor{"last_hidden_state", WP_DTYPE_F32, 1, {e.packed.config.hidden_size}, nullptr, 0};
  return OkStatus();
}

namespace {

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

}  // namespace

Status LoadEngine(TransformerEngine& e, wp_progress_fn progress, void* progress_ctx) {
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
  return BindEngine(e);
}

}  // namespace warmpool::transformer
