// The transformer engine behind the C ABI (engine.h): a Hugging Face decoder directory
// served on the CPU, or on a GPU when the worker's memory is a device's. Its weights region holds
// every tensor as stored and the tokenizer's file (engines/transformer/packed_model.h), so that
// replicas, respawned workers and unparks attach it without the directory. Its generations are
// sequences stepped together (engine_generate.cc), their KV caches blocks of one pool: the
// engine's workspace (host memory; on a GPU device memory from the budget, the pool's bookkeeping
// on the host: engines/transformer/gpu_slots.h).
//
// On device memory the forward pass runs in the GPU module (engines/transformer/gpu_sequence.h).
// Where that cannot start (a build without it, no CUDA runtime: the driver test double) the engine
// copies the weights back into host memory, outside the device budget, and computes on the CPU,
// saying so once: slower, never wrong.
#include <algorithm>
#include <memory>
#include <new>
#include <vector>

#include <nlohmann/json.hpp>

#include "engines/builtin.h"
#include "engines/transformer/embedding.h"
#include "engines/transformer/engine_state.h"
#include "warmpool/engine.h"

namespace warmpool::transformer {
namespace {

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


// Embeddings and typed runs compute in slot 0's cache: never while a generation holds slots.
Status NoGenerationOpen(const TransformerEngine& e) {
  if (e.open_sequences == 0) return OkStatus();
  return Error(Code::kFailedPrecondition, "model \"{}\" has {} generations open: run this after them", e.name,
               e.open_sequences);
}

// Every input tokenized and checked before any runs: a bad one leaves the output untouched.
Status Embed(TransformerEngine& e, const wp_string* inputs, uint32_t count, float* embeddings, uint32_t* input_tokens,
             wp_progress_fn progress, void* progress_ctx) {
  if (!e.sequence) return Error(Code::kFailedPrecondition, "model \"{}\" is not loaded", e.name);
  if (Status s = NoGenerationOpen(e); !s.ok()) return s;
  if (count > 0 && (inputs == nullptr || embeddings == nullptr)) return Error(Code::kInvalidArgument, "inputs missing");
  std::vector<std::vector<int32_t>> tokenized;
  for (uint32_t i = 0; i < count; i++) {
    std::string_view text(inputs[i].data != nullptr ? inputs[i].data : "", inputs[i].bytes);
    Result<std::vector<int32_t>> tokens = e.files->tokenizer->Encode(text, /*add_special_tokens=*/true);
    if (!tokens.ok()) return Error(tokens.status().code(), "input {}: {}", i, tokens.status().message());
    if (tokens->empty()) return Error(Code::kInvalidArgument, "input {} is empty", i);
    if (tokens->size() > e.context) {
      return Error(Code::kInvalidArgument, "input {} has {} tokens, more than the context of {} of model \"{}\"", i,
                   tokens->size(), e.context, e.name);
    }
    tokenized.push_back(std::move(*tokens));
  }
  const uint32_t size = e.packed.config.hidden_size;
  std::vector<float> out(uint64_t{count} * size);
  uint64_t total = 0, before = 0;  // tokens of all the inputs; of those before this one
  for (const std::vector<int32_t>& tokens : tokenized) total += tokens.size();
  auto keep_going = [&](uint64_t done) { return progress == nullptr || progress(progress_ctx, done, total) == 0; };
  // On the CPU short inputs go in groups, a step each (EmbedGroupEnd); a GPU's sequences take one
  // at a time. Either way the worker hears between steps, and may stop it there.
  const bool grouped = e.model != nullptr && e.kv_pool != nullptr;
  // The single sequence's cache (an earlier embedding's, a typed run's) holds blocks until
  // cleared: cleared now (no generation is open), the pool's available blocks, and with them the
  // groups, are the same for the same request whatever ran before.
  if (grouped) e.cache->Clear();
  const uint32_t group_rows = std::min<uint32_t>(kPrefillPiece, e.context);
  for (uint32_t i = 0; i < count;) {
    if (i > 0 && !keep_going(before)) return Error(Code::kUnavailable, "the embedding was stopped after {} inputs", i);
    const size_t end = grouped ? EmbedGroupEnd(tokenized, i, AvailableBlocks(*e.kv_pool), group_rows) : i + 1;
    if (end - i > 1) {
      Status s = EmbedGroup(*e.model, *e.kv_pool, e.context, std::span(tokenized).subspan(i, end - i),
                            {out.data() + uint64_t{i} * size, (end - i) * size});
      if (!s.ok()) return Error(s.code(), "inputs {} to {}: {}", i, end - 1, s.message());
    } else {
      Status s = EmbedTokens(*e.sequence, tokenized[i], {out.data() + uint64_t{i} * size, size},
                             [&](size_t done) { return keep_going(before + done); });
      if (!s.ok()) return Error(s.code(), "input {}: {}", i, s.message());
    }
    for (; i < end; i++) before += tokenized[i].size();
  }
  std::copy(out.begin(), out.end(), embeddings);
  for (uint32_t i = 0; input_tokens != nullptr && i < count; i++) {
    input_tokens[i] = static_cast<uint32_t>(tokenized[i].size());
  }
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
    Status s = OpenEngine(*spec, *engine, described);
    if (!s.ok()) return s;
    *info = described;
    *out = reinterpret_cast<wp_engine*>(engine.release());
    return OkStatus();
  });
}

wp_status LoadCall(wp_engine* engine, wp_progress_fn progress, void* progress_ctx, char* err, size_t err_len) {
  return Guarded(err, err_len, [&] { return LoadEngine(*As(engine), progress, progress_ctx); });
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

wp_status ExportCacheCall(wp_engine* engine, wp_region* out) {
  TransformerEngine& e = *As(engine);
  if (!e.kv_pool || out == nullptr) return WP_NOT_FOUND;
  if (e.kv_pool->floats_here()) {
    *out = {e.kv_pool->region().data(), e.kv_pool->region().bytes(), e.kv_pool->region().handle()};
    return WP_OK;
  }
  // A GPU's pool: its own device region, with the records mirrored into it (gpu_slots.h).
  if (!e.gpu_model || e.gpu_model->pool().handle < 0) return WP_NOT_FOUND;
  *out = e.gpu_model->pool();
  return WP_OK;
}

wp_status AdoptCacheCall(wp_engine* engine, const wp_region* cache, char* err, size_t err_len) {
  return Guarded(err, err_len, [&] {
    TransformerEngine& e = *As(engine);
    if (cache == nullptr || cache->handle < 0) return Error(Code::kInvalidArgument, "no KV cache region to adopt");
    return AdoptCache(e, cache->handle, cache->bytes);
  });
}

wp_status KvUsageCall(wp_engine* engine, uint64_t* blocks_held, uint64_t* blocks) {
  TransformerEngine& e = *As(engine);
  if (!e.kv_pool || blocks_held == nullptr || blocks == nullptr) return WP_NOT_FOUND;
  *blocks_held = e.kv_pool->blocks().counts().held;
  *blocks = e.kv_pool->blocks().count();
  return WP_OK;
}

wp_status KvReservationsCall(wp_engine* engine, uint64_t* reserved, uint64_t* refused) {
  TransformerEngine& e = *As(engine);
  if (!e.kv_pool || reserved == nullptr || refused == nullptr) return WP_NOT_FOUND;
  *reserved = e.kv_reserved;
  *refused = e.kv_refused;
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
    Status bound = BindEngine(e);
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

wp_status EmbedCall(wp_engine* engine, const wp_string* inputs, uint32_t input_count, float* embeddings,
                    uint32_t* input_tokens, wp_progress_fn progress, void* progress_ctx, char* err, size_t err_len) {
  return Guarded(err, err_len, [&] {
    return Embed(*As(engine), inputs, input_count, embeddings, input_tokens, progress, progress_ctx);
  });
}

wp_status SignatureCall(wp_engine* engine, const wp_tensor** inputs, uint32_t* input_count, const wp_tensor** outputs,
                        uint32_t* output_count) {
  TransformerEngine& e = *As(engine);
  *inputs = &e.signature[0];
  *outputs = &e.signature[1];
  *input_count = *output_count = 1;
  return WP_OK;
}

// Typed tensors: the logits after a run of token ids from position 0 (what Hugging Face's
// model(input_ids).logits[-1] is), or a model without an output head's last hidden state
// (last_hidden_state[-1]), in pieces of kPrefillPiece as a prompt. The worker has checked the input
// against the signature.
Status RunTokens(TransformerEngine& e, const wp_tensor& ids, uint64_t max_output_bytes, wp_tensor_sink_fn sink,
                 void* sink_ctx, wp_progress_fn progress, void* progress_ctx) {
  if (!e.sequence) return Error(Code::kFailedPrecondition, "model \"{}\" is not loaded", e.name);
  if (Status s = NoGenerationOpen(e); !s.ok()) return s;
  const Config& config = e.sequence->config();
  wp_tensor out = e.signature[1];
  const uint64_t out_size = static_cast<uint64_t>(out.shape[0]);
  const uint64_t count = static_cast<uint64_t>(ids.shape[0]);
  if (count == 0 || count > e.sequence->context()) {
    return Error(Code::kInvalidArgument, "input_ids holds {} tokens: 1 to the context's {}", count,
                 e.sequence->context());
  }
  if (max_output_bytes != 0 && out_size * sizeof(float) > max_output_bytes) {
    return Error(Code::kResourceExhausted, "the {} take {} bytes, more than a reply holds ({})", out.name,
                 out_size * sizeof(float), max_output_bytes);
  }
  std::vector<int32_t> tokens(count);
  const auto* values = static_cast<const int64_t*>(ids.data);
  for (uint64_t i = 0; i < count; i++) {
    if (values[i] < 0 || values[i] >= config.vocab_size) {
      return Error(Code::kInvalidArgument, "input_ids[{}] is {}: token ids run from 0 to {}", i, values[i],
                   config.vocab_size - 1);
    }
    tokens[i] = static_cast<int32_t>(values[i]);
  }
  std::vector<float> values_out(out_size);
  std::vector<float> scratch(config.hidden_size);  // the earlier pieces' last states, unused
  std::span<const int32_t> all(tokens);
  for (size_t done = 0; done < count; done += kPrefillPiece) {
    // Between pieces, as a prompt's: the worker hears that the run moves, and may stop it.
    if (done > 0 && progress != nullptr && progress(progress_ctx, done, count) != 0) {
      return Error(Code::kUnavailable, "the run was stopped");
    }
    const size_t piece = std::min<size_t>(kPrefillPiece, count - done);
    // Only the last piece's row is given; the earlier ones' logits would cost a product with the
    // head for nothing.
    const std::span<const int32_t> run = all.subspan(done, piece);
    const auto start = static_cast<uint32_t>(done);
    const Status s = done + piece < count ? e.sequence->Hidden(run, start, scratch)
                     : e.has_head         ? e.sequence->Forward(run, start, values_out)
                                          : e.sequence->Hidden(run, start, values_out);
    if (!s.ok()) return s;
  }
  out.data = values_out.data();
  out.bytes = values_out.size() * sizeof(float);
  const wp_status taken = sink(sink_ctx, &out);
  return taken == WP_OK ? OkStatus() : Status(CodeFromInt(taken), fmt::format("the {} were refused", out.name));
}

wp_status RunCall(wp_engine* engine, const wp_tensor* inputs, uint32_t, uint64_t max_output_bytes,
                  wp_tensor_sink_fn sink, void* sink_ctx, wp_progress_fn progress, void* progress_ctx, char* err,
                  size_t err_len) {
  return Guarded(err, err_len, [&] {
    return RunTokens(*As(engine), inputs[0], max_output_bytes, sink, sink_ctx, progress, progress_ctx);
  });
}

wp_status OpenSequenceCall(wp_engine* engine, const wp_generate_request* request, wp_sequence** out,
                           uint32_t* prompt_tokens, char* err, size_t err_len) {
  if (request == nullptr || out == nullptr) {
    return WpFromStatus(Error(Code::kInvalidArgument, "transformer: open_sequence needs a request and out"), err,
                        err_len);
  }
  *out = nullptr;
  return Guarded(err, err_len, [&]() -> Status {
    Result<wp_sequence*> opened = OpenSequence(*As(engine), *request, prompt_tokens);
    if (!opened.ok()) return opened.status();
    *out = *opened;
    return OkStatus();
  });
}

wp_status StepCall(wp_engine* engine, wp_sequence_step* sequences, uint32_t count, wp_step_emit_fn emit,
                   void* emit_ctx, char* err, size_t err_len) {
  return Guarded(err, err_len, [&] { return StepSequences(*As(engine), sequences, count, emit, emit_ctx); });
}

void CloseSequenceCall(wp_engine* engine, wp_sequence* sequence) { CloseSequence(*As(engine), sequence); }

uint32_t PreemptedCall(wp_engine*, const wp_sequence* sequence) { return PreemptedBlocks(sequence); }

const wp_engine_vtable kTransformerVtable = {
    WP_ENGINE_ABI_VERSION, "transformer",     &OpenCall,   &LoadCall,          &InferCall,
    &CloseCall,            &ExportCall,       &AttachCall, &DescribeCall,      &GenerateCall,
    &EmbedCall,            &SignatureCall,    &RunCall,    &OpenSequenceCall,  &StepCall,
    &CloseSequenceCall,    &ExportCacheCall,  &KvUsageCall, &AdoptCacheCall,    &KvReservationsCall,
    &PreemptedCall,
};

}  // namespace
}  // namespace warmpool::transformer

extern "C" const wp_engine_vtable* warmpool_engine_transformer(void) { return &warmpool::transformer::kTransformerVtable; }
