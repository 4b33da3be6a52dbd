// A C++ handle over any engine's C ABI (engine.h) that
// turns wp_status plus its error buffer into Status and closes the instance when it goes away.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "warmpool/engine.h"

namespace warmpool {

// Bridges between Status and the C ABI. Codes are equal numerically.
Status StatusFromWp(wp_status status, const char* err);
// Copies the message (truncated to fit, always NUL-terminated) into err and returns the code.
wp_status WpFromStatus(const Status& status, char* err, size_t err_len);

// A wp_progress_fn over an Engine::ProgressFn (ctx points at it): non-zero when it returns false
// or throws (nothing may unwind through an engine's C frames).
int ProgressTrampoline(void* ctx, uint64_t done, uint64_t total);

// A spec for a model that is a file (or none): every field set, no directory.
inline wp_engine_spec SpecForFile(const char* name, const char* path, const uint8_t* header = nullptr,
                                  uint64_t header_bytes = 0, uint64_t file_size = 0) {
  return wp_engine_spec{name, path, header, header_bytes, file_size, /*has_directory=*/0, /*directory_fd=*/-1,
                        /*context=*/0, /*sequences=*/0, /*kv_tokens=*/0, /*prefill_stretch=*/0};
}

// The error buffer an engine call writes into: long enough for a JSON parse error that quotes its
// context.
inline constexpr size_t kErrorBufferBytes = 4096;

class Engine {
 public:
  // Returns true to continue, false to cancel the load.
  using ProgressFn = std::function<bool(uint64_t done_bytes, uint64_t total_bytes)>;

  // Checks the vtable (ABI version, every entry point present) and opens an instance. memory must
  // outlive the Engine.
  static Result<Engine> Open(const wp_engine_vtable* vtable, const wp_engine_spec& spec,
                             const wp_device_memory* memory);

  Engine(Engine&& other) noexcept;
  Engine& operator=(Engine&& other) noexcept;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine();

  Status Load(const ProgressFn& progress = nullptr);
  // After Load: the region holding the weights (its handle is shareable). NOT_FOUND: none (echo).
  Result<wp_region> ExportWeights();
  // The region holding its sequences' KV cache (engine ABI version 10), NOT_FOUND when it keeps
  // none another process can map.
  Result<wp_region> ExportCache();
  // Blocks of its KV cache held by sequences, and all it has (engine ABI version 10), and those its
  // open sequences may come to need (version 12; 0 before); nullopt when it keeps no cache in blocks.
  struct KvCacheUsage {
    uint64_t held = 0;
    uint64_t blocks = 0;
    uint64_t reserved = 0;
  };
  std::optional<KvCacheUsage> KvUsage();
  // When the last OpenSequence was refused for want of room in the KV cache, the blocks it would
  // have needed (engine ABI version 12); 0 after any other outcome, or when the engine cannot say.
  uint64_t KvRefusedBlocks();
  // After a step that ended `sequence`: the blocks it needs to go on when its engine preempted it
  // for room in the KV cache (engine ABI version 13), else 0.
  uint32_t PreemptedBlocks(const wp_sequence* sequence);
  // The KV cache an earlier instance of these weights exported and left cleanly, taken over as this
  // one's (engine ABI version 11); the caller keeps `handle`. FAILED_PRECONDITION where the engine
  // adopts none.
  Status AdoptCache(int handle, uint64_t bytes);
  // Instead of Load: weights another process loaded, imported here; the engine takes the region
  // over. Fails if it does not fit the model (the region is then still the caller's).
  Status Attach(const wp_region& weights);
  // input holds rows x cols floats, row-major; output is resized to rows x OutputColumns(cols).
  Status Infer(std::span<const float> input, uint32_t rows, uint32_t cols, std::vector<float>& output);
  // The same into memory of the caller's (a client's region): output holds exactly
  // rows x OutputColumns(cols) floats.
  Status Infer(std::span<const float> input, uint32_t rows, uint32_t cols, std::span<float> output);

  // Version 3 engines that serve directories: the description an open from one made (the header
  // a later open attaches by). NOT_FOUND when the engine gives none.
  Result<std::string> Describe();
  // Language models (version 3 engines with generate): emit gets each step's text (made valid
  // UTF-8: an engine's bytes go into protobuf strings) and tokens, and returns false to stop. FAILED_PRECONDITION for engines that do not generate.
  // logprobs: one per token when the request asked for them (and the engine is of version 4).
  using EmitFn = std::function<bool(std::string_view text, std::span<const int32_t> tokens,
                                    std::span<const wp_token_logprobs> logprobs)>;
  bool generates() const { return vtable_->abi_version >= 3 && vtable_->generate != nullptr; }
  Result<wp_generate_result> Generate(const wp_generate_request& request, const EmitFn& emit);

  // Version 7: generations as sequences stepped together (continuous batching), all three calls.
  bool steps() const {
    return vtable_->abi_version >= 7 && vtable_->open_sequence != nullptr && vtable_->step != nullptr &&
           vtable_->close_sequence != nullptr;
  }
  // An open generation (the request as Generate takes it); prompt_tokens (unless null) its prompt's
  // length. Close it with CloseSequence, before the engine goes.
  Result<wp_sequence*> OpenSequence(const wp_generate_request& request, uint32_t* prompt_tokens = nullptr);
  // One step of open sequences (engine.h's step): emit gets each sequence's output by its index in
  // `sequences`, its text made valid UTF-8; each wp_sequence_step says how the step left it.
  using StepEmitFn = std::function<void(uint32_t index, std::string_view text, std::span<const int32_t> tokens,
                                        std::span<const wp_token_logprobs> logprobs)>;
  Status Step(std::span<wp_sequence_step> sequences, const StepEmitFn& emit);
  void CloseSequence(wp_sequence* sequence);

  // Version 4: each input's embedding (info().embedding_size floats each, in order) and tokens.
  struct Embeddings {
    std::vector<float> values;
    std::vector<uint32_t> tokens;
  };
  bool embeds() const {
    return vtable_->abi_version >= 4 && vtable_->embed != nullptr && info_.embedding_size > 0;
  }
  // Version 14: the model embeds but gives no logits (a checkpoint without an output head).
  bool embeds_only() const { return vtable_->abi_version >= 14 && embeds() && info_.embeds_only != 0; }
  // progress: as load's (tokens run so far of all), returning false to stop (UNAVAILABLE).
  Result<Embeddings> Embed(const std::vector<std::string>& inputs, const ProgressFn& progress = nullptr);

  // Version 5: typed tensors (engines/engine_tensors.cc).
  bool runs_tensors() const { return vtable_->abi_version >= 5 && vtable_->run != nullptr; }
  // What run takes and gives; `stated` false when the engine states nothing (it takes any
  // well-formed tensors). The spans are the engine's, valid until it closes.
  struct TensorSignature {
    bool stated = false;
    std::span<const wp_tensor> inputs, outputs;
  };
  Result<TensorSignature> Signature() const;
  // Checks the inputs (well-formed, and as the signature says), runs them, and passes each output
  // to sink once it is checked too (well-formed, named in the signature, each once; all of them
  // given): an engine's mistake is an INTERNAL error, not a malformed reply. A sink's error stops
  // the run and is what Run returns.
  // max_output_bytes and progress as the ABI's run (0, null: none).
  using SinkFn = std::function<Status(const wp_tensor& output)>;
  Status Run(std::span<const wp_tensor> inputs, const SinkFn& sink, uint64_t max_output_bytes = 0,
             const ProgressFn& progress = nullptr);

  const wp_engine_info& info() const { return info_; }
  const wp_engine_vtable& vtable() const { return *vtable_; }
  uint32_t OutputColumns(uint32_t cols) const { return info_.out_features != 0 ? info_.out_features : cols; }

 private:
  // A request this engine's version can run: a resumed generation needs version 9.
  Status CanRun(const wp_generate_request& request) const;
  Engine(const wp_engine_vtable* vtable, wp_engine* instance, const wp_engine_info& info)
      : vtable_(vtable), instance_(instance), info_(info) {}
  void Close();

  const wp_engine_vtable* vtable_ = nullptr;
  wp_engine* instance_ = nullptr;
  wp_engine_info info_{};
};

}  // namespace warmpool
