// The engines this worker serves, by model. The load thread adds them (load, attach) and removes
// them (an unload queued behind its model's load); the serving thread looks them up for every
// inference and park, and removes them (an unload with nothing queued). The lock is held only to
// find, add or remove: a job holds its own reference, so an unload that removes an engine while
// an inference or park still runs on it closes the engine when that job lets go of it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "engines/builtin.h"

namespace warmpool::worker {

class ModelTable {
 public:
  // nullptr: the model is not here.
  std::shared_ptr<Engine> Find(uint32_t model) {
    std::lock_guard lock(mutex_);
    auto it = engines_.find(model);
    return it != engines_.end() ? it->second : nullptr;
  }
  // The model's engine's max_batch rows; nullopt: the model is not here. Read under the lock, so
  // that this look-up never holds the engine: whoever takes it out closes it.
  std::optional<uint32_t> MaxBatch(uint32_t model) {
    std::lock_guard lock(mutex_);
    auto it = engines_.find(model);
    if (it == engines_.end()) return std::nullopt;
    return it->second->info().max_batch;
  }
  void Put(uint32_t model, Engine engine) {
    std::lock_guard lock(mutex_);
    engines_[model] = std::make_shared<Engine>(std::move(engine));
  }
  // Removes the model's engine and hands it over: it closes when the last holder lets go.
  std::shared_ptr<Engine> Take(uint32_t model) {
    std::lock_guard lock(mutex_);
    auto it = engines_.find(model);
    if (it == engines_.end()) return nullptr;
    std::shared_ptr<Engine> engine = std::move(it->second);
    engines_.erase(it);
    return engine;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<uint32_t, std::shared_ptr<Engine>> engines_;
};

}  // namespace warmpool::worker
