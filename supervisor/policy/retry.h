// Retry policy as pure functions: when a request that crashed its worker is run again, when a
// model that keeps crashing becomes `failed` and for how long, and how long a dead worker waits
// before it is started again.
#pragma once

#include <cstdint>
#include <deque>

namespace warmpool::supervisor::policy {

struct RetrySettings {
  uint32_t crash_loop_crashes = 3;      // crashes charged to one model ...
  uint64_t crash_loop_window_ms = 60000;  // ... within this window make it failed ...
  uint64_t cooldown_ms = 5000;          // ... for a cooldown that doubles at each failure ...
  uint64_t cooldown_max_ms = 300000;    // ... up to this
  uint64_t respawn_min_ms = 100;        // a dead worker waits this long, doubling per crash ...
  uint64_t respawn_max_ms = 30000;      // ... up to this ...
  uint64_t respawn_stable_ms = 60000;   // ... and starts over after living this long
};

// A model's recent crashes and its next cooldown.
struct CrashRecord {
  std::deque<uint64_t> times_ms;        // every crash charged, within the window
  std::deque<uint64_t> alone_times_ms;  // of those, the ones its jobs ran alone
  uint64_t cooldown_ms = 0;  // the last cooldown given (0: none yet)
};

// A request is run again after its worker died, unless it has now crashed two workers, counting a
// crash it shared with other jobs (any of which may have been the cause) only once it has also
// crashed one alone; or it has been running at kMaxCrashesOfRequest crashes, all shared. A poison
// request in a batch thus ends after two crashes, as it would alone, and an innocent one is not
// failed for its neighbours.
inline constexpr uint32_t kMaxCrashesOfRequest = 4;
bool RetryAfterCrash(uint32_t crashes_alone, uint32_t crashes_shared);

// Charges a crash at now: `alone` when the model's jobs were the only ones running, else it
// shared the crash with another model's (a load beside an inference, say), either of which may
// have caused it. True when the model is now in a crash loop: crash_loop_crashes alone within the
// window, or kSharedCrashLoopFactor times as many counting the shared ones (so that a model is not
// failed for a neighbour's crashes, and one that only ever crashes beside others still ends). It
// then becomes failed for NextCooldown, and its record starts over.
inline constexpr uint32_t kSharedCrashLoopFactor = 2;
bool ChargeCrash(CrashRecord& record, uint64_t now_ms, const RetrySettings& settings, bool alone = true);
// The cooldown of a model failing now: the base, doubled for each failure before, capped. Records it.
uint64_t NextCooldown(CrashRecord& record, const RetrySettings& settings);
// A model that served well for a whole window after its last crash earns its base cooldown back.
void Forgive(CrashRecord& record, uint64_t now_ms, const RetrySettings& settings);

// The wait before respawning a worker that died after living lived_ms, given the last wait.
uint64_t RespawnDelay(uint64_t last_delay_ms, uint64_t lived_ms, const RetrySettings& settings);

}  // namespace warmpool::supervisor::policy
