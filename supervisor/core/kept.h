// Weights kept across a restart of the supervisor. The handles the core holds (a resident model's
// weights region, a parked copy) are what make a model warm; the shell keeps them outside the
// process (the service manager's file-descriptor store, supervisor/warm_store.h) and gives them
// back to the next warmpoold, whose core adopts those that still match its registry.
//
// Only what the handle alone can bring back is kept: weights whose memory is a file descriptor of
// their own (the host backend's memfd, parked copies). On cuda the device memory belongs to the
// owner process, which exits with the supervisor: device weights are kept only with [cuda]
// keep_across_restarts, where an allocation outlives its owner while an exported descriptor is
// held (`warmpool-driver-check lifetime` answers that for a driver).
#pragma once

#include <cstdint>
#include <string>

#include "supervisor/core/model.h"
#include "supervisor/core/model_entry.h"

namespace warmpool::supervisor {

// The core looks at what is worth keeping at most this often after the index changed (the tick
// makes sure a change is not left waiting), and sends it (action::StoreKept) when a model joined
// or left it; when only the LRU order moved (every request moves its model), at most every
// kKeptOrderOnlyMs. A model loaded or used within that time of a crash is what the next
// supervisor may not know of.
inline constexpr uint64_t kKeptSyncMs = 200;
inline constexpr uint64_t kKeptOrderOnlyMs = 5000;

struct KeptWeights {
  std::string name;
  std::string engine;
  std::string path;
  bool parked = false;  // a host copy, else weights on weights.device
  // weights.handle: the region (the host copy when parked); weights.version: of the file they
  // were loaded from.
  Weights weights;
  // The KV cache kept with a parked copy (residency::Parked::kv_cache), a record of its own beside
  // the copy's: weights describes the copy it goes with, but for handle (the cache's region) and
  // weight_bytes (the cache's size). The next core gives it to the copy it adopts, if any.
  bool kv_cache = false;
};

}  // namespace warmpool::supervisor
