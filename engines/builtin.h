// The engines compiled into warmpool, and a C++ handle over any engine's C ABI (engine.h) that
// turns wp_status plus its error buffer into Status and closes the instance when it goes away.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "warmpool/engine.h"

namespace warmpool {

// "dense" or "echo"; nullptr for any other name.
const wp_engine_vtable* FindBuiltinEngine(std::string_view name);

// Bridges between Status and the C ABI. Codes are equal numerically.
Status StatusFromWp(wp_status status, const char* err);
// Copies the message (truncated to fit, always NUL-terminated) into err and returns the code.
wp_status WpFromStatus(const Status& status, char* err, size_t err_len);

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
  // Instead of Load: weights another process loaded, imported here; the engine takes the region
  // over. Fails if it does not fit the model (the region is then still the caller's).
  Status Attach(const wp_region& weights);
  // input holds rows x cols floats, row-major; output is resized to rows x OutputColumns(cols).
  Status Infer(std::span<const float> input, uint32_t rows, uint32_t cols, std::vector<float>& output);
  // The same into memory of the caller's (a client's region): output holds exactly
  // rows x OutputColumns(cols) floats.
  Status Infer(std::span<const float> input, uint32_t rows, uint32_t cols, std::span<float> output);

  const wp_engine_info& info() const { return info_; }
  const wp_engine_vtable& vtable() const { return *vtable_; }
  uint32_t OutputColumns(uint32_t cols) const { return info_.out_features != 0 ? info_.out_features : cols; }

 private:
  Engine(const wp_engine_vtable* vtable, wp_engine* instance, const wp_engine_info& info)
      : vtable_(vtable), instance_(instance), info_(info) {}
  void Close();

  const wp_engine_vtable* vtable_ = nullptr;
  wp_engine* instance_ = nullptr;
  wp_engine_info info_{};
};

}  // namespace warmpool
