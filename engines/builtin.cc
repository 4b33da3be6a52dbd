#include "engines/builtin.h"

#include "common/utf8.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

namespace warmpool {
namespace {

struct EmitBridge {
  const Engine::EmitFn* emit;
  uint32_t abi_version;  // of the engine: a chunk of version 3 has no logprobs to read
};

int EmitTrampoline(void* ctx, const wp_generate_chunk* chunk) {
  const auto* bridge = static_cast<const EmitBridge*>(ctx);
  try {
    const std::string text = ValidUtf8(
        std::string(chunk->text.data != nullptr ? chunk->text.data : "", chunk->text.bytes));
    std::span<const int32_t> tokens(chunk->tokens, chunk->tokens != nullptr ? chunk->tokens + chunk->token_count : chunk->tokens);
    std::span<const wp_token_logprobs> logprobs;
    if (bridge->abi_version >= 4 && chunk->logprobs != nullptr) logprobs = {chunk->logprobs, chunk->logprob_count};
    return (*bridge->emit)(text, tokens, logprobs) ? 0 : 1;
  } catch (...) {
    return 1;
  }
}

struct StepEmitBridge {
  const Engine::StepEmitFn* emit;
  uint32_t count;  // sequences in the step: an index past them is the engine's mistake, dropped
};

void StepEmitTrampoline(void* ctx, uint32_t index, const wp_generate_chunk* chunk) {
  const auto* bridge = static_cast<const StepEmitBridge*>(ctx);
  if (index >= bridge->count || chunk == nullptr || !*bridge->emit) return;
  try {
    const std::string text = ValidUtf8(
        std::string(chunk->text.data != nullptr ? chunk->text.data : "", chunk->text.bytes));
    std::span<const int32_t> tokens;
    if (chunk->tokens != nullptr) tokens = {chunk->tokens, chunk->token_count};
    std::span<const wp_token_logprobs> logprobs;
    if (chunk->logprobs != nullptr) logprobs = {chunk->logprobs, chunk->logprob_count};
    (*bridge->emit)(index, text, tokens, logprobs);
  } catch (...) {
    // nothing may unwind through the engine's C frames; the chunk is lost, the step goes on
  }
}

}  // namespace

int ProgressTrampoline(void* ctx, uint64_t done, uint64_t total) {
  try {
    return (*static_cast<const Engine::ProgressFn*>(ctx))(done, total) ? 0 : 1;
  } catch (...) {
    return 1;  // an exception must not unwind through the engine's C frames
  }
}

Status StatusFromWp(wp_status status, const char* err) {
  if (status == WP_OK) return OkStatus();
  std::string message = err != nullptr ? std::string(err) : std::string();
  if (message.empty()) message = "engine failed without a message";
  return Status(CodeFromInt(static_cast<int>(status)), std::move(message));
}

wp_status WpFromStatus(const Status& status, char* err, size_t err_len) {
  if (!status.ok() && err != nullptr && err_len > 0) {
    size_t n = std::min(err_len - 1, status.message().size());
    std::memcpy(err, status.message().data(), n);
    err[n] = '\0';
  }
  return static_cast<wp_status>(static_cast<int>(status.code()));
}

Result<Engine> Engine::Open(const wp_engine_vtable* vtable, const wp_engine_spec& spec,
                            const wp_device_memory* memory) {
  if (vtable == nullptr) return Error(Code::kInvalidArgument, "no engine given");
  const char* engine_name = vtable->name != nullptr ? vtable->name : "?";
  if (vtable->abi_version < WP_ENGINE_ABI_VERSION_MIN || vtable->abi_version > WP_ENGINE_ABI_VERSION) {
    return Error(Code::kFailedPrecondition, "engine \"{}\" implements ABI version {}, warmpool loads {} to {}",
                 engine_name, vtable->abi_version, WP_ENGINE_ABI_VERSION_MIN, WP_ENGINE_ABI_VERSION);
  }
  if (vtable->open == nullptr || vtable->load == nullptr || vtable->infer == nullptr ||
      vtable->close == nullptr || vtable->export_weights == nullptr || vtable->attach == nullptr) {
    return Error(Code::kFailedPrecondition, "engine \"{}\" leaves an entry point of its vtable empty",
                 engine_name);
  }
  char err[kErrorBufferBytes] = {};
  wp_engine* instance = nullptr;
  // A version 2 engine knows nothing of a directory, and writes only the first part of info.
  if (vtable->abi_version < 3 && spec.has_directory) {
    return Error(Code::kFailedPrecondition, "engine \"{}\" (ABI version {}) cannot serve a model directory",
                 engine_name, vtable->abi_version);
  }
  wp_engine_info info{};
  wp_status status = vtable->open(&spec, memory, &instance, &info, err, sizeof(err));
  if (status != WP_OK) {
    if (instance != nullptr) vtable->close(instance);
    return StatusFromWp(status, err);
  }
  return Engine(vtable, instance, info);
}

Engine::Engine(Engine&& other) noexcept
    : vtable_(other.vtable_), instance_(std::exchange(other.instance_, nullptr)), info_(other.info_) {}

Engine& Engine::operator=(Engine&& other) noexcept {
  if (this != &other) {
    Close();
    vtable_ = other.vtable_;
    instance_ = std::exchange(other.instance_, nullptr);
    info_ = other.info_;
  }
  return *this;
}

Engine::~Engine() { Close(); }

void Engine::Close() {
  if (instance_ != nullptr) vtable_->close(instance_);
  instance_ = nullptr;
}

Status Engine::Load(const ProgressFn& progress) {
  if (instance_ == nullptr) return Error(Code::kFailedPrecondition, "engine is closed");
  char err[kErrorBufferBytes] = {};
  wp_status status = progress ? vtable_->load(instance_, &ProgressTrampoline, const_cast<ProgressFn*>(&progress), err, sizeof(err))
                              : vtable_->load(instance_, nullptr, nullptr, err, sizeof(err));
  return StatusFromWp(status, err);
}

Result<wp_region> Engine::ExportWeights() {
  if (instance_ == nullptr) return Error(Code::kFailedPrecondition, "engine is closed");
  wp_region region{nullptr, 0, -1};
  wp_status status = vtable_->export_weights(instance_, &region);
  if (status != WP_OK) return StatusFromWp(status, "the engine has no weights to share");
  return region;
}

Result<wp_region> Engine::ExportCache() {
  if (instance_ == nullptr) return Error(Code::kFailedPrecondition, "engine is closed");
  wp_region region{nullptr, 0, -1};
  if (vtable_->abi_version < 10 || vtable_->export_cache == nullptr ||
      vtable_->export_cache(instance_, &region) != WP_OK || region.handle < 0 || region.bytes == 0) {
    return Error(Code::kNotFound, "the engine keeps no KV cache another process can map");
  }
  return region;
}

std::optional<Engine::KvCacheUsage> Engine::KvUsage() {
  uint64_t held = 0, blocks = 0, reserved = 0;
  if (instance_ == nullptr || vtable_->abi_version < 10 || vtable_->kv_usage == nullptr ||
      vtable_->kv_usage(instance_, &held, &blocks) != WP_OK || blocks == 0) {
    return std::nullopt;
  }
  uint64_t refused = 0;
  if (vtable_->abi_version < 12 || vtable_->kv_reservations == nullptr ||
      vtable_->kv_reservations(instance_, &reserved, &refused) != WP_OK) {
    reserved = 0;
  }
  return KvCacheUsage{std::min(held, blocks), blocks, std::min(reserved, blocks)};
}

uint64_t Engine::KvRefusedBlocks() {
  uint64_t reserved = 0, refused = 0;
  if (instance_ == nullptr || vtable_->abi_version < 12 || vtable_->kv_reservations == nullptr ||
      vtable_->kv_reservations(instance_, &reserved, &refused) != WP_OK) {
    return 0;
  }
  return refused;
}

uint32_t Engine::PreemptedBlocks(const wp_sequence* sequence) {
  if (instance_ == nullptr || vtable_->abi_version < 13 || vtable_->preempted == nullptr) return 0;
  return vtable_->preempted(instance_, sequence);
}

Status Engine::AdoptCache(int handle, uint64_t bytes) {
  if (instance_ == nullptr) return Error(Code::kFailedPrecondition, "engine is closed");
  if (vtable_->abi_version < 11 || vtable_->adopt_cache == nullptr) {
    return Error(Code::kFailedPrecondition, "the engine takes over no earlier instance's KV cache");
  }
  const wp_region cache{nullptr, bytes, handle};
  char err[kErrorBufferBytes] = {};
  return StatusFromWp(vtable_->adopt_cache(instance_, &cache, err, sizeof(err)), err);
}

Status Engine::Attach(const wp_region& weights) {
  if (instance_ == nullptr) return Error(Code::kFailedPrecondition, "engine is closed");
  char err[kErrorBufferBytes] = {};
  return StatusFromWp(vtable_->attach(instance_, &weights, err, sizeof(err)), err);
}

Status Engine::Infer(std::span<const float> input, uint32_t rows, uint32_t cols, std::vector<float>& output) {
  output.resize(static_cast<size_t>(rows) * OutputColumns(cols));
  return Infer(input, rows, cols, std::span<float>(output));
}

Status Engine::Infer(std::span<const float> input, uint32_t rows, uint32_t cols, std::span<float> output) {
  if (instance_ == nullptr) return Error(Code::kFailedPrecondition, "engine is closed");
  if (input.size() != static_cast<uint64_t>(rows) * cols) {
    return Error(Code::kInvalidArgument, "input holds {} floats, not rows x cols = {} x {}", input.size(),
                 rows, cols);
  }
  if (output.size() != static_cast<uint64_t>(rows) * OutputColumns(cols)) {
    return Error(Code::kInvalidArgument, "output holds {} floats, not rows x {} = {}", output.size(),
                 OutputColumns(cols), static_cast<uint64_t>(rows) * OutputColumns(cols));
  }
  char err[kErrorBufferBytes] = {};
  wp_status status = vtable_->infer(instance_, input.data(), rows, cols, output.data(), err, sizeof(err));
  return StatusFromWp(status, err);
}

Result<std::string> Engine::Describe() {
  if (instance_ == nullptr) return Error(Code::kFailedPrecondition, "engine is closed");
  const uint8_t* header = nullptr;
  uint64_t bytes = 0;
  if (vtable_->abi_version < 3 || vtable_->describe == nullptr ||
      vtable_->describe(instance_, &header, &bytes) != WP_OK || header == nullptr) {
    return Error(Code::kNotFound, "the engine gives no description of its model");
  }
  return std::string(reinterpret_cast<const char*>(header), bytes);
}

Result<Engine::Embeddings> Engine::Embed(const std::vector<std::string>& inputs, const ProgressFn& progress) {
  if (instance_ == nullptr) return Error(Code::kFailedPrecondition, "engine is closed");
  if (!embeds()) {
    return Error(Code::kFailedPrecondition, "engine \"{}\" does not make embeddings",
                 vtable_->name != nullptr ? vtable_->name : "?");
  }
  std::vector<wp_string> strings;
  strings.reserve(inputs.size());
  for (const std::string& input : inputs) strings.push_back({input.data(), input.size()});
  Embeddings out;
  out.values.resize(inputs.size() * uint64_t{info_.embedding_size});
  out.tokens.resize(inputs.size());
  char err[kErrorBufferBytes] = {};
  wp_status status = vtable_->embed(instance_, strings.data(), static_cast<uint32_t>(strings.size()),
                                    out.values.data(), out.tokens.data(), progress ? &ProgressTrampoline : nullptr,
                                    progress ? const_cast<ProgressFn*>(&progress) : nullptr, err, sizeof(err));
  if (status != WP_OK) return StatusFromWp(status, err);
  return out;
}

// Version 8 put cached_tokens in what was the struct's tail padding with 8-byte pointers: arrays
// of version 7 engines keep their stride only there.
static_assert(sizeof(void*) != 8 || sizeof(wp_sequence_step) == 288, "wp_sequence_step changed size");

Status Engine::CanRun(const wp_generate_request& request) const {
  if (request.resume_count != 0 && vtable_->abi_version < 9) {
    // An older engine would start the generation again: its client would get the text twice.
    return Error(Code::kUnavailable,
                 "engine \"{}\" (engine ABI version {}) cannot resume a generation its worker's death cut "
                 "short: what was sent stands, ask again for the rest",
                 vtable_->name != nullptr ? vtable_->name : "?", vtable_->abi_version);
  }
  return OkStatus();
}

Result<wp_generate_result> Engine::Generate(const wp_generate_request& request, const EmitFn& emit) {
  if (instance_ == nullptr) return Error(Code::kFailedPrecondition, "engine is closed");
  if (!generates()) {
    return Error(Code::kFailedPrecondition, "engine \"{}\" does not generate text: send it tensors (infer)",
                 vtable_->name != nullptr ? vtable_->name : "?");
  }
  if (request.conversation.bytes != 0 && vtable_->abi_version < 6) {
    return Error(Code::kInvalidArgument,
                 "engine \"{}\" (engine ABI version {}) takes no tools or tool calls: send plain messages",
                 vtable_->name != nullptr ? vtable_->name : "?", vtable_->abi_version);
  }
  if (Status s = CanRun(request); !s.ok()) return s;
  char err[kErrorBufferBytes] = {};
  wp_generate_result result{};
  EmitBridge bridge{&emit, vtable_->abi_version};
  wp_status status = vtable_->generate(instance_, &request, &EmitTrampoline, &bridge, &result,
                                       err, sizeof(err));
  if (status != WP_OK) return StatusFromWp(status, err);
  return result;
}

Result<wp_sequence*> Engine::OpenSequence(const wp_generate_request& request, uint32_t* prompt_tokens) {
  if (instance_ == nullptr) return Error(Code::kFailedPrecondition, "engine is closed");
  if (!steps()) {
    return Error(Code::kFailedPrecondition, "engine \"{}\" does not step sequences together",
                 vtable_->name != nullptr ? vtable_->name : "?");
  }
  if (Status s = CanRun(request); !s.ok()) return s;
  char err[kErrorBufferBytes] = {};
  wp_sequence* sequence = nullptr;
  uint32_t prompt = 0;
  wp_status status = vtable_->open_sequence(instance_, &request, &sequence, &prompt, err, sizeof(err));
  if (status != WP_OK) return StatusFromWp(status, err);
  if (sequence == nullptr) return Error(Code::kInternal, "engine opened a sequence and gave none back");
  if (prompt_tokens != nullptr) *prompt_tokens = prompt;
  return sequence;
}

Status Engine::Step(std::span<wp_sequence_step> sequences, const StepEmitFn& emit) {
  if (instance_ == nullptr) return Error(Code::kFailedPrecondition, "engine is closed");
  if (!steps()) return Error(Code::kFailedPrecondition, "engine does not step sequences together");
  char err[kErrorBufferBytes] = {};
  StepEmitBridge bridge{&emit, static_cast<uint32_t>(sequences.size())};
  wp_status status = vtable_->step(instance_, sequences.data(), static_cast<uint32_t>(sequences.size()),
                                   &StepEmitTrampoline, &bridge, err, sizeof(err));
  for (wp_sequence_step& s : sequences) {
    s.error[sizeof(s.error) - 1] = '\0';  // an engine's message, bounded whatever it wrote
    if (vtable_->abi_version < 8) s.cached_tokens = 0;  // not its to write
    if (s.ended != 0 && s.status == WP_OK && s.result.finish_reason > WP_FINISH_CANCELLED) {
      s.result.finish_reason = WP_FINISH_STOP;  // a reason this side does not know
    }
  }
  return StatusFromWp(status, err);
}

void Engine::CloseSequence(wp_sequence* sequence) {
  if (instance_ != nullptr && steps() && sequence != nullptr) vtable_->close_sequence(instance_, sequence);
}

}  // namespace warmpool
