// The transformer engine behind the C ABI (engine.h, version 6): a Hugging Face decoder directory
// served on the CPU, or on a GPU when the worker's memory is a device's. Its weights region holds
// every tensor as stored and the tokenizer's file (engines/transformer/packed_model.h), so that
// replicas, respawned workers and unparks attach it without the directory. One sequence at a time:
// its KV cache is the engine's workspace (host memory, or device memory from the budget).
//
// On device memory the forward pass runs in the GPU module (engines/transformer/gpu_sequence.h).
// Where that cannot start (a build without it, no CUDA runtime: the driver test double) the engine
// copies the weights back into host memory, outside the device budget, and computes on the CPU,
// saying so once: slower, never wrong.
#include <algorithm>
#include <deque>
#include <memory>
#include <new>
#include <vector>

#include <nlohmann/json.hpp>

#include "engines/builtin.h"
#include "engines/transformer/embedding.h"
#include "engines/transformer/engine_state.h"
#include "engines/transformer/text_generation.h"
#include "warmpool/engine.h"

namespace warmpool::transformer {
namespace {

// Stop strings a request may give, and their length: each is searched for in the text held back.
constexpr uint32_t kMaxStopStrings = 16;
constexpr uint64_t kMaxStopBytes = 256;

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


// A conversation as the prompt its model was trained on: its chat template, given the messages (and
// the tools it may call), the special tokens' text, and the assistant's turn to speak (Hugging
// Face's apply_chat_template). The messages come as roles and contents, or (version 6) as one JSON
// document that may hold tools and tool calls.
Result<std::string> RenderChat(const TransformerEngine& e, const wp_generate_request& r) {
  if (!e.files->chat) {
    return Error(Code::kFailedPrecondition,
                 "model \"{}\" has no chat template (tokenizer_config.json's chat_template): send a prompt", e.name);
  }
  nlohmann::ordered_json context = {{"messages", nlohmann::ordered_json::array()}};
  if (r.conversation.bytes != 0) {
    if (r.conversation.data == nullptr) return Error(Code::kInvalidArgument, "conversation missing");
    context = nlohmann::ordered_json::parse(r.conversation.data, r.conversation.data + r.conversation.bytes, nullptr, false);
    if (!context.is_object() || !context.contains("messages") || !context["messages"].is_array() ||
        (context.contains("tools") && !context["tools"].is_array())) {
      return Error(Code::kInvalidArgument, "the conversation is not {{\"messages\": [...], \"tools\": [...]}}");
    }
    if (context.contains("tools") && context["tools"].empty()) context.erase("tools");  // templates test `tools` as given
  } else {
    if (r.roles == nullptr || r.contents == nullptr) return Error(Code::kInvalidArgument, "messages missing");
    for (uint32_t i = 0; i < r.message_count; i++) {
      context["messages"].push_back(
          {{"role", std::string(r.roles[i].data != nullptr ? r.roles[i].data : "", r.roles[i].bytes)},
           {"content", std::string(r.contents[i].data != nullptr ? r.contents[i].data : "", r.contents[i].bytes)}});
    }
  }
  context["add_generation_prompt"] = true;
  context["bos_token"] = e.files->bos_text;
  context["eos_token"] = e.files->eos_text;
  const bool tools = context.contains("tools");
  return (tools && e.files->chat_tools ? e.files->chat_tools : e.files->chat)->Render(context);
}

// A chunk's log-probabilities in the ABI's terms, with each token's bytes: valid while it lives.
class ChunkLogprobs {
 public:
  ChunkLogprobs(const tokenizer::Tokenizer& tokenizer, std::span<const TokenLogprobs> logprobs) {
    auto piece = [&](int32_t id) -> const std::string& {
      Result<std::string> bytes = tokenizer.DecodePieces({&id, 1});
      return pieces_.emplace_back(bytes.ok() ? std::move(*bytes) : std::string());
    };
    for (const TokenLogprobs& l : logprobs) {
      std::vector<wp_logprob>& top = tops_.emplace_back();
      for (const auto& [id, logprob] : l.top) {
        const std::string& bytes = piece(id);
        top.push_back({id, logprob, {bytes.data(), bytes.size()}});
      }
      const std::string& bytes = piece(l.token);
      out_.push_back({{l.token, l.logprob, {bytes.data(), bytes.size()}}, top.data(), static_cast<uint32_t>(top.size())});
    }
  }
  const wp_token_logprobs* data() const { return out_.empty() ? nullptr : out_.data(); }

 private:
  std::deque<std::string> pieces_;             // a deque: what a wp_string points at never moves
  std::deque<std::vector<wp_logprob>> tops_;
  std::vector<wp_token_logprobs> out_;
};

Status Generate(TransformerEngine& e, const wp_generate_request& r, wp_emit_fn emit, void* emit_ctx,
                wp_generate_result& result) {
  if (!e.sequence) return Error(Code::kFailedPrecondition, "model \"{}\" is not loaded", e.name);
  TextRequest request;
  if (r.message_count > 0 || r.conversation.bytes != 0) {
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
  request.logprobs = r.logprobs != 0;
  request.top_logprobs = r.top_logprobs;
  Result<TextResult> done = GenerateText(
      *e.sequence, *e.files, request,
      [&](std::string_view text, std::span<const int32_t> tokens, std::span<const TokenLogprobs> logprobs) {
        ChunkLogprobs c_logprobs(*e.files->tokenizer, logprobs);
        wp_generate_chunk chunk{{text.data(), text.size()},           tokens.data(),
                                static_cast<uint32_t>(tokens.size()), c_logprobs.data(),
                                static_cast<uint32_t>(logprobs.size())};
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

// Every input tokenized and checked before any runs: a bad one leaves the output untouched.
Status Embed(TransformerEngine& e, const wp_string* inputs, uint32_t count, float* embeddings, uint32_t* input_tokens,
             wp_progress_fn progress, void* progress_ctx) {
  if (!e.sequence) return Error(Code::kFailedPrecondition, "model \"{}\" is not loaded", e.name);
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
  for (uint32_t i = 0; i < count; i++) {
    if (i > 0 && !keep_going(before)) return Error(Code::kUnavailable, "the embedding was stopped after {} inputs", i);
    Status s = EmbedTokens(*e.sequence, tokenized[i], {out.data() + uint64_t{i} * size, size},
                           [&](size_t done) { return keep_going(before + done); });
    if (!s.ok()) return Error(s.code(), "input {}: {}", i, s.message());
    before += tokenized[i].size();
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
// model(input_ids).logits[-1] is), in pieces of kPrefillPiece as a prompt. The worker has checked
// the input against the signature.
Status RunTokens(TransformerEngine& e, const wp_tensor& ids, uint64_t max_output_bytes, wp_tensor_sink_fn sink,
                 void* sink_ctx, wp_progress_fn progress, void* progress_ctx) {
  if (!e.sequence) return Error(Code::kFailedPrecondition, "model \"{}\" is not loaded", e.name);
  const Config& config = e.sequence->config();
  const uint64_t count = static_cast<uint64_t>(ids.shape[0]);
  if (count == 0 || count > e.sequence->context()) {
    return Error(Code::kInvalidArgument, "input_ids holds {} tokens: 1 to the context's {}", count,
                 e.sequence->context());
  }
  if (max_output_bytes != 0 && uint64_t{config.vocab_size} * sizeof(float) > max_output_bytes) {
    return Error(Code::kResourceExhausted, "the logits take {} bytes, more than a reply holds ({})",
                 uint64_t{config.vocab_size} * sizeof(float), max_output_bytes);
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
  std::vector<float> logits(config.vocab_size);
  std::span<const int32_t> all(tokens);
  for (size_t done = 0; done < count; done += kPrefillPiece) {
    // Between pieces, as a prompt's: the worker hears that the run moves, and may stop it.
    if (done > 0 && progress != nullptr && progress(progress_ctx, done, count) != 0) {
      return Error(Code::kUnavailable, "the run was stopped");
    }
    const size_t piece = std::min<size_t>(kPrefillPiece, count - done);
    if (Status s = e.sequence->Forward(all.subspan(done, piece), static_cast<uint32_t>(done), logits); !s.ok()) {
      return s;
    }
  }
  wp_tensor out = e.signature[1];
  out.data = logits.data();
  out.bytes = logits.size() * sizeof(float);
  const wp_status taken = sink(sink_ctx, &out);
  return taken == WP_OK ? OkStatus() : Status(CodeFromInt(taken), "the logits were refused");
}

wp_status RunCall(wp_engine* engine, const wp_tensor* inputs, uint32_t, uint64_t max_output_bytes,
                  wp_tensor_sink_fn sink, void* sink_ctx, wp_progress_fn progress, void* progress_ctx, char* err,
                  size_t err_len) {
  return Guarded(err, err_len, [&] {
    return RunTokens(*As(engine), inputs[0], max_output_bytes, sink, sink_ctx, progress, progress_ctx);
  });
}

const wp_engine_vtable kTransformerVtable = {
    WP_ENGINE_ABI_VERSION, "transformer", &OpenCall,   &LoadCall,     &InferCall,
    &CloseCall,            &ExportCall,   &AttachCall, &DescribeCall, &GenerateCall,
    &EmbedCall,            &SignatureCall, &RunCall,
};

}  // namespace
}  // namespace warmpool::transformer

extern "C" const wp_engine_vtable* warmpool_engine_transformer(void) { return &warmpool::transformer::kTransformerVtable; }
